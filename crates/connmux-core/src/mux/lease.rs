//! A psock lent to the worker that reads it: while nothing else involves
//! the psock, its framing and its writes need no one else, so the mux hands
//! them out ([`Mux::lease`]) and the worker frames, answers and writes the
//! psock's messages itself, telling the mux what it did now and then
//! ([`Mux::lease_sync`]) instead of for every read.
//!
//! ```text
//!            lease(p, s): Open, nothing buffered (lease_keeping: at
//!            most a message begun, which the lease takes), ready, held
//!            (lease_taking: but those its holder answers on the lease),
//!            queued or out (lease_taking: s's replies queued, which the
//!            lease takes), steered to s (affinity), s's queue empty, its
//!            reads not lent to its assembly buffer (large messages)
//!   Owned ────────────────────────────────────────────────► Leased
//!     ▲                                                       │
//!     │ unlease / unlease_queued (the worker: a message too   │ anything else touches p
//!     │ large or bad to keep, a short write, an end of        │ (a send queued on it, unattach,
//!     │ stream, a close, a heavy connection's cut read, a     │ an abort, a steering change):
//!     │ kept message's deadline); what the lease kept is fed  │ revoked, PsockLeaseRevoked(p) once
//!     │ to the mux                                            │
//!     └───────────────────────────────────────────────────────┤
//! ```
//!
//! A read that ends inside a message ([`Lease::frame_read`]): the lease
//! keeps the message's start (up to the room its worker gives it) and the
//! next reads complete it; its whole message is then served before the
//! read's own.
//!
//! ```text
//!                 rest of a read: a message begun, within room
//!   Empty ─────────────────────────────────────────────► Keeping(bytes, since)
//!     ▲  ◄───────────────────────────────────────────────   │  │
//!     │    the message whole: served first (`take_done`)    │  │ more of it: kept
//!     │                                                     │◄─┘
//!     │ unlease: the kept bytes fed to the mux as read at `since`
//!     └─────────────────────────────────────────────────────┘
//! ```
//!
//! What a lease keeps true:
//! - **Order and atomicity.** A lease exists only while the psock holds no
//!   byte of a message (nothing buffered, none ready, none in a socket's
//!   queue, none unsettled but those its holder answers on the lease itself;
//!   `lease_keeping`: the start of the next message
//!   moves to the lease, its deadline with it) and has nothing to write
//!   (`lease_taking`: replies of the lease's socket queued, none out, move
//!   to the lease, which writes them before its own); while it is out the
//!   psock counts as having a chunk out (`Tx::Lent`), so a message another
//!   thread sends to it waits on its queue, whole, until the lease comes back.
//! - **Steering.** Only under `Steering::Affinity` with the psock's tag on
//!   the socket the worker serves, whose queue is empty: exactly where the
//!   mux would put each message, since the worker answers them at once.
//! - **Limits.** Framing keeps the psock's size limit; a message that is
//!   too large or badly framed is left to the mux (the worker gives the
//!   lease back and feeds the read as usual), which decides the error. A
//!   message begun is kept only within the room the worker gives
//!   (its own bound on what its leases keep: the budget does not see those
//!   bytes) and only until its assembly deadline, which the worker keeps
//!   by giving the lease back: the mux then holds the bytes as read at
//!   their first byte's time, and its deadline fires as it would have.
//! - **Statistics.** The counts of what was framed and written are added
//!   at the next `lease_sync` or `unlease`, which the worker calls as
//!   often as it likes (the runtime: within a millisecond); the psock's idle
//!   clock moves then too.

use std::ops::Range;

use super::{Event, Life, Mux, PsockId, SockId, Steering, Tx};
use crate::parser::{Parse, Parser};
use crate::run::Run;
use crate::stats::PsockStats;
use crate::time::Timestamp;
use bytes::Bytes;

