//! The psock's orderly close: after the peer's FIN (`rx_closed(p, None)`)
//! the psock delivers what it has buffered whole, keeps writing its queue,
//! and says `PsockDrained` once nothing is left to deliver, answer or write;
//! a reset, bad bytes or a failed write end it as failed instead.

mod common;

use bytes::Bytes;
use common::*;
use connmux_core::mux::{Direct, Event, Mux, MuxConfig, PsockConfig, PsockError, RxError, SockType, Steering};
use connmux_core::Timestamp;

const T0: Timestamp = Timestamp::ZERO;

fn drained(ev: &[Event]) -> usize {
    ev.iter().filter(|e| matches!(e, Event::PsockDrained(_))).count()
}

#[test]
fn a_half_closed_psock_delivers_answers_and_drains_once_its_replies_are_written() {
    let (mut m, k) = dgram_mux(rr_config());
    let p = attach_l4(&mut m);
    let (a, b, partial) = (l4_total(10, 1), l4_total(12, 2), l4_total(30, 3));
    m.feed(p, &[a.clone(), b.clone(), partial[..9].to_vec()].concat(), T0).unwrap();
    events(&mut m);
    m.rx_closed(p, None).unwrap();
    assert_eq!(events(&mut m), vec![Event::PsockFailed(p, PsockError::Closed)]);
    assert!(m.peer_closed(p));
    assert_eq!(m.rx_capacity(p), 0, "no new bytes after the FIN");
    // The two whole requests are still delivered; answered one by one.
    let (r1, from) = m.recv_msg(k).unwrap();
    assert_eq!((r1.to_vec(), from), (a, p));
    m.send_msg(k, Some(p), Bytes::from(l4_total(8, 11)), false).unwrap();
    let (r2, _) = m.recv_msg(k).unwrap();
    assert_eq!(r2.to_vec(), b);
    m.send_msg(k, Some(p), Bytes::from(l4_total(8, 12)), false).unwrap();
    assert_eq!(drained(&events(&mut m)), 0, "replies still queued");
    // A write in progress: still not drained.
    let chunk = m.tx_begin(p).unwrap();
    assert_eq!(drained(&events(&mut m)), 0, "a write is out");
    m.tx_complete(p, chunk.len() - 1);
    assert_eq!(drained(&events(&mut m)), 0, "one byte left");
    assert_eq!(flush(&mut m, p).len(), 1);
    assert_eq!(events(&mut m), vec![Event::PsockDrained(p)]);
    assert_eq!(m.psock_stats(p).unwrap().tx_addressed_drops, 0);
    // Once.
    m.rx_closed(p, None).unwrap();
    m.rx_settle(p, 1);
    assert!(events(&mut m).is_empty());
    assert!(m.peer_closed(p));
}

#[test]
fn holds_keep_a_half_closed_psock_open_until_its_requests_are_settled() {
    let (mut m, k) = dgram_mux(rr_config());
    m.set_holds(k, true).unwrap();
    let p = attach_l4(&mut m);
    m.feed(p, &[l4_total(10, 1), l4_total(10, 2)].concat(), T0).unwrap();
    m.rx_closed(p, None).unwrap();
    assert_eq!(recv_all(&mut m, k).len(), 2);
    assert_eq!(m.rx_holds(p), 2);
    events(&mut m);
    // Nothing queued or buffered, but two requests are being answered.
    m.rx_settle(p, 1);
    assert_eq!(drained(&events(&mut m)), 0, "one request still being answered");
    m.send_msg(k, Some(p), Bytes::from(l4_total(8, 9)), false).unwrap();
    m.rx_settle(p, 1);
    assert_eq!(drained(&events(&mut m)), 0, "its reply is not written yet");
    flush(&mut m, p);
    assert_eq!(events(&mut m), vec![Event::PsockDrained(p)]);
    assert_eq!(m.rx_holds(p), 0);
}

