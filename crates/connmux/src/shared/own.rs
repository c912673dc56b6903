//! A worker's own hand-off state (`Own`): messages its reads handed
//! straight to its serving socket, writes it made and has not told the core
//! of, and the psocks lent to it (leases) with what they keep; and the feeds
//! of a read's bytes into the core on its behalf.

use rustc_hash::FxHashMap;
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use connmux_core::mux::{Event, PsockId, SockId};
use connmux_core::{Bytes, Timestamp};

use super::{Core, PsockRt, Shared};

/// A worker's own hand-off between its reads, its event dispatch and its
/// in-place `serve`: the worker keeps it (in its serving buffers) and passes
/// it down explicitly; nothing else sees it.
#[derive(Default)]
pub(crate) struct Own {
    /// The socket this worker serves in place, and the most messages a read
    /// may put straight on it (`serve::SERVE_BATCH`). `None`: it does not
    /// serve, and reads queue their messages as any feed does.
    pub serve: Option<(SockId, usize)>,
    /// That socket became readable in this worker's dispatch and nobody has
    /// looked since (the worker serves, or raises the eventfd at the end of
    /// its pass).
    pub pending: bool,
    /// Messages reads handed straight to that socket (see [`feed_read`]),
    /// not yet served.
    pub direct: Vec<(Bytes, PsockId)>,
    /// Chunks this worker wrote whole and has not told the core of yet
    /// ([`Shared::write_owned`]): completed in its next hold of the core
    /// lock, at the latest before it waits ([`Shared::complete_owned`]).
    pub wrote: Vec<(Arc<PsockRt>, usize)>,
    /// Whether this worker takes leases (`Tuning::lease`, on a driver that
    /// lends); TLS psocks' too (the driver decrypts their reads itself).
    pub can_lease: bool,
    /// The psocks lent to this worker (`Mux::lease`): read, framed,
    /// answered and written here with no hold of the core lock.
    pub leases: FxHashMap<PsockId, Leased>,
    /// Leased psocks that did something since the last hold, with the
    /// replies (messages, bytes) written for them: synced in the next hold
    /// ([`Own::hold`]; see [`Own::hold_can_wait`]).
    pub lease_used: Vec<(PsockId, u32, usize)>,
    /// Psocks served in place this pass, to lend to this worker in the
    /// pass's hold if nothing else involves them then.
    pub lease_try: Vec<Arc<PsockRt>>,
    /// The clock reading (`connmux_sys::clock::now_nanos`) of this
    /// worker's latest read of a lent psock.
    pub read_at: u64,
    /// When `lease_used` was last told to the core (same clock).
    pub synced_at: u64,
    /// What the leases keep of messages begun, and may.
    pub keep: Keep,
    /// What the leases' backlogs hold of replies their connections have
    /// not taken, and may.
    pub backlog: BacklogRoom,
    /// Connections whose lease's backlog began since the driver last
    /// looked: before its next wait the driver watches their writability
    /// (epoll: write interest; io_uring: a `POLLOUT` poll). The event writes
    /// the backlog (`serve::write_backlog`), or, where the lease has gone
    /// back meanwhile, flushes the psock's queue the core's way.
    pub to_watch: Vec<Arc<PsockRt>>,
}

/// Bytes of replies a lent psock holds when its connection takes less than
/// was written: the lease stays, its worker writes them when the connection
/// takes more, and the replies of its next reads go behind them. Past this
/// (a peer that reads slowly or not at all) the lease goes back with all of
/// it on the psock's queue, where the core's bounds on a connection's
/// replies (`psock_sndbuf`) apply: a few times what a loopback connection
/// takes in one write.
pub(crate) const LEASE_BACKLOG: usize = 256 << 10;

/// Bytes of such replies all of one worker's leases hold together (the
/// core's memory budget does not see them): 16 connections at
/// [`LEASE_BACKLOG`].
pub(crate) const LEASE_BACKLOG_TOTAL: usize = 4 << 20;

/// The bytes of replies a worker's leases hold because their connections
/// took less than was written ([`Backlog`]): bounded per lease and in all
/// ([`LEASE_BACKLOG`], [`LEASE_BACKLOG_TOTAL`]; the core's budget does
/// not see them). Never for TLS psocks (their records wait in their
/// sessions, flushed the core's way).
#[derive(Default)]
pub(crate) struct BacklogRoom {
    /// What they hold now.
    pub held: usize,
}

