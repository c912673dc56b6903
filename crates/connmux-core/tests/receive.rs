//! §7 acceptance cases on framing and receive, driven through the mux.

mod common;

use std::time::Duration;

use common::*;
use connmux_core::mux::{
    Event, Mux, MuxConfig, MuxError, PsockConfig, PsockError, PsockId, RecvFlags, RxError, SockType, Steering,
};
use connmux_core::parser::ParseError;
use connmux_core::{Bytes, Timestamp};

const T0: Timestamp = Timestamp::ZERO;

fn ms(n: u64) -> Timestamp {
    Timestamp::from_nanos(n * 1_000_000)
}

#[test]
fn case_08_two_messages_in_one_segment_keep_their_boundaries() {
    let (mut m, k) = dgram_mux(rr_config());
    let p = attach_l4(&mut m);
    let a = l4_total(10, b'a');
    let b = l4_total(10, b'b');
    m.feed(p, &[a.clone(), b.clone()].concat(), T0).unwrap();
    assert_eq!(recv_all(&mut m, k), vec![a, b]);
}

#[test]
fn case_09_message_over_three_segments_is_delivered_once_after_the_last() {
    let (mut m, k) = dgram_mux(rr_config());
    let p = attach_l4(&mut m);
    let msg = l4_total(100, 9);
    events(&mut m);
    m.feed(p, &msg[..30], ms(0)).unwrap();
    m.feed(p, &msg[30..70], ms(20)).unwrap();
    assert_eq!(m.recv_msg(k).unwrap_err(), MuxError::WouldBlock);
    assert!(events(&mut m).is_empty(), "nothing readable before the last byte");
    m.feed(p, &msg[70..], ms(40)).unwrap();
    assert_eq!(events(&mut m), vec![Event::SockReadable(k)]);
    assert_eq!(recv_all(&mut m, k), vec![msg]);
    assert_eq!(m.psock_stats(p).unwrap().rx_msgs, 1);
}

#[test]
fn case_10_header_split_two_plus_two_needs_more_once() {
    let (mut m, k) = dgram_mux(rr_config());
    let p = attach_l4(&mut m);
    let msg = l4_total(12, 1);
    m.feed(p, &msg[..2], T0).unwrap();
    assert_eq!(m.rx_need(p), Some(2));
    m.feed(p, &msg[2..], T0).unwrap();
    assert_eq!(m.psock_stats(p).unwrap().rx_need_more_hdr, 1);
    assert_eq!(recv_all(&mut m, k), vec![msg]);
}

#[test]
fn case_11_bytes_held_before_attach_are_delivered_after() {
    // The connection held bytes before attach (here: several messages and a
    // split one); the driver feeds them right after attach.
    let (mut m, k) = dgram_mux(rr_config());
    let held = [l4_total(8, 1), l4_total(9, 2), l4_total(10, 3)].concat();
    let p = attach_l4(&mut m);
    m.feed(p, &held[..20], T0).unwrap();
    m.feed(p, &held[20..], T0).unwrap();
    assert_eq!(recv_all(&mut m, k), vec![l4_total(8, 1), l4_total(9, 2), l4_total(10, 3)]);
}

#[test]
fn case_12_length_over_the_limit_stops_that_psock_only() {
    let cfg = MuxConfig { max_msg_size: 1000, ..rr_config() };
    let (mut m, k) = dgram_mux(cfg);
    let p = attach_l4(&mut m);
    let q = attach_l4(&mut m);
    events(&mut m);
    m.feed(p, &l4_total(2000, 0)[..100], T0).unwrap();
    assert_eq!(events(&mut m), vec![Event::PsockFailed(p, PsockError::Rx(RxError::TooBig { len: 2000, max: 1000 }))]);
    assert_eq!(RxError::TooBig { len: 2000, max: 1000 }.errno(), 90, "EMSGSIZE");
    assert_eq!(m.psock_stats(p).unwrap().rx_msg_too_big, 1);
    assert_eq!(m.rx_capacity(p), 0, "receive stopped on that connection");
    assert_eq!(m.recv_msg(k).unwrap_err(), MuxError::WouldBlock, "nothing partial delivered");
    // The KCM socket has no error and the other psock still works.
    m.feed(q, &l4_total(10, 5), T0).unwrap();
    assert_eq!(recv_all(&mut m, k), vec![l4_total(10, 5)]);
}

#[test]
fn case_13_parser_error_is_posted_with_its_errno() {
    let (mut m, _k) = dgram_mux(rr_config());
    let mut parser = L4::new();
    parser.refuse = Some(7);
    let p = m.attach(Box::new(parser), PsockConfig::default());
    events(&mut m);
    m.feed(p, &l4(&[0; 7]), T0).unwrap();
    let ev = events(&mut m);
    assert_eq!(ev, vec![Event::PsockFailed(p, PsockError::Rx(RxError::Parser(ParseError::Program(22))))]);
    match &ev[0] {
        Event::PsockFailed(_, PsockError::Rx(e)) => assert_eq!(e.errno(), 22),
        _ => unreachable!(),
    }
    assert_eq!(m.psock_stats(p).unwrap().rx_interrupted, 1);
    assert_eq!(m.rx_capacity(p), 0);
}

