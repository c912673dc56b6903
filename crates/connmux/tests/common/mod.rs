//! Helpers for the loopback tests: real TCP on 127.0.0.1, bounded waits.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use connmux::{Config, Mux, Parser};

pub const WAIT: Duration = Duration::from_secs(10);

/// A connected pair over loopback: (the side we attach, the raw peer).
pub fn pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let peer = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (ours, _) = l.accept().unwrap();
    peer.set_nodelay(true).unwrap();
    peer.set_read_timeout(Some(WAIT)).unwrap();
    (ours, peer)
}

pub fn l4() -> Box<dyn Parser> {
    connmux::parsers::from_spec("l4").unwrap()
}

/// An L4-framed message: 4-byte big-endian length of the body, then the body.
pub fn framed(body: &[u8]) -> Vec<u8> {
    let mut v = (body.len() as u32).to_be_bytes().to_vec();
    v.extend_from_slice(body);
    v
}

pub fn mux_with(f: impl FnOnce(&mut Config)) -> Mux {
    let mut c = Config::default();
    c.workers = 1;
    c.placement = connmux::Placement::Unpinned;
    f(&mut c);
    Mux::new(c).unwrap()
}

/// Read one L4 message from a raw peer (bounded by the peer's read timeout).
pub fn read_framed(peer: &mut TcpStream) -> Vec<u8> {
    let mut hdr = [0u8; 4];
    peer.read_exact(&mut hdr).unwrap();
    let mut body = vec![0u8; u32::from_be_bytes(hdr) as usize];
    peer.read_exact(&mut body).unwrap();
    body
}

pub fn write_all(peer: &mut TcpStream, b: &[u8]) {
    peer.write_all(b).unwrap();
}

/// Poll `f` until it returns Some, for at most WAIT.
pub fn eventually<T>(mut f: impl FnMut() -> Option<T>) -> T {
    let end = Instant::now() + WAIT;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < end, "condition not met within {WAIT:?}");
        std::thread::sleep(Duration::from_millis(2));
    }
}
