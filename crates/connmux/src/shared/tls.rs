//! TLS records on a psock, the runtime side: per-psock rustls state and the
//! steps both drivers call to move ciphertext in and records out.
//!
//! Owns [`PsockTls`] (behind `PsockRt::tls`) and the mux's TLS counters. Must
//! not name a driver, the public `Mux` or the `tls` module above: the public
//! part (`TlsConn`'s re-export, `TlsStats`, `Mux::attach_tls`) is `crate::tls`.
//!
//! Where it sits: between a psock's TCP connection and the core. Ciphertext
//! read from the connection goes through rustls, and the plaintext is what the
//! core's stream parser frames; the bytes the core hands out for transmit go
//! through rustls's writer, and the records it makes are what is written to
//! the connection. So framing, steering, limits and statistics are exactly
//! those of a plain psock, counted on the plaintext.
//!
//! Why userspace: the kernel's TLS (kTLS, the `tls` ULP) is not on every
//! machine connmux runs on, and it needs the handshake done elsewhere anyway.
//! Here both run in the worker that owns the psock, non-blocking: attaching
//! never waits for the peer, and no message is framed or written before the
//! handshake completes (messages sent meanwhile wait in the core, bounded by
//! its transmit limits).
//!
//! This module is the TLS logic both drivers call (`driver::epoll`,
//! `driver::uring`): `rx` moves ciphertext in and plaintext to
//! the core, `flush` (epoll) and `take_records` (io_uring) move the core's
//! messages out as records. Lock order: a psock's TLS lock, then the hub lock;
//! never the TLS lock while holding the hub lock, and no event is dispatched
//! while a TLS lock is held (dispatch may flush another psock).
//!
//! Memory per TLS psock is bounded on top of the core's limits: rustls keeps
//! at most one record being assembled (64 KiB during the handshake), at most
//! about 16 KiB of decrypted bytes not yet taken by the core, and at most
//! [`TLS_BUFFER_LIMIT`] of records not yet written; the epoll driver holds at
//! most one read of ciphertext (`Config::read_chunk`) that rustls could not
//! take while the core was full. Plaintext goes to the core no faster than its
//! `rx_capacity`, so a slow consumer closes the TCP window as without TLS.
//!
//! Errors (a bad handshake, an alert, a record that fails to authenticate, the
//! peer closing in the middle of a message) stop the psock's receive with
//! `RxError::Tls`, counted in `TlsStats`;
//! the psock is reported on `Mux::events` like any failed psock, and the
//! other psocks are not affected.

use std::io::{self, BufRead, IoSlice, Write};
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use connmux_core::mux::{Event, Owned, RxError};
use connmux_core::Bytes;

use super::{PsockRt, Shared, WorkerIo};

/// Cap on the records a psock has made but not yet written (and on plaintext
/// buffered before the handshake, which connmux never gives it). Past it the
/// core's messages stay in the core, charged to their socket's send budget.
pub const TLS_BUFFER_LIMIT: usize = 64 << 10;

/// A TLS connection to run on an attached TCP connection: a rustls server or
/// client connection, made from its configuration and not yet used.
pub struct TlsConn(rustls::Connection);

impl From<rustls::ServerConnection> for TlsConn {
    fn from(c: rustls::ServerConnection) -> Self {
        TlsConn(c.into())
    }
}

impl From<rustls::ClientConnection> for TlsConn {
    fn from(c: rustls::ClientConnection) -> Self {
        TlsConn(c.into())
    }
}

impl From<rustls::Connection> for TlsConn {
    fn from(c: rustls::Connection) -> Self {
        TlsConn(c)
    }
}

#[derive(Debug, Default)]
pub(crate) struct TlsCounters {
    pub attached: AtomicU64,
    pub handshakes: AtomicU64,
    pub handshake_failures: AtomicU64,
    pub errors: AtomicU64,
}