#[test]
fn case_14_length_within_bytes_already_gathered_is_eproto() {
    let (mut m, k) = dgram_mux(rr_config());
    let mut parser = L4::new();
    parser.adjust = 0; // the length field counts the header
    let p = m.attach(Box::new(parser), PsockConfig::default());
    events(&mut m);
    m.feed(p, &[0, 0, 0], T0).unwrap();
    assert!(events(&mut m).is_empty());
    m.feed(p, &[2, 0xff, 0xff], T0).unwrap();
    let e = RxError::BadLength { len: 2, gathered: 3 };
    assert_eq!(events(&mut m), vec![Event::PsockFailed(p, PsockError::Rx(e.clone()))]);
    assert_eq!(e.errno(), 71, "EPROTO");
    assert_eq!(m.psock_stats(p).unwrap().rx_bad_hdr_len, 1);
    assert_eq!(m.recv_msg(k).unwrap_err(), MuxError::WouldBlock);
}

#[test]
fn case_15_assembly_timeout_counts_from_the_first_byte() {
    let cfg = MuxConfig { assembly_timeout: Some(Duration::from_millis(100)), ..rr_config() };
    let (mut m, k) = dgram_mux(cfg);
    let p = attach_l4(&mut m);
    let msg = l4_total(50, 1);
    events(&mut m);
    m.feed(p, &msg[..5], ms(1000)).unwrap();
    assert_eq!(m.poll_timeout(), Some(ms(1100)));
    m.feed(p, &msg[5..20], ms(1050)).unwrap();
    assert_eq!(m.poll_timeout(), Some(ms(1100)), "later bytes do not restart it");
    m.handle_timeout(ms(1099));
    assert!(events(&mut m).is_empty());
    m.handle_timeout(ms(1100));
    assert_eq!(events(&mut m), vec![Event::PsockFailed(p, PsockError::Rx(RxError::Timeout))]);
    assert_eq!(RxError::Timeout.errno(), 110, "ETIMEDOUT");
    assert_eq!(m.psock_stats(p).unwrap().rx_msg_timeouts, 1);
    assert_eq!(m.poll_timeout(), None);
    // The rest arriving at 300 ms changes nothing.
    m.feed(p, &msg[20..], ms(1300)).unwrap();
    assert_eq!(m.recv_msg(k).unwrap_err(), MuxError::WouldBlock);
}

#[test]
fn case_15_without_a_timeout_a_partial_message_waits_forever() {
    let (mut m, _k) = dgram_mux(rr_config());
    let p = attach_l4(&mut m);
    events(&mut m);
    m.feed(p, &l4_total(50, 1)[..5], ms(0)).unwrap();
    assert_eq!(m.poll_timeout(), None);
    m.handle_timeout(Timestamp::from_nanos(u64::MAX));
    assert!(events(&mut m).is_empty());
    assert!(m.rx_capacity(p) > 0);
}

#[test]
fn case_15_per_psock_timeout_overrides_the_mux_default() {
    let (mut m, _k) = dgram_mux(rr_config());
    let cfg = PsockConfig { assembly_timeout: Some(Some(Duration::from_millis(10))), ..PsockConfig::default() };
    let p = m.attach(L4::boxed(), cfg);
    m.feed(p, &l4_total(50, 1)[..5], ms(5)).unwrap();
    assert_eq!(m.poll_timeout(), Some(ms(15)));
}

#[test]
fn case_16_message_of_60_percent_of_the_limit_does_not_stall() {
    let cfg = MuxConfig { max_msg_size: 1 << 20, psock_rx_buf: 64 << 10, ..rr_config() };
    let (mut m, k) = dgram_mux(cfg);
    let p = attach_l4(&mut m);
    let msg = l4_total((1 << 20) * 6 / 10, 0x5a);
    let mut off = 0;
    for _ in 0..10_000 {
        if off == msg.len() {
            break;
        }
        // A driver reads what rx_capacity allows; it must never be 0 mid-message.
        let cap = m.rx_capacity(p);
        assert!(cap > 0, "stalled at {off}");
        let n = cap.min(msg.len() - off).min(60_000);
        m.feed(p, &msg[off..off + n], T0).unwrap();
        off += n;
    }
    assert_eq!(recv_all(&mut m, k), vec![msg]);
}

#[test]
fn case_17_dgram_short_read_truncates_and_discards_the_rest() {
    let (mut m, k) = dgram_mux(rr_config());
    let p = attach_l4(&mut m);
    let a = l4_total(10, b'a');
    let b = l4_total(10, b'b');
    m.feed(p, &[a.clone(), b.clone()].concat(), T0).unwrap();
    let mut buf = [0u8; 4];
    let info = m.recv(k, &mut buf, RecvFlags::default()).unwrap();
    assert_eq!((info.len, info.trunc, info.eor), (4, true, true));
    assert_eq!(&buf, &a[..4]);
    assert_eq!(info.psock, p);
    assert_eq!(m.sock_stats(k).unwrap().rx_msgs, 1);
    let mut buf = [0u8; 64];
    let info = m.recv(k, &mut buf, RecvFlags::default()).unwrap();
    assert_eq!(&buf[..info.len], &b[..], "the next read is the next message");
}

