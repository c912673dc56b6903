//! §7 acceptance cases on control, errors and lifecycle; stale ids.

mod common;

use common::*;
use connmux_core::mux::{Event, Mux, MuxConfig, MuxError, PsockError, PsockId, SendFlags, SockId, SockType};
use connmux_core::Timestamp;

const T0: Timestamp = Timestamp::ZERO;
const NONE: SendFlags = SendFlags { more: false, eor: false, batch: false };

#[test]
fn case_02_clone_is_the_same_type_with_default_options() {
    let mut m = Mux::new(MuxConfig { sock_rcvbuf: 1000, sock_sndbuf: 2000, ..rr_config() });
    let k1 = m.socket(SockType::SeqPacket);
    m.set_rcvbuf(k1, 5).unwrap();
    m.set_sndbuf(k1, 6).unwrap();
    m.set_recv_disable(k1, true).unwrap();
    let k2 = m.clone_sock(k1).unwrap();
    assert_ne!(k1, k2);
    assert_eq!(m.sock_type(k2), Ok(SockType::SeqPacket));
    assert_eq!((m.rcvbuf(k2), m.sndbuf(k2)), (Ok(1000), Ok(2000)), "nothing inherited");
    assert_eq!(m.recv_disabled(k2), Ok(false));
    assert_eq!(m.sock_count(), 2);
    assert!(m.proc_kcm().contains("KCMs: 2, Psocks 0"), "{}", m.proc_kcm());
    // The clone joins the receive-waiter list at once.
    let p = attach_l4(&mut m);
    m.feed(p, &l4_total(10, 1), T0).unwrap();
    assert_eq!(m.rx_queued(k2), Ok(1));
}

#[test]
fn case_02_clone_of_a_closed_socket_is_badsock() {
    let mut m = Mux::new(rr_config());
    let k1 = m.socket(SockType::Dgram);
    let _k2 = m.clone_sock(k1).unwrap();
    m.close(k1).unwrap();
    assert_eq!(m.clone_sock(k1), Err(MuxError::BadSock));
}

#[test]
fn case_05_unattach_twice_or_foreign_is_enoent() {
    let mut m = Mux::new(rr_config());
    let _k = m.socket(SockType::Dgram);
    let p = attach_l4(&mut m);
    assert_eq!(m.unattach(p), Ok(()));
    let e = m.unattach(p).unwrap_err();
    assert_eq!(e, MuxError::NoPsock);
    assert_eq!(e.errno(), 2, "ENOENT");
    // An id of another mux (never attached here).
    let mut other = Mux::new(rr_config());
    let _ko = other.socket(SockType::Dgram);
    let _po = attach_l4(&mut other);
    let q = attach_l4(&mut other);
    assert_eq!(m.unattach(q), Err(MuxError::NoPsock));
    // A stale id does not reach the slot's next occupant.
    let p2 = attach_l4(&mut m);
    assert_eq!(p2.index, p.index, "slot reused");
    assert_eq!(m.unattach(p), Err(MuxError::NoPsock));
    assert_eq!(m.psock_count(), 1);
    assert_eq!(m.psocks(), vec![p2]);
}

#[test]
fn case_06_recv_disable_reads_back_what_was_set() {
    let mut m = Mux::new(rr_config());
    let k = m.socket(SockType::Dgram);
    assert_eq!(m.recv_disabled(k), Ok(false));
    m.set_recv_disable(k, true).unwrap();
    assert_eq!(m.recv_disabled(k), Ok(true));
    m.set_recv_disable(k, true).unwrap();
    assert_eq!(m.recv_disabled(k), Ok(true));
    m.set_recv_disable(k, false).unwrap();
    assert_eq!(m.recv_disabled(k), Ok(false));
}

