//! The three KCM CVE scenarios, replayed on the real core under loom threads
//! (the core behind the runtime's one lock, the runtime's flush), asserting
//! the invariants that make each impossible here:
//!
//! - every byte is owned by exactly one place, so accounting never goes
//!   negative and ends at zero (`memory_used`), and what reaches the wire is
//!   whole messages only;
//! - ids carry slab generations: a closed socket's or released psock's id is
//!   refused everywhere afterwards and never names a newer object;
//! - one `tx_begin` chunk in flight per psock (the core's `tx_busy`);
//! - a message is queued only when it has bytes: no empty message exists.

use connmux_core::mux::{MuxError, SendFlags, SockType};
use connmux_model::*;
use loom::sync::Arc;
use loom::thread;

const MORE: SendFlags = SendFlags { more: true, eor: false, batch: false };
const END: SendFlags = SendFlags { more: false, eor: true, batch: false };
const PART: SendFlags = SendFlags { more: false, eor: false, batch: false };

/// CVE-2024-44946: thread A builds a DGRAM MORE message and then fails (the
/// copy error path: `send_abort`); thread B completes it on the same socket;
/// a third thread closes the socket. Linux freed the message twice. Here the
/// open message lives in the core under the lock: whatever the order, the
/// wire carries "abcd", "cd" or nothing, whole, and accounting ends at zero.
#[test]
fn cve_2024_44946_concurrent_sendmsg_no_double_free() {
    builder(2).check(|| {
        let rt = Arc::new(Runtime::new(small_config(1 << 10), 1 << 10));
        let s = rt.socket(SockType::Dgram);
        let a = {
            let rt = rt.clone();
            thread::spawn(move || {
                let _ = rt.with_core(&mut Ctx::App, |m| m.send(s, b"ab", MORE));
                let _ = rt.with_core(&mut Ctx::App, |m| m.send_abort(s));
            })
        };
        let b = {
            let rt = rt.clone();
            thread::spawn(move || {
                let _ = rt.with_core(&mut Ctx::App, |m| m.send(s, b"cd", END));
            })
        };
        let closed = rt.with_core(&mut Ctx::App, |m| m.close(s));
        a.join().unwrap();
        b.join().unwrap();
        rt.settle();
        assert_eq!(closed, Ok(()));
        let wire = rt.wire.delivered();
        assert!(wire.is_empty() || wire == b"cd" || wire == b"abcd", "wire {wire:?}");
        assert_eq!(rt.memory_used(), 0, "every byte released exactly once");
        assert!(rt.max_inflight.load(loom::sync::atomic::Ordering::Acquire) <= 1);
        // The closed socket's id is refused, not reused.
        assert_eq!(rt.with_core(&mut Ctx::App, |m| m.send(s, b"x", END)), Err(MuxError::BadSock));
    });
}

/// CVE-2025-38717: unattach of a psock reserved by socket X (mid-message)
/// racing close(X), with the worker flushing the psock. Linux queued X's
/// transmit work after close had cancelled it (use after free). Here both are
/// core calls under the lock; the psock is released exactly once; stale ids
/// are refused afterwards and new objects get new generations.
#[test]
fn cve_2025_38717_unattach_racing_close_stale_ids_harmless() {
    builder(2).check(|| {
        // 3 bytes of socket room: the message is part-written when threads start.
        let rt = Arc::new(Runtime::new(small_config(1 << 10), 3));
        let x = rt.socket(SockType::Dgram);
        let p = rt.psock;
        rt.with_core(&mut Ctx::App, |m| m.send(x, &framed(b"hello"), END)).unwrap();
        assert_eq!(rt.wire.delivered().len(), 3, "part of the message is out");
        let un = {
            let rt = rt.clone();
            thread::spawn(move || rt.with_core(&mut Ctx::App, |m| m.unattach(p)))
        };
        let cl = {
            let rt = rt.clone();
            thread::spawn(move || rt.with_core(&mut Ctx::App, |m| m.close(x)))
        };
        // The worker: the peer reads, EPOLLOUT, flush.
        rt.wire.peer_reads(2);
        rt.worker_pass(Vec::new());
        // Closing the last socket unattaches every psock: the unattach then
        // finds nothing (ENOENT), as on Linux.
        let u = un.join().unwrap();
        assert!(u == Ok(()) || u == Err(MuxError::NoPsock), "{u:?}");
        assert_eq!(cl.join().unwrap(), Ok(()));
        rt.settle();
        assert_eq!(rt.released.load(loom::sync::atomic::Ordering::Acquire), 1, "released exactly once");
        assert_eq!(rt.memory_used(), 0);
        let mut core = rt.core.lock().unwrap();
        assert_eq!(core.unattach(p), Err(MuxError::NoPsock));
        assert_eq!(core.close(x), Err(MuxError::BadSock));
        assert!(core.tx_begin(p).is_none(), "a stale psock id hands out nothing");
        core.tx_complete(p, 100);
        core.tx_failed(p, 32);
        // New objects in the freed slots answer to new ids only.
        let y = core.socket(SockType::Dgram);
        let q = core.attach(connmux_core::parsers::from_spec("l4").unwrap(), Default::default());
        assert_ne!(y, x);
        assert_ne!(q, p);
        assert_eq!(core.sock_stats(y).unwrap().tx_mem, 0);
        assert!(core.tx_begin(q).is_none(), "nothing of X's reached the new psock");
    });
}

/// CVE-2026-43244: a SEQPACKET send copies part of a message, then fails
/// (`send_abort`: SEQPACKET keeps the open message), then a zero-length EOR
/// send completes it, while another thread sends zero-length EORs on the same
/// socket. Linux left an empty skb in the chain and warned. Here a message is
/// one contiguous buffer queued only when non-empty: exactly one message, with
/// exactly the bytes sent, and no empty slice is ever handed to the writer
/// (the runtime model's flush asserts it).
#[test]
fn cve_2026_43244_partial_send_error_never_queues_an_empty_message() {
    builder(2).check(|| {
        let rt = Arc::new(Runtime::new(small_config(1 << 10), 1 << 10));
        let s = rt.socket(SockType::SeqPacket);
        let msg = framed(b"partial");
        let a = {
            let rt = rt.clone();
            let msg = msg.clone();
            thread::spawn(move || {
                rt.with_core(&mut Ctx::App, |m| m.send(s, &msg, PART)).unwrap();
                rt.with_core(&mut Ctx::App, |m| m.send_abort(s)).unwrap();
                rt.with_core(&mut Ctx::App, |m| m.send(s, &[], END)).unwrap();
            })
        };
        assert_eq!(rt.with_core(&mut Ctx::App, |m| m.send(s, &[], END)), Ok(0));
        a.join().unwrap();
        rt.settle();
        assert_eq!(unframe(&rt.wire.delivered()), vec![b"partial".to_vec()]);
        let st = rt.core.lock().unwrap().sock_stats(s).unwrap();
        assert_eq!((st.tx_msgs, st.tx_mem, st.tx_queued), (1, 0, 0));
    });
}