#[test]
fn case_18_dgram_zero_byte_read_consumes_one_message() {
    let (mut m, k) = dgram_mux(rr_config());
    let p = attach_l4(&mut m);
    m.feed(p, &[l4_total(10, 1), l4_total(10, 2)].concat(), T0).unwrap();
    let info = m.recv(k, &mut [], RecvFlags::default()).unwrap();
    assert_eq!((info.len, info.trunc), (0, true));
    assert_eq!(m.rx_queued(k).unwrap(), 1);
    assert_eq!(recv_all(&mut m, k), vec![l4_total(10, 2)]);
}

#[test]
fn case_19_seqpacket_short_read_keeps_the_rest() {
    // (D) Linux since about 6.1 drops the rest; KCM's designed behaviour is kept.
    let mut m = Mux::new(rr_config());
    let k = m.socket(SockType::SeqPacket);
    let p = attach_l4(&mut m);
    let msg = l4_total(10, 3);
    m.feed(p, &msg, T0).unwrap();
    let mut buf = [0u8; 4];
    let i1 = m.recv(k, &mut buf, RecvFlags::default()).unwrap();
    assert_eq!((i1.len, i1.eor, i1.trunc), (4, false, false));
    assert_eq!(m.sock_stats(k).unwrap().rx_msgs, 0, "not finished yet");
    let mut rest = [0u8; 6];
    let i2 = m.recv(k, &mut rest, RecvFlags::default()).unwrap();
    assert_eq!((i2.len, i2.eor, i2.trunc), (6, true, false));
    assert_eq!([&buf[..], &rest[..]].concat(), msg);
    let st = m.sock_stats(k).unwrap();
    assert_eq!((st.rx_msgs, st.rx_bytes), (1, 10));
}

#[test]
fn case_20_peek_changes_nothing_and_sets_no_flags() {
    for ty in [SockType::Dgram, SockType::SeqPacket] {
        let mut m = Mux::new(rr_config());
        let k = m.socket(ty);
        let p = attach_l4(&mut m);
        let msg = l4_total(10, 4);
        m.feed(p, &msg, T0).unwrap();
        let before = m.sock_stats(k).unwrap();
        for len in [4, 10, 20] {
            let mut buf = vec![0u8; len];
            let info = m.recv(k, &mut buf, RecvFlags { peek: true }).unwrap();
            assert_eq!(info.len, len.min(10));
            assert!(!info.eor && !info.trunc, "{ty:?} peek of {len}");
            assert_eq!(&buf[..info.len], &msg[..info.len]);
        }
        assert_eq!(m.sock_stats(k).unwrap(), before);
        assert_eq!(recv_all(&mut m, k), vec![msg]);
    }
}

#[test]
fn case_21_complete_read_sets_eor_on_both_types() {
    for ty in [SockType::Dgram, SockType::SeqPacket] {
        let mut m = Mux::new(rr_config());
        let k = m.socket(ty);
        let p = attach_l4(&mut m);
        m.feed(p, &l4_total(10, 4), T0).unwrap();
        let mut buf = [0u8; 10];
        let info = m.recv(k, &mut buf, RecvFlags::default()).unwrap();
        assert_eq!((info.len, info.eor, info.trunc), (10, true, false), "{ty:?}");
    }
}

fn case_22_with(steering: Steering) {
    let mut m = Mux::new(MuxConfig { steering, ..MuxConfig::default() });
    let k1 = m.socket(SockType::Dgram);
    let k2 = m.clone_sock(k1).unwrap();
    let p = attach_l4(&mut m);
    let burst: Vec<Vec<u8>> = (0..5).map(|i| l4_total(10, i)).collect();
    m.feed(p, &burst.concat(), T0).unwrap();
    assert_eq!(m.rx_queued(k1).unwrap(), 5, "one read pass, one socket");
    assert_eq!(m.rx_queued(k2).unwrap(), 0);
    let next: Vec<Vec<u8>> = (5..8).map(|i| l4_total(10, i)).collect();
    m.feed(p, &next.concat(), T0).unwrap();
    assert_eq!(recv_all(&mut m, k2), next, "next pass goes to K2");
    assert_eq!(recv_all(&mut m, k1), burst);
    m.feed(p, &l4_total(10, 9), T0).unwrap();
    assert_eq!(m.rx_queued(k1).unwrap(), 1, "and back to K1");
}

#[test]
fn case_22_one_read_pass_goes_to_one_socket_then_round_robin() {
    case_22_with(Steering::RoundRobin);
}