/// Per-psock TLS state, behind the psock's own lock (`PsockRt::tls`).
pub(crate) struct PsockTls {
    conn: rustls::Connection,
    /// The handshake completed (and was counted).
    established: bool,
    /// Where its receive side is (see [`TlsRx`]).
    rx: TlsRx,
    /// TLS failed: nothing more can be sent either (but the alert).
    failed: bool,
    /// Ciphertext read from the connection that rustls could not take yet
    /// because the core was full (epoll driver; at most one read).
    held: Vec<u8>,
    /// `held`'s memory as last told to the core's budget (`Mux::set_rx_below`).
    held_counted: usize,
    /// Where the ciphertext given to rustls is in its record framing.
    records: RecordEdge,
    /// A record deadline is armed in the core (`set_record_deadline`).
    record_armed: bool,
    /// No record of this psock is on its way outside rustls (an io_uring
    /// send in flight, or the rest of a short one), so what rustls holds may
    /// be written at once without passing it. Always on the epoll driver,
    /// whose writes of a TLS psock all hold this state's lock; the io_uring
    /// worker sets it before each receive ([`PsockTls::set_unsent`]).
    write_now: bool,
    /// The close in order of a drained psock ([`close_in_order`]).
    closing: Closing,
}

/// A TLS psock's receive side:
///
/// ```text
///   Open ── the connection's stream ends ──► Ending { how, told }
///    │      (FIN: how None, told whether       │ the plaintext before it taken
///    │       rustls took the end; an error)    │ by the core: reported to it
///    │                                         ▼
///    └── a TLS error, a close_notify, the ──► Done (nothing more is read)
///        psock gone from the core
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TlsRx {
    Open,
    /// The stream ended (`how` None: FIN; Some: a read error); `told`:
    /// rustls took the end of a FIN (it refuses while its plaintext is
    /// full, and is told again once it is empty).
    Ending {
        how: Option<i32>,
        told: bool,
    },
    Done,
}

/// A TLS psock's close in order, once its peer closed its write side and
/// has every answer made into records (`PsockDrained`):
///
/// ```text
///   Open ──close_in_order──► Notified ──rustls has written all──► Shut
///         (close_notify queued            (FIN; unattached where the
///          behind the last records)        owner asked: the service)
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Closing {
    Open,
    Notified,
    Shut,
}

/// Where a TLS byte stream is relative to its records (5-byte header with
/// the body length in its last two bytes, then the body): whether the bytes
/// seen so far end inside a record. rustls holds such a partial record
/// below the parser, where the core's assembly deadline does not see it.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RecordEdge {
    /// Header bytes seen of the current record (0..5).
    hdr: u8,
    /// The length field's bytes so far.
    len: u16,
    /// Body bytes still to come.
    left: usize,
}

impl RecordEdge {
    /// Account for `data`, the next bytes of the stream.
    pub(crate) fn advance(&mut self, mut data: &[u8]) {
        // Bounded: each turn consumes at least one byte.
        while !data.is_empty() {
            if self.left > 0 {
                let k = self.left.min(data.len());
                self.left -= k;
                data = &data[k..];
                continue;
            }
            match self.hdr {
                3 | 4 => self.len = (self.len << 8) | u16::from(data[0]),
                _ => {}
            }
            self.hdr += 1;
            data = &data[1..];
            if self.hdr == 5 {
                self.left = usize::from(self.len);
                self.hdr = 0;
                self.len = 0;
            }
        }
    }
    /// The bytes seen end inside a record (a header or a body not finished).
    pub(crate) fn inside(&self) -> bool {
        self.hdr > 0 || self.left > 0
    }
}

impl PsockTls {
    pub(crate) fn new(conn: TlsConn) -> PsockTls {
        let mut conn = conn.0;
        conn.set_buffer_limit(Some(TLS_BUFFER_LIMIT));
        PsockTls {
            conn,
            established: false,
            rx: TlsRx::Open,
            failed: false,
            held: Vec::new(),
            held_counted: 0,
            records: RecordEdge::default(),
            record_armed: false,
            write_now: true,
            closing: Closing::Open,
        }
    }

    /// The io_uring worker, before it hands this psock's received bytes
    /// over: whether records it took from rustls are still unsent (in a
    /// ring send, or the rest of a short one). A failure's alert is then
    /// left to follow them through the ring.
    pub(crate) fn set_unsent(&mut self, unsent: bool) {
        self.write_now = !unsent;
    }

