//! The `uring` server of `connmux bench uneven`: the `epoll` loop's twin on
//! io_uring, with no framework. One thread per CPU, each with its own ring,
//! owning the connections placed on it: a multishot receive per connection
//! into the ring's provided buffers (the most recently used given first, as
//! connmux's driver does), the echo of the whole messages where they lie,
//! and one plain `write` of the replies. A batch is one `io_uring_enter`
//! (the wait that brings the receive) and one `write`: the floor of an
//! io_uring server on this load, as the `epoll` loop is of an epoll one.
//!
//! Placement and heavy requests as in the `epoll` loop (`uneven_epoll`).

use std::collections::HashMap;
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Duration;

use connmux_sys::eventfd::EventFd;
use connmux_sys::uring::{Completion, Ring, RingConfig};
use crossbeam::channel::{Receiver, Sender};

use super::uneven::{burn, echo_whole};
use super::uneven_epoll::{place_incoming, write_all};

/// The token of the thread's eventfd poll (a connection's token is its fd).
const WAKE: u64 = u64::MAX;

/// Serve `l` on one thread per CPU of `cpus` until the process ends.
pub fn serve(l: TcpListener, cpus: &[usize], heavy: Duration, read_work: Duration) -> anyhow::Result<()> {
    let mut hands: Vec<(Arc<EventFd>, Sender<TcpStream>)> = Vec::new();
    for &cpu in cpus {
        let wake = Arc::new(EventFd::new()?);
        let (tx, rx) = crossbeam::channel::unbounded();
        let w = wake.clone();
        std::thread::Builder::new().name(format!("uring-{cpu}")).spawn(move || {
            let _ = connmux_sys::affinity::pin_current_thread(cpu);
            if let Err(e) = run(&rx, &w, heavy, read_work) {
                eprintln!("uneven-server uring-{cpu}: {e}");
            }
        })?;
        hands.push((wake, tx));
    }
    place_incoming(l, cpus, move |i, c| {
        let (wake, tx) = &hands[i];
        if tx.send(c).is_ok() {
            let _ = wake.notify();
        }
    });
    Ok(())
}

/// A connection of one thread: its stream, the partial message its last
/// receive ended in, and whether it is closing (its receive cancelled, the
/// stream kept until the receive's end comes, so its fd is not reused
/// while the ring still reads it).
struct Conn {
    stream: TcpStream,
    carry: Vec<u8>,
    closing: bool,
}

/// One thread: wait, then for each receive the echo of its whole messages
/// and one write.
fn run(new: &Receiver<TcpStream>, wake: &EventFd, heavy: Duration, read_work: Duration) -> std::io::Result<()> {
    let config = RingConfig {
        entries: 256,
        cq_entries: 4096,
        buf_count: 256,
        buf_size: 16 << 10,
        buf_hot: 4,
        defer_taskrun: true,
    };
    let mut ring: Ring<Vec<u8>> = Ring::new_deferred(config)?;
    ring.poll_readable(wake.as_raw_fd(), WAKE)?;
    let mut conns: HashMap<u64, Conn> = HashMap::new();
    let mut comps = Vec::new();
    let mut joined = Vec::new();
    let mut out = Vec::new();
    loop {
        ring.wait(1, None)?;
        comps.clear();
        ring.reap(&mut comps);
        for c in &comps {
            match *c {
                Completion::Poll { token: WAKE, .. } => {
                    let _ = wake.drain();
                    for s in new.try_iter() {
                        let token = s.as_raw_fd() as u64;
                        if ring.recv_multishot(s.as_raw_fd(), token).is_ok() {
                            conns.insert(token, Conn { stream: s, carry: Vec::new(), closing: false });
                        }
                    }
                    ring.poll_readable(wake.as_raw_fd(), WAKE)?;
                }
                Completion::Recv { token, buf_id, more, .. } => {
                    let data = ring.buffer(buf_id).unwrap_or(&[]);
                    let keep = match conns.get_mut(&token) {
                        Some(conn) if !conn.closing => {
                            // (A partial message of the last receive goes first.)
                            let whole = match conn.carry.is_empty() {
                                true => data,
                                false => {
                                    joined.clear();
                                    joined.extend_from_slice(&conn.carry);
                                    joined.extend_from_slice(data);
                                    &joined[..]
                                }
                            };
                            let ok = match echo_whole(whole, heavy, &mut out) {
                                Some(used) => {
                                    // (`whole` is the ring's buffer or `joined`,
                                    // never the carry itself.)
                                    conn.carry.clear();
                                    conn.carry.extend_from_slice(&whole[used..]);
                                    if !read_work.is_zero() {
                                        burn(read_work);
                                    }
                                    write_all(&mut conn.stream, &out)
                                }
                                None => false,
                            };
                            out.clear();
                            ok
                        }
                        _ => false,
                    };
                    ring.recycle(buf_id);
                    end_or_rearm(&mut ring, &mut conns, token, keep, more);
                }
                Completion::RecvEnd { token, res } => {
                    // Out of buffers: receive again; anything else ends it.
                    end_or_rearm(&mut ring, &mut conns, token, res == -libc::ENOBUFS, false);
                }
                _ => {}
            }
        }
    }
}

/// After a receive's completion: a connection to keep gets a new receive if
/// this one ended (`more` false); one to drop has its receive cancelled, and
/// goes once that receive has ended.
fn end_or_rearm(ring: &mut Ring<Vec<u8>>, conns: &mut HashMap<u64, Conn>, token: u64, keep: bool, more: bool) {
    let Some(conn) = conns.get_mut(&token) else { return };
    let fd = conn.stream.as_raw_fd();
    match (keep && !conn.closing, more) {
        (true, true) => {}
        (true, false) => {
            if ring.recv_multishot(fd, token).is_err() {
                conns.remove(&token);
            }
        }
        (false, true) => {
            conn.closing = true;
            let _ = ring.cancel_fd(fd);
        }
        (false, false) => {
            conns.remove(&token);
        }
    }
}