/// Affinity steering with untagged sockets (application threads' clones):
/// a psock's pass goes to the socket that took its last one if that
/// socket's reader has taken everything (it keeps up); another psock starts
/// on the next socket (round robin's rotation); a reader still holding
/// messages gives the pass to the next socket.
#[test]
fn untagged_psocks_keep_a_socket_that_keeps_up_under_affinity_steering() {
    let mut m = Mux::new(MuxConfig { steering: Steering::Affinity, ..MuxConfig::default() });
    let k1 = m.socket(SockType::Dgram);
    let k2 = m.clone_sock(k1).unwrap();
    let p = attach_l4(&mut m);
    let q = attach_l4(&mut m);
    let burst: Vec<Vec<u8>> = (0..5).map(|i| l4_total(10, i)).collect();
    m.feed(p, &burst.concat(), T0).unwrap();
    assert_eq!((m.rx_queued(k1).unwrap(), m.rx_queued(k2).unwrap()), (5, 0), "one read pass, one socket");
    m.feed(q, &l4_total(10, 100), T0).unwrap();
    assert_eq!(m.rx_queued(k2).unwrap(), 1, "another psock starts on the next socket");
    assert_eq!(recv_all(&mut m, k1), burst);
    let next: Vec<Vec<u8>> = (5..8).map(|i| l4_total(10, i)).collect();
    m.feed(p, &next.concat(), T0).unwrap();
    assert_eq!((m.rx_queued(k1).unwrap(), m.rx_queued(k2).unwrap()), (3, 1), "K1 took all: the next pass stays");
    m.feed(p, &l4_total(10, 9), T0).unwrap();
    assert_eq!((m.rx_queued(k1).unwrap(), m.rx_queued(k2).unwrap()), (3, 2), "K1 still holds some: to K2");
    assert_eq!(recv_all(&mut m, k1), next);
}

/// A reading thread's socket (`Owned::set_reader`: the thread that runs
/// the psocks' owner's pass) takes a read while it keeps up, before the
/// socket that took the psock's last read; once it holds messages, the
/// read goes on as without it (one connection's heavy requests still
/// spread over the threads).
#[test]
fn the_reading_threads_socket_takes_reads_while_its_queue_is_short() {
    let mut m = Mux::new(MuxConfig { steering: Steering::Affinity, imbalance: 2, ..MuxConfig::default() });
    let k1 = m.socket(SockType::Dgram);
    let k2 = m.clone_sock(k1).unwrap();
    let p = attach_l4(&mut m);
    let queued = |m: &Mux| (m.rx_queued(k1).unwrap(), m.rx_queued(k2).unwrap());
    m.feed(p, &l4_total(10, 0), T0).unwrap();
    assert_eq!(queued(&m), (1, 0), "the first read to K1");
    assert_eq!(recv_all(&mut m, k1).len(), 1);
    // K1 keeps up, and took the last read; K2 reads the psocks now.
    m.owned().set_reader(Some(k2));
    let three: Vec<Vec<u8>> = (1..4).map(|i| l4_total(10, i)).collect();
    m.feed(p, &three[..2].concat(), T0).unwrap();
    assert_eq!(queued(&m), (0, 2), "the reader's, whole");
    m.feed(p, &three[2], T0).unwrap();
    assert_eq!(queued(&m), (0, 3), "the reader holds some, at most `imbalance`: still the reader's");
    m.feed(p, &l4_total(10, 4), T0).unwrap();
    assert_eq!(queued(&m), (1, 3), "past `imbalance`: another socket's");
    assert_eq!(recv_all(&mut m, k2), three);
    m.owned().set_reader(None);
    m.feed(p, &l4_total(10, 5), T0).unwrap();
    assert_eq!(queued(&m), (1, 1), "no reader, K1 busy: round robin's turn");
}

#[test]
fn case_23_recv_disable_moves_queued_messages_to_the_other_socket() {
    let mut m = Mux::new(rr_config());
    let k1 = m.socket(SockType::Dgram);
    let k2 = m.clone_sock(k1).unwrap();
    let p = attach_l4(&mut m);
    let three: Vec<Vec<u8>> = (0..3).map(|i| l4_total(10, i)).collect();
    m.feed(p, &three.concat(), T0).unwrap();
    assert_eq!(m.rx_queued(k1).unwrap(), 3);
    events(&mut m);
    m.set_recv_disable(k1, true).unwrap();
    assert!(m.recv_disabled(k1).unwrap());
    assert_eq!(events(&mut m), vec![Event::SockReadable(k2)]);
    assert_eq!(m.rx_queued(k1).unwrap(), 0);
    for i in 3..6 {
        m.feed(p, &l4_total(10, i), T0).unwrap();
    }
    assert_eq!(m.rx_queued(k1).unwrap(), 0, "new messages only to K2");
    let mut want = three.clone();
    want.extend((3..6).map(|i| l4_total(10, i)));
    assert_eq!(recv_all(&mut m, k2), want, "FIFO: the moved ones first");
    m.set_recv_disable(k1, false).unwrap();
    assert!(!m.recv_disabled(k1).unwrap());
    for i in 6..8 {
        m.feed(p, &l4_total(10, i), T0).unwrap();
    }
    assert_eq!(m.rx_queued(k1).unwrap() + m.rx_queued(k2).unwrap(), 2);
    assert_eq!(m.rx_queued(k1).unwrap(), 1, "K1 receives again, in turn");
}