    /// A client connection that speaks first (its ClientHello waits).
    pub(crate) fn speaks_first(&self) -> bool {
        self.conn.is_handshaking() && self.conn.wants_write()
    }

    /// Whether receive is over for good.
    pub(crate) fn done(&self) -> bool {
        self.rx == TlsRx::Done
    }

    /// The plaintext of the core's chunk, as records (no more than the
    /// buffer limit takes); how many bytes were taken. Small messages share
    /// records: the slices go to rustls in one vectored write.
    fn encrypt(&mut self, slices: &[Bytes], max_iov: usize) -> usize {
        let n = slices.len().min(max_iov);
        let iov: Vec<IoSlice<'_>> = slices[..n].iter().map(|b| IoSlice::new(b)).collect();
        self.conn.writer().write_vectored(&iov).unwrap_or(0)
    }
}

/// `io::Read`/`io::Write` on a psock's non-blocking descriptor.
struct Fd(RawFd);

impl io::Write for Fd {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        connmux_sys::socket::writev(self.0, &[IoSlice::new(buf)])
    }
    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        connmux_sys::socket::writev(self.0, bufs)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// What the core could not take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Rx {
    /// Everything went in (or receive is over: see [`PsockTls::done`]).
    Done,
    /// The core is full: decrypted bytes wait in rustls, and the bytes of the
    /// input not taken are to be offered again after `PsockRxResume`.
    Full,
}

/// Where decrypted bytes stand after offering them to the core.
enum Plain {
    /// All taken; more may come from more ciphertext.
    Empty,
    /// The core took what it could and is full.
    Full,
    /// The peer's stream ended: close_notify (true) or the connection's end
    /// without it (false), all before it taken.
    Closed(bool),
}

/// A TLS psock's receive path: the mux, its worker's psocks (the owner's,
/// for the calls on its receive side), the psock, and where the events
/// those calls raise go.
pub(crate) struct RxAt<'a> {
    pub sh: &'a Shared,
    pub o: &'a mut Owned,
    pub rt: &'a PsockRt,
    pub events: &'a mut Vec<Event>,
}

/// Move ciphertext `data` through TLS into the core, as far as the core takes
/// it; returns how many bytes of `data` were taken, and whether the core is
/// full. Called with the psock's TLS lock held, without the hub lock.
pub(crate) fn rx(at: &mut RxAt<'_>, st: &mut PsockTls, data: &[u8]) -> (usize, Rx) {
    let (sh, rt) = (at.sh, at.rt);
    let r = rx_records(at, st, data);
    // A partial record after the handshake is the start of a message the
    // parser has not seen: the assembly timeout covers it from here.
    let inside = st.established && st.rx != TlsRx::Done && st.records.inside();
    if inside != st.record_armed {
        st.record_armed = inside;
        let now = sh.now();
        let mut core = sh.lock();
        let deadline = if inside { core.mux.config().assembly_timeout.map(|d| now.add(d)) } else { None };
        let _ = core.mux.of(at.o).set_record_deadline(rt.id, deadline);
        core.drain_events(at.events);
    }
    r
}

