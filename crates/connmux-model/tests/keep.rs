//! A socket's kept messages (`connmux::sync::keep`, compiled from the
//! runtime's file with loom's types) under every interleaving loom finds:
//! a pass ending in one thread deposits what it kept for the socket
//! (`Own::end_keep`), a receive of another thread takes from it, and a
//! third receive-disables the socket under the hub lock
//! (`KcmSocket::set_recv_disable`). Every message must end exactly once
//! either received or back in the hub, and none may stay kept on the
//! socket that no longer receives, with no look of the depositor's after
//! its deposit (its receive may have returned).
//!
//! The order `Keep::stop` keeps (the flag stored, then what is kept given
//! back) is what makes that hold; the other order strands a deposit made
//! between the give-back and the flag (`gives_back_before_the_flag_strands`).

use connmux_model::builder;
use connmux_model::sync::keep::Keep;
use loom::sync::{Arc, Mutex};
use loom::thread;

/// The hub: the messages given back to it.
type Hub = Mutex<Vec<u32>>;

/// How the receive-disable stops the socket.
#[derive(Clone, Copy)]
enum Stop {
    /// As the runtime does: `Keep::stop`.
    Keep,
    /// What is kept given back, then the flag stored.
    GiveBackFirst,
}

fn run(stop: Stop) {
    builder(3).check(move || {
        let hub: Arc<Hub> = Arc::new(Mutex::new(Vec::new()));
        let keep: Arc<Keep<Vec<u32>>> = Arc::new(Keep::default());
        // A pass its thread ran earlier kept one message already.
        assert!(keep.deposit(|k| k.push(0)));
        let pass = {
            let (hub, keep) = (hub.clone(), keep.clone());
            thread::spawn(move || {
                let mut mine = vec![1, 2];
                if !keep.deposit(|k| k.append(&mut mine)) {
                    // Refused: given back in a hold of the hub.
                    hub.lock().unwrap().append(&mut mine);
                }
            })
        };
        let receive = {
            let keep = keep.clone();
            thread::spawn(move || keep.take(|k| (!k.is_empty()).then(|| k.remove(0))))
        };
        let disable = {
            let (hub, keep) = (hub.clone(), keep.clone());
            thread::spawn(move || {
                let mut h = hub.lock().unwrap();
                match stop {
                    Stop::Keep => keep.stop(|k| h.append(k)),
                    Stop::GiveBackFirst => {
                        keep.with(|k| h.append(k));
                        keep.mirror(true);
                    }
                }
            })
        };
        pass.join().unwrap();
        let received = receive.join().unwrap();
        disable.join().unwrap();
        let left = keep.with(|k| k.clone());
        assert!(left.is_empty(), "kept on a socket that no longer receives: {left:?}");
        let mut all = hub.lock().unwrap().clone();
        all.extend(received);
        all.sort_unstable();
        assert_eq!(all, vec![0, 1, 2], "every message once, received or given back");
        // Stopped: nothing more is kept nor taken.
        assert!(!keep.deposit(|k| k.push(9)));
        assert_eq!(keep.take(|k| k.pop()), None);
    });
}

#[test]
fn a_pass_ending_beside_a_receive_disable_strands_nothing() {
    run(Stop::Keep);
}

#[test]
#[should_panic(expected = "kept on a socket that no longer receives")]
fn gives_back_before_the_flag_strands() {
    run(Stop::GiveBackFirst);
}