#[test]
fn case_24_backpressure_holds_one_message_per_psock_and_loses_nothing() {
    let mut m = Mux::new(rr_config());
    let k = m.socket(SockType::Dgram);
    let p1 = attach_l4(&mut m);
    let p2 = attach_l4(&mut m);
    m.set_recv_disable(k, true).unwrap();
    let s1: Vec<Vec<u8>> = (0..5).map(|i| l4_total(10 + i, 1)).collect();
    let s2: Vec<Vec<u8>> = (0..5).map(|i| l4_total(10 + i, 2)).collect();
    m.feed(p1, &s1.concat(), T0).unwrap();
    m.feed(p2, &s2.concat(), T0).unwrap();
    for p in [p1, p2] {
        assert_eq!(m.rx_capacity(p), 0, "the connection is not read any more");
        assert_eq!(m.psock_stats(p).unwrap().rx_msgs, 1, "at most one message parsed and held");
    }
    assert!(m.proc_kcm().contains("RxPause RdyRx"), "{}", m.proc_kcm());
    events(&mut m);
    m.set_recv_disable(k, false).unwrap();
    let ev = events(&mut m);
    assert!(ev.contains(&Event::PsockRxResume(p1)) && ev.contains(&Event::PsockRxResume(p2)), "{ev:?}");
    let got = recv_all(&mut m, k);
    assert_eq!(got.len(), 10);
    let from1: Vec<Vec<u8>> = got.iter().filter(|g| g[4] == 1).cloned().collect();
    let from2: Vec<Vec<u8>> = got.iter().filter(|g| g[4] == 2).cloned().collect();
    assert_eq!(from1, s1, "per-connection order");
    assert_eq!(from2, s2);
    assert!(m.rx_capacity(p1) > 0 && m.rx_capacity(p2) > 0);
}

#[test]
fn case_24_full_sockets_push_back_like_disabled_ones() {
    let mut m = Mux::new(rr_config());
    let k = m.socket(SockType::Dgram);
    m.set_rcvbuf(k, 30).unwrap();
    let p = attach_l4(&mut m);
    let msgs: Vec<Vec<u8>> = (0..10).map(|i| l4_total(10, i)).collect();
    m.feed(p, &msgs.concat(), T0).unwrap();
    // 3 messages fill 30 bytes; the 4th is held by the psock.
    assert_eq!(m.rx_queued(k).unwrap(), 3);
    assert_eq!(m.rx_capacity(p), 0);
    let mut got = Vec::new();
    for _ in 0..100 {
        match m.recv_msg(k) {
            Ok((b, _)) => got.push(b.to_vec()),
            Err(_) => break,
        }
        assert!(m.sock_stats(k).unwrap().rx_mem <= 30 + 10, "exceeds SO_RCVBUF by one message at most");
    }
    assert_eq!(got, msgs);
}

#[test]
fn case_25_closing_a_socket_moves_its_unread_messages() {
    let mut m = Mux::new(rr_config());
    let k1 = m.socket(SockType::Dgram);
    let k2 = m.clone_sock(k1).unwrap();
    let p = attach_l4(&mut m);
    let msgs: Vec<Vec<u8>> = (0..3).map(|i| l4_total(10, i)).collect();
    m.feed(p, &msgs.concat(), T0).unwrap();
    assert_eq!(m.rx_queued(k1).unwrap(), 3);
    m.close(k1).unwrap();
    assert_eq!(recv_all(&mut m, k2), msgs);
}

#[test]
fn case_25_messages_of_a_closed_socket_wait_in_the_hold_queue() {
    let mut m = Mux::new(rr_config());
    let k1 = m.socket(SockType::Dgram);
    let k2 = m.clone_sock(k1).unwrap();
    m.set_recv_disable(k2, true).unwrap();
    let p = attach_l4(&mut m);
    let msgs: Vec<Vec<u8>> = (0..3).map(|i| l4_total(10, i)).collect();
    m.feed(p, &msgs.concat(), T0).unwrap();
    m.close(k1).unwrap();
    assert!(m.memory_used() <= m.memory_bound());
    m.set_recv_disable(k2, false).unwrap();
    assert_eq!(recv_all(&mut m, k2), msgs, "the hold queue drains first");
}

#[test]
fn case_26_empty_socket_accepts_a_message_larger_than_its_rcvbuf() {
    let mut m = Mux::new(rr_config());
    let k = m.socket(SockType::Dgram);
    m.set_rcvbuf(k, 10).unwrap();
    let p = attach_l4(&mut m);
    let big = l4_total(1000, 7);
    let next = l4_total(20, 8);
    m.feed(p, &[big.clone(), next.clone()].concat(), T0).unwrap();
    assert_eq!(m.rx_queued(k).unwrap(), 1, "the second waits: the socket is full");
    assert_eq!(m.recv_msg(k).unwrap().0.to_vec(), big);
    assert_eq!(m.recv_msg(k).unwrap().0.to_vec(), next);
}

