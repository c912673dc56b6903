//! A blocking receive spins briefly before it sleeps (`Config::recv_spin`):
//! it still honours the receive timeout, and messages that arrive while it
//! spins, or after it has gone to sleep, are all taken in order.

#[macro_use]
mod common;

use std::io::{ErrorKind, Write};
use std::time::{Duration, Instant};

use common::*;
use connmux::SockType;

/// A read timeout shorter than the spin ends the receive at the timeout.
fn timeout_shorter_than_spin_is_kept() {
    let mux = mux_with(|c| c.recv_spin = Duration::from_millis(300));
    let sock = mux.socket(SockType::Dgram).unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
    let t = Instant::now();
    assert_eq!(sock.recv_msg().unwrap_err().kind(), ErrorKind::WouldBlock);
    let took = t.elapsed();
    assert!(took >= Duration::from_millis(20) && took < Duration::from_millis(250), "took {took:?}");
}

/// Messages sent while the receiver spins (every 1 ms) and after it sleeps
/// (every 30 ms, past a 5 ms spin) all arrive, whole and in order; with no
/// spin at all the same holds.
fn messages_during_and_after_the_spin_arrive_in_order() {
    for spin in [Duration::from_millis(5), Duration::ZERO] {
        let mux = mux_with(|c| c.recv_spin = spin);
        let sock = mux.socket(SockType::Dgram).unwrap();
        sock.set_read_timeout(Some(WAIT)).unwrap();
        let (ours, mut peer) = pair();
        mux.attach(&ours, l4()).unwrap();
        let sender = std::thread::spawn(move || {
            for i in 0..40u8 {
                let gap = if i % 10 == 9 { 30 } else { 1 };
                std::thread::sleep(Duration::from_millis(gap));
                peer.write_all(&framed(&[i; 16])).unwrap();
            }
            peer
        });
        for i in 0..40u8 {
            let m = sock.recv_msg().unwrap();
            assert_eq!(&m.data[..], &framed(&[i; 16])[..], "spin {spin:?}, message {i}");
        }
        drop(sender.join().unwrap());
    }
}

on_both_drivers!(timeout_shorter_than_spin_is_kept, messages_during_and_after_the_spin_arrive_in_order);
