//! `Config::default()` is what the servers run with: a worker per CPU, the
//! assembly timeout, memory budget and connection cap of `connmux
//! rpc-server`; and each of them applies (and can be changed) on a mux.

#[macro_use]
mod common;

use std::io::{ErrorKind, Read};
use std::net::TcpStream;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use connmux::service::Verdict;
use connmux::{Bytes, Config, Mux, PsockId, SockType};

#[test]
fn the_default_config_has_the_servers_defaults() {
    let c = Config::default();
    let cpus = std::thread::available_parallelism().unwrap().get();
    assert_eq!(c.workers, cpus, "a worker per CPU");
    assert_eq!(connmux::default_workers(), cpus);
    assert_eq!(c.core.assembly_timeout, Some(connmux::DEFAULT_ASSEMBLY_TIMEOUT));
    assert_eq!(connmux::DEFAULT_ASSEMBLY_TIMEOUT, Duration::from_secs(10));
    assert_eq!(c.core.mem_limit, connmux::DEFAULT_MEM_LIMIT);
    assert_eq!(connmux::DEFAULT_MEM_LIMIT, 256 << 20);
    assert_eq!(c.max_conns, Some(connmux::DEFAULT_MAX_CONNS));
    assert_eq!(connmux::DEFAULT_MAX_CONNS, 10_000);
    // The mux runs that many workers.
    let mux = Mux::new(Config { placement: connmux::Placement::Unpinned, ..Config::default() }).unwrap();
    assert_eq!(mux.workers(), cpus);
}

on_both_drivers!(a_message_begun_and_left_times_out_by_default, a_service_takes_its_cap_from_the_config,);

/// The default assembly timeout applies (here shortened, as a user would
/// set it): a message whose start came and whose rest never does is
/// dropped and its connection fails, where the core's own default (no
/// timeout) would wait forever.
fn a_message_begun_and_left_times_out_by_default() {
    let mux = mux_with(|c| {
        assert_eq!(c.core.assembly_timeout, Some(connmux::DEFAULT_ASSEMBLY_TIMEOUT), "on by default");
        c.core.assembly_timeout = c.core.assembly_timeout.map(|_| Duration::from_millis(100));
    });
    let _sock = mux.socket(SockType::Dgram).unwrap();
    let (ours, mut peer) = pair();
    let p = mux.attach(&ours, l4()).unwrap();
    write_all(&mut peer, &[0, 0, 0, 100, b'x']);
    let ev = mux.events().recv_timeout(WAIT).expect("a timeout event within WAIT");
    assert_eq!(ev.psock, p);
    assert_eq!(mux.psock_stats(p).unwrap().rx_msg_timeouts, 1);
}

/// `Config::max_conns` is a service's cap from its start: past it a new
/// connection is reset and counted as refused; `set_max_conns(None)` lifts it.
fn a_service_takes_its_cap_from_the_config() {
    let mux = mux_with(|c| {
        assert_eq!(c.max_conns, Some(connmux::DEFAULT_MAX_CONNS), "capped by default");
        c.max_conns = Some(2);
    });
    let handler = Arc::new(|req: Bytes, _from: PsockId, _s: &mut bytes::BytesMut| Verdict::Reply(req));
    let svc = l4_service(mux, handler);
    let connect = || {
        let c = TcpStream::connect(svc.local_addr()).unwrap();
        c.set_read_timeout(Some(WAIT)).unwrap();
        c
    };
    let mut kept = Vec::new();
    for i in 0..2 {
        let mut c = connect();
        write_all(&mut c, &framed(b"hi"));
        assert_eq!(read_framed(&mut c), b"hi", "connection {i} is served");
        kept.push(c);
    }
    let mut third = connect();
    // Reset as soon as it is accepted: its read ends (EOF or a reset).
    let r = third.read(&mut [0u8; 16]);
    assert!(
        matches!(r, Ok(0)) || matches!(&r, Err(e) if e.kind() == ErrorKind::ConnectionReset),
        "the third connection was not refused: {r:?}"
    );
    eventually(|| (svc.stats().refused.load(Ordering::Relaxed) == 1).then_some(()));
    svc.set_max_conns(None);
    let mut fourth = connect();
    write_all(&mut fourth, &framed(b"now"));
    assert_eq!(read_framed(&mut fourth), b"now", "served once the cap is lifted");
    assert_eq!(svc.stats().refused.load(Ordering::Relaxed), 1);
}
