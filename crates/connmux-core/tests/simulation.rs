//! Seeded simulation of the receive side: M psocks × N sockets, random splits
//! of every byte stream (1-byte chunks, many messages per chunk, headers
//! split), random reads (whole, partial SEQPACKET, peeks), receive disables
//! and SO_RCVBUF pressure. Checked at every step: memory_used() <=
//! memory_bound(); at the end: exactly the messages sent came out, and (in
//! runs without a disable) each psock's messages kept their order within each
//! socket. A disable moves queued messages to the *tail* of another socket's
//! queue (KCM §1.12), which may reorder them there, so order is not asserted
//! in runs with disables.
//!
//! A second simulation drives the transmit side (both transmit policies,
//! addressed sends up to their refusals, partial and failed writes, peers
//! that answer, close or fail, socket closes, unattaches) and checks at
//! every step that each psock's share on the sockets' side holds what the
//! psock itself has: the sockets' side decides from the share alone.
//!
//! Replay one run: `CONNMUX_SEED=<seed> cargo test -p connmux-core --test simulation`.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::*;
use connmux_core::mux::{
    Event, Mux, MuxConfig, MuxError, PsockConfig, PsockId, RecvFlags, SockId, SockType, Steering, TxPolicy,
};
use connmux_core::Timestamp;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

struct Run {
    seed: u64,
    disables: bool,
    feeds: usize,
    msgs: usize,
    /// Steps where a psock with bytes left to send could not be read
    /// (backpressure reached the connection).
    paused: usize,
}

