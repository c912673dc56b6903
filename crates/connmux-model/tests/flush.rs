//! The transmit hand-off (`Shared::flush`, the worker's `flush_queued`
//! list, the epoll write interest) on the real core: two application threads
//! send on two sockets while the worker serves EPOLLOUT, through a socket with
//! a few bytes of room (short writes, WouldBlock). After every thread is done
//! and the peer reads, everything must be on the wire, whole, per-socket in
//! order, with one chunk in flight at a time.

use connmux_core::mux::{SendFlags, SockType};
use connmux_model::*;
use loom::sync::atomic::Ordering;
use loom::sync::Arc;
use loom::thread;

const END: SendFlags = SendFlags { more: false, eor: true, batch: false };

fn run(rounds: usize, drop_unfinished: bool, room: usize, same_sock: bool) {
    builder(2).check(move || {
        let mut rt = Runtime::new(small_config(1 << 10), room);
        rt.flush_rounds = rounds;
        rt.drop_unfinished_flush = drop_unfinished;
        let rt = Arc::new(rt);
        let s1 = rt.socket(SockType::Dgram);
        let s2 = if same_sock { s1 } else { rt.socket(SockType::Dgram) };
        let a = {
            let rt = rt.clone();
            thread::spawn(move || {
                rt.with_core(&mut Ctx::App, |m| m.send(s1, &framed(b"a1"), END)).unwrap();
            })
        };
        let b = {
            let rt = rt.clone();
            thread::spawn(move || {
                rt.with_core(&mut Ctx::App, |m| m.send(s2, &framed(b"b1"), END)).unwrap();
            })
        };
        // The worker: the peer reads some, EPOLLOUT if interested, flush.
        rt.wire.peer_reads(4);
        rt.worker_pass(Vec::new());
        a.join().unwrap();
        b.join().unwrap();
        rt.settle();
        let msgs = unframe(&rt.wire.delivered());
        assert_eq!(rt.memory_used(), 0, "stranded: bytes queued with nobody to write them");
        assert_eq!(msgs.len(), 2, "stranded: {msgs:?}");
        assert!(msgs.contains(&b"a1".to_vec()) && msgs.contains(&b"b1".to_vec()), "{msgs:?}");
        assert_eq!(rt.max_inflight.load(Ordering::Acquire), 1, "one chunk in flight per psock");
    });
}

#[test]
fn flush_handoff_loses_no_transmit_with_short_writes() {
    run(4, false, 3, false);
    run(4, false, 3, true);
}

#[test]
fn flush_handoff_loses_no_transmit_at_the_round_bound() {
    run(1, false, 1 << 10, false);
    run(1, false, 1 << 10, true);
}

/// Before 3f5c7fc the flush bound returned without write interest: a message
/// queued while another thread's chunk was out (no kick: the psock was busy)
/// stays queued with nobody to write it.
#[test]
#[should_panic(expected = "stranded")]
fn flush_bound_without_handoff_strands_a_message() {
    // Two threads on one socket: the second message joins the reserved,
    // busy psock's queue without a kick.
    run(1, true, 1 << 10, true);
}

/// The psock's owner writing its replies with no hold of the hub lock
/// (`serve::write_alone`, `sync::writer`) while an application thread
/// sends on the same psock through the hub, through a socket with room for
/// all or a few bytes (the owner's short write hands its rest to the hub).
/// Everything reaches the wire whole, each sender's messages in order, one
/// writer at a time, nothing left charged. Without `Writer::claim` the hub
/// writes into the owner's write; without its `WANT` the hub's chunk waits
/// for nobody.
#[test]
fn the_owner_writing_outside_the_hub_never_cuts_or_loses_a_message() {
    for room in [64, 6] {
        builder(2).check(move || {
            let rt = Arc::new(Runtime::new(small_config(1 << 10), room));
            let app = rt.socket(SockType::Dgram);
            let own = rt.socket(SockType::Dgram);
            let a = {
                let rt = rt.clone();
                thread::spawn(move || {
                    for m in [&b"a1"[..], b"a2"] {
                        rt.with_core(&mut Ctx::App, |c| c.send(app, &framed(m), END)).unwrap();
                    }
                })
            };
            for m in [&b"o1"[..], b"o2"] {
                let f = framed(m);
                if !rt.owner_write(own, &f) {
                    rt.with_core(&mut Ctx::App, |c| c.send_to(own, rt.psock, &f, END)).unwrap();
                }
            }
            a.join().unwrap();
            rt.settle();
            let got = unframe(&rt.wire.delivered());
            let pos =
                |m: &[u8]| got.iter().position(|g| g.as_slice() == m).unwrap_or_else(|| panic!("{m:?} lost: {got:?}"));
            assert_eq!(got.len(), 4, "each message once: {got:?}");
            assert!(pos(b"a1") < pos(b"a2") && pos(b"o1") < pos(b"o2"), "a sender's order: {got:?}");
            assert_eq!(rt.max_inflight.load(Ordering::Acquire), 1, "one writer at a time");
            assert_eq!(rt.memory_used(), 0, "nothing left charged");
        });
    }
}