#[test]
fn recv_msg_returns_the_message_and_its_psock() {
    let (mut m, k) = dgram_mux(rr_config());
    let p = attach_l4(&mut m);
    let q = attach_l4(&mut m);
    m.feed(q, &l4_total(10, 1), T0).unwrap();
    m.feed(p, &l4_total(10, 2), T0).unwrap();
    assert_eq!(m.recv_msg(k).unwrap(), (l4_total(10, 1).into(), q));
    assert_eq!(m.recv_msg(k).unwrap(), (l4_total(10, 2).into(), p));
}

#[test]
fn sock_readable_is_raised_only_when_the_queue_becomes_non_empty() {
    let (mut m, k) = dgram_mux(rr_config());
    let p = attach_l4(&mut m);
    events(&mut m);
    m.feed(p, &l4_total(10, 1), T0).unwrap();
    m.feed(p, &l4_total(10, 2), T0).unwrap();
    assert_eq!(events(&mut m), vec![Event::SockReadable(k)]);
    recv_all(&mut m, k);
    m.feed(p, &l4_total(10, 3), T0).unwrap();
    assert_eq!(events(&mut m), vec![Event::SockReadable(k)]);
}

#[test]
fn steering_affinity_keeps_a_psock_on_its_socket_until_uneven() {
    let mut m = Mux::new(MuxConfig { steering: Steering::Affinity, imbalance: 2, ..MuxConfig::default() });
    let k0 = m.socket(SockType::Dgram);
    let k1 = m.clone_sock(k0).unwrap();
    m.set_affinity(k0, Some(0)).unwrap();
    m.set_affinity(k1, Some(1)).unwrap();
    let p = m.attach(L4::boxed(), PsockConfig { affinity: Some(1), ..PsockConfig::default() });
    for i in 0..3 {
        m.feed(p, &l4_total(10, i), T0).unwrap();
    }
    assert_eq!(m.rx_queued(k1).unwrap(), 3, "its own socket while the queue is <= imbalance");
    assert_eq!(m.rx_queued(k0).unwrap(), 0);
    m.feed(p, &l4_total(10, 3), T0).unwrap();
    assert_eq!(m.rx_queued(k0).unwrap(), 1, "uneven: the next able socket");
    recv_all(&mut m, k1);
    m.feed(p, &l4_total(10, 4), T0).unwrap();
    assert_eq!(m.rx_queued(k1).unwrap(), 1, "back home once the queue is short");
}

#[test]
fn a_tag_only_socket_takes_its_own_psocks_and_nothing_spills_to_it() {
    let mut m = Mux::new(MuxConfig { steering: Steering::Affinity, imbalance: 2, ..MuxConfig::default() });
    let k0 = m.socket(SockType::Dgram);
    let lane = m.clone_sock(k0).unwrap();
    m.set_affinity(k0, Some(0)).unwrap();
    m.set_affinity(lane, Some(1)).unwrap();
    m.set_tag_only(lane, true).unwrap();
    let light = m.attach(L4::boxed(), PsockConfig { affinity: Some(0), ..PsockConfig::default() });
    let heavy = m.attach(L4::boxed(), PsockConfig { affinity: Some(1), ..PsockConfig::default() });
    // Far past the imbalance: the light psock's messages stay on k0.
    for i in 0..10 {
        m.feed(light, &l4_total(10, i), T0).unwrap();
    }
    assert_eq!(m.rx_queued(k0).unwrap(), 10);
    assert_eq!(m.rx_queued(lane).unwrap(), 0, "nothing spills over to a tag-only socket");
    // Its own psock's messages stay on it, past the imbalance too.
    for i in 0..5 {
        m.feed(heavy, &l4_total(10, 100 + i), T0).unwrap();
    }
    assert_eq!(m.rx_queued(lane).unwrap(), 5);
    assert_eq!(m.rx_queued_from(lane, heavy).unwrap(), 5);
    assert_eq!(m.rx_queued_from(k0, heavy).unwrap(), 0);
    assert_eq!(m.rx_queued_from(k0, light).unwrap(), 10);
    let got: Vec<u8> = recv_all(&mut m, lane).iter().map(|b| b[4]).collect();
    assert_eq!(got, vec![100, 101, 102, 103, 104], "in order");
    // While the tag-only socket cannot take more (receive disabled), its
    // psock's messages wait rather than go to k0.
    m.set_recv_disable(lane, true).unwrap();
    m.feed(heavy, &l4_total(10, 105), T0).unwrap();
    assert_eq!(m.rx_queued_from(k0, heavy).unwrap(), 0);
    m.set_recv_disable(lane, false).unwrap();
    assert_eq!(recv_all(&mut m, lane).iter().map(|b| b[4]).collect::<Vec<_>>(), vec![105]);
}