impl BacklogRoom {
    /// Whether `len` more bytes fit on lease `l`'s backlog.
    fn fits(&self, l: &Leased, len: usize) -> bool {
        // (A TLS psock's records wait in its session, flushed the core's way.)
        l.rt.tls.is_none() && l.backlog.bytes() + len <= LEASE_BACKLOG && self.held + len <= LEASE_BACKLOG_TOTAL
    }

    /// What a new lease of `rt` may hold (0 for a TLS psock).
    fn room_for(&self, rt: &PsockRt) -> usize {
        match rt.tls {
            Some(_) => 0,
            None => LEASE_BACKLOG.min(LEASE_BACKLOG_TOTAL.saturating_sub(self.held)),
        }
    }
}

/// Replies of a lent psock that its connection has not taken yet (a write
/// fell short), in order: its worker writes them when the connection takes
/// more, and the replies of the lease's next reads go behind them. A
/// connection that would block keeps its lease while this stays within
/// [`BacklogRoom`]; past it (a peer that reads slowly or not at all) the
/// lease goes back with all of it first on the psock's queue, where the
/// core's own bounds on a connection's replies apply.
///
/// ```text
///             a write falls short, within room
///   Empty ─────────────────────────────────────► Waiting(chunks)
///     ▲   ◄─────────────────────────────────────   │  │ more replies: behind,
///     │     the connection took all of it           │◄─┘ within room
///     │                                             │
///     └── (the lease goes back: the chunks first ◄──┘ past room, a failed
///          on the psock's queue, as they are)        write, any give-back
/// ```
#[derive(Default)]
pub(crate) struct Backlog {
    /// What is left of each chunk written short or queued behind.
    chunks: VecDeque<Bytes>,
    /// The whole replies in each chunk (counted once the chunk is out).
    msgs: VecDeque<u32>,
    /// Bytes in `chunks`.
    bytes: usize,
}

impl Backlog {
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }

    /// Bytes waiting.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn push(&mut self, chunk: Bytes, msgs: u32) {
        if chunk.is_empty() {
            return;
        }
        self.bytes += chunk.len();
        self.chunks.push_back(chunk);
        self.msgs.push_back(msgs);
    }

    /// The chunks in order, for one write.
    pub fn chunks(&mut self) -> &[Bytes] {
        self.chunks.make_contiguous()
    }

    /// `n` bytes of the chunks went out: returns the whole replies that
    /// did (those of every chunk now all out).
    pub fn advance(&mut self, mut n: usize) -> u32 {
        self.bytes -= n.min(self.bytes);
        let mut done = 0u32;
        while n > 0 {
            let Some(front) = self.chunks.front_mut() else { break };
            if n < front.len() {
                bytes::Buf::advance(front, n);
                break;
            }
            n -= front.len();
            self.chunks.pop_front();
            done = done.saturating_add(self.msgs.pop_front().unwrap_or(0));
        }
        done
    }

    /// Its chunks with their whole replies, in order, emptied (for the
    /// core's queue when the lease goes back, as they are).
    fn take_all(&mut self) -> Vec<(Bytes, u32)> {
        self.bytes = 0;
        self.chunks.drain(..).zip(self.msgs.drain(..)).collect()
    }
}

/// Bytes of a message begun that a lent psock keeps when a read ends inside
/// it (`connmux_core::mux::Lease::frame_read`): the next reads complete it
/// on the lease. A larger message (or a longer start) gives the lease back
/// and goes the core's way, where a message of 16 KiB or more is read
/// straight into its assembly buffer (and a connection whose last message
/// was that large is not lent until a smaller one comes: its reads then
/// each bring one message, with no copy).
pub(crate) const LEASE_KEEP: usize = 16 << 10;

/// Bytes all of one worker's leases keep together: a message begun is kept
/// only while all of it fits beside what the others keep, else its lease
/// goes back (the core's memory budget does not see kept bytes, so the most
/// memory in all is `mem_limit` plus this per worker): 64 messages at
/// [`LEASE_KEEP`].
pub(crate) const LEASE_KEEP_TOTAL: usize = 1 << 20;

/// The bytes a worker's leases keep of messages a read ended inside
/// (`connmux_core::mux::Lease::frame_read`): bounded per lease and in all
/// ([`LEASE_KEEP`], [`LEASE_KEEP_TOTAL`]; the core's budget does not see
/// them), and each only until its assembly deadline, which the worker
/// keeps by giving the lease back in its hold ([`Own::hold`]).
#[derive(Default)]
pub(crate) struct Keep {
    /// What they keep now.
    pub kept: usize,
    /// No kept message's deadline is earlier than this (`None`: none runs).
    pub due: Option<Timestamp>,
}