#[test]
fn case_39_peer_fin_fails_the_psock_but_delivered_messages_stay() {
    let mut m = Mux::new(rr_config());
    let k = m.socket(SockType::Dgram);
    let t1 = attach_l4(&mut m);
    let t2 = attach_l4(&mut m);
    let a = l4_total(10, 1);
    let partial = l4_total(30, 2);
    m.feed(t1, &[a.clone(), partial[..7].to_vec()].concat(), T0).unwrap();
    events(&mut m);
    m.rx_closed(t1, None).unwrap();
    assert_eq!(events(&mut m), vec![Event::PsockFailed(t1, PsockError::Closed)]);
    m.rx_closed(t1, Some(104)).unwrap();
    assert!(events(&mut m).is_empty(), "reported once");
    assert_eq!(m.rx_capacity(t1), 0);
    assert_eq!(recv_all(&mut m, k), vec![a], "delivered messages remain readable; the partial one is dropped");
    // The socket sees no error; other psocks carry on; transmit on T1 goes on.
    m.feed(t2, &l4_total(10, 3), T0).unwrap();
    assert_eq!(recv_all(&mut m, k), vec![l4_total(10, 3)]);
    m.send(k, &l4_total(10, 4), NONE).unwrap();
    assert_eq!(flush(&mut m, t1), l4_total(10, 4), "T1 is still first in LRU order and can send");
}

#[test]
fn case_39_fin_while_paused_still_delivers_whole_buffered_messages() {
    let mut m = Mux::new(rr_config());
    let k = m.socket(SockType::Dgram);
    m.set_recv_disable(k, true).unwrap();
    let t1 = attach_l4(&mut m);
    let msgs: Vec<Vec<u8>> = (0..3).map(|i| l4_total(10, i)).collect();
    m.feed(t1, &[msgs.concat(), l4_total(20, 9)[..5].to_vec()].concat(), T0).unwrap();
    m.rx_closed(t1, None).unwrap();
    m.set_recv_disable(k, false).unwrap();
    assert_eq!(recv_all(&mut m, k), msgs);
    assert_eq!(m.rx_capacity(t1), 0);
    assert_eq!(m.memory_used(), 0, "the partial tail was dropped");
}

#[test]
fn case_41_close_drops_unsent_messages() {
    let mut m = Mux::new(rr_config());
    let k1 = m.socket(SockType::Dgram);
    let k2 = m.clone_sock(k1).unwrap();
    for i in 0..3 {
        m.send(k1, &l4_total(10, i), NONE).unwrap();
    }
    m.send(k1, b"open", SendFlags { more: true, ..NONE }).unwrap();
    m.close(k1).unwrap();
    let t1 = attach_l4(&mut m);
    assert_eq!(flush(&mut m, t1), b"", "nothing of the closed socket is sent");
    assert_eq!(m.memory_used(), 0);
    m.send(k2, &l4_total(10, 9), NONE).unwrap();
    assert_eq!(flush(&mut m, t1), l4_total(10, 9));
}

#[test]
fn case_41_close_mid_message_aborts_that_psock() {
    let mut m = Mux::new(rr_config());
    let k1 = m.socket(SockType::Dgram);
    let k2 = m.clone_sock(k1).unwrap();
    let t1 = attach_l4(&mut m);
    let t2 = attach_l4(&mut m);
    m.send(k1, &l4_total(100, 1), NONE).unwrap();
    m.send(k1, &l4_total(100, 2), NONE).unwrap();
    let _c = m.tx_begin(t1).unwrap();
    m.tx_complete(t1, 50);
    events(&mut m);
    m.close(k1).unwrap();
    assert_eq!(events(&mut m), vec![Event::PsockFailed(t1, PsockError::Tx(32))], "EPIPE");
    assert!(m.tx_begin(t1).is_none());
    assert_eq!(m.psock_stats(t1).unwrap().tx_aborts, 1);
    assert_eq!(m.stats().tx_retries, 0, "nothing is resent for a closed socket");
    // The other socket sends on T2.
    m.send(k2, &l4_total(10, 3), NONE).unwrap();
    assert_eq!(flush(&mut m, t2), l4_total(10, 3));
}