/// A leased psock's framing and counts, held by the worker that reads it.
pub struct Lease {
    psock: PsockId,
    sock: SockId,
    parser: Box<dyn Parser>,
    max_len: usize,
    /// The parser hands messages over whole ([`Parser::delivers_whole`]).
    whole: bool,
    counts: Counts,
    /// The start of a message a read ended inside (see the module's top).
    tail: Vec<u8>,
    /// When its first byte was read (its assembly deadline's origin), or
    /// when reading the psock resumed after its worker held it back.
    since: Option<Timestamp>,
    /// The kept message's deadline is held: its worker is not reading the
    /// psock (its replies backed up) ([`Lease::hold_kept`]).
    held: bool,
    /// A message `tail` became whole in the last read, not yet served.
    done: Vec<u8>,
    /// The psock's assembly timeout (from a message's first byte).
    timeout: Option<std::time::Duration>,
    /// Replies of the lease's socket the psock's queue held, not yet
    /// written, taken with the lease ([`Mux::lease_taking`]): what is left
    /// of each message, and the whole messages in it.
    unsent: Vec<(Bytes, u32)>,
}

/// What [`Lease::frame_read`] made of a read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeaseRead {
    /// Serve: first the message the lease kept, now whole
    /// ([`Lease::take_done`]; this range of it is the message as the
    /// parser delivers it), when there is one; then the runs pushed onto
    /// `out`, which are of `data[from..]`. The read's last bytes, if they
    /// begin a message, are kept.
    Serve { done: Option<Range<usize>>, from: usize },
    /// The whole read went on the kept message, still not whole.
    Kept,
    /// Not for the lease: give it back ([`Mux::unlease`] feeds the mux what
    /// the lease kept, read at its time), then feed the mux `data[from..]`.
    /// Nothing of the read is counted.
    GiveBack { from: usize },
}

/// What a lease did since it was last synced.
#[derive(Clone, Copy, Debug, Default)]
struct Counts {
    rx_msgs: u64,
    /// Wire bytes of the messages framed.
    rx_bytes: u64,
    /// What of them the socket's reader got (less where the parser cuts).
    rx_delivered: u64,
    tx_msgs: u64,
    tx_bytes: u64,
    /// The last message's wire length (the stream predicts loans from it).
    last_len: usize,
    /// Bytes of a message begun were read (the psock is not idle).
    touched: bool,
    /// Short writes whose rest waited on the lease (`Lease::backed_up`).
    backlogs: u64,
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease").field("psock", &self.psock).field("sock", &self.sock).finish()
    }
}

impl Lease {
    /// The leased psock.
    pub fn psock(&self) -> PsockId {
        self.psock
    }

    /// Frame the whole messages at the front of `data` (a read of the
    /// psock), pushing their runs onto `out`. Returns the bytes taken:
    /// `data.len()` when `data` was all whole messages, each within the
    /// psock's size limit. Anything less and nothing is counted (the caller
    /// goes on with [`Lease::frame_read`]). Only for a lease that keeps
    /// nothing ([`Lease::keeps`]): a read after a kept start goes on with it.
    #[inline]
    pub fn frame(&mut self, data: &[u8], out: &mut Vec<Run>) -> usize {
        debug_assert!(!self.keeps());
        let first = out.len();
        let taken = self.parser.frame_batch(data, self.max_len, usize::MAX, out);
        if taken != data.len() {
            out.truncate(first);
            return taken;
        }
        self.count(first, out, taken);
        taken
    }

    /// Count the messages framed onto `out` after `first`, `taken` wire
    /// bytes in all.
    #[inline]
    fn count(&mut self, first: usize, out: &[Run], taken: usize) {
        let runs = &out[first..];
        if let Some(last) = runs.last() {
            self.counts.last_len = last.stride;
        }
        self.counts.rx_msgs += crate::run::count(runs) as u64;
        self.counts.rx_bytes += taken as u64;
        self.counts.rx_delivered += match self.whole {
            true => taken as u64,
            false => runs.iter().map(|r| (r.len * r.count) as u64).sum::<u64>(),
        };
    }

    /// The replies the lease took from the psock's queue when it was made
    /// ([`Mux::lease_taking`]), in order: the worker writes them first.
    pub fn take_unsent(&mut self) -> Vec<(Bytes, u32)> {
        std::mem::take(&mut self.unsent)
    }