#[test]
fn direct_hand_outs_to_a_holding_socket_are_held() {
    let cfg = MuxConfig { steering: Steering::Affinity, ..MuxConfig::default() };
    let (mut m, k) = dgram_mux(cfg);
    m.set_affinity(k, Some(0)).unwrap();
    m.set_holds(k, true).unwrap();
    let p = m.attach(L4::boxed(), PsockConfig { affinity: Some(0), ..PsockConfig::default() });
    let mut out = Vec::new();
    let mut d = Direct { sock: k, out: &mut out, limit: 64 };
    m.feed_direct(p, &[l4_total(10, 1), l4_total(10, 2)].concat(), T0, &mut d).unwrap();
    assert_eq!(out.len(), 2, "handed out directly");
    assert_eq!(m.rx_holds(p), 2);
    let mut ranges = Vec::new();
    let mut out2 = Vec::new();
    let mut d = Direct { sock: k, out: &mut out2, limit: 64 };
    m.feed_in_place(p, &[l4_total(10, 3), l4_total(10, 4), l4_total(10, 5)].concat(), T0, &mut d, 64, &mut ranges)
        .unwrap();
    assert_eq!(connmux_core::run::count(&ranges) + out2.len(), 3);
    assert_eq!(m.rx_holds(p), 5, "in place too");
    m.rx_closed(p, None).unwrap();
    events(&mut m);
    m.rx_settle(p, 4);
    assert_eq!(drained(&events(&mut m)), 0);
    m.rx_settle(p, 1);
    assert_eq!(events(&mut m), vec![Event::PsockDrained(p)]);
}

#[test]
fn a_fin_with_nothing_left_drains_at_once_and_a_paused_one_after_its_message_is_taken() {
    let (mut m, k) = dgram_mux(rr_config());
    let p = attach_l4(&mut m);
    m.rx_closed(p, None).unwrap();
    assert_eq!(events(&mut m), vec![Event::PsockFailed(p, PsockError::Closed), Event::PsockDrained(p)]);
    // A psock paused with a ready message (the socket is full) at the FIN.
    m.set_rcvbuf(k, 1).unwrap();
    let q = attach_l4(&mut m);
    m.feed(q, &[l4_total(10, 1), l4_total(10, 2)].concat(), T0).unwrap();
    assert_eq!(m.rx_capacity(q), 0, "paused");
    m.rx_closed(q, None).unwrap();
    assert_eq!(drained(&events(&mut m)), 0);
    assert_eq!(recv_all(&mut m, k).len(), 2, "both delivered once the socket has room");
    assert_eq!(events(&mut m).into_iter().filter(|e| *e == Event::PsockDrained(q)).count(), 1);
}

#[test]
fn a_reset_bad_bytes_or_a_failed_write_end_in_failure_never_drained() {
    let (mut m, k) = dgram_mux(rr_config());
    // A reset: failed at once.
    let p = attach_l4(&mut m);
    m.rx_closed(p, Some(104)).unwrap();
    assert_eq!(events(&mut m), vec![Event::PsockFailed(p, PsockError::Closed)]);
    assert!(!m.peer_closed(p));
    // Bad bytes after a whole message, before the FIN: reported, failed.
    let mut m2 = Mux::new(MuxConfig { max_msg_size: 64, ..rr_config() });
    let k2 = m2.socket(SockType::Dgram);
    let q = attach_l4(&mut m2);
    m2.set_rcvbuf(k2, 1).unwrap();
    // Paused on the first message, so the oversized header is parsed only
    // after the FIN.
    let mut bytes = [l4_total(10, 1), l4_total(10, 2)].concat();
    bytes.extend_from_slice(&1000u32.to_be_bytes());
    m2.feed(q, &bytes, T0).unwrap();
    m2.rx_closed(q, None).unwrap();
    assert!(m2.peer_closed(q));
    events(&mut m2);
    recv_all(&mut m2, k2);
    let ev = events(&mut m2);
    assert!(
        ev.iter().any(|e| matches!(e, Event::PsockFailed(x, PsockError::Rx(RxError::TooBig { .. })) if *x == q)),
        "{ev:?}"
    );
    assert_eq!(drained(&ev), 0);
    assert!(!m2.peer_closed(q));
    // A write that fails after the FIN.
    let r = attach_l4(&mut m);
    m.rx_closed(r, None).unwrap();
    events(&mut m);
    let r2 = attach_l4(&mut m);
    m.feed(r2, &l4_total(10, 1), T0).unwrap();
    m.send_msg(k, Some(r2), Bytes::from(l4_total(8, 1)), false).unwrap();
    m.rx_closed(r2, None).unwrap();
    events(&mut m);
    recv_all(&mut m, k);
    let _ = m.tx_begin(r2).unwrap();
    m.tx_failed(r2, 32);
    let ev = events(&mut m);
    assert!(ev.contains(&Event::PsockFailed(r2, PsockError::Tx(32))), "{ev:?}");
    assert_eq!(drained(&ev), 0);
    assert!(!m.peer_closed(r2));
    m.tx_complete(r2, 0);
    assert_eq!(drained(&events(&mut m)), 0);
}