#[test]
fn case_41_close_with_queued_but_unstarted_messages_releases_the_psock_unharmed() {
    let mut m = Mux::new(rr_config());
    let k1 = m.socket(SockType::Dgram);
    let k2 = m.clone_sock(k1).unwrap();
    let t1 = attach_l4(&mut m);
    m.send(k1, &l4_total(100, 1), NONE).unwrap();
    events(&mut m);
    m.close(k1).unwrap();
    assert!(events(&mut m).is_empty());
    assert!(m.tx_begin(t1).is_none(), "the queued message is gone");
    m.send(k2, &l4_total(10, 2), NONE).unwrap();
    assert_eq!(flush(&mut m, t1), l4_total(10, 2), "T1 is free again");
}

#[test]
fn case_42_closing_the_last_socket_releases_every_psock_and_keeps_totals() {
    let mut m = Mux::new(rr_config());
    let k = m.socket(SockType::Dgram);
    let t1 = attach_l4(&mut m);
    let t2 = attach_l4(&mut m);
    // A retry, so tx_retries has something to keep.
    m.send(k, &l4_total(40, 1), NONE).unwrap();
    let _c = m.tx_begin(t1).unwrap();
    m.tx_complete(t1, 10);
    m.tx_failed(t1, 104);
    flush(&mut m, t2);
    m.feed(t2, &l4_total(10, 5), T0).unwrap();
    let before = m.stats();
    assert_eq!(before.tx_retries, 1);
    events(&mut m);
    m.close(k).unwrap();
    let ev = events(&mut m);
    assert!(ev.contains(&Event::PsockReleased(t1)) && ev.contains(&Event::PsockReleased(t2)), "{ev:?}");
    assert_eq!((m.sock_count(), m.psock_count()), (0, 0));
    let after = m.stats();
    assert_eq!(after.tx_retries, 1, "(D) tx_retries survives the release");
    assert_eq!((after.tx_msgs, after.tx_bytes), (before.tx_msgs, before.tx_bytes));
    assert_eq!((after.rx_msgs, after.rx_bytes), (1, 10));
    assert_eq!(after.psock_unattach, 2);
    assert_eq!(after.rx_ready_drops, 0);
    assert_eq!(m.memory_used(), 0);
    assert!(m.proc_kcm().contains("KCMs: 0, Psocks 0"));
}

#[test]
fn case_42_ready_message_dropped_at_release_is_counted() {
    let mut m = Mux::new(rr_config());
    let k = m.socket(SockType::Dgram);
    m.set_recv_disable(k, true).unwrap();
    let t1 = attach_l4(&mut m);
    m.feed(t1, &l4_total(10, 1), T0).unwrap();
    m.close(k).unwrap();
    assert_eq!(m.stats().rx_ready_drops, 1);
}

#[test]
fn stale_ids_are_errors_never_another_object() {
    let mut m = Mux::new(rr_config());
    let k1 = m.socket(SockType::Dgram);
    let k2 = m.socket(SockType::Dgram);
    m.close(k1).unwrap();
    let k3 = m.socket(SockType::SeqPacket);
    assert_eq!(k3.index, k1.index, "lowest free index, as KCM numbers kcm-N");
    assert_eq!(m.close(k1), Err(MuxError::BadSock));
    assert_eq!(m.send(k1, b"x", NONE), Err(MuxError::BadSock));
    assert_eq!(m.recv_msg(k1), Err(MuxError::BadSock));
    assert_eq!(m.sock_type(k1), Err(MuxError::BadSock));
    assert_eq!(m.sock_type(k3), Ok(SockType::SeqPacket));
    let bogus = SockId { index: 99, generation: 0 };
    assert_eq!(m.set_recv_disable(bogus, true), Err(MuxError::BadSock));
    let bogus_p = PsockId { index: 7, generation: 3 };
    assert_eq!(m.rx_capacity(bogus_p), 0);
    assert_eq!(m.feed(bogus_p, b"x", T0), Err(MuxError::NoPsock));
    assert!(m.tx_begin(bogus_p).is_none());
    m.tx_complete(bogus_p, 5);
    m.tx_failed(bogus_p, 5);
    assert_eq!(m.rx_closed(bogus_p, None), Err(MuxError::NoPsock));
    let _ = k2;
}