fn rx_records(at: &mut RxAt<'_>, st: &mut PsockTls, data: &[u8]) -> (usize, Rx) {
    let (sh, rt) = (at.sh, at.rt);
    let mut off = 0;
    // Bounded: each round takes input bytes, or ends.
    loop {
        if st.rx == TlsRx::Done {
            return (data.len(), Rx::Done);
        }
        match drain_plain(at, st) {
            Plain::Full => return (off, Rx::Full),
            Plain::Closed(notify) => {
                end(at, st, Some(notify));
                return (data.len(), Rx::Done);
            }
            Plain::Empty => {}
        }
        if off == data.len() {
            match st.rx {
                // A read error (rustls saw no end: its reader still waits).
                TlsRx::Ending { how: Some(_), .. } => end(at, st, None),
                // A FIN rustls refused to take while its plaintext was full:
                // now that it is empty, tell it (once), and look again.
                TlsRx::Ending { how: None, told: false } => {
                    let told = st.conn.read_tls(&mut io::empty()).is_ok();
                    st.rx = TlsRx::Ending { how: None, told };
                    if told {
                        continue;
                    }
                }
                _ => {}
            }
            return (off, Rx::Done);
        }
        match st.conn.read_tls(&mut &data[off..]) {
            // After a close_notify nothing more is read: the rest is dropped.
            Ok(0) => off = data.len(),
            Ok(n) => {
                st.records.advance(&data[off..off + n]);
                off += n;
            }
            Err(e) => {
                fail(at, st, e.to_string());
                return (data.len(), Rx::Done);
            }
        }
        if let Err(e) = st.conn.process_new_packets() {
            fail(at, st, e.to_string());
            return (data.len(), Rx::Done);
        }
        if !st.established && !st.conn.is_handshaking() {
            st.established = true;
            sh.tls.handshakes.fetch_add(1, Ordering::Relaxed);
            if let Some(chain) = st.conn.peer_certificates() {
                let _ = rt.tls_peer.set(chain.iter().map(|c| c.clone().into_owned()).collect());
            }
            let mut core = sh.lock();
            let _ = core.mux.of(at.o).set_handshake_deadline(rt.id, None);
            core.drain_events(at.events);
            drop(core);
            // Messages that waited for the handshake can go now.
            at.events.push(Event::PsockTransmit(rt.id));
        }
        if st.conn.wants_write() {
            // Handshake messages, session tickets, key updates.
            at.events.push(Event::PsockTransmit(rt.id));
        }
    }
}

/// The connection's stream ended (`errno` None: FIN). The plaintext before it
/// still goes to the core first; the psock's end is reported after it.
pub(crate) fn rx_eof(at: &mut RxAt<'_>, st: &mut PsockTls, errno: Option<i32>) -> Rx {
    if st.rx != TlsRx::Open {
        return Rx::Done;
    }
    // An empty read tells rustls the stream ended, so that its reader tells
    // a close_notify from a truncation.
    let told = errno.is_none() && st.conn.read_tls(&mut io::empty()).is_ok();
    st.rx = TlsRx::Ending { how: errno, told };
    rx(at, st, &[]).1
}

/// Offer the decrypted bytes rustls holds to the core, in one hold of the
/// hub lock: taking plaintext rustls has decrypted is a copy, no system
/// call, and a hold a record cost a client pipelining small requests a
/// hold a request.
fn drain_plain(at: &mut RxAt<'_>, st: &mut PsockTls) -> Plain {
    let (sh, rt) = (at.sh, at.rt);
    let now = sh.now();
    let mut core = None;
    // Bounded: each round takes at least one byte of the plaintext rustls
    // holds (it decrypts no more than its buffer limit ahead). Not a fixed
    // count of rounds: a chunk is a record's plaintext, and a read of many
    // small records (a client pipelining small requests) ended a count of
    // 64 as if the core were full, so the psock's reads stopped with
    // nobody to resume them.
    let plain = loop {
        let chunk = match st.conn.reader().into_first_chunk() {
            Ok([]) => break Plain::Closed(true),
            Ok(c) => c,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break Plain::Empty,
            Err(_) => break Plain::Closed(false),
        };
        let core = core.get_or_insert_with(|| sh.lock());
        let cap = core.mux.view_of(at.o).rx_capacity(rt.id);
        if cap == 0 {
            break Plain::Full;
        }
        let n = cap.min(chunk.len());
        let fed = core.mux.of(at.o).feed(rt.id, &chunk[..n], now);
        st.conn.reader().consume(n);
        if fed.is_err() {
            // Gone from the core: nothing more to receive.
            st.rx = TlsRx::Done;
            break Plain::Empty;
        }
    };
    if let Some(mut core) = core {
        core.drain_events(at.events);
    }
    plain
}