    /// Whether the lease keeps the start of a message (the next read goes
    /// on with it).
    #[inline]
    pub fn keeps(&self) -> bool {
        !self.tail.is_empty()
    }

    /// Bytes of a message begun that the lease keeps.
    pub fn kept(&self) -> usize {
        self.tail.len()
    }

    /// When the kept message's first byte was read (`None`: none kept).
    pub fn kept_since(&self) -> Option<Timestamp> {
        self.since
    }

    /// The kept message's assembly deadline (`None`: none kept, or the
    /// psock has no timeout): the lease must be given back by then, and
    /// the mux times the message out as it would have.
    pub fn kept_due(&self) -> Option<Timestamp> {
        if self.held {
            return None;
        }
        Some(self.since?.add(self.timeout?))
    }

    /// The worker stopped reading the psock (its replies backed up): the
    /// kept message's deadline stops, the time being the server's, until
    /// [`Lease::restart_kept`].
    pub fn hold_kept(&mut self) {
        self.held = true;
    }

    /// Reading the psock resumed at `now`: the kept message's deadline runs
    /// again from `now`, in full.
    pub fn restart_kept(&mut self, now: Timestamp) {
        self.held = false;
        if self.since.is_some() {
            self.since = Some(now);
        }
    }

    /// Frame a read of the psock, read at `now`, whatever it holds: the
    /// message the lease keeps (if any) completed from its front, the whole
    /// messages after that framed where they lie (runs onto `out`), and a
    /// message begun at its end kept, as long as the lease keeps no more
    /// than `room` bytes (and the message is within the size limit). A message
    /// too large, badly framed, or not whole within `room`: the lease goes
    /// back ([`LeaseRead::GiveBack`]), and the mux decides.
    pub fn frame_read(&mut self, data: &[u8], now: Timestamp, room: usize, out: &mut Vec<Run>) -> LeaseRead {
        // (A message begun is shorter than `max_len`: the psock, which
        // holds nothing while lent, takes it back whole on `unlease`.)
        let first = out.len();
        let mut from = 0;
        let mut done = None;
        let mut done_len = 0;
        if self.keeps() {
            // Bounded: each turn appends at least one byte, or ends.
            let whole = loop {
                match self.parser.parse(&self.tail) {
                    Parse::Length(n) if n == self.tail.len() => break n,
                    Parse::Length(n) if n < self.tail.len() || n > self.max_len || n > room => {
                        return LeaseRead::GiveBack { from };
                    }
                    Parse::Length(n) => {
                        let take = (n - self.tail.len()).min(data.len() - from);
                        self.tail.reserve_exact(n - self.tail.len());
                        self.tail.extend_from_slice(&data[from..from + take]);
                        from += take;
                        self.counts.touched = true;
                        if self.tail.len() < n {
                            return LeaseRead::Kept;
                        }
                        // Whole now (the parser said how long: no need to ask again).
                        break n;
                    }
                    Parse::NeedMore(k) => {
                        let take = k.max(1).min(data.len() - from);
                        if take == 0 {
                            self.counts.touched = true;
                            return LeaseRead::Kept;
                        }
                        if self.tail.len() + take > room || self.tail.len() + take >= self.max_len {
                            return LeaseRead::GiveBack { from };
                        }
                        self.tail.extend_from_slice(&data[from..from + take]);
                        from += take;
                    }
                    Parse::Invalid(_) => return LeaseRead::GiveBack { from },
                }
            };
            // Served where it lies in its own buffer, as the parser cuts it
            // (a message it would copy to cut goes the mux's way).
            let Some(r) = self.parser.finish_in_place(&self.tail) else { return LeaseRead::GiveBack { from } };
            done = Some(r);
            done_len = whole;
            self.done = std::mem::take(&mut self.tail);
            self.since = None;
        }
        let rest = &data[from..];
        let taken = self.parser.frame_batch(rest, self.max_len, usize::MAX, out);
        if taken < rest.len() {
            let left = &rest[taken..];
            // A message begun, within room: kept. Anything else is the mux's
            // (it frames the read again and decides).
            let keep = match self.parser.parse(left) {
                Parse::NeedMore(_) => left.len() <= room && left.len() < self.max_len,
                Parse::Length(n) => n > left.len() && n <= self.max_len && n <= room,
                Parse::Invalid(_) => false,
            };
            if !keep {
                out.truncate(first);
                // The message made whole goes back before the read's rest.
                self.tail = std::mem::take(&mut self.done);
                return LeaseRead::GiveBack { from };
            }
            self.tail.reserve_exact(left.len());
            self.tail.extend_from_slice(left);
            self.since = Some(now);
            self.counts.touched = true;
        }
        if let Some(r) = &done {
            self.counts.rx_msgs += 1;
            self.counts.rx_bytes += done_len as u64;
            self.counts.rx_delivered += (r.end - r.start) as u64;
            self.counts.last_len = done_len;
        }
        self.count(first, out, taken);
        LeaseRead::Serve { done, from }
    }