/// The runtime's heavy lanes: each worker's heavy psocks carry the tag of
/// its lane socket (tag-only), so their messages wait there in arrival order,
/// and the lane's thread and the helpers of other CPUs take them one at a
/// time, each receive the head (stealing is just another reader of the
/// socket); replies go back addressed, each to its own psock, in whatever
/// order the threads finish them. Light psocks never go to a lane, even past
/// the imbalance, and a heavy psock given its worker's tag again is steered
/// home.
#[test]
fn heavy_lanes_hold_their_workers_heavy_psocks_and_any_reader_takes_the_head() {
    let mut m = Mux::new(MuxConfig { steering: Steering::Affinity, imbalance: 2, ..MuxConfig::default() });
    let k0 = m.socket(SockType::Dgram);
    let k1 = m.clone_sock(k0).unwrap();
    let lane0 = m.clone_sock(k0).unwrap();
    let lane1 = m.clone_sock(k0).unwrap();
    m.set_affinity(k0, Some(0)).unwrap();
    m.set_affinity(k1, Some(1)).unwrap();
    for (lane, tag) in [(lane0, 2), (lane1, 3)] {
        m.set_affinity(lane, Some(tag)).unwrap();
        m.set_tag_only(lane, true).unwrap();
    }
    let light = m.attach(L4::boxed(), PsockConfig { affinity: Some(0), ..PsockConfig::default() });
    let h0 = m.attach(L4::boxed(), PsockConfig { affinity: Some(0), ..PsockConfig::default() });
    let h1 = m.attach(L4::boxed(), PsockConfig { affinity: Some(1), ..PsockConfig::default() });
    // Both turn heavy: each to its worker's lane.
    m.set_psock_affinity(h0, Some(2)).unwrap();
    m.set_psock_affinity(h1, Some(3)).unwrap();
    for i in 0..5u8 {
        m.feed(h0, &l4_total(10, i), T0).unwrap();
        m.feed(h1, &l4_total(10, 100 + i), T0).unwrap();
    }
    for i in 0..6u8 {
        m.feed(light, &l4_total(10, 200 + i), T0).unwrap();
    }
    assert_eq!(m.rx_queued(lane0).unwrap(), 5, "past the imbalance, nothing spills");
    assert_eq!(m.rx_queued_from(lane0, h0).unwrap(), 5);
    assert_eq!(m.rx_queued_from(lane1, h1).unwrap(), 5);
    assert_eq!(
        m.rx_queued_from(lane0, light).unwrap() + m.rx_queued_from(lane1, light).unwrap(),
        0,
        "a light psock never goes to a lane"
    );
    assert_eq!(m.rx_queued_from(k0, light).unwrap() + m.rx_queued_from(k1, light).unwrap(), 6);
    // Lane 0's thread and worker 1's helper take from lane 0 in turn (and
    // the other way round on lane 1): each receive is the head.
    let mut taken = Vec::new();
    for _ in 0..5 {
        for lane in [lane0, lane1] {
            let (b, from) = m.recv_msg(lane).unwrap();
            taken.push((b[4], from));
        }
    }
    let want: Vec<_> = (0..5u8).flat_map(|i| [(i, h0), (100 + i, h1)]).collect();
    assert_eq!(taken, want);
    // Replies in another order than the requests, from either lane socket:
    // each goes to its psock, whole.
    for (n, &(tag, from)) in taken.iter().rev().enumerate() {
        let via = if n % 2 == 0 { lane0 } else { lane1 };
        m.send_msg(via, Some(from), Bytes::from(l4_total(12, tag)), false).unwrap();
    }
    let wire0 = split_l4(&flush(&mut m, h0));
    let wire1 = split_l4(&flush(&mut m, h1));
    assert_eq!(wire0.iter().map(|w| w[4]).collect::<Vec<_>>(), vec![4, 3, 2, 1, 0]);
    assert_eq!(wire1.iter().map(|w| w[4]).collect::<Vec<_>>(), vec![104, 103, 102, 101, 100]);
    // h1 light again, nothing of it waiting in its lane: home to worker 1.
    assert_eq!(m.rx_queued_from(lane1, h1).unwrap(), 0);
    m.set_psock_affinity(h1, Some(1)).unwrap();
    recv_all(&mut m, k1);
    m.feed(h1, &l4_total(10, 110), T0).unwrap();
    m.feed(h0, &l4_total(10, 10), T0).unwrap();
    assert_eq!(m.rx_queued_from(k1, h1).unwrap(), 1);
    assert_eq!(m.rx_queued_from(lane1, h1).unwrap(), 0);
    assert_eq!(m.rx_queued_from(lane0, h0).unwrap(), 1, "h0 still heavy");
}

#[test]
fn round_robin_never_chooses_a_tag_only_socket() {
    let mut m = Mux::new(rr_config());
    let k0 = m.socket(SockType::Dgram);
    let lane = m.clone_sock(k0).unwrap();
    m.set_tag_only(lane, true).unwrap();
    let p = attach_l4(&mut m);
    for i in 0..20 {
        m.feed(p, &l4_total(10, i), T0).unwrap();
    }
    assert_eq!(m.rx_queued(k0).unwrap(), 20);
    assert_eq!(m.rx_queued(lane).unwrap(), 0);
}