impl Keep {
    /// The most a lease keeping `kept` now may keep after its next read.
    #[inline]
    pub fn room_for(&self, kept: usize) -> usize {
        LEASE_KEEP.min(LEASE_KEEP_TOTAL.saturating_sub(self.kept.saturating_sub(kept)))
    }

    /// A lease's read took what it keeps from `before` to `after` bytes,
    /// the message's assembly deadline `due` (`Lease::kept_due`).
    #[inline]
    pub fn changed(&mut self, before: usize, after: usize, due: Option<Timestamp>) {
        self.kept = self.kept.saturating_sub(before) + after;
        if let Some(due) = due {
            if self.due.is_none_or(|u| due < u) {
                self.due = Some(due);
            }
        }
    }
}

/// Entries of `Own::lease_used` past which a worker tells the core at once
/// (several lent psocks taking turns add one a read).
const LEASE_USED_MAX: usize = 64;

/// A psock lent to a worker, with its connection.
pub(crate) struct Leased {
    pub lease: connmux_core::mux::Lease,
    pub rt: Arc<PsockRt>,
    /// Replies the connection has not taken yet.
    pub backlog: Backlog,
}

impl Own {
    /// Whether reads handed messages to the serving socket that `serve` has
    /// not taken yet.
    pub fn has_direct(&self) -> bool {
        !self.direct.is_empty()
    }

    /// Whether the serving socket became readable since the last call.
    pub fn take_pending(&mut self) -> bool {
        std::mem::replace(&mut self.pending, false)
    }

    /// A worker's hold of the core lock once per pass, before it waits:
    /// the writes it made whole ([`Shared::write_owned`]), the counts of
    /// its leased psocks that did something (a revoked one is given back),
    /// and leases for the psocks it served that nothing else involves now.
    ///
    /// `lane_held`: a psock's messages the core holds that this worker's
    /// lane has (their verdicts come back here: lent all the same).
    pub fn hold(&mut self, core: &mut Core, now: Timestamp, lane_held: impl Fn(PsockId) -> u64) {
        if !self.wrote.is_empty() {
            Shared::complete_owned(core, self);
        }
        // (Taken out for the loop, its memory kept: a give-back looks in it.)
        let mut used = std::mem::take(&mut self.lease_used);
        for (p, msgs, bytes) in used.drain(..) {
            let Some(l) = self.leases.get_mut(&p) else { continue };
            l.lease.wrote(msgs, bytes);
            if !core.mux.lease_sync(&mut l.lease, now) {
                self.unlease(core, p, now);
            }
        }
        self.lease_used = used;
        if self.keep.due.is_some_and(|t| t <= now) {
            self.expire_kept(core, now);
        }
        let mut tries = std::mem::take(&mut self.lease_try);
        for rt in tries.drain(..) {
            self.lend(core, &rt, lane_held(rt.id));
        }
        self.lease_try = tries;
    }

    /// Lend `rt` to this worker now if nothing else involves it (the core
    /// decides: `Mux::lease_taking`) and it serves: in its pass's hold, or
    /// under the hold a read of it that would go the core's way takes
    /// (`lend_before_read`). Returns whether it is lent.
    ///
    /// `held`: its messages the core holds that this worker's lane has
    /// (their verdicts come back here: lent all the same).
    pub fn lend(&mut self, core: &mut Core, rt: &Arc<PsockRt>, held: u64) -> bool {
        let Some((sock, _)) = self.serve else { return false };
        // Not while a message of it waits here: it would be passed.
        if self.leases.contains_key(&rt.id) || self.direct.iter().any(|(_, q)| *q == rt.id) {
            return false;
        }
        // A message begun comes too, within what the leases may keep, and
        // replies its queue holds, within a quarter of what its backlog may
        // hold (written first, when the connection takes more: watched
        // before the next wait). A quarter: a lease taken nearly full goes
        // back at its next short write, with all of it, and a slow reader's
        // connection would be lent and given back over and over.
        let unsent = self.backlog.room_for(rt) / 4;
        let Some(mut lease) = core.mux.lease_taking(rt.id, sock, self.keep.room_for(0), unsent, held) else {
            return false;
        };
        self.keep.changed(0, lease.kept(), lease.kept_due());
        rt.lease_revoked.store(false, Ordering::Relaxed);
        let mut backlog = Backlog::default();
        for (chunk, msgs) in lease.take_unsent() {
            self.backlog.held += chunk.len();
            backlog.push(chunk, msgs);
        }
        if !backlog.is_empty() {
            // (Counted at the lease's next sync.)
            lease.backed_up();
            self.lease_used.push((rt.id, 0, 0));
            self.to_watch.push(rt.clone());
        }
        self.leases.insert(rt.id, Leased { lease, rt: rt.clone(), backlog });
        true
    }