    /// The message [`LeaseRead::Serve`] said was made whole (its wire bytes;
    /// the caller serves the range it was given of them).
    pub fn take_done(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.done)
    }

    /// `msgs` whole replies, `bytes` in all, were written to the psock.
    pub fn wrote(&mut self, msgs: u32, bytes: usize) {
        self.counts.tx_msgs += u64::from(msgs);
        self.counts.tx_bytes += bytes as u64;
    }

    /// A write of the lease's replies fell short and the rest waits with
    /// its worker, which keeps the lease (counted in
    /// `MuxStats::lease_backlogs` at the next sync).
    pub fn backed_up(&mut self) {
        self.counts.backlogs += 1;
    }
}

/// Stands in for a leased psock's parser in its stream parser: the mux
/// feeds a leased psock nothing, so it is never asked to parse.
struct LentParser {
    name: String,
}

impl Parser for LentParser {
    fn parse(&mut self, _buf: &[u8]) -> Parse {
        Parse::NeedMore(1)
    }
    fn name(&self) -> &str {
        &self.name
    }
}

impl Mux {
    /// Lend psock `p` to the worker that serves socket `s`, if nothing else
    /// involves it now (see the module's top). `None`: serve it as usual.
    pub fn lease(&mut self, p: PsockId, s: SockId) -> Option<Lease> {
        self.lease_keeping(p, s, 0)
    }

    /// [`Mux::lease`], also when the psock holds the start of a message of
    /// at most `keep` bytes (a stream of messages that reads cut): the lease
    /// keeps it, its assembly deadline with it, and completes it from the
    /// next reads (`Lease::frame_read`).
    pub fn lease_keeping(&mut self, p: PsockId, s: SockId, keep: usize) -> Option<Lease> {
        self.lease_taking(p, s, keep, 0, 0)
    }

    /// [`Mux::lease_keeping`], also when the psock's queue holds replies of
    /// `s` not yet written (a connection whose peer reads slowly), at most
    /// `unsent` bytes of them, none out: the lease takes them
    /// ([`Lease::take_unsent`]), for its worker to write before anything
    /// else. They leave the socket's send buffer and its counts (the lease
    /// counts them when written, as its own replies); a message written in
    /// part leaves the rest. Not when any queued message is another
    /// socket's or held back by a batch of its socket.
    ///
    /// `held`: messages of `p` taken from a holding socket and not settled
    /// yet that the caller has in hand and answers on the lease itself
    /// (a heavy connection's messages in its worker's lane, whose verdicts
    /// come back to that worker): lent only when the psock has exactly that
    /// many ([`Mux::rx_holds`]), none held elsewhere; their settles come
    /// as usual ([`Mux::rx_settle`]).
    pub fn lease_taking(&mut self, p: PsockId, s: SockId, keep: usize, unsent: usize, held: u64) -> Option<Lease> {
        let mut lease = self.lend(p, s, keep, unsent, held)?;
        if lease.keeps() {
            // The deadline went with the bytes.
            self.sync_deadline(p);
        }
        self.take_queue(&mut lease);
        Some(lease)
    }

