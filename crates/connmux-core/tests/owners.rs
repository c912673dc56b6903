//! Seeded simulation of a mux whose psocks are held by several owners, as a
//! runtime's workers would hold them: each owner has its own `Owned`, all
//! share one `Hub`. A call on a psock's receive side goes through its
//! owner; a call on a socket, a send or a write through an owner with no
//! psocks (an application thread), which also attaches psocks for an
//! owner (the owner creates them when it runs). What
//! the hub tells another owner's psock waits in the hub's queue for that
//! owner, which is woken (`Event::Wake`) and takes it a random number
//! of steps later (`MuxRef::apply_pending`), as a worker takes what was
//! posted to it when it next runs.
//!
//! Checked: every message a peer sent arrives at a socket exactly once and
//! whole, each psock's messages in order on each socket; every message a
//! socket sent reaches a peer at most once, whole and never interleaved
//! with another, an addressed one only its own peer; in runs where no
//! psock or socket went away, every message sent arrives. Once nothing
//! waits, each owner's psocks and their shares on the hub agree, and the
//! statistics summed over the owners match the hub's counts.
//!
//! Replay one run: `CONNMUX_SEED=<seed> cargo test -p connmux-core --test owners`.

mod common;

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::Duration;

use common::*;
use connmux_core::mux::{
    Event, Hub, MuxConfig, MuxError, MuxRef, MuxView, Owned, PsockConfig, PsockError, PsockId, RxError, SendFlags,
    SockId, SockType, Steering, TxPolicy,
};
use connmux_core::{Bytes, Timestamp};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The tag of the owner that stands for application threads (no psocks).
const APP: u32 = 1000;

/// One attached connection and its peer.
struct Conn {
    p: PsockId,
    owner: usize,
    /// Its number in the messages its peer sends.
    tag: u8,
    /// What its peer has still to send.
    to_send: VecDeque<u8>,
    next_seq: u32,
    /// Sent by its peer (seq), all of them fed.
    sent: Vec<u32>,
    /// What was written to it (its peer's receive side).
    wire: Vec<u8>,
    /// Unattached, or failed (what it held is gone).
    gone: bool,
    /// Its peer closed its side in order (FIN) with nothing left to send.
    fin: bool,
}

struct World {
    hub: Hub,
    owners: Vec<Owned>,
    app: Owned,
    /// Owners woken and not yet run.
    woken: HashSet<usize>,
    now: u64,
    /// Wakes for what was told to another owner (to check the runs
    /// exercise them).
    posted: usize,
    /// The hub's events but the wakes, in order.
    events: VecDeque<Event>,
}

impl World {
    /// Run `f` as owner `k` (or the application, `None`), then note the
    /// owners it woke.
    fn call<R>(&mut self, k: Option<usize>, f: impl FnOnce(&mut MuxRef<'_>) -> R) -> R {
        let o = match k {
            Some(k) => &mut self.owners[k],
            None => &mut self.app,
        };
        let r = f(&mut MuxRef::new(o, &mut self.hub));
        while let Some(e) = self.hub.poll_event() {
            match e {
                Event::Wake(o) => {
                    assert_ne!(o, APP, "woke the application for a psock's business");
                    self.woken.insert(o as usize);
                    self.posted += 1;
                }
                e => self.events.push_back(e),
            }
        }
        r
    }

    /// Owner `k` runs: it takes what was told to it.
    fn deliver(&mut self, k: usize) {
        self.woken.remove(&k);
        self.call(Some(k), |m| m.apply_pending());
    }

    fn deliver_all(&mut self) {
        // Bounded: applying an entry may tell others again, never forever.
        for _ in 0..10_000 {
            let Some(&k) = self.woken.iter().next() else { return };
            self.deliver(k);
        }
        panic!("owners never stopped waking each other");
    }

    fn view(&self, k: usize) -> MuxView<'_> {
        MuxView::new(&self.owners[k], &self.hub)
    }
}

#[derive(Default)]
struct Totals {
    posted: usize,
    received: usize,
    written: usize,
    complete_runs: usize,
}