#[test]
fn steering_key_keeps_one_key_on_one_socket() {
    let mut m = Mux::new(MuxConfig { steering: Steering::Key, ..MuxConfig::default() });
    let ks: Vec<_> = (0..4).map(|_| m.socket(SockType::Dgram)).collect();
    let mut parser = L4::new();
    parser.keyed = true;
    let p = m.attach(Box::new(parser), PsockConfig::default());
    // Keys 0..8, each three times, one message per feed.
    for round in 0..3 {
        for key in 0..8u8 {
            let mut msg = l4(&[key, round]);
            msg.truncate(6);
            m.feed(p, &msg, T0).unwrap();
        }
    }
    let mut used = 0;
    for k in ks {
        let got = recv_all(&mut m, k);
        if !got.is_empty() {
            used += 1;
        }
        for key in 0..8u8 {
            let n = got.iter().filter(|g| g[4] == key).count();
            assert!(n == 0 || n == 3, "key {key} split across sockets");
        }
    }
    assert!(used >= 2, "keys spread over sockets");
}

#[test]
fn feeding_past_the_psock_cap_is_refused() {
    let cfg = MuxConfig { max_msg_size: 100, psock_rx_buf: 50, ..rr_config() };
    let (mut m, _k) = dgram_mux(cfg);
    let p = attach_l4(&mut m);
    assert_eq!(m.rx_capacity(p), 50);
    assert_eq!(m.feed(p, &[0u8; 151], T0), Err(MuxError::Invalid));
    assert_eq!(m.feed(p, &[0u8; 150], T0), Ok(()), "exactly the cap");
}

/// `feed_direct`: a message steered to the caller's own socket while its
/// queue is empty is handed over at once, counted as received; once a message
/// waits in the queue, later ones queue behind it; the list is bounded.
#[test]
fn feed_direct_hands_over_only_ahead_of_an_empty_queue() {
    let (mut m, k) = dgram_mux(rr_config());
    let p = attach_l4(&mut m);
    events(&mut m);
    let mut out = Vec::new();
    let mut wire = l4_total(10, 1);
    wire.extend(l4_total(11, 2));
    {
        let mut d = connmux_core::mux::Direct { sock: k, out: &mut out, limit: 1 };
        m.feed_direct(p, &wire, T0, &mut d).unwrap();
    }
    // The limit is 1: the first is handed over, the second queued.
    assert_eq!(out.len(), 1);
    assert_eq!((&out[0].0[..], out[0].1), (&l4_total(10, 1)[..], p));
    assert_eq!(m.rx_queued(k).unwrap(), 1);
    // With a message queued, nothing more is handed over: order is kept.
    {
        let mut d = connmux_core::mux::Direct { sock: k, out: &mut out, limit: 64 };
        m.feed_direct(p, &l4_total(12, 3), T0, &mut d).unwrap();
    }
    assert_eq!(out.len(), 1);
    assert_eq!(recv_all(&mut m, k), vec![l4_total(11, 2), l4_total(12, 3)]);
    let st = m.sock_stats(k).unwrap();
    assert_eq!((st.rx_msgs, st.rx_bytes), (3, 33));
    assert_eq!(m.psock_stats(p).unwrap().rx_msgs, 3);
}

#[test]
fn a_psock_whose_queued_messages_are_not_taken_stops_being_read_and_resumes_at_half() {
    let cfg = MuxConfig { psock_queued_max: 8, ..rr_config() };
    let (mut m, s) = dgram_mux(cfg);
    let (busy, other) = (attach_l4(&mut m), attach_l4(&mut m));
    // One read of 20 small messages: all are queued (a read is never cut),
    // then the psock is read no more.
    let wire: Vec<u8> = (0..20u8).flat_map(|i| l4_total(8, i)).collect();
    m.feed(busy, &wire, ms(0)).unwrap();
    assert_eq!(m.rx_queued(s), Ok(20));
    assert_eq!(m.rx_capacity(busy), 0, "past psock_queued_max: not read");
    // Another psock's message is not held up by it.
    assert!(m.rx_capacity(other) > 0);
    m.feed(other, &l4_total(8, 99), ms(0)).unwrap();
    events(&mut m);
    // Readers take them: read again once at most half (4) wait.
    for i in 0..15 {
        m.recv_msg(s).unwrap();
        assert_eq!(m.rx_capacity(busy), 0, "still {} of it queued", 20 - i - 1);
        assert!(!events(&mut m).contains(&Event::PsockRxResume(busy)));
    }
    let (msg, from) = m.recv_msg(s).unwrap();
    assert_eq!((msg.len(), from), (8, busy));
    assert!(events(&mut m).contains(&Event::PsockRxResume(busy)), "resumed at half");
    assert!(m.rx_capacity(busy) > 0);
    let rest: Vec<(usize, PsockId)> = std::iter::from_fn(|| m.recv_msg(s).ok()).map(|(b, p)| (b.len(), p)).collect();
    assert_eq!(rest, vec![(8, busy), (8, busy), (8, busy), (8, busy), (8, other)], "nothing lost, order kept");
}