fn run(seed: u64) -> Run {
    let mut rng = StdRng::seed_from_u64(seed);
    let n_psocks = rng.gen_range(1..=4usize);
    let n_socks = rng.gen_range(1..=4usize);
    let disables = rng.gen_bool(0.5);
    let steering = [Steering::RoundRobin, Steering::Affinity, Steering::Key][rng.gen_range(0..3)];
    let max_msg = 600;
    let cfg = MuxConfig {
        max_msg_size: max_msg,
        assembly_timeout: Some(Duration::from_secs(3600)),
        sock_rcvbuf: rng.gen_range(1..3000),
        sock_sndbuf: 1 << 20,
        psock_rx_buf: rng.gen_range(1..2000),
        steering,
        imbalance: rng.gen_range(0..5),
        psock_sndbuf: 4 << 20,
        tx_policy: TxPolicy::RoundRobin,
        ..MuxConfig::default()
    };
    let mut m = Mux::new(cfg);
    let mut socks: Vec<(SockId, SockType)> = Vec::new();
    for i in 0..n_socks {
        let ty = if rng.gen_bool(0.5) { SockType::Dgram } else { SockType::SeqPacket };
        let s = m.socket(ty);
        if rng.gen_bool(0.5) {
            m.set_affinity(s, Some(i as u32 % 2)).unwrap();
        }
        socks.push((s, ty));
    }
    let mut psocks: Vec<PsockId> = Vec::new();
    let mut streams: Vec<(Vec<u8>, usize)> = Vec::new();
    let mut sent: Vec<Vec<u8>> = Vec::new();
    for i in 0..n_psocks {
        let mut parser = L4::new();
        parser.keyed = steering == Steering::Key;
        let aff = if rng.gen_bool(0.7) { Some(i as u32 % 2) } else { None };
        psocks.push(m.attach(Box::new(parser), PsockConfig { affinity: aff, ..PsockConfig::default() }));
        let count = rng.gen_range(1..60u32);
        let mut wire = Vec::new();
        for seq in 0..count {
            // Mostly small messages (many per chunk), some near the limit.
            let len = if rng.gen_bool(0.1) { rng.gen_range(5..=max_msg - 4) } else { rng.gen_range(5..40) };
            let msg = message(i as u8, seq, len);
            wire.extend_from_slice(&msg);
            sent.push(msg);
        }
        streams.push((wire, 0));
    }
    let mut got: HashMap<SockId, Vec<Vec<u8>>> = HashMap::new();
    // SEQPACKET partial reads in progress, per socket.
    let mut partial: HashMap<SockId, Vec<u8>> = HashMap::new();
    let mut now = 0u64;
    let mut feeds = 0;
    let mut paused = 0;
    let check = |m: &Mux, step: usize| {
        assert!(
            m.memory_used() <= m.memory_bound(),
            "seed {seed} step {step}: memory_used {} > memory_bound {}",
            m.memory_used(),
            m.memory_bound()
        );
        // The memory budget's running count never drifts from the real sum.
        assert_eq!(m.memory_counted(), m.memory_used(), "seed {seed} step {step}: budget count drifted");
        // What the sockets' side decides from equals what the psocks hold.
        if let Err(e) = m.shares_exact() {
            panic!("seed {seed} step {step}: {e}");
        }
    };
    let total_msgs = sent.len();
    let mut received = 0;
    for step in 0..200_000 {
        now += rng.gen_range(0..1000);
        let all_fed = streams.iter().all(|(w, c)| *c == w.len());
        if all_fed && received == total_msgs {
            break;
        }
        let action = rng.gen_range(0..100);
        if action < 45 && !all_fed {
            // Feed a random split of one stream.
            let i = rng.gen_range(0..n_psocks);
            let (wire, cur) = &mut streams[i];
            let cap = m.rx_capacity(psocks[i]).min(wire.len() - *cur);
            if cap == 0 {
                paused += 1;
            }
            if cap > 0 {
                let n = match rng.gen_range(0..4) {
                    0 => 1,
                    1 => rng.gen_range(1..=cap.min(7)),
                    2 => rng.gen_range(1..=cap),
                    _ => cap,
                };
                m.feed(psocks[i], &wire[*cur..*cur + n], Timestamp::from_nanos(now)).unwrap();
                *cur += n;
                feeds += 1;
            }
        } else if action < 85 {
            // Read from a random socket.
            let (s, ty) = socks[rng.gen_range(0..n_socks)];
            let r = rng.gen_range(0..10);
            if ty == SockType::SeqPacket && r < 5 {
                let mut buf = vec![0u8; rng.gen_range(0..50)];
                if r == 0 {
                    // A peek returns the head's next bytes and changes nothing.
                    if let Ok(info) = m.recv(s, &mut buf, RecvFlags { peek: true }) {
                        assert!(!info.eor && !info.trunc);
                        let mut again = vec![0u8; info.len];
                        let info2 = m.recv(s, &mut again, RecvFlags { peek: true }).unwrap();
                        assert_eq!((info2.len, &again[..]), (info.len, &buf[..info.len]), "seed {seed}");
                    }
                } else if let Ok(info) = m.recv(s, &mut buf, RecvFlags::default()) {
                    assert!(!info.trunc, "seed {seed}: SEQPACKET never truncates");
                    let acc = partial.entry(s).or_default();
                    acc.extend_from_slice(&buf[..info.len]);
                    if info.eor {
                        got.entry(s).or_default().push(std::mem::take(acc));
                        received += 1;
                    }
                }
            } else if ty == SockType::Dgram && r < 3 {
                let mut buf = vec![0u8; max_msg];
                if let Ok(info) = m.recv(s, &mut buf, RecvFlags::default()) {
                    assert!(info.eor && !info.trunc, "seed {seed}");
                    got.entry(s).or_default().push(buf[..info.len].to_vec());
                    received += 1;
                }
            } else {
                match m.recv_msg(s) {
                    Ok((b, _)) => {
                        let acc = partial.entry(s).or_default();
                        let mut whole = std::mem::take(acc);
                        whole.extend_from_slice(&b);
                        got.entry(s).or_default().push(whole);
                        received += 1;
                    }
                    Err(e) => assert_eq!(e, MuxError::WouldBlock),
                }
            }
        } else if action < 93 {
            // SO_RCVBUF pressure.
            let (s, _) = socks[rng.gen_range(0..n_socks)];
            let v = if rng.gen_bool(0.5) { rng.gen_range(1..100) } else { rng.gen_range(100..5000) };
            m.set_rcvbuf(s, v).unwrap();
        } else if disables {
            let (s, _) = socks[rng.gen_range(0..n_socks)];
            // A SEQPACKET message read part-way moves with its rest; keep the
            // part already read with the message it belongs to.
            if partial.get(&s).is_some_and(|p| !p.is_empty()) {
                continue;
            }
            let d = rng.gen_bool(0.6);
            m.set_recv_disable(s, d).unwrap();
        }
        for e in events(&mut m) {
            if let Event::PsockFailed(p, err) = e {
                panic!("seed {seed}: psock {p:?} failed on good input: {err:?}");
            }
        }
        check(&m, step);
        if step > 150_000 {
            // Bounded: let everything drain.
            for &(s, _) in &socks {
                m.set_recv_disable(s, false).unwrap();
                m.set_rcvbuf(s, 1 << 20).unwrap();
            }
        }
    }
    assert_eq!(received, total_msgs, "seed {seed}: {received} of {total_msgs} messages came out");
    assert_eq!(m.memory_used(), 0, "seed {seed}: nothing left behind");
    // Same multiset out as in.
    let mut out: Vec<Vec<u8>> = got.values().flatten().cloned().collect();
    out.sort();
    let mut want = sent.clone();
    want.sort();
    assert_eq!(out, want, "seed {seed}: messages differ");
    if !disables {
        for (s, msgs) in &got {
            let mut last: HashMap<u8, u32> = HashMap::new();
            for msg in msgs {
                let (p, seq) = id_of(msg);
                if let Some(prev) = last.insert(p, seq) {
                    assert!(seq > prev, "seed {seed}: psock {p} out of order on {s:?}: {prev} then {seq}");
                }
            }
        }
    }
    let st = m.stats();
    assert_eq!(st.rx_msgs as usize, total_msgs, "seed {seed}");
    assert_eq!(st.rx_bytes as usize, sent.iter().map(Vec::len).sum::<usize>(), "seed {seed}: bytes counted once");
    Run { seed, disables, feeds, msgs: total_msgs, paused }
}