/// The peer's stream ended: a close between messages (or a read error) ends
/// the psock as a TCP end would; during the handshake or in the middle of a
/// message it is a TLS error (a truncation is not a message boundary).
/// `notify`: Some(close_notify seen) for an end of stream, None for an error.
fn end(at: &mut RxAt<'_>, st: &mut PsockTls, notify: Option<bool>) {
    let (sh, rt) = (at.sh, at.rt);
    let Some(notify) = notify else {
        let errno = match st.rx {
            TlsRx::Ending { how, .. } => how,
            _ => None,
        };
        st.rx = TlsRx::Done;
        let mut core = sh.lock();
        let _ = core.mux.of(at.o).rx_closed(rt.id, errno);
        core.drain_events(at.events);
        return;
    };
    let why = match (notify, st.established) {
        (_, false) => Some("connection closed during the handshake"),
        (true, true) => Some("close_notify in the middle of a message"),
        (false, true) => Some("connection closed without close_notify in the middle of a message"),
    };
    let mid = !st.established || {
        let mut core = sh.lock();
        let mid = core.mux.view_of(at.o).rx_need(rt.id).is_some();
        core.drain_events(at.events);
        mid
    };
    match why {
        Some(why) if mid => fail(at, st, why.to_string()),
        _ => {
            st.rx = TlsRx::Done;
            let mut core = sh.lock();
            let _ = core.mux.of(at.o).rx_closed(rt.id, None);
            core.drain_events(at.events);
        }
    }
}

/// A TLS error: count it, stop the psock's receive with it, and send the
/// alert rustls queued (if any) before the application aborts the psock.
fn fail(at: &mut RxAt<'_>, st: &mut PsockTls, why: String) {
    let (sh, rt) = (at.sh, at.rt);
    st.rx = TlsRx::Done;
    st.failed = true;
    st.held = Vec::new();
    if st.write_now {
        // The alert, behind any record rustls made and nobody took yet, goes
        // out now, before the failure is raised: the application resets the
        // connection as soon as it hears of it (the service does), and a
        // reset that overtakes the alert leaves the peer with ECONNRESET and
        // no reason. What would block is left to the transmit path.
        // Bounded: each round writes, or stops.
        for _ in 0..4 {
            if !st.conn.wants_write() {
                break;
            }
            match st.conn.write_tls(&mut Fd(rt.fd())) {
                Ok(n) if n > 0 => {}
                _ => break,
            }
        }
    }
    if st.established {
        sh.tls.errors.fetch_add(1, Ordering::Relaxed);
    } else {
        sh.tls.handshake_failures.fetch_add(1, Ordering::Relaxed);
    }
    let mut core = sh.lock();
    let _ = core.mux.of(at.o).rx_abort(rt.id, RxError::Tls(why));
    core.drain_events(at.events);
    drop(core);
    at.events.push(Event::PsockTransmit(rt.id));
}

/// The epoll driver's read of a readable TLS psock (and its resume after
/// backpressure): first what was held, then one read from the connection.
pub(crate) fn epoll_read(at: &mut RxAt<'_>, tls: &Mutex<PsockTls>, buf: &mut [u8]) {
    let rt = at.rt;
    let mut st = tls.lock().unwrap();
    let full = 'read: {
        if st.rx == TlsRx::Done {
            break 'read false;
        }
        let held = std::mem::take(&mut st.held);
        let (took, r) = rx(at, &mut st, &held);
        if r == Rx::Full {
            if st.rx != TlsRx::Done {
                st.held = held[took..].to_vec();
            }
            break 'read true;
        }
        if st.rx != TlsRx::Open {
            break 'read false;
        }
        match connmux_sys::socket::read(rt.fd(), buf) {
            Ok(0) => rx_eof(at, &mut st, None) == Rx::Full,
            Ok(n) => take_bytes(at, &mut st, &buf[..n]),
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => false,
            Err(e) => rx_eof(at, &mut st, Some(e.raw_os_error().unwrap_or(libc::EIO))) == Rx::Full,
        }
    };
    read_interest(at, st, full);
}

