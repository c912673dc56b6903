//! The `epoll` server of `connmux bench uneven`: the same echo with no
//! framework, one thread per CPU, each with its own epoll (level-triggered),
//! owning the connections placed on it. It is the floor of an event-driven
//! server on this load, against which the blocking thread per connection
//! and connmux are read: a connection waits on its thread's epoll, then is
//! read, answered and written in one `read` and one `write`.
//!
//! A connection goes to the thread on the CPU it was received on
//! (`SO_INCOMING_CPU`; in turn when no thread is there), as connmux places
//! its connections. Heavy requests burn on the thread that read them: one
//! heavy connection holds up the light ones of its thread, as in any
//! hand-written event loop without hand-off.

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Duration;

use connmux_sys::epoll::{Epoll, Events, Interest};
use crossbeam::channel::{Receiver, Sender};

use super::uneven::{burn, echo_whole, READ_BUF};

/// One thread's share: its epoll and the connections handed to it.
struct Loop {
    epoll: Arc<Epoll>,
    conns: Receiver<TcpStream>,
}

/// Serve `l` on one thread per CPU of `cpus` until the process ends.
pub fn serve(l: TcpListener, cpus: &[usize], heavy: Duration, read_work: Duration) -> anyhow::Result<()> {
    let mut hands: Vec<(Arc<Epoll>, Sender<TcpStream>)> = Vec::new();
    for &cpu in cpus {
        let epoll = Arc::new(Epoll::new()?);
        let (tx, rx) = crossbeam::channel::unbounded();
        let lp = Loop { epoll: epoll.clone(), conns: rx };
        std::thread::Builder::new().name(format!("epoll-{cpu}")).spawn(move || {
            let _ = connmux_sys::affinity::pin_current_thread(cpu);
            run(lp, heavy, read_work)
        })?;
        hands.push((epoll, tx));
    }
    place_incoming(l, cpus, move |i, c| {
        let (epoll, tx) = &hands[i];
        let fd = c.as_raw_fd();
        if tx.send(c).is_ok() {
            // Registered after the hand-off, so the thread finds the stream
            // when its first event comes.
            let _ = epoll.add(fd, fd as u64, Interest::READ);
        }
    });
    Ok(())
}

/// Accept on `l` until the process ends, each connection (non-blocking, no
/// Nagle) handed to `hand` with the index in `cpus` of the thread that
/// takes it: the thread on the CPU it was received on (`SO_INCOMING_CPU`,
/// as connmux places its connections), in turn when none is there.
pub(super) fn place_incoming(l: TcpListener, cpus: &[usize], mut hand: impl FnMut(usize, TcpStream) + Send + 'static) {
    let cpus = cpus.to_vec();
    std::thread::spawn(move || {
        let mut next = 0;
        for c in l.incoming().flatten() {
            let on = socket2::SockRef::from(&c).cpu_affinity().ok();
            let i = match cpus.iter().position(|&cpu| Some(cpu) == on) {
                Some(i) => i,
                None => {
                    next += 1;
                    (next - 1) % cpus.len()
                }
            };
            if c.set_nonblocking(true).is_ok() && c.set_nodelay(true).is_ok() {
                hand(i, c);
            }
        }
    });
}

/// One thread: wait, then for each readable connection one read, the echo of
/// its whole messages and one write.
fn run(lp: Loop, heavy: Duration, read_work: Duration) {
    let mut evs = Events::with_capacity(256);
    let mut conns: HashMap<u64, (TcpStream, Vec<u8>)> = HashMap::new();
    let mut buf = vec![0u8; READ_BUF];
    let mut out = Vec::with_capacity(READ_BUF);
    loop {
        if lp.epoll.wait(&mut evs, None).is_err() {
            return;
        }
        for ev in evs.iter() {
            if !conns.contains_key(&ev.token) {
                for c in lp.conns.try_iter() {
                    conns.insert(c.as_raw_fd() as u64, (c, Vec::new()));
                }
            }
            let Some((c, carry)) = conns.get_mut(&ev.token) else { continue };
            let n = match c.read(&mut buf[carry.len()..]) {
                Ok(0) => 0,
                Ok(n) => n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => continue,
                Err(_) => 0,
            };
            let keep = n > 0 && {
                // (The carry, a partial message of the last read, goes first.)
                let have = carry.len() + n;
                buf[..carry.len()].copy_from_slice(carry);
                match echo_whole(&buf[..have], heavy, &mut out) {
                    Some(used) => {
                        carry.clear();
                        carry.extend_from_slice(&buf[used..have]);
                        if !read_work.is_zero() {
                            burn(read_work);
                        }
                        write_all(c, &out)
                    }
                    None => false,
                }
            };
            out.clear();
            if !keep {
                let _ = lp.epoll.delete(ev.token as i32);
                conns.remove(&ev.token);
            }
        }
    }
}

/// Write all of `out` (a short write waits for room: the load reads its
/// replies, so this is rare and short).
pub(super) fn write_all(c: &mut TcpStream, out: &[u8]) -> bool {
    let mut at = 0;
    for _ in 0..100_000 {
        match c.write(&out[at..]) {
            Ok(n) => at += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => std::thread::sleep(Duration::from_micros(50)),
            Err(_) => return false,
        }
        if at == out.len() {
            return true;
        }
    }
    false
}