#[test]
fn simulation_random_splits_reads_disables_and_pressure() {
    let seeds: Vec<u64> = match std::env::var("CONNMUX_SEED") {
        Ok(s) => vec![s.parse().expect("CONNMUX_SEED must be a number")],
        Err(_) => (0..1500).map(|i| 0x5eed_0000 + i).collect(),
    };
    let mut feeds = 0;
    let mut msgs = 0;
    let mut with_disables = 0;
    let mut with_pause = 0;
    for seed in seeds.iter().copied() {
        let r = std::panic::catch_unwind(|| run(seed));
        match r {
            Ok(r) => {
                feeds += r.feeds;
                msgs += r.msgs;
                with_disables += usize::from(r.disables);
                with_pause += usize::from(r.paused > 0);
                assert_eq!(r.seed, seed);
            }
            Err(e) => {
                eprintln!("simulation failed: replay with CONNMUX_SEED={seed}");
                std::panic::resume_unwind(e);
            }
        }
    }
    eprintln!(
        "simulation: {} runs ({with_disables} with disables, {with_pause} with backpressure), {feeds} random splits fed, {msgs} messages",
        seeds.len()
    );
    if seeds.len() > 1 {
        assert!(feeds >= 10_000, "only {feeds} splits");
        assert!(with_pause > seeds.len() / 10, "backpressure barely exercised");
        assert!(with_disables > seeds.len() / 4, "disables barely exercised");
    }
}

/// What one seeded transmit run went through (to check the runs cover it).
#[derive(Default)]
struct TxRun {
    least_outstanding: bool,
    refusals: usize,
    failures: usize,
    digest: u64,
}