/// Ciphertext read from the connection, through TLS into the core. Whether
/// the core is full (what it did not take is held for its resume).
fn take_bytes(at: &mut RxAt<'_>, st: &mut PsockTls, data: &[u8]) -> bool {
    let (took, r) = rx(at, st, data);
    if r == Rx::Full && st.rx != TlsRx::Done {
        st.held = data[took..].to_vec();
    }
    r == Rx::Full
}

/// After an epoll read: the core is full (or the stream is over), so stop
/// polling for input. `PsockRxResume` turns it back on and has the worker
/// come back to `epoll_read` for what rustls and `held` keep, which no
/// readiness would announce.
///
/// What stays held counts in the budget as the psock's, as the io_uring
/// driver's spills do: hundreds of peers whose reads the core cannot take
/// would otherwise each keep a read the budget does not see.
fn read_interest(at: &mut RxAt<'_>, mut st: MutexGuard<'_, PsockTls>, full: bool) {
    let (sh, rt) = (at.sh, at.rt);
    let stop = st.rx != TlsRx::Open;
    let below = if st.held.is_empty() { 0 } else { st.held.capacity() };
    if below != st.held_counted {
        st.held_counted = below;
        // (TLS lock before the hub lock.)
        let mut core = sh.lock();
        core.mux.of(at.o).set_rx_below(rt.id, below);
        core.drain_events(at.events);
    }
    drop(st);
    sh.set_interest(rt, |i| i.read = !(full || stop));
}

/// Write a TLS psock (the epoll driver's flush, from its worker or from an
/// application thread): the records already made first, then the core's
/// messages as new records, until nothing is left or the connection would
/// block. With io_uring the worker writes its TLS psocks itself (its sends
/// must stay in order): other threads hand them over.
pub(crate) fn flush(sh: &Shared, rt: &PsockRt, tls: &Mutex<PsockTls>, events: &mut Vec<Event>) {
    if let WorkerIo::Uring = sh.worker(rt.worker()).io() {
        sh.want_write(rt);
        return;
    }
    let mut st = tls.lock().unwrap();
    // Bounded: each round writes records, or ends.
    for _ in 0..1024 {
        let mut written = 0;
        while st.conn.wants_write() {
            match st.conn.write_tls(&mut Fd(rt.fd())) {
                Ok(n) if n > 0 => written += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock || (e.kind() == io::ErrorKind::WriteZero) => {
                    drop(st);
                    sh.want_write(rt);
                    return;
                }
                Ok(_) => {
                    // No progress on a non-empty write: leave it to writability.
                    drop(st);
                    sh.want_write(rt);
                    return;
                }
                Err(e) => {
                    // The records are lost with the connection.
                    st.failed = true;
                    drop(st);
                    let mut core = sh.lock();
                    core.mux.tx_failed(rt.id, e.raw_os_error().unwrap_or(libc::EIO));
                    core.drain_events(events);
                    return;
                }
            }
            if written > TLS_BUFFER_LIMIT * 4 {
                break;
            }
        }
        if !encrypt_from_core(sh, rt, &mut st, events) && !st.conn.wants_write() {
            return shut_if_notified(sh, rt, st, events);
        }
    }
    drop(st);
    sh.want_write(rt);
}

/// A drained TLS psock (`PsockDrained`: its peer closed its write side and
/// every answer was made into records): close_notify goes behind the last
/// records, and the write side is shut once rustls has written everything
/// (by the epoll [`flush`], or by [`take_records`] once the io_uring worker
/// has no send out). A psock whose TLS failed is left to its owner (its
/// alert went out with the failure).
pub(crate) fn close_in_order(sh: &Shared, rt: &PsockRt, tls: &Mutex<PsockTls>, events: &mut Vec<Event>) {
    {
        let mut st = tls.lock().unwrap();
        if st.failed || st.closing != Closing::Open {
            return;
        }
        st.conn.send_close_notify();
        st.closing = Closing::Notified;
    }
    flush(sh, rt, tls, events);
}

/// Whether this TLS psock's close in order is over (its write side shut).
pub(crate) fn shut(tls: &Mutex<PsockTls>) -> bool {
    tls.lock().unwrap().closing == Closing::Shut
}