    /// Move lent psock `lease.psock`'s queued replies (all `lease.sock`'s,
    /// checked by `lend`) to the lease, undoing what queueing them counted.
    fn take_queue(&mut self, lease: &mut Lease) {
        let (p, s) = (lease.psock, lease.sock);
        let Some(ps) = self.psocks.get_mut(p.index, p.generation) else { return };
        if ps.tx_queue.is_empty() {
            return;
        }
        let (mut len, mut rest, mut msgs) = (0usize, 0usize, 0u32);
        for m in ps.tx_queue.drain(..) {
            ps.tx_addr_bytes -= m.data.len();
            len += m.data.len();
            rest += m.data.len() - m.sent;
            msgs = msgs.saturating_add(m.msgs);
            lease.unsent.push((m.data.slice(m.sent..), m.msgs));
        }
        // Placed, and counted as the socket's sends, again when the lease
        // writes them (`lease_sync`); the part written before stays counted.
        if let Some(sh) = self.sk.share_mut(p) {
            sh.placed -= u64::from(msgs);
            sh.addr_gone(len);
        }
        self.uncharge(s, len, msgs);
        if let Some(sock) = self.sk.socks.get_mut(s.index, s.generation) {
            sock.stats.tx_msgs -= u64::from(msgs);
            sock.stats.tx_bytes -= rest as u64;
        }
    }

    fn lend(&mut self, p: PsockId, s: SockId, keep: usize, unsent: usize, held: u64) -> Option<Lease> {
        let share = self.sk.share(p)?;
        let (sk_holds, unreserved) = (share.holds, share.tx_kcm.is_none());
        let Mux { psocks, sk: super::Sockets { socks, hold, .. }, config, .. } = self;
        let ps = psocks.get_mut(p.index, p.generation)?;
        let sock = socks.get(s.index, s.generation)?;
        // Replies queued: all of `s` (addressed to this psock, none held
        // back by a batch), within `unsent` bytes, and not so many that the
        // psock stopped being read (its peer reads none: a lease would
        // read it again).
        let queue_takes = ps.tx_queue.is_empty()
            || (unsent > 0
                && ps.tx_addr_bytes < super::psock::backlog_pause(config)
                && !sock.held_psocks.contains(&p)
                && ps.tx_queue.iter().all(|m| m.addressed() && m.owner == s)
                && ps.tx_queue.iter().map(|m| m.data.len() - m.sent).sum::<usize>() <= unsent);
        let steered_here = config.steering == Steering::Affinity
            && ps.affinity.is_some()
            && sock.affinity == ps.affinity
            && sock.on_waiters
            && sock.rx_queue.is_empty();
        let quiet = ps.life == Life::Open
            && ps.leased.is_none()
            && ps.ready.is_none()
            && sk_holds == held
            && ps.below == 0
            // (An assembly deadline runs only for a message begun.)
            && (ps.timer.is_none() || ps.stream.buffered() > 0)
            && ps.handshake_deadline.is_none()
            && ps.record_deadline.is_none()
            && ps.mem == super::limits::MemState::Reading
            && queue_takes
            && matches!(ps.tx, Tx::Idle | Tx::Kicked)
            && unreserved
            && ps.stream.buffered() <= keep
            && !ps.stream.is_lent()
            // Large messages (as framed so far, or predicted from the last)
            // are read straight into the assembly buffer, each read ending
            // on a message boundary; a lease would read them into its
            // worker's buffer and, the message not fitting what it keeps,
            // give itself back with all of it to copy, each message.
            && !ps.stream.would_lend()
            && !ps.stream.is_stopped()
            && ps.stream.parser().frames_in_place();
        if !steered_here || !quiet || queued_anywhere(socks, hold, p) {
            return None;
        }
        // Only the start of one message, as framed so far; else not now.
        let (tail, since) = ps.stream.take_partial(keep)?;
        let name = ps.stream.parser().name().to_string();
        let parser = ps.stream.swap_parser(Box::new(LentParser { name }));
        ps.leased = Some(s);
        ps.lease_revoked = false;
        // Nobody else writes it meanwhile: a send to it waits on its queue.
        ps.tx = Tx::Lent;
        let max_len = ps.stream.limits().max_msg_size;
        let whole = parser.delivers_whole();
        self.counters.leases += 1;
        Some(Lease {
            psock: p,
            sock: s,
            parser,
            max_len,
            whole,
            counts: Counts::default(),
            since: since.filter(|_| !tail.is_empty()),
            held: false,
            tail,
            done: Vec::new(),
            timeout: ps.stream.limits().assembly_timeout,
            unsent: Vec::new(),
        })
    }

