//! §7 acceptance cases on transmit, driven through the mux with a simulated
//! driver (`tx_begin` / `tx_complete` / `tx_failed`).

mod common;

use common::*;
use connmux_core::mux::{Event, Mux, MuxConfig, MuxError, PsockError, SendFlags, SockType};
use connmux_core::Bytes;
use rand::{Rng, SeedableRng};

const MORE: SendFlags = SendFlags { more: true, eor: false, batch: false };
const EOR: SendFlags = SendFlags { more: false, eor: true, batch: false };
const NONE: SendFlags = SendFlags { more: false, eor: false, batch: false };
const BATCH: SendFlags = SendFlags { more: false, eor: true, batch: true };

fn transmit_events(ev: &[Event]) -> Vec<Event> {
    ev.iter().filter(|e| matches!(e, Event::PsockTransmit(_))).cloned().collect()
}

#[test]
fn case_27_dgram_more_accumulates_one_message() {
    let (mut m, k) = dgram_mux(rr_config());
    let p = attach_l4(&mut m);
    events(&mut m);
    assert_eq!(m.send(k, b"ab", MORE), Ok(2));
    assert!(events(&mut m).is_empty(), "nothing to write while the message is open");
    assert_eq!(m.tx_begin(p).map(|c| c.len()), None);
    assert_eq!(m.send(k, b"cd", NONE), Ok(2));
    assert_eq!(events(&mut m), vec![Event::PsockTransmit(p)]);
    assert_eq!(flush(&mut m, p), b"abcd");
    let st = m.sock_stats(k).unwrap();
    assert_eq!((st.tx_msgs, st.tx_bytes), (1, 4));
    assert_eq!(m.psock_stats(p).unwrap().tx_msgs, 1);
}

#[test]
fn case_27_dgram_ignores_eor_only_more_matters() {
    let (mut m, k) = dgram_mux(rr_config());
    let p = attach_l4(&mut m);
    m.send(k, b"a", SendFlags { more: true, eor: true, batch: false }).unwrap();
    assert_eq!(flush(&mut m, p), b"", "MORE keeps it open even with EOR");
    m.send(k, b"b", NONE).unwrap();
    assert_eq!(flush(&mut m, p), b"ab");
}

#[test]
fn case_28_seqpacket_message_ends_only_on_eor() {
    let mut m = Mux::new(rr_config());
    let k = m.socket(SockType::SeqPacket);
    let p = attach_l4(&mut m);
    m.send(k, b"one ", NONE).unwrap();
    m.send(k, b"two ", MORE).unwrap();
    m.send(k, b"three ", NONE).unwrap();
    assert_eq!(flush(&mut m, p), b"", "no EOR, no message");
    assert_eq!(m.sock_stats(k).unwrap().tx_msgs, 0);
    m.send(k, b"four", SendFlags { more: true, eor: true, batch: false }).unwrap();
    assert_eq!(flush(&mut m, p), b"one two three four", "EOR ends it, MORE is ignored");
    assert_eq!(m.sock_stats(k).unwrap().tx_msgs, 1);
    // Each write() (EOR added) is its own message.
    m.send(k, b"w1", EOR).unwrap();
    m.send(k, b"w2", EOR).unwrap();
    assert_eq!(flush(&mut m, p), b"w1w2");
    assert_eq!(m.psock_stats(p).unwrap().tx_msgs, 3);
}

#[test]
fn case_29_zero_length_sends() {
    for ty in [SockType::Dgram, SockType::SeqPacket] {
        let mut m = Mux::new(rr_config());
        let k = m.socket(ty);
        let p = attach_l4(&mut m);
        events(&mut m);
        assert_eq!(m.send(k, b"", EOR), Ok(0));
        assert_eq!(m.send(k, b"", NONE), Ok(0));
        assert!(events(&mut m).is_empty(), "{ty:?}: nothing on the wire");
        assert_eq!(m.tx_begin(p).map(|c| c.len()), None);
        assert_eq!(m.sock_stats(k).unwrap().tx_msgs, 0);
    }
    let mut m = Mux::new(rr_config());
    let k = m.socket(SockType::SeqPacket);
    let p = attach_l4(&mut m);
    m.send(k, b"open", NONE).unwrap();
    assert_eq!(m.send(k, b"", EOR), Ok(0));
    assert_eq!(flush(&mut m, p), b"open", "zero-length EOR completes the open message");
    assert_eq!(m.sock_stats(k).unwrap().tx_msgs, 1);
}