/// Seeded simulation of the transmit side: plain sends under both transmit
/// policies, addressed sends up to their refusals (the psock's backlog, the
/// socket's send buffer), batches, writers that write part of a chunk, fail
/// or report after an unattach, peers that answer, close, send bad bytes or
/// stall mid-message, sockets closed and psocks unattached. Checked at
/// every step: each psock's share holds what the psock has
/// (`Mux::shares_exact`: the sockets' side decides refusals and
/// `TxPolicy::LeastOutstanding` from it) and the memory bound.
/// `digest` hashes every call's result and every event, the same for two
/// builds that decide the same.
fn run_tx(seed: u64) -> TxRun {
    use connmux_core::mux::{RxError, SendFlags};
    use connmux_core::Bytes;
    use std::hash::{Hash, Hasher};

    let mut rng = StdRng::seed_from_u64(seed);
    let policy = if rng.gen_bool(0.5) { TxPolicy::LeastOutstanding } else { TxPolicy::RoundRobin };
    let max_msg = 600;
    let cfg = MuxConfig {
        max_msg_size: max_msg,
        assembly_timeout: Some(Duration::from_millis(rng.gen_range(50..500))),
        sock_sndbuf: rng.gen_range(64..4000),
        psock_sndbuf: rng.gen_range(64..4000),
        steering: Steering::Affinity,
        tx_policy: policy,
        ..MuxConfig::default()
    };
    let mut m = Mux::new(cfg);
    let mut h = std::collections::hash_map::DefaultHasher::new();
    let mut r = TxRun { least_outstanding: policy == TxPolicy::LeastOutstanding, ..TxRun::default() };
    let n_socks = rng.gen_range(1..=3u32);
    let mut socks: Vec<(SockId, SockType)> = Vec::new();
    let new_sock = |m: &mut Mux, rng: &mut StdRng, tag: u32| {
        let ty = if rng.gen_bool(0.5) { SockType::Dgram } else { SockType::SeqPacket };
        let s = m.socket(ty);
        m.set_affinity(s, Some(tag)).unwrap();
        (s, ty)
    };
    for i in 0..n_socks {
        socks.push(new_sock(&mut m, &mut rng, i));
    }
    let mut psocks: Vec<PsockId> = Vec::new();
    let mut attached = 0u32;
    let mut attach = |m: &mut Mux| {
        attached += 1;
        m.attach(L4::boxed(), PsockConfig { affinity: Some(attached % n_socks), ..PsockConfig::default() })
    };
    for _ in 0..rng.gen_range(1..=4) {
        psocks.push(attach(&mut m));
    }
    // Chunks out with a writer, by psock: their length.
    let mut out: HashMap<PsockId, usize> = HashMap::new();
    let mut now = 0u64;
    let msg = |rng: &mut StdRng, tag: u8| l4(&vec![tag; rng.gen_range(1..120)]);
    for step in 0..2000u32 {
        let action = rng.gen_range(0..93);
        let s = socks[rng.gen_range(0..socks.len())];
        let p = psocks[rng.gen_range(0..psocks.len())];
        let res: String = if action < 20 {
            // A plain send (placed by the policy).
            let batch = rng.gen_bool(0.1);
            let flags = match s.1 {
                SockType::SeqPacket => SendFlags { eor: true, batch, more: false },
                SockType::Dgram => SendFlags { batch, ..SendFlags::default() },
            };
            format!("{:?}", m.send(s.0, &msg(&mut rng, 1), flags))
        } else if action < 40 {
            // An addressed send: one message, several, or several and the chunk.
            let res = match rng.gen_range(0..4) {
                0 | 1 => m.send_msg(s.0, Some(p), Bytes::from(msg(&mut rng, 2)), rng.gen_bool(0.2)).map(|_| false),
                2 => {
                    let k = rng.gen_range(1..5u32);
                    let data: Vec<u8> = (0..k).flat_map(|_| msg(&mut rng, 3)).collect();
                    m.send_msgs_to(s.0, p, Bytes::from(data), k).map(|_| false)
                }
                _ => {
                    let k = rng.gen_range(1..5u32);
                    let data: Vec<u8> = (0..k).flat_map(|_| msg(&mut rng, 4)).collect();
                    let mut slices = Vec::new();
                    let began = m.send_msgs_to_begin(s.0, p, Bytes::from(data), k, &mut slices);
                    if began == Ok(true) {
                        out.insert(p, slices.iter().map(|b| b.len()).sum());
                    }
                    began
                }
            };
            r.refusals += usize::from(res == Err(MuxError::WouldBlock));
            format!("{res:?}")
        } else if action < 55 {
            // A writer: begins a chunk, or reports one (in part, or failed).
            match out.remove(&p) {
                Some(len) if rng.gen_bool(0.03) => {
                    m.tx_failed(p, 104);
                    format!("failed {len}")
                }
                Some(len) => {
                    let n = if rng.gen_bool(0.6) { len } else { rng.gen_range(0..=len) };
                    m.tx_complete(p, n);
                    format!("wrote {n} of {len}")
                }
                None => {
                    let chunk = m.tx_begin(p);
                    if let Some(c) = &chunk {
                        out.insert(p, c.len());
                    }
                    format!("{:?}", chunk.map(|c| c.len()))
                }
            }
        } else if action < 65 {
            // The peer answers (or sends a message too large, or stalls in one).
            let data = match rng.gen_range(0..100) {
                0 => (max_msg as u32 * 2).to_be_bytes().to_vec(),
                1 => 50u32.to_be_bytes().to_vec(),
                _ => msg(&mut rng, 5),
            };
            if m.rx_capacity(p) >= data.len() {
                format!("{:?}", m.feed(p, &data, Timestamp::from_nanos(now)))
            } else {
                "full".into()
            }
        } else if action < 75 {
            let mut n = 0;
            while m.recv_msg(s.0).is_ok() {
                n += 1;
            }
            format!("read {n}")
        } else if action < 80 {
            now += rng.gen_range(0..200_000_000);
            m.handle_timeout(Timestamp::from_nanos(now));
            "time".into()
        } else if action < 81 {
            let res = if rng.gen_bool(0.5) {
                m.rx_closed(p, rng.gen_bool(0.5).then_some(104))
            } else {
                m.rx_abort(p, RxError::Tls("bad record".into()))
            };
            format!("{res:?}")
        } else if action < 84 {
            if socks.len() > 1 && rng.gen_bool(0.5) {
                let i = rng.gen_range(0..socks.len());
                format!("{:?}", m.close(socks.swap_remove(i).0))
            } else {
                let tag = rng.gen_range(0..n_socks);
                socks.push(new_sock(&mut m, &mut rng, tag));
                "socket".into()
            }
        } else if action < 86 {
            if psocks.len() > 1 && rng.gen_bool(0.5) {
                let i = rng.gen_range(0..psocks.len());
                format!("{:?}", m.unattach(psocks.swap_remove(i)))
            } else {
                psocks.push(attach(&mut m));
                "attach".into()
            }
        } else if action < 90 {
            format!("{:?}", m.end_batch(s.0))
        } else {
            format!("{:?}", m.set_sndbuf(s.0, rng.gen_range(64..4000)))
        };
        res.hash(&mut h);
        for e in events(&mut m) {
            if matches!(e, Event::PsockFailed(..)) {
                r.failures += 1;
            }
            format!("{e:?}").hash(&mut h);
        }
        if let Err(e) = m.shares_exact() {
            panic!("seed {seed} step {step}: {e}");
        }
        assert!(m.memory_used() <= m.memory_bound(), "seed {seed} step {step}: over the memory bound");
    }
    format!("{:?}", m.stats()).hash(&mut h);
    r.digest = h.finish();
    r
}