    /// Add what the lease did since its last sync to the statistics (and
    /// the psock's idle clock). Returns whether it may go on: `false` when
    /// the psock is gone or its lease was revoked; then the caller gives it
    /// back ([`Mux::unlease`]; a gone psock's lease is simply dropped).
    pub fn lease_sync(&mut self, lease: &mut Lease, now: Timestamp) -> bool {
        self.note_time(now);
        let c = std::mem::take(&mut lease.counts);
        self.counters.lease_backlogs += c.backlogs;
        let p = lease.psock;
        let Some(ps) = self.psocks.get_mut(p.index, p.generation) else { return false };
        if ps.leased.is_none() {
            return false;
        }
        if c.touched {
            ps.last_active = now;
        }
        // (Bytes with no whole message: a reply written in part.)
        if c.rx_msgs > 0 || c.tx_msgs > 0 || c.tx_bytes > 0 {
            ps.last_active = now;
            ps.stream.count_framed(c.rx_msgs, c.rx_bytes, c.last_len);
            add_tx(&mut ps.stats, c.tx_msgs, c.tx_bytes);
            // Told to its share as the mux's own framing and placing are.
            let received = ps.stream.stats().msgs;
            if let Some(sh) = self.sk.share_mut(p) {
                sh.placed += c.tx_msgs;
                sh.received = received;
            }
            if let Some(sock) = self.sk.socks.get_mut(lease.sock.index, lease.sock.generation) {
                sock.stats.rx_msgs += c.rx_msgs;
                sock.stats.rx_bytes += c.rx_delivered;
                sock.stats.tx_msgs += c.tx_msgs;
                sock.stats.tx_bytes += c.tx_bytes;
            }
        }
        !ps.lease_revoked
    }

    /// Take the lease back: the psock is the mux's again (what was sent to
    /// it meanwhile is raised for writing, `PsockTransmit`). What the lease
    /// kept of a message is fed to it as read when its first byte was: its
    /// assembly deadline runs from then, as if the mux had framed it.
    pub fn unlease(&mut self, mut lease: Lease, now: Timestamp) {
        self.lease_sync(&mut lease, now);
        let (p, s) = (lease.psock, lease.sock);
        let unsent = std::mem::take(&mut lease.unsent);
        let Some(ps) = self.psocks.get_mut(p.index, p.generation) else { return };
        if ps.leased.is_none() {
            return;
        }
        ps.stream.swap_parser(lease.parser);
        ps.leased = None;
        ps.lease_revoked = false;
        if ps.tx == Tx::Lent {
            ps.tx = Tx::Idle;
        }
        self.counters.lease_returns += 1;
        if !lease.tail.is_empty() {
            // Shorter than the size limit, and the psock held nothing:
            // taken whole. Fed as read at its first byte's time (the
            // assembly deadline's origin), which must not make the psock
            // look idle since then.
            let active = ps.last_active;
            // (A held deadline restarts here: the mux's own holds it again
            // while the psock's replies stay backed up.)
            let at = if lease.held { now } else { lease.since.unwrap_or(now) };
            let fed = self.feed(p, &lease.tail, at);
            debug_assert!(fed.is_ok(), "kept bytes refused: {fed:?}");
            if let Some(ps) = self.psocks.get_mut(p.index, p.generation) {
                ps.last_active = ps.last_active.max(active);
            }
        }
        // Replies it took from the queue and its worker never had: back
        // first on the queue, as they were.
        for (chunk, msgs) in unsent.into_iter().rev().filter(|(c, _)| !c.is_empty()) {
            self.unsent_first(p, s, chunk, msgs);
        }
        self.kick(p);
    }