#[test]
fn case_30_interleaved_senders_never_interleave_within_a_message() {
    // The sans-IO form of the 8-thread test: 8 sockets, 2 psocks, sends cut in
    // MORE pieces and interleaved at random, short writes at random.
    let seed: u64 = std::env::var("CONNMUX_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(30);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut m = Mux::new(MuxConfig { sock_sndbuf: 64 << 10, ..rr_config() });
    let k0 = m.socket(SockType::Dgram);
    let mut socks = vec![k0];
    for _ in 1..8 {
        socks.push(m.clone_sock(k0).unwrap());
    }
    let ps = [attach_l4(&mut m), attach_l4(&mut m)];
    let per_sock = 300;
    let mut plan: Vec<Vec<Vec<u8>>> = (0..8)
        .map(|s| (0..per_sock).map(|i| l4_total(4 + rng.gen_range(1..2000), (s * 31 + i) as u8)).collect())
        .collect();
    let mut want: Vec<Vec<u8>> = plan.iter().flatten().cloned().collect();
    let mut cursor = [(0usize, 0usize); 8]; // (message, offset)
    let mut wires = [Vec::new(), Vec::new()];
    let mut busy: [Option<Vec<Bytes>>; 2] = [None, None];
    for _step in 0..2_000_000 {
        let all_sent = cursor.iter().all(|c| c.0 == per_sock);
        if all_sent && busy.iter().all(Option::is_none) {
            // Everything sent: stop once no psock has anything left to write.
            let mut idle = true;
            for (i, &p) in ps.iter().enumerate() {
                if let Some(c) = m.tx_begin(p) {
                    busy[i] = Some(c.slices);
                    idle = false;
                }
            }
            if idle {
                break;
            }
        }
        if !all_sent && rng.gen_bool(0.6) {
            let s = rng.gen_range(0..8);
            let (mi, off) = cursor[s];
            if mi < per_sock {
                let msg = &plan[s][mi];
                let n = rng.gen_range(1..=msg.len() - off);
                let last = off + n == msg.len();
                match m.send(socks[s], &msg[off..off + n], if last { NONE } else { MORE }) {
                    Ok(k) => {
                        assert_eq!(k, n);
                        cursor[s] = if last { (mi + 1, 0) } else { (mi, off + n) };
                    }
                    Err(MuxError::WouldBlock) => assert_eq!(off, 0, "only a new message can block"),
                    Err(e) => panic!("{e}"),
                }
            }
        } else {
            let i = rng.gen_range(0..2);
            let p = ps[i];
            if busy[i].is_none() {
                busy[i] = m.tx_begin(p).map(|c| c.slices);
            }
            if let Some(slices) = busy[i].take() {
                let total: usize = slices.iter().map(|b| b.len()).sum();
                let n = if rng.gen_bool(0.5) { total } else { rng.gen_range(0..=total) };
                let mut left = n;
                for b in &slices {
                    let k = left.min(b.len());
                    wires[i].extend_from_slice(&b[..k]);
                    left -= k;
                }
                m.tx_complete(p, n);
            }
        }
        events(&mut m);
    }
    assert!(cursor.iter().all(|c| c.0 == per_sock), "seed {seed}: not all sent");
    let mut got: Vec<Vec<u8>> = wires.iter().flat_map(|w| split_l4(w)).collect();
    assert_eq!(got.len(), 8 * per_sock, "seed {seed}");
    got.sort();
    want.sort();
    assert_eq!(got, want, "seed {seed}: every message intact, none interleaved");
    plan.clear();
    assert_eq!(m.stats().tx_msgs, (8 * per_sock) as u64);
}

#[test]
fn case_31_messages_queued_while_writing_stay_on_the_same_psock_in_order() {
    let (mut m, k) = dgram_mux(rr_config());
    let p1 = attach_l4(&mut m);
    let p2 = attach_l4(&mut m);
    m.send(k, &l4_total(100, 1), NONE).unwrap();
    let chunk = m.tx_begin(p1).expect("P1 reserved first");
    let mut wire = chunk.slices[0][..10].to_vec();
    m.tx_complete(p1, 10); // still writing the first message
    for i in 2..6 {
        m.send(k, &l4_total(100, i), NONE).unwrap();
    }
    wire.extend(flush(&mut m, p1));
    let order: Vec<u8> = split_l4(&wire).iter().map(|x| x[4]).collect();
    assert_eq!(order, vec![1, 2, 3, 4, 5], "all on P1, in order");
    assert_eq!(m.psock_stats(p1).unwrap().tx_msgs, 5);
    assert_eq!(flush(&mut m, p2), b"", "P2 never used");
}

#[test]
fn case_32_idle_psocks_rotate_in_lru_order() {
    let (mut m, k) = dgram_mux(rr_config());
    let t1 = attach_l4(&mut m);
    let t2 = attach_l4(&mut m);
    events(&mut m);
    let mut order = Vec::new();
    for i in 0..4 {
        m.send(k, &l4_total(10, i), NONE).unwrap();
        let ev = transmit_events(&events(&mut m));
        assert_eq!(ev.len(), 1);
        let Event::PsockTransmit(p) = ev[0] else { unreachable!() };
        order.push(p);
        flush(&mut m, p);
    }
    assert_eq!(order, vec![t1, t2, t1, t2]);
    let st = m.psock_stats(t1).unwrap();
    assert_eq!((st.reserved, st.unreserved), (2, 2));
}

#[test]
fn case_33_batch_holds_until_a_send_without_it() {
    let (mut m, k) = dgram_mux(rr_config());
    let p1 = attach_l4(&mut m);
    let p2 = attach_l4(&mut m);
    events(&mut m);
    for i in 0..3 {
        m.send(k, &l4_total(10, i), BATCH).unwrap();
    }
    assert!(events(&mut m).is_empty());
    assert!(m.tx_begin(p1).is_none() && m.tx_begin(p2).is_none(), "nothing on the wire");
    assert!(m.proc_kcm().contains("WMore"));
    m.send(k, &l4_total(10, 3), NONE).unwrap();
    assert_eq!(transmit_events(&events(&mut m)), vec![Event::PsockTransmit(p1)]);
    let chunk = m.tx_begin(p1).unwrap();
    assert_eq!(chunk.slices.len(), 4, "all four in one writev");
    m.tx_complete(p1, chunk.len());
    assert_eq!(flush(&mut m, p2), b"");
}

#[test]
fn case_33_sendmmsg_of_16_goes_contiguous_on_one_psock() {
    let (mut m, k) = dgram_mux(rr_config());
    let p1 = attach_l4(&mut m);
    let p2 = attach_l4(&mut m);
    let msgs: Vec<Vec<u8>> = (0..16).map(|i| l4_total(20 + i, i as u8)).collect();
    for (i, msg) in msgs.iter().enumerate() {
        let batch = i != 15;
        m.send_msg(k, None, Bytes::from(msg.clone()), batch).unwrap();
    }
    assert_eq!(split_l4(&flush(&mut m, p1)), msgs);
    assert_eq!(flush(&mut m, p2), b"");
}

#[test]
fn case_34_no_psock_queues_until_sndbuf_then_attach_flushes_in_order() {
    let cfg = MuxConfig { sock_sndbuf: 100, ..rr_config() };
    let (mut m, k) = dgram_mux(cfg);
    let mut sent = Vec::new();
    for i in 0..10 {
        match m.send(k, &l4_total(30, i), NONE) {
            Ok(_) => sent.push(l4_total(30, i)),
            Err(e) => {
                assert_eq!(e, MuxError::WouldBlock);
                assert_eq!(e.errno(), 11, "EAGAIN");
                break;
            }
        }
    }
    assert_eq!(sent.len(), 4, "0, 30, 60, 90 < 100: four start, the fifth blocks");
    assert!(!m.writable(k).unwrap());
    assert!(m.proc_kcm().contains("TxWait"));
    events(&mut m);
    let t1 = attach_l4(&mut m);
    assert_eq!(transmit_events(&events(&mut m)), vec![Event::PsockTransmit(t1)]);
    assert_eq!(split_l4(&flush(&mut m, t1)), sent);
    assert!(events(&mut m).contains(&Event::SockWritable(k)));
    assert!(m.writable(k).unwrap());
}

#[test]
fn case_35_one_message_larger_than_sndbuf_is_accepted() {
    let cfg = MuxConfig { sock_sndbuf: 100, ..rr_config() };
    let (mut m, k) = dgram_mux(cfg);
    let p = attach_l4(&mut m);
    let big = l4_total(10_000, 1);
    assert_eq!(m.send(k, &big, NONE), Ok(10_000));
    assert_eq!(m.send(k, b"x", NONE), Err(MuxError::WouldBlock), "the next message waits");
    // Continuing an open message skips the check.
    let (mut m2, k2) = dgram_mux(MuxConfig { sock_sndbuf: 100, ..rr_config() });
    for _ in 0..50 {
        assert_eq!(m2.send(k2, &[0u8; 100], MORE), Ok(100));
    }
    assert_eq!(split_l4(&flush(&mut m, p)), vec![big]);
}

#[test]
fn case_36_failover_resends_the_message_whole_on_another_psock() {
    let (mut m, k) = dgram_mux(rr_config());
    let t1 = attach_l4(&mut m);
    let t2 = attach_l4(&mut m);
    let msg = l4_total(1000, 0x36);
    assert_eq!(m.send(k, &msg, NONE), Ok(1000), "the sender's return is unaffected");
    let chunk = m.tx_begin(t1).unwrap();
    assert_eq!(chunk.len(), 1000);
    m.tx_complete(t1, 300);
    let chunk = m.tx_begin(t1).unwrap();
    assert_eq!(chunk.len(), 700, "a short write resumes mid-message");
    events(&mut m);
    m.tx_failed(t1, 104); // ECONNRESET
    let ev = events(&mut m);
    assert!(ev.contains(&Event::PsockFailed(t1, PsockError::Tx(104))), "{ev:?}");
    assert!(ev.contains(&Event::PsockTransmit(t2)), "{ev:?}");
    assert_eq!(flush(&mut m, t2), msg, "whole, from its first byte");
    assert_eq!(m.stats().tx_retries, 1);
    assert_eq!(m.psock_stats(t1).unwrap().tx_aborts, 1);
    assert!(m.tx_begin(t1).is_none(), "no more sends on the failed psock");
    assert!(m.proc_kcm().contains("TxStop"));
    // Later messages avoid T1.
    m.send(k, &l4_total(10, 1), NONE).unwrap();
    assert_eq!(flush(&mut m, t2), l4_total(10, 1));
}

#[test]
fn case_37_unattach_mid_message_completes_it_from_its_first_byte_elsewhere() {
    let (mut m, k) = dgram_mux(rr_config());
    let t1 = attach_l4(&mut m);
    let t2 = attach_l4(&mut m);
    let msg = l4_total(1000, 0x37);
    m.send(k, &msg, NONE).unwrap();
    let _chunk = m.tx_begin(t1).unwrap();
    m.tx_complete(t1, 400);
    events(&mut m);
    m.unattach(t1).unwrap();
    let ev = events(&mut m);
    assert!(ev.contains(&Event::PsockReleased(t1)), "{ev:?}");
    assert_eq!(flush(&mut m, t2), msg);
    let st = m.stats();
    assert_eq!(st.psock_unattach_rsvd, 1);
    assert_eq!(st.psock_unattach, 1);
    assert_eq!(st.tx_retries, 1);
    assert_eq!(st.psock.tx_aborts, 1);
    // A late completion for the released psock is ignored.
    m.tx_complete(t1, 600);
    assert_eq!(m.tx_begin(t1).map(|c| c.len()), None);
}

#[test]
fn case_37_unattach_with_no_other_psock_waits_for_the_next_attach() {
    let (mut m, k) = dgram_mux(rr_config());
    let t1 = attach_l4(&mut m);
    let msg = l4_total(100, 1);
    m.send(k, &msg, NONE).unwrap();
    let _c = m.tx_begin(t1).unwrap();
    m.tx_complete(t1, 50);
    m.unattach(t1).unwrap();
    assert!(m.proc_kcm().contains("TxWait"));
    let t2 = attach_l4(&mut m);
    assert_eq!(flush(&mut m, t2), msg);
}

#[test]
fn case_38_dgram_send_error_discards_the_pending_message() {
    let (mut m, k) = dgram_mux(rr_config());
    let p = attach_l4(&mut m);
    m.send(k, &[7u8; 100], MORE).unwrap();
    m.send_abort(k).unwrap(); // the copy of the next piece faulted
    assert_eq!(m.sock_stats(k).unwrap().tx_mem, 0);
    m.send(k, b"fresh", NONE).unwrap();
    assert_eq!(flush(&mut m, p), b"fresh");
}

#[test]
fn case_38_seqpacket_send_error_keeps_the_message_open() {
    let mut m = Mux::new(rr_config());
    let k = m.socket(SockType::SeqPacket);
    let p = attach_l4(&mut m);
    assert_eq!(m.send(k, &[5u8; 50], NONE), Ok(50));
    m.send_abort(k).unwrap();
    m.send(k, b"!", EOR).unwrap();
    let mut want = vec![5u8; 50];
    want.push(b'!');
    assert_eq!(flush(&mut m, p), want);
}

#[test]
fn addressed_send_goes_whole_on_the_named_psock_without_reserving() {
    let (mut m, k) = dgram_mux(rr_config());
    let t1 = attach_l4(&mut m);
    let t2 = attach_l4(&mut m);
    events(&mut m);
    assert_eq!(m.send_to(k, t2, &l4_total(10, 1), NONE), Ok(10));
    m.send_msg(k, Some(t2), Bytes::from(l4_total(12, 2)), false).unwrap();
    assert_eq!(transmit_events(&events(&mut m)), vec![Event::PsockTransmit(t2)]);
    assert_eq!(split_l4(&flush(&mut m, t2)), vec![l4_total(10, 1), l4_total(12, 2)]);
    assert_eq!(m.psock_stats(t2).unwrap().reserved, 0);
    // Reservation order is untouched: the next plain send takes T1.
    m.send(k, &l4_total(10, 3), NONE).unwrap();
    assert_eq!(flush(&mut m, t1), l4_total(10, 3));
}

#[test]
fn addressed_send_to_a_failed_psock_is_refused_and_queued_ones_are_dropped() {
    let (mut m, k) = dgram_mux(rr_config());
    let t1 = attach_l4(&mut m);
    m.send_to(k, t1, &l4_total(10, 1), NONE).unwrap();
    m.send_to(k, t1, &l4_total(10, 2), NONE).unwrap();
    let _c = m.tx_begin(t1).unwrap();
    m.tx_failed(t1, 32);
    assert_eq!(m.psock_stats(t1).unwrap().tx_addressed_drops, 2);
    assert_eq!(m.sock_stats(k).unwrap().tx_mem, 0, "their memory is released");
    assert_eq!(m.send_to(k, t1, b"x", NONE), Err(MuxError::Pipe));
    m.unattach(t1).unwrap();
    assert_eq!(m.send_to(k, t1, b"x", NONE), Err(MuxError::NoPsock));
    assert_eq!(m.stats().psock.tx_addressed_drops, 2, "folded on unattach");
}

/// A writer writes its chunk without the core and reports after; an
/// unattach in between (the application's, on another thread) must not
/// count the chunk's replies as dropped while they may be on the wire: they
/// are counted by the writer's report, the messages queued behind the chunk
/// are dropped at the unattach.
#[test]
fn replies_being_written_at_an_unattach_are_counted_by_the_writers_report() {
    let (mut m, k) = dgram_mux(rr_config());
    let t1 = attach_l4(&mut m);
    m.send_to(k, t1, &l4_total(10, 1), NONE).unwrap();
    m.send_to(k, t1, &l4_total(10, 2), NONE).unwrap();
    let chunk = m.tx_begin(t1).unwrap();
    assert_eq!(chunk.slices.len(), 2);
    m.send_to(k, t1, &l4_total(10, 3), NONE).unwrap();
    m.unattach(t1).unwrap();
    let st = m.stats().psock;
    assert_eq!((st.tx_msgs, st.tx_addressed_drops), (0, 1), "only the queued one dropped so far");
    assert_eq!(m.sock_stats(k).unwrap().tx_mem, 20, "the chunk is charged until its writer reports");
    // The writer got the first reply and half the second out.
    m.tx_complete(t1, 15);
    let st = m.stats().psock;
    assert_eq!((st.tx_msgs, st.tx_bytes, st.tx_addressed_drops), (1, 15, 2));
    assert_eq!(m.sock_stats(k).unwrap().tx_mem, 0);
    // Reported once: a stray second report changes nothing.
    m.tx_complete(t1, 5);
    m.tx_failed(t1, 32);
    let st = m.stats().psock;
    assert_eq!((st.tx_msgs, st.tx_bytes, st.tx_addressed_drops), (1, 15, 2));
}

#[test]
fn a_chunk_out_at_an_unattach_sends_its_reserved_messages_elsewhere() {
    let (mut m, k) = dgram_mux(rr_config());
    let t1 = attach_l4(&mut m);
    m.send(k, &l4_total(10, 1), NONE).unwrap();
    m.send_to(k, t1, &l4_total(12, 2), NONE).unwrap();
    let chunk = m.tx_begin(t1).unwrap();
    assert_eq!(chunk.slices.len(), 2);
    m.unattach(t1).unwrap();
    // The reserved message goes out whole on the next psock; the addressed
    // reply, written whole by the first writer, is counted once it reports.
    let t2 = attach_l4(&mut m);
    assert_eq!(flush(&mut m, t2), l4_total(10, 1));
    m.tx_complete(t1, 22);
    let st = m.stats().psock;
    assert_eq!((st.tx_msgs, st.tx_addressed_drops), (2, 0));
    assert_eq!(m.sock_stats(k).unwrap().tx_mem, 0);
}

#[test]
fn coalesced_replies_go_in_order_and_count_one_by_one() {
    let (mut m, k) = dgram_mux(rr_config());
    let t1 = attach_l4(&mut m);
    events(&mut m);
    m.send_to(k, t1, &l4_total(10, 1), NONE).unwrap();
    let mut three = l4_total(10, 2);
    three.extend(l4_total(11, 3));
    three.extend(l4_total(12, 4));
    m.send_msgs_to(k, t1, Bytes::from(three), 3).unwrap();
    assert_eq!(m.sock_stats(k).unwrap().tx_queued, 4, "four messages queued");
    assert_eq!(split_l4(&flush(&mut m, t1)), vec![l4_total(10, 1), l4_total(10, 2), l4_total(11, 3), l4_total(12, 4)]);
    let st = m.sock_stats(k).unwrap();
    assert_eq!((st.tx_msgs, st.tx_bytes, st.tx_queued, st.tx_mem), (4, 43, 0, 0));
    assert_eq!(m.psock_stats(t1).unwrap().tx_msgs, 4);
    // Dropped on a failed psock: each message of the run is one drop.
    let mut two = l4_total(10, 5);
    two.extend(l4_total(10, 6));
    m.send_msgs_to(k, t1, Bytes::from(two), 2).unwrap();
    let _c = m.tx_begin(t1).unwrap();
    m.tx_failed(t1, 32);
    assert_eq!(m.psock_stats(t1).unwrap().tx_addressed_drops, 2);
    let st = m.sock_stats(k).unwrap();
    assert_eq!((st.tx_queued, st.tx_mem), (0, 0));
    assert_eq!(m.send_msgs_to(k, t1, Bytes::from(l4_total(10, 7)), 1), Err(MuxError::Pipe));
}

#[test]
fn send_msgs_to_begin_hands_out_the_chunk_or_leaves_it_to_the_writer() {
    let (mut m, k) = dgram_mux(rr_config());
    let t1 = attach_l4(&mut m);
    events(&mut m);
    let mut slices = Vec::new();
    // Idle psock: the caller gets the chunk, and no transmit event is raised.
    let mut two = l4_total(10, 1);
    two.extend(l4_total(10, 2));
    assert_eq!(m.send_msgs_to_begin(k, t1, Bytes::from(two.clone()), 2, &mut slices), Ok(true));
    assert!(transmit_events(&events(&mut m)).is_empty());
    assert_eq!(slices.concat(), two);
    assert!(m.tx_begin(t1).is_none(), "the caller is the writer until tx_complete");
    // Sent while that chunk is out: queued behind it, for the writer's next
    // tx_begin; no transmit event (the writer comes back) and no chunk.
    let mut later = Vec::new();
    let third = l4_total(11, 3);
    assert_eq!(m.send_msgs_to_begin(k, t1, Bytes::from(third.clone()), 1, &mut later), Ok(false));
    assert!(later.is_empty());
    assert!(transmit_events(&events(&mut m)).is_empty());
    // A short write keeps the rest first, then the later message follows.
    m.tx_complete(t1, 5);
    let mut rest = two[5..].to_vec();
    rest.extend(&third);
    assert_eq!(flush(&mut m, t1), rest);
    let st = m.sock_stats(k).unwrap();
    assert_eq!((st.tx_msgs, st.tx_queued, st.tx_mem), (3, 0, 0));
    assert_eq!(m.psock_stats(t1).unwrap().tx_msgs, 3);
    // Nothing to send: no chunk. A failed psock: EPIPE, as for send_msgs_to.
    assert_eq!(m.send_msgs_to_begin(k, t1, Bytes::new(), 0, &mut slices), Ok(false));
    m.send_msgs_to(k, t1, Bytes::from(l4_total(10, 4)), 1).unwrap();
    let _c = m.tx_begin(t1).unwrap();
    m.tx_failed(t1, 32);
    assert_eq!(m.send_msgs_to_begin(k, t1, Bytes::from(l4_total(10, 5)), 1, &mut slices), Err(MuxError::Pipe));
}

#[test]
fn a_write_outside_the_hub_counts_as_sent_and_its_rest_goes_first() {
    let (mut m, k) = dgram_mux(rr_config());
    let t1 = attach_l4(&mut m);
    events(&mut m);
    assert!(m.tx_idle(t1), "nothing queued, nothing out");
    // Written whole outside the hub: counted as sent, nothing queued, no
    // writer raised.
    let mut two = l4_total(10, 1);
    two.extend(l4_total(10, 2));
    m.tx_direct(k, t1, two.len(), 2);
    assert!(transmit_events(&events(&mut m)).is_empty());
    assert!(m.tx_idle(t1));
    let st = m.sock_stats(k).unwrap();
    assert_eq!((st.tx_msgs, st.tx_bytes, st.tx_queued, st.tx_mem), (2, 20, 0, 0));
    let ps = m.psock_stats(t1).unwrap();
    assert_eq!((ps.tx_msgs, ps.tx_bytes), (2, 20));
    // A send of another socket's queued meanwhile, then a direct write that
    // took 5 bytes: its rest goes first, whole, then the queued send.
    let k2 = m.socket(SockType::Dgram);
    let other = l4_total(11, 9);
    m.send_to(k2, t1, &other, NONE).unwrap();
    assert!(!m.tx_idle(t1));
    events(&mut m);
    let mut three = l4_total(10, 3);
    three.extend(l4_total(10, 4));
    three.extend(l4_total(12, 5));
    m.tx_direct_rest(k, t1, Bytes::from(three.clone()), 5, 3);
    let mut want = three[5..].to_vec();
    want.extend(&other);
    assert_eq!(flush(&mut m, t1), want);
    assert!(m.tx_idle(t1));
    let st = m.sock_stats(k).unwrap();
    assert_eq!((st.tx_msgs, st.tx_bytes, st.tx_queued, st.tx_mem), (5, 20 + 32, 0, 0));
    let ps = m.psock_stats(t1).unwrap();
    assert_eq!((ps.tx_msgs, ps.tx_bytes), (2 + 3 + 1, 20 + 32 + other.len() as u64));
    // On a psock whose transmit failed: dropped, counted, nothing charged.
    m.send_to(k, t1, &l4_total(10, 6), NONE).unwrap();
    let _c = m.tx_begin(t1).unwrap();
    m.tx_failed(t1, 32);
    let drops = m.psock_stats(t1).unwrap().tx_addressed_drops;
    m.tx_direct_rest(k, t1, Bytes::from(l4_total(10, 7)), 0, 1);
    assert_eq!(m.psock_stats(t1).unwrap().tx_addressed_drops, drops + 1);
    assert_eq!(m.sock_stats(k).unwrap().tx_mem, 0);
}

#[test]
fn addressed_batch_defers_the_transmit_event() {
    let (mut m, k) = dgram_mux(rr_config());
    let t1 = attach_l4(&mut m);
    events(&mut m);
    m.send_to(k, t1, &l4_total(10, 1), BATCH).unwrap();
    m.send_to(k, t1, &l4_total(10, 2), BATCH).unwrap();
    assert!(events(&mut m).is_empty());
    m.send_to(k, t1, &l4_total(10, 3), NONE).unwrap();
    assert_eq!(transmit_events(&events(&mut m)), vec![Event::PsockTransmit(t1)]);
    assert_eq!(split_l4(&flush(&mut m, t1)).len(), 3);
}

#[test]
fn end_batch_sends_what_a_batch_stopped_early_holds() {
    let (mut m, k) = dgram_mux(rr_config());
    let t1 = attach_l4(&mut m);
    let t2 = attach_l4(&mut m);
    events(&mut m);
    // Nothing open: nothing to do.
    m.end_batch(k).unwrap();
    assert!(events(&mut m).is_empty());
    // Addressed to two connections and a plain one, all held...
    m.send_to(k, t1, &l4_total(10, 1), BATCH).unwrap();
    m.send_to(k, t2, &l4_total(10, 2), BATCH).unwrap();
    m.send_to(k, t1, &l4_total(10, 3), BATCH).unwrap();
    m.send(k, &l4_total(10, 4), BATCH).unwrap();
    assert!(events(&mut m).is_empty(), "no connection told while the batch is open");
    // ...until the batch ends: each connection's messages in one writev.
    m.end_batch(k).unwrap();
    let mut told = transmit_events(&events(&mut m));
    told.sort_by_key(|e| format!("{e:?}"));
    told.dedup();
    assert_eq!(told.len(), 2, "both connections told: {told:?}");
    let c1 = m.tx_begin(t1).unwrap();
    let plain_on_t1 = c1.slices.len() == 3;
    m.tx_complete(t1, c1.len());
    let c2 = m.tx_begin(t2).unwrap();
    assert_eq!(c1.slices.len() + c2.slices.len(), 4, "every message out once");
    assert_eq!(c2.slices.len(), if plain_on_t1 { 1 } else { 2 });
    m.tx_complete(t2, c2.len());
    // Ended: the next send without BATCH has nothing held to push.
    m.end_batch(k).unwrap();
    assert!(events(&mut m).is_empty());
}

#[test]
fn one_writer_at_a_time_and_a_transmit_event_only_when_idle() {
    let (mut m, k) = dgram_mux(rr_config());
    let t1 = attach_l4(&mut m);
    events(&mut m);
    m.send(k, &l4_total(10, 1), NONE).unwrap();
    assert_eq!(transmit_events(&events(&mut m)).len(), 1);
    m.send(k, &l4_total(10, 2), NONE).unwrap();
    assert!(transmit_events(&events(&mut m)).is_empty(), "already told");
    let c = m.tx_begin(t1).unwrap();
    assert!(m.tx_begin(t1).is_none(), "busy until tx_complete");
    m.send(k, &l4_total(10, 3), NONE).unwrap();
    assert!(transmit_events(&events(&mut m)).is_empty(), "the writer will come back");
    m.tx_complete(t1, c.len());
    assert_eq!(split_l4(&flush(&mut m, t1)), vec![l4_total(10, 3)]);
}

#[test]
fn socket_writable_is_raised_after_would_block_when_space_returns() {
    let (mut m, k) = dgram_mux(MuxConfig { sock_sndbuf: 50, ..rr_config() });
    let t1 = attach_l4(&mut m);
    m.send(k, &l4_total(60, 1), NONE).unwrap();
    assert_eq!(m.send(k, &l4_total(10, 2), NONE), Err(MuxError::WouldBlock));
    events(&mut m);
    let c = m.tx_begin(t1).unwrap();
    m.tx_complete(t1, 30);
    assert!(!events(&mut m).contains(&Event::SockWritable(k)), "the message is not written yet");
    let _ = c;
    flush(&mut m, t1);
    assert_eq!(events(&mut m), vec![Event::SockWritable(k)]);
    m.set_sndbuf(k, 10).unwrap();
    assert_eq!(m.sndbuf(k), Ok(10));
}

#[test]
fn peers_that_do_not_read_fill_the_socket_without_holding_up_replies_to_others() {
    // A socket whose send buffer two peers that do not read have filled.
    let cfg = MuxConfig { sock_sndbuf: 8000, psock_sndbuf: 64 << 10, ..rr_config() };
    let (mut m, k) = dgram_mux(cfg);
    let (slow1, slow2, good) = (attach_l4(&mut m), attach_l4(&mut m), attach_l4(&mut m));
    for slow in [slow1, slow2] {
        for i in 0..4 {
            m.send_to(k, slow, &l4_total(1000, i), SendFlags::default()).unwrap();
        }
    }
    assert!(!m.writable(k).unwrap(), "the socket's plain sends wait (KCM's SO_SNDBUF)");
    // The slow peers, each holding a good share of it, are refused more.
    for slow in [slow1, slow2] {
        assert_eq!(m.send_to(k, slow, &l4_total(1000, 9), SendFlags::default()), Err(MuxError::WouldBlock));
    }
    // The good peer's replies are taken and written whole.
    for i in 0..3 {
        assert_eq!(m.send_to(k, good, &l4_total(100, i), SendFlags::default()), Ok(100));
    }
    assert_eq!(split_l4(&flush(&mut m, good)), (0..3).map(|i| l4_total(100, i)).collect::<Vec<_>>());
    // Its backlog too is bounded: past an eighth of the buffer it waits.
    let taken = (0..100).take_while(|&i| m.send_to(k, good, &l4_total(100, i), SendFlags::default()).is_ok()).count();
    assert_eq!(taken, 10, "1000 bytes (an eighth of 8000) of its own, then refused");
}