#[test]
fn simulation_transmit_shares_follow_their_psocks() {
    let seeds: Vec<u64> = match std::env::var("CONNMUX_SEED") {
        Ok(s) => vec![s.parse().expect("CONNMUX_SEED must be a number")],
        Err(_) => (0..300).map(|i| 0x7a5e_0000 + i).collect(),
    };
    let mut total = TxRun::default();
    let mut balanced = 0;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for seed in seeds.iter().copied() {
        let r = match std::panic::catch_unwind(|| run_tx(seed)) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("transmit simulation failed: replay with CONNMUX_SEED={seed}");
                std::panic::resume_unwind(e);
            }
        };
        std::hash::Hash::hash(&r.digest, &mut h);
        balanced += usize::from(r.least_outstanding);
        total.refusals += r.refusals;
        total.failures += r.failures;
    }
    eprintln!(
        "transmit simulation: {} runs ({balanced} least outstanding), {} addressed sends refused, {} psock failures; digest {:016x}",
        seeds.len(),
        total.refusals,
        total.failures,
        std::hash::Hasher::finish(&h)
    );
    if seeds.len() > 1 {
        assert!(balanced > seeds.len() / 4 && balanced < seeds.len() * 3 / 4, "{balanced} balanced runs");
        assert!(total.refusals > seeds.len(), "refusals barely exercised: {}", total.refusals);
        assert!(total.failures > seeds.len(), "failures barely exercised: {}", total.failures);
    }
}