    /// Whether a pass may go without its hold ([`Own::hold`]) at clock
    /// reading `now`: no write waits to be completed, no psock to lend, and
    /// what the leases did may wait (told no longer than `every` ago, and
    /// not piling up).
    pub fn hold_can_wait(&self, now: u64, every: u64) -> bool {
        self.wrote.is_empty()
            && self.lease_try.is_empty()
            && (self.lease_used.is_empty()
                || (now.saturating_sub(self.synced_at) < every && self.lease_used.len() < LEASE_USED_MAX))
    }

    /// Note that leased psock `p` did something this pass, and wrote
    /// `msgs` replies of `bytes` (told to the core at a later hold).
    #[inline]
    pub fn lease_used(&mut self, p: PsockId, msgs: u32, bytes: usize) {
        match self.lease_used.last_mut() {
            Some((q, m, b)) if *q == p => {
                *m = m.saturating_add(msgs);
                *b += bytes;
            }
            _ => self.lease_used.push((p, msgs, bytes)),
        }
    }

    /// Give psock `p`'s lease back, if this worker holds it (with what it
    /// did since the last hold).
    pub fn unlease(&mut self, core: &mut Core, p: PsockId, now: Timestamp) {
        self.unlease_rt(core, p, now);
    }

    /// [`Own::unlease`] in a hold of its own, at `at` (a clock reading),
    /// the core's events appended to `events`: what the psock reads next
    /// goes the usual way.
    pub fn give_back(&mut self, sh: &Shared, p: PsockId, at: u64, events: &mut Vec<Event>) {
        let mut core = sh.lock();
        self.unlease(&mut core, p, sh.timestamp(at));
        core.drain_events(events);
    }

    /// [`Own::unlease`] returning the connection (the caller goes on with it).
    pub fn unlease_rt(&mut self, core: &mut Core, p: PsockId, now: Timestamp) -> Option<Arc<PsockRt>> {
        let l = self.take_lease(p)?;
        Some(Own::return_lease(core, l, now))
    }

    /// Give lease `l` (taken from this worker) back to the core: its
    /// backlog first on the psock's queue, for the core to write when the
    /// connection takes more (its writability is watched already).
    pub fn return_lease(core: &mut Core, mut l: Leased, now: Timestamp) -> Arc<PsockRt> {
        match l.backlog.is_empty() {
            true => core.mux.unlease(l.lease, now),
            false => core.mux.unlease_queued(l.lease, l.backlog.take_all(), now),
        }
        l.rt
    }

    /// Queue `chunk` (`msgs` whole replies, not yet written) on lease `p`'s
    /// backlog, if it is there and has room (`Err`: the chunk, to give back
    /// with the lease); `Ok`: whether the backlog was empty before it (the
    /// caller then watches the connection's writability).
    pub fn back_up(&mut self, p: PsockId, chunk: Bytes, msgs: u32) -> Result<bool, Bytes> {
        let len = chunk.len();
        let Some(l) = self.leases.get_mut(&p) else { return Err(chunk) };
        if len == 0 {
            return Ok(false); // nothing waits
        }
        if !self.backlog.fits(l, len) {
            return Err(chunk);
        }
        self.backlog.held += len;
        let was_empty = l.backlog.is_empty();
        l.backlog.push(chunk, msgs);
        Ok(was_empty)
    }

    /// Queue `chunks` (`len` bytes in all, which [`Own::backlog_fits`]
    /// said fit) on lease `p`'s backlog, each as it is: one look-up for
    /// them all.
    pub fn back_up_all(&mut self, p: PsockId, len: usize, chunks: impl Iterator<Item = (Bytes, u32)>) {
        let Some(l) = self.leases.get_mut(&p) else { return };
        debug_assert!(self.backlog.fits(l, len), "checked by the caller");
        self.backlog.held += len;
        for (chunk, msgs) in chunks {
            l.backlog.push(chunk, msgs);
        }
    }

