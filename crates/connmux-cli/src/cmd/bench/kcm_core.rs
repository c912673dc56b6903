//! `bench kcm-server --engine core`: the KCM model with nothing between a
//! connection and the thread that answers it. Each thread owns a
//! `connmux_core::mux::Mux` of its own (the sans-IO core: no lock, no
//! worker), the connections it accepted (attached there with the `l4`
//! parser) and one KCM socket; it waits on its own epoll, reads each
//! readable connection into the core, takes every whole message with
//! `recv_msg`, echoes it with an addressed send (batched: the echoes of one
//! pass leave together, as the runtime's corked replies do), and writes
//! what the core hands out. No thread reads another's connections, so
//! messages are not balanced across threads.
//!
//! What it is for: the floor of an application thread that reads its own
//! connections (a clone that stands alone, with no worker's hop), set
//! beside the runtime's KCM model and a thread per connection in the same
//! run (`bench kcm`, `core-N`).

use std::collections::HashMap;
use std::io::{ErrorKind, IoSlice, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;

use connmux_core::mux::{Event, Mux, MuxConfig, PsockConfig, PsockId, SockType};
use connmux_core::Timestamp;
use connmux_sys::epoll::{Epoll, Events, Interest};

const LISTENER: u64 = u64::MAX;

fn token(p: PsockId) -> u64 {
    (u64::from(p.index) << 32) | u64::from(p.generation)
}

fn psock(t: u64) -> PsockId {
    PsockId { index: (t >> 32) as u32, generation: t as u32 }
}

/// Starts `threads` threads, each serving the connections it accepts on `l`.
pub fn serve(l: TcpListener, threads: usize) -> anyhow::Result<()> {
    anyhow::ensure!(threads > 0, "--threads must be at least 1");
    l.set_nonblocking(true)?;
    for i in 0..threads {
        let l = l.try_clone()?;
        std::thread::Builder::new().name(format!("core-{i}")).spawn(move || {
            if let Err(e) = run(&l) {
                eprintln!("kcm-server: core thread {i}: {e}");
            }
        })?;
    }
    Ok(())
}

/// One thread: its epoll, its core, its connections.
fn run(l: &TcpListener) -> std::io::Result<()> {
    let ep = Epoll::new()?;
    ep.add(l.as_raw_fd(), LISTENER, Interest::READ)?;
    let mut mux = Mux::new(MuxConfig::default());
    let sock = mux.socket(SockType::Dgram);
    let mut conns: HashMap<PsockId, TcpStream> = HashMap::new();
    let mut evs = Events::with_capacity(256);
    let mut buf = vec![0u8; 64 << 10];
    let clock = std::time::Instant::now();
    // Bounded by the process's life: the bench kills the server.
    loop {
        ep.wait(&mut evs, None)?;
        let now = Timestamp::from_nanos(clock.elapsed().as_nanos() as u64);
        for ev in evs.iter() {
            if ev.token == LISTENER {
                while let Ok((c, _)) = l.accept() {
                    c.set_nonblocking(true)?;
                    c.set_nodelay(true)?;
                    let parser = connmux_core::parsers::from_spec("l4").expect("built-in");
                    let p = mux.attach(parser, PsockConfig::default());
                    ep.add(c.as_raw_fd(), token(p), Interest::READ)?;
                    conns.insert(p, c);
                }
                continue;
            }
            let p = psock(ev.token);
            let Some(c) = conns.get_mut(&p) else { continue };
            if ev.writable {
                // The rest of a write that fell short: wait for reads again.
                ep.modify(c.as_raw_fd(), ev.token, Interest::READ)?;
                transmit(&mut mux, &ep, p, c)?;
            }
            if ev.readable || ev.hup || ev.error {
                read(&mut mux, p, c, &mut buf, now);
            }
        }
        // Every whole message echoed on its own connection; the echoes
        // of this pass leave together.
        while let Ok((data, p)) = mux.recv_msg(sock) {
            let _ = mux.send_msg(sock, Some(p), data, true);
        }
        let _ = mux.end_batch(sock);
        while let Some(ev) = mux.poll_event() {
            match ev {
                Event::PsockTransmit(p) => {
                    if let Some(c) = conns.get_mut(&p) {
                        transmit(&mut mux, &ep, p, c)?;
                    }
                }
                Event::PsockFailed(p, _) => {
                    let _ = mux.unattach(p);
                }
                Event::PsockReleased(p) => {
                    if let Some(c) = conns.remove(&p) {
                        let _ = ep.delete(c.as_raw_fd());
                    }
                }
                _ => {}
            }
        }
    }
}

/// Reads what the core takes from `c` (until the socket is empty).
fn read(mux: &mut Mux, p: PsockId, c: &mut TcpStream, buf: &mut [u8], now: Timestamp) {
    // Bounded: each turn reads bytes or ends.
    loop {
        let want = mux.rx_capacity(p).min(buf.len());
        if want == 0 {
            return;
        }
        match c.read(&mut buf[..want]) {
            Ok(0) => {
                let _ = mux.rx_closed(p, None);
                return;
            }
            Ok(n) => {
                let _ = mux.feed(p, &buf[..n], now);
                if n < want {
                    return;
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => return,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => {
                let _ = mux.rx_closed(p, Some(e.raw_os_error().unwrap_or(EIO)));
                return;
            }
        }
    }
}

/// EIO, for an error that carries no errno.
const EIO: i32 = 5;

/// Writes what the core hands out for `p`; a write that falls short waits
/// for the connection to be writable.
fn transmit(mux: &mut Mux, ep: &Epoll, p: PsockId, c: &mut TcpStream) -> std::io::Result<()> {
    // Bounded: each turn writes a chunk whole or stops.
    while let Some(chunk) = mux.tx_begin(p) {
        let want: usize = chunk.slices.iter().map(|b| b.len()).sum();
        // (One slice a message: copying them into one buffer first made no
        // difference at 2 x 64.)
        let iov: Vec<IoSlice<'_>> = chunk.slices.iter().map(|b| IoSlice::new(b)).collect();
        match c.write_vectored(&iov) {
            Ok(n) => {
                mux.tx_complete(p, n);
                if n < want {
                    ep.modify(c.as_raw_fd(), token(p), Interest::READ_WRITE)?;
                    return Ok(());
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                mux.tx_complete(p, 0);
                ep.modify(c.as_raw_fd(), token(p), Interest::READ_WRITE)?;
                return Ok(());
            }
            Err(e) => {
                mux.tx_failed(p, e.raw_os_error().unwrap_or(EIO));
                return Ok(());
            }
        }
    }
    Ok(())
}
