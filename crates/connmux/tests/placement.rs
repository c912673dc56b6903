//! Which worker reads a new connection (`Config::incoming_cpu`): the one
//! pinned on the CPU where the connection's packets arrive, on real loopback
//! TCP from clients pinned to each CPU.

#[macro_use]
mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};

use common::*;
use connmux::{Placement, SockType};

/// Two workers pinned on CPUs 0 and 1, or `None` where this process may not
/// run on both (reported, not passed in silence).
fn two_cpus() -> Option<Vec<usize>> {
    let avail = connmux_sys::affinity::available_cpus().unwrap_or_default();
    if !(avail.contains(&0) && avail.contains(&1)) {
        eprintln!("SKIPPED: needs CPUs 0 and 1 (available: {avail:?})");
        return None;
    }
    Some(vec![0, 1])
}

/// Connect to `l` from a thread pinned on `cpu`; the accepted side.
fn accept_from(l: &TcpListener, cpu: usize) -> (TcpStream, TcpStream) {
    let addr = l.local_addr().unwrap();
    let client = std::thread::spawn(move || {
        connmux_sys::affinity::pin_current_thread(cpu).unwrap();
        let c = TcpStream::connect(addr).unwrap();
        c.set_read_timeout(Some(WAIT)).unwrap();
        c
    })
    .join()
    .unwrap();
    let (ours, _) = l.accept().unwrap();
    (ours, client)
}

/// Each connection is read by the worker on its client's CPU, whatever the
/// order they come in; messages flow through them both ways.
fn connection_goes_to_the_worker_on_its_cpu() {
    let Some(cpus) = two_cpus() else { return };
    let mux = mux_with(|c| {
        c.workers = 2;
        c.placement = Placement::Cpus(cpus.clone());
    });
    let sock = mux.socket(SockType::Dgram).unwrap();
    sock.set_read_timeout(Some(WAIT)).unwrap();
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut conns = Vec::new();
    for (i, cpu) in [1, 1, 0, 1, 0, 0, 1].into_iter().enumerate() {
        let (ours, mut client) = accept_from(&l, cpu);
        let p = mux.attach(&ours, l4()).unwrap();
        assert_eq!(mux.psock_worker(p), Some(cpu), "connection {i} from CPU {cpu}");
        client.write_all(&framed(&[i as u8; 8])).unwrap();
        let m = sock.recv_msg().unwrap();
        assert_eq!(m.psock, p);
        assert_eq!(&m.data[..], &framed(&[i as u8; 8])[..]);
        sock.send_to(&framed(&[i as u8 + 100; 4]), p).unwrap();
        let mut back = [0u8; 8];
        client.read_exact(&mut back).unwrap();
        assert_eq!(back, [0, 0, 0, 4, i as u8 + 100, i as u8 + 100, i as u8 + 100, i as u8 + 100]);
        conns.push((ours, client));
    }
}

/// All clients on one CPU still spread: the worker on that CPU is passed
/// over once it holds more than twice the other's connections plus 8; with
/// the choice turned off, connections go to the workers in turn.
fn one_cpu_clients_still_spread_and_off_is_in_turn() {
    let Some(cpus) = two_cpus() else { return };
    let mux = mux_with(|c| {
        c.workers = 2;
        c.placement = Placement::Cpus(cpus.clone());
    });
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut conns = Vec::new();
    let mut on = [0usize; 2];
    for _ in 0..30 {
        let (ours, client) = accept_from(&l, 1);
        let p = mux.attach(&ours, l4()).unwrap();
        on[mux.psock_worker(p).unwrap()] += 1;
        conns.push((ours, client));
    }
    // 9 go to CPU 1's worker before the first is passed over, then it keeps
    // to at most twice the other's plus 9.
    assert!(on[0] >= 5 && on[1] >= 9 && on[1] <= 2 * on[0] + 9, "{on:?}");

    let off = mux_with(|c| {
        c.workers = 2;
        c.placement = Placement::Cpus(cpus.clone());
        c.incoming_cpu = false;
    });
    let mut seen = Vec::new();
    for _ in 0..4 {
        let (ours, client) = accept_from(&l, 1);
        let p = off.attach(&ours, l4()).unwrap();
        seen.push(off.psock_worker(p).unwrap());
        conns.push((ours, client));
    }
    assert_eq!(seen, [0, 1, 0, 1]);
}

on_both_drivers!(connection_goes_to_the_worker_on_its_cpu, one_cpu_clients_still_spread_and_off_is_in_turn);