    /// [`Mux::unlease`] with replies its holder has not written, `unsent`:
    /// chunks of whole replies of the lease's socket, in order, the first
    /// perhaps begun (after a short write: the bytes of it written were the
    /// lease's, [`Lease::wrote`]). They go first on the psock's queue as
    /// they are (no copy into one), each counted as a send of its replies,
    /// for the driver to write when the connection takes more. A write that
    /// failed is then [`Mux::tx_failed`], which drops them as any addressed
    /// message.
    pub fn unlease_queued(&mut self, mut lease: Lease, unsent: Vec<(Bytes, u32)>, now: Timestamp) {
        // Behind what it took from the queue and did not write (older):
        // `unlease` puts them all back.
        lease.unsent.extend(unsent);
        self.unlease(lease, now);
    }

    /// Put `chunk` (`msgs` whole replies of socket `s`, none of its bytes
    /// written) first on psock `p`'s queue, charged and counted as a send
    /// of them.
    fn unsent_first(&mut self, p: PsockId, s: SockId, chunk: Bytes, msgs: u32) {
        let Mux { psocks, sk, .. } = self;
        let Some(ps) = psocks.get_mut(p.index, p.generation) else { return };
        let Some((sock, sh)) = sk.sock_and_share(s, p) else { return };
        let len = chunk.len();
        // Counted as `send_msgs_to` counts them.
        sock.charge(len, msgs);
        sh.place(msgs, len);
        ps.tx_addr_bytes += len;
        ps.tx_queue.push_front(super::TxMsg::new(chunk, s, super::Placed::Addressed, msgs));
    }

    /// Whether psock `p` is lent to its worker now.
    pub fn leased(&self, p: PsockId) -> bool {
        self.psocks.get(p.index, p.generation).is_some_and(|ps| ps.leased.is_some())
    }

    /// Something besides the worker involves leased psock `p`: ask for the
    /// lease back (once).
    pub(super) fn revoke(&mut self, p: PsockId) {
        if let Some(ps) = self.psocks.get_mut(p.index, p.generation) {
            if ps.leased.is_some() && !ps.lease_revoked {
                ps.lease_revoked = true;
                self.events.push_back(Event::PsockLeaseRevoked(p));
            }
        }
    }

    /// Revoke every lease that delivers to socket `s` (how it takes
    /// messages changed). A pass over the psocks: for rare calls only.
    pub(super) fn revoke_sock(&mut self, s: SockId) {
        let leased: Vec<PsockId> = self
            .psocks
            .iter()
            .filter(|(_, _, ps)| ps.leased == Some(s))
            .map(|(i, g, _)| PsockId { index: i, generation: g })
            .collect();
        for p in leased {
            self.revoke(p);
        }
    }
}

/// Whether a message of `p` waits in a socket's queue (another worker's,
/// where steering spilled it) or the mux's hold queue: the lease would
/// answer later messages first. Refused as well when a queue is long, so
/// the look costs at most a few dozen comparisons per socket.
fn queued_anywhere(
    socks: &super::Slab<super::Sock>,
    hold: &std::collections::VecDeque<super::RxMsg>,
    p: PsockId,
) -> bool {
    const LOOK: usize = 64;
    hold.len() > LOOK
        || hold.iter().any(|m| m.psock == p)
        || socks.iter().any(|(_, _, s)| s.rx_queue.len() > LOOK || s.rx_queue.iter().any(|m| m.psock == p))
}

fn add_tx(stats: &mut PsockStats, msgs: u64, bytes: u64) {
    stats.tx_msgs += msgs;
    stats.tx_bytes += bytes;
}