/// Everything of a TLS psock is written (no record unsent, none in flight):
/// a close in order under way ends, its write side shut (FIN). Takes the
/// psock's TLS lock from the caller and lets it go before the shut.
fn shut_if_notified(sh: &Shared, rt: &PsockRt, mut st: MutexGuard<'_, PsockTls>, events: &mut Vec<Event>) {
    if st.closing == Closing::Notified {
        st.closing = Closing::Shut;
        drop(st);
        sh.shut_drained(rt, events);
    }
}

/// Turn the core's next chunk into records. False when there is nothing to
/// do: no chunk, the handshake is not done yet (messages wait in the core),
/// or TLS failed (the psock's messages are given back to the core, which
/// resends a socket's messages whole on another psock).
fn encrypt_from_core(sh: &Shared, rt: &PsockRt, st: &mut PsockTls, events: &mut Vec<Event>) -> bool {
    if !st.established && !st.failed {
        return false;
    }
    let mut core = sh.lock();
    let Some(chunk) = core.mux.tx_begin(rt.id) else {
        core.drain_events(events);
        return false;
    };
    if st.failed {
        core.mux.tx_complete(rt.id, 0);
        core.mux.tx_failed(rt.id, connmux_core::mux::EBADMSG);
        core.drain_events(events);
        return false;
    }
    let n = st.encrypt(&chunk.slices, crate::shared::MAX_IOV);
    core.mux.tx_complete(rt.id, n);
    core.drain_events(events);
    n > 0
}

/// The io_uring driver's transmit of a TLS psock: the core's next chunk as
/// records (if the handshake is done), and every record made so far, to send
/// in one `sendmsg`. Empty when there is nothing to send.
pub(crate) fn take_records(sh: &Shared, rt: &PsockRt, tls: &Mutex<PsockTls>, events: &mut Vec<Event>) -> Bytes {
    let mut st = tls.lock().unwrap();
    if !st.conn.wants_write() {
        encrypt_from_core(sh, rt, &mut st, events);
    }
    let mut out = Vec::new();
    // Bounded: writing to a Vec takes everything at once.
    for _ in 0..16 {
        if !st.conn.wants_write() || st.conn.write_tls(&mut out).is_err() {
            break;
        }
    }
    if out.is_empty() && !st.conn.wants_write() {
        // (The worker asks only with no send of this psock out.)
        shut_if_notified(sh, rt, st, events);
    }
    Bytes::from(out)
}

/// A send of a TLS psock's records failed (io_uring): its transmit stops.
pub(crate) fn tx_failed(sh: &Shared, rt: &PsockRt, errno: i32, events: &mut Vec<Event>) {
    if let Some(tls) = &rt.tls {
        tls.lock().unwrap().failed = true;
    }
    let mut core = sh.lock();
    core.mux.tx_failed(rt.id, errno);
    core.drain_events(events);
}

#[cfg(test)]
mod record_edge_tests {
    use super::RecordEdge;

    #[test]
    fn tells_whether_the_bytes_end_inside_a_record() {
        // Two records: 3 bytes of body, then 0x0102 = 258 bytes.
        let mut wire = vec![0x17, 0x03, 0x03, 0x00, 0x03, 1, 2, 3];
        wire.extend_from_slice(&[0x17, 0x03, 0x03, 0x01, 0x02]);
        wire.extend(std::iter::repeat_n(9u8, 258));
        // Fed whole, and fed byte by byte: inside exactly while a record is open.
        let mut e = RecordEdge::default();
        e.advance(&wire);
        assert!(!e.inside());
        let mut e = RecordEdge::default();
        let ends = [8, wire.len()];
        for (i, b) in wire.iter().enumerate() {
            e.advance(std::slice::from_ref(b));
            assert_eq!(e.inside(), !ends.contains(&(i + 1)), "after {} bytes", i + 1);
        }
        // A header cut after its length's first byte.
        let mut e = RecordEdge::default();
        e.advance(&[0x17, 0x03, 0x03, 0x00]);
        assert!(e.inside());
        e.advance(&[0x00]);
        assert!(!e.inside(), "an empty record ends with its header");
    }
}
