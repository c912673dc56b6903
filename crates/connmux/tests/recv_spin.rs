//! A blocking receive spins briefly before it sleeps (`Config::recv_spin`):
//! it still honours the receive timeout, messages that arrive while it
//! spins, or after it has gone to sleep, are all taken in order, and a
//! socket that found a backlog since it last waited sleeps at once.

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

/// The scheduler state ('R' running or runnable, 'S' asleep) and the CPU
/// time so far (ns, `schedstat`) of this process's thread named `name`.
fn thread_state(name: &str) -> Option<(char, u64)> {
    for t in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
        if std::fs::read_to_string(t.path().join("comm")).unwrap_or_default().trim_end() != name {
            continue;
        }
        let stat = std::fs::read_to_string(t.path().join("stat")).ok()?;
        // The state follows the command name's closing parenthesis.
        let state = stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next())?;
        let ran = std::fs::read_to_string(t.path().join("schedstat")).ok()?;
        return Some((state, ran.split_whitespace().next()?.parse().ok()?));
    }
    None
}

/// A spin of 30 s (bounded also by its count of yields: tens of ms): a
/// receiver that took three queued messages (a backlog) sleeps in its next
/// receive having used next to no CPU; one that took a lone message spins
/// first, using far more. On epoll a receiver with nothing queued leads
/// the worker's pass instead (`crate::lead`): it sleeps in the worker's
/// epoll, and spins in neither case.
fn a_backlog_makes_the_next_wait_sleep_at_once() {
    let mux = mux_with(|c| c.recv_spin = Duration::from_secs(30));
    let sock = std::sync::Arc::new(mux.socket(SockType::Dgram).unwrap());
    sock.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let (ours, mut peer) = pair();
    mux.attach(&ours, l4()).unwrap();
    let mut cpu = Vec::new();
    // (Named per driver: both variants may run at once, in one process.)
    let d = if driver() == connmux::Driver::Epoll { "e" } else { "u" };
    for (name, burst) in [(format!("rx-backlog-{d}"), 3u8), (format!("rx-lone-{d}"), 1)] {
        let mut all = Vec::new();
        for i in 0..burst {
            all.extend_from_slice(&framed(&[i; 8]));
        }
        peer.write_all(&all).unwrap();
        eventually(|| (sock.queued() == burst as usize).then_some(()));
        let led = mux.led_passes();
        let s = sock.clone();
        let receiver = std::thread::Builder::new()
            .name(name.clone())
            .spawn(move || {
                for i in 0..burst {
                    assert_eq!(&s.recv_msg().unwrap().data[..], &framed(&[i; 8])[..]);
                }
                // Waits for the message written below.
                s.recv_msg().unwrap();
            })
            .unwrap();
        // Asleep in its last receive, with nothing left queued.
        let ran = eventually(|| match thread_state(&name) {
            Some(('S', ran)) if sock.queued() == 0 => Some(ran),
            _ => None,
        });
        cpu.push(ran);
        if driver() == connmux::Driver::Epoll {
            // Leading the worker's pass (it may first wait a look for the
            // worker's thread to step aside).
            eventually(|| (mux.led_passes() > led).then_some(()));
        }
        peer.write_all(&framed(b"release")).unwrap();
        receiver.join().unwrap();
    }
    let (backlog, lone) = (cpu[0], cpu[1]);
    assert!(backlog < 5_000_000, "the receiver that found a backlog ran {backlog} ns before it slept");
    if driver() == connmux::Driver::Epoll {
        assert!(lone < 5_000_000, "the lone receiver ran {lone} ns: it spun instead of leading");
        return;
    }
    assert!(
        lone > 2 * backlog && lone > 5_000_000,
        "the lone receiver ran {lone} ns (the backlog's {backlog} ns): no spin"
    );
}

on_both_drivers!(
    timeout_shorter_than_spin_is_kept,
    messages_during_and_after_the_spin_arrive_in_order,
    a_backlog_makes_the_next_wait_sleep_at_once
);