fn run(seed: u64) -> Totals {
    let mut rng = StdRng::seed_from_u64(seed);
    let n_owners = rng.gen_range(2..=4usize);
    let policy = if rng.gen_bool(0.5) { TxPolicy::LeastOutstanding } else { TxPolicy::RoundRobin };
    let cfg = MuxConfig {
        max_msg_size: 600,
        assembly_timeout: Some(Duration::from_secs(3600)),
        sock_rcvbuf: rng.gen_range(200..4000),
        sock_sndbuf: rng.gen_range(200..4000),
        psock_rx_buf: rng.gen_range(1..2000),
        psock_sndbuf: 1 << 20,
        steering: if rng.gen_bool(0.5) { Steering::Affinity } else { Steering::RoundRobin },
        imbalance: rng.gen_range(0..5),
        tx_policy: policy,
        ..MuxConfig::default()
    };
    // Some runs have a memory budget small enough to pause psocks, and to
    // abort the stuck (their messages are then lost).
    let budget = rng.gen_bool(0.3);
    let cfg = match budget {
        true => MuxConfig {
            mem_limit: rng.gen_range(48_000..200_000),
            mem_grace: Duration::from_millis(rng.gen_range(10..300)),
            ..cfg
        },
        false => cfg,
    };
    // Half the runs unattach psocks and close sockets (whose messages may
    // then be lost or reordered); the others must deliver everything.
    let churn = rng.gen_bool(0.5);
    let mut w = World {
        hub: Hub::new(cfg),
        owners: (0..n_owners as u32).map(Owned::new).collect(),
        app: Owned::new(APP),
        woken: HashSet::new(),
        now: 0,
        posted: 0,
        events: VecDeque::new(),
    };
    let mut socks: Vec<SockId> = Vec::new();
    for i in 0..rng.gen_range(1..=3u32) {
        let s = w.call(None, |m| m.socket(SockType::Dgram));
        w.call(None, |m| m.set_affinity(s, Some(i % n_owners as u32))).unwrap();
        socks.push(s);
    }
    let mut conns: Vec<Conn> = Vec::new();
    let attach = |w: &mut World, conns: &mut Vec<Conn>, rng: &mut StdRng| {
        let owner = rng.gen_range(0..n_owners);
        let cfg = PsockConfig { affinity: Some(owner as u32), ..PsockConfig::default() };
        // Attached by its owner, or by the application for it (the owner
        // creates its receive side when it runs; until then it takes no
        // bytes, but sockets may already send on it).
        let p = if rng.gen_bool(0.5) {
            w.call(Some(owner), |m| m.attach(L4::boxed(), cfg))
        } else {
            w.call(None, |m| m.attach_to(owner as u32, L4::boxed(), cfg))
        };
        let tag = conns.len() as u8;
        conns.push(Conn {
            p,
            owner,
            tag,
            to_send: VecDeque::new(),
            next_seq: 0,
            sent: Vec::new(),
            wire: Vec::new(),
            gone: false,
            fin: false,
        });
    };
    for _ in 0..rng.gen_range(1..=5) {
        attach(&mut w, &mut conns, &mut rng);
    }
    // Received at sockets, by (socket, peer): the last sequence, and every
    // (peer, seq) once.
    let mut last: HashMap<(SockId, u8), u32> = HashMap::new();
    let mut received: HashSet<(u8, u32)> = HashSet::new();
    // Sent by sockets and accepted: (from, seq) → the psock it must reach
    // (addressed), or None.
    let mut accepted: HashMap<(u8, u32), Option<PsockId>> = HashMap::new();
    let mut seq_out = 0u32;
    let mut lost_any = false;
    let mut drained: HashSet<PsockId> = HashSet::new();

    let mut closed = false;
    let mut receive = |w: &mut World, s: SockId, n: usize, received: &mut HashSet<(u8, u32)>, closed: &bool| {
        for _ in 0..n {
            let Ok((msg, _p)) = w.call(None, |m| m.recv_msg(s)) else { return };
            let (from, seq) = id_of(&msg);
            assert!(received.insert((from, seq)), "seed {seed}: ({from}, {seq}) received twice");
            // A closed socket's queue moves to the tail of another's
            // (KCM's requeue): order holds only while none closed.
            if let Some(prev) = last.insert((s, from), seq) {
                assert!(prev < seq || *closed, "seed {seed}: peer {from}'s {seq} after {prev} on one socket");
            }
        }
    };

    for _step in 0..1500u32 {
        let action = rng.gen_range(0..100);
        let c = rng.gen_range(0..conns.len());
        let s = socks[rng.gen_range(0..socks.len())];
        if action < 25 {
            // A peer sends; its owner reads what the psock takes.
            let conn = &mut conns[c];
            if conn.gone || conn.fin {
                continue;
            }
            if conn.to_send.is_empty() && conn.next_seq < 60 {
                let len = rng.gen_range(5..200);
                conn.to_send.extend(message(conn.tag, conn.next_seq, len));
                conn.sent.push(conn.next_seq);
                conn.next_seq += 1;
            }
            let (k, p) = (conn.owner, conn.p);
            let cap = w.view(k).rx_capacity(p);
            let n = rng.gen_range(1..=64).min(cap).min(conn.to_send.len());
            if n == 0 {
                continue;
            }
            let chunk: Vec<u8> = conn.to_send.drain(..n).collect();
            let now = Timestamp::from_nanos(w.now);
            w.call(Some(k), |m| m.feed(p, &chunk, now)).unwrap();
        } else if action < 40 {
            receive(&mut w, s, rng.gen_range(1..8), &mut received, &closed);
        } else if action < 52 {
            // A socket sends (placed on a psock by the policy).
            seq_out += 1;
            let msg = message(200, seq_out, rng.gen_range(5..150));
            let batch = rng.gen_bool(0.1);
            let r = w.call(None, |m| m.send(s, &msg, SendFlags { batch, ..SendFlags::default() }));
            if r.is_ok() {
                accepted.insert((200, seq_out), None);
            }
        } else if action < 64 {
            // An addressed send.
            seq_out += 1;
            let p = conns[c].p;
            let msg = Bytes::from(message(100, seq_out, rng.gen_range(5..150)));
            match w.call(None, |m| m.send_msg(s, Some(p), msg, false)) {
                Ok(()) => {
                    accepted.insert((100, seq_out), Some(p));
                }
                Err(MuxError::WouldBlock | MuxError::NoPsock | MuxError::Pipe) => {}
                Err(e) => panic!("seed {seed}: addressed send: {e:?}"),
            }
        } else if action < 80 {
            // An owner writes one of its psocks (all, or part, of a chunk).
            let conn = &mut conns[c];
            let (k, p) = (conn.owner, conn.p);
            let Some(chunk) = w.call(Some(k), |m| m.tx_begin(p)) else { continue };
            let len = chunk.len();
            let n = if rng.gen_bool(0.7) { len } else { rng.gen_range(0..=len) };
            let bytes: Vec<u8> = chunk.slices.iter().flat_map(|b| b.iter().copied()).take(n).collect();
            conn.wire.extend_from_slice(&bytes);
            w.call(Some(k), |m| m.tx_complete(p, n));
        } else if action < 92 {
            // A woken owner runs.
            let k = rng.gen_range(0..n_owners);
            if w.woken.contains(&k) {
                w.deliver(k);
            }
        } else if action < 93 {
            // A peer that sent all it had closes its side in order: its
            // psock is drained once its messages are read and its queue
            // written.
            let conn = &mut conns[c];
            if conn.gone || conn.fin || !conn.to_send.is_empty() || !rng.gen_bool(0.2) {
                continue;
            }
            let (k, p) = (conn.owner, conn.p);
            conn.fin = true;
            w.call(Some(k), |m| m.rx_closed(p, None)).unwrap();
        } else if action < 94 {
            w.now += rng.gen_range(0..50_000_000);
            let now = Timestamp::from_nanos(w.now);
            let k = rng.gen_range(0..n_owners);
            w.call(Some(k), |m| m.handle_timeout(now));
        } else if action < 95 {
            // A psock is unattached (rarely: what it held is lost), by its
            // owner or by an application thread (its owner drops its
            // receive side when it runs).
            if churn && conns.iter().filter(|c| !c.gone).count() > 1 && !conns[c].gone {
                let (k, p) = (conns[c].owner, conns[c].p);
                let by = if rng.gen_bool(0.5) { Some(k) } else { None };
                w.call(by, |m| m.unattach(p)).unwrap();
                conns[c].gone = true;
                lost_any = true;
            } else if conns.len() < 200 {
                attach(&mut w, &mut conns, &mut rng);
            }
        } else if action < 96 {
            if churn && socks.len() > 1 && rng.gen_bool(0.3) {
                let i = rng.gen_range(0..socks.len());
                w.call(None, |m| m.close(socks.swap_remove(i))).unwrap();
                lost_any = true;
                closed = true;
            } else {
                let tag = rng.gen_range(0..n_owners as u32);
                let s = w.call(None, |m| m.socket(SockType::Dgram));
                w.call(None, |m| m.set_affinity(s, Some(tag))).unwrap();
                socks.push(s);
            }
        } else {
            w.call(None, |m| m.end_batch(s)).unwrap();
        }
        // Events: no peer misbehaves, so a psock fails only when a socket
        // closes part-way through writing a message of its own on it (KCM
        // aborts the psock: its peer holds a truncated message).
        while let Some(e) = w.events.pop_front() {
            if let Event::PsockDrained(p) = e {
                drained.insert(p);
            }
            if let Event::PsockFailed(p, err) = e {
                if err == PsockError::Closed && conns.iter().any(|c| c.p == p && c.fin) {
                    continue; // its peer's FIN, reported as KCM does
                }
                match err {
                    PsockError::Rx(RxError::MemLimit { .. }) if budget => lost_any = true,
                    _ => {
                        assert_eq!(err, PsockError::Tx(32), "seed {seed}: {p:?} failed");
                        assert!(lost_any, "seed {seed}: {p:?} failed with every socket open");
                    }
                }
                // The runtime aborts a failed connection (an application
                // thread unattaches it): what it held goes back or is
                // dropped.
                if let Some(c) = conns.iter_mut().find(|c| c.p == p && !c.gone) {
                    c.gone = true;
                    w.call(None, |m| m.unattach(p)).unwrap();
                }
            }
        }
    }

    // Drain: every woken owner, every peer's bytes, every socket's queue, every
    // psock's transmit queue, until nothing moves.
    for _round in 0..10_000 {
        let mut moved = false;
        // Timers fire as time goes on (a budget's grace ends).
        w.now += 100_000_000;
        let now = Timestamp::from_nanos(w.now);
        for k in 0..n_owners {
            w.call(Some(k), |m| m.handle_timeout(now));
        }
        w.deliver_all();
        for s in socks.clone() {
            end_batches(&mut w, s);
        }
        for conn in conns.iter_mut().filter(|c| !c.gone) {
            let (k, p) = (conn.owner, conn.p);
            let cap = w.view(k).rx_capacity(p).min(conn.to_send.len());
            if cap > 0 {
                let chunk: Vec<u8> = conn.to_send.drain(..cap).collect();
                let now = Timestamp::from_nanos(w.now);
                w.call(Some(k), |m| m.feed(p, &chunk, now)).unwrap();
                moved = true;
            }
            while let Some(chunk) = w.call(Some(k), |m| m.tx_begin(p)) {
                let len = chunk.len();
                conn.wire.extend(chunk.slices.iter().flat_map(|b| b.iter().copied()));
                w.call(Some(k), |m| m.tx_complete(p, len));
                moved = true;
            }
        }
        for s in socks.clone() {
            while w.call(None, |m| m.recv_msg(s)).is_ok_and(|(msg, _)| {
                let (from, seq) = id_of(&msg);
                assert!(received.insert((from, seq)), "seed {seed}: ({from}, {seq}) received twice");
                moved = true;
                true
            }) {}
        }
        w.deliver_all();
        while let Some(e) = w.events.pop_front() {
            if let Event::PsockDrained(p) = e {
                drained.insert(p);
            }
            if let Event::PsockFailed(p, err) = e {
                if err == PsockError::Closed {
                    continue;
                }
                if matches!(err, PsockError::Rx(RxError::MemLimit { .. })) {
                    lost_any = true;
                }
                if let Some(c) = conns.iter_mut().find(|c| c.p == p && !c.gone) {
                    c.gone = true;
                    w.call(None, |m| m.unattach(p)).unwrap();
                    moved = true;
                }
            }
        }
        // (While the budget holds psocks paused, time goes on: a grace
        // ends, the stuck are aborted, the others read again.)
        if !moved && !w.view(0).mem_tight() {
            break;
        }
    }
    // Statistics summed over the owners: the hub's count of what the budget
    // holds is every owner's psocks and the hub's own; each message a peer
    // sent was framed once.
    let st = w.hub.stats();
    assert_eq!(st.psocks, conns.iter().filter(|c| !c.gone).count(), "seed {seed}: live psocks");
    if !lost_any {
        assert_eq!(st.rx_msgs as usize, received.len(), "seed {seed}: messages framed against received");
    }
    for k in 0..n_owners {
        if let Err(e) = w.view(k).shares_exact() {
            panic!("seed {seed}: owner {k}: {e}");
        }
    }

    // Receive side: exactly what the peers of attached psocks sent.
    for conn in conns.iter().filter(|c| !c.gone) {
        if !conn.to_send.is_empty() {
            let v = w.view(conn.owner);
            panic!(
                "seed {seed}: peer {} ({:?}, owner {}) still has {} bytes the mux never took (capacity {}, paused {}, counted {} tight {})\n{}",
                conn.tag,
                conn.p,
                conn.owner,
                conn.to_send.len(),
                v.rx_capacity(conn.p),
                v.mem_paused(conn.p),
                w.hub.memory_counted(),
                v.mem_tight(),
                v.proc_kcm()
            );
        }
        for seq in &conn.sent {
            assert!(received.contains(&(conn.tag, *seq)), "seed {seed}: peer {}'s {seq} never received", conn.tag);
        }
    }
    // Every peer that closed in order, its psock still attached, is
    // drained: its last messages read, its queue written.
    for conn in conns.iter().filter(|c| c.fin && !c.gone) {
        assert!(drained.contains(&conn.p), "seed {seed}: peer {} closed, its psock never drained", conn.tag);
    }
    // Transmit side: whole messages, at most once, addressed ones to their
    // peer only; all of them when nothing went away.
    let mut arrived: HashSet<(u8, u32)> = HashSet::new();
    let mut written = 0;
    for conn in &conns {
        let mut wire = &conn.wire[..];
        if conn.gone {
            // Unattached part-way through a message: the peer's connection
            // ends there (its whole messages are checked).
            wire = &wire[..whole_prefix(wire)];
        }
        for msg in split_l4(wire) {
            let id = id_of(&msg);
            let Some(to) = accepted.get(&id) else { panic!("seed {seed}: {id:?} written, never accepted") };
            assert!(to.is_none_or(|p| p == conn.p), "seed {seed}: {id:?} for {to:?} written to {:?}", conn.p);
            assert!(arrived.insert(id), "seed {seed}: {id:?} written twice");
            written += 1;
        }
    }
    if !lost_any {
        for id in accepted.keys() {
            assert!(arrived.contains(id), "seed {seed}: {id:?} accepted, never written");
        }
    }
    // Written, or dropped with their psock: nothing is left charged, but
    // what waits on its socket for a psock that can take it (none left
    // attached, or none that can still answer).
    let answering = conns.iter().any(|c| !c.gone && !c.fin);
    for &s in socks.iter().filter(|_| answering) {
        let unsent = w.view(0).tx_unsent(s).unwrap();
        let all: String = (0..n_owners).map(|k| w.view(k).proc_kcm()).collect::<String>();
        assert_eq!(unsent, 0, "seed {seed}: {s:?} keeps {unsent} messages nobody will write\n{all}");
    }
    Totals { posted: w.posted, received: received.len(), written, complete_runs: usize::from(!lost_any) }
}