    /// Whether `len` more bytes fit on lease `p`'s backlog ([`BacklogRoom`]).
    pub fn backlog_fits(&self, p: PsockId, len: usize) -> bool {
        self.leases.get(&p).is_some_and(|l| self.backlog.fits(l, len))
    }

    /// Give back every lease whose kept message's assembly deadline has
    /// passed at `now`: the core holds its bytes as read at their time, and
    /// its own deadline (already due) times the message out. A scan of the
    /// leases, at most once per assembly timeout.
    ///
    /// A lease whose replies are backed up is not read by this worker: its
    /// deadline is held instead (the time is the server's, not the peer's),
    /// and restarts when the backlog is written (`serve::write_backlog`).
    #[cold]
    fn expire_kept(&mut self, core: &mut Core, now: Timestamp) {
        let late: Vec<PsockId> =
            self.leases.iter().filter(|(_, l)| l.lease.kept_due().is_some_and(|t| t <= now)).map(|(p, _)| *p).collect();
        for p in late {
            match self.leases.get_mut(&p) {
                Some(l) if !l.backlog.is_empty() => l.lease.hold_kept(),
                _ => self.unlease(core, p, now),
            }
        }
        self.keep.due = self.leases.values().filter_map(|l| l.lease.kept_due()).min();
    }

    /// Take lease `p` back from this worker (to give it back to the core):
    /// what it did since the last hold is in it.
    pub fn take_lease(&mut self, p: PsockId) -> Option<Leased> {
        let mut l = self.leases.remove(&p)?;
        self.keep.kept = self.keep.kept.saturating_sub(l.lease.kept());
        self.backlog.held = self.backlog.held.saturating_sub(l.backlog.bytes());
        for (q, msgs, bytes) in self.lease_used.iter_mut() {
            if *q == p {
                l.lease.wrote(*msgs, *bytes);
                (*msgs, *bytes) = (0, 0);
            }
        }
        Some(l)
    }
}

/// Feed bytes read from a psock: straight to the worker's own serving socket
/// where steering sends them there and its queue is empty (held in
/// `own.direct` for its next `serve`, at most one serve batch), else queued.
pub(crate) fn feed_read(
    core: &mut Core,
    own: &mut Own,
    p: PsockId,
    data: &[u8],
    now: Timestamp,
) -> Result<(), connmux_core::mux::MuxError> {
    match own.serve {
        Some((sock, batch)) => {
            let mut d = connmux_core::mux::Direct { sock, out: &mut own.direct, limit: batch };
            core.mux.feed_direct(p, data, now, &mut d)
        }
        None => core.mux.feed(p, data, now),
    }
}

/// [`feed_read`] that also frames whole messages where they lie in `data`
/// (`Mux::feed_in_place`) for the caller to serve at once: their runs go to
/// `runs`. Not while messages of this psock wait in the direct list (they
/// are older and are served first, by `serve`).
pub(crate) fn feed_read_in_place(
    core: &mut Core,
    own: &mut Own,
    p: PsockId,
    data: &[u8],
    now: Timestamp,
    runs: &mut Vec<connmux_core::run::Run>,
) -> Result<(), connmux_core::mux::MuxError> {
    match own.serve {
        Some((sock, batch)) => {
            let limit = if own.direct.iter().any(|(_, q)| *q == p) { 0 } else { batch };
            let mut d = connmux_core::mux::Direct { sock, out: &mut own.direct, limit: batch };
            core.mux.feed_in_place(p, data, now, &mut d, limit, runs)
        }
        None => core.mux.feed(p, data, now),
    }
}

/// [`feed_read`] for bytes read straight into a psock's assembly buffer
/// (`Mux::rx_lend`): the loan goes back, its bytes taken the same way.
pub(crate) fn commit_read(
    core: &mut Core,
    own: &mut Own,
    loan: connmux_core::mux::RxLoan,
    now: Timestamp,
) -> Result<(), connmux_core::mux::MuxError> {
    match own.serve {
        Some((sock, batch)) => {
            let mut d = connmux_core::mux::Direct { sock, out: &mut own.direct, limit: batch };
            core.mux.rx_commit_direct(loan, now, &mut d)
        }
        None => core.mux.rx_commit(loan, now),
    }
}