/// The length of the whole L4 messages at the front of `wire`.
fn whole_prefix(wire: &[u8]) -> usize {
    let mut at = 0;
    while wire.len() >= at + 4 {
        let n = u32::from_be_bytes([wire[at], wire[at + 1], wire[at + 2], wire[at + 3]]) as usize + 4;
        if wire.len() < at + n {
            break;
        }
        at += n;
    }
    at
}

/// A socket's held batch goes out (the drain's `end_batch`).
fn end_batches(w: &mut World, s: SockId) {
    w.call(None, |m| m.end_batch(s)).unwrap();
}

#[test]
fn owners_apply_what_the_hub_tells_them_later_and_nothing_is_lost() {
    let seeds: Vec<u64> = match std::env::var("CONNMUX_SEED") {
        Ok(s) => vec![s.parse().expect("CONNMUX_SEED must be a number")],
        Err(_) => (0..300).map(|i| 0x0e1e_0000 + i).collect(),
    };
    let mut t = Totals::default();
    for seed in seeds.iter().copied() {
        let r = match std::panic::catch_unwind(|| run(seed)) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("owners simulation failed: replay with CONNMUX_SEED={seed}");
                std::panic::resume_unwind(e);
            }
        };
        t.posted += r.posted;
        t.received += r.received;
        t.written += r.written;
        t.complete_runs += r.complete_runs;
    }
    eprintln!(
        "owners simulation: {} runs ({} with nothing gone), {} wakes of another owner, {} messages received, {} written",
        seeds.len(),
        t.complete_runs,
        t.posted,
        t.received,
        t.written
    );
    if seeds.len() > 1 {
        // (What crosses owners is the receive side's: a socket taking a
        // paused psock's message, readers freeing one, the budget, a write
        // ending a reply backlog; sends place on the hub's queues.)
        assert!(t.posted > seeds.len(), "hand-overs barely exercised: {}", t.posted);
        assert!(t.complete_runs > seeds.len() / 10, "runs with nothing lost: {}", t.complete_runs);
    }
}
