//! Limits no single peer can outgrow: the mux-wide memory budget, the idle
//! timeout, and the handshake and partial-record deadlines of the layer below
//! the parser.
//!
//! # Memory budget
//!
//! The per-psock bounds (`max_msg_size + psock_rx_buf` received,
//! `psock_sndbuf` of replies) hold per connection; N connections may hold N
//! times them. `MuxConfig::mem_limit` bounds the sum, [`Mux::memory_used`],
//! which counts memory as the process holds it: an assembly buffer's
//! allocation (room reserved for a message's rest is memory; a page reused
//! from an earlier buffer is resident), not only the bytes in it, and a
//! loan of it is no larger than the budget's room:
//!
//! ```text
//!             over the limit, holding at least MEM_FLOOR
//!   Reading ──────────────────────────────────────────► Paused { since, held }
//!      ▲                                                  │          │
//!      └──────── total at or below the low mark ──────────┘          │
//!                                                                    │ still over the low mark
//!                                                                    │ after mem_grace, holding
//!                                                                    ▼ no less than `held`
//!                                                     aborted: RxError::MemLimit
//! ```
//!
//! - Over the limit, the holders (received bytes held plus replies queued
//!   for them) of at least [`MEM_FLOOR`] are paused, largest first; a
//!   psock that reaches it while the mux is still over is paused when it is
//!   fed. A paused psock is not read (`rx_capacity` 0), so TCP pushes back
//!   on its peer; the others, which hold little (a request that is answered
//!   at once holds nothing), go on being read and answered. (Pausing only
//!   enough of the largest to cover the excess lets every other psock grow
//!   until it is the largest: the total then reaches the sum of them all.)
//! - A paused psock that still holds as much after `mem_grace`, while the
//!   total is still over the low mark, is stuck (its message cannot complete
//!   unread, its peer does not read its replies): the largest of those are
//!   aborted until the total is at the low mark (`mem_aborts`,
//!   `PsockFailed(Rx(MemLimit))`, which the runtime turns into a reset). Its
//!   assembly buffer is freed at once.
//!   One that holds less by then (its replies were read) is judged again
//!   one grace later, on what it holds then: a psock holding only the start
//!   of a message it may not read the rest of makes no more progress, and
//!   such psocks alone could keep the total over the low mark for good
//!   (`tests/owners.rs` found it: seven paused psocks each holding a 16 KiB
//!   buffer over a low mark of 95 KB, neither aborted nor resumed).
//! - A psock paused while its assembly buffer is lent (a receive armed
//!   ahead for a message only predicted, which counts whole while out) has
//!   the loan recalled (`PsockRxRecall`): a quiet peer then holds nothing,
//!   and is not taken for a stuck one.
//! - At or below the low mark every paused psock is read again
//!   (`PsockRxResume`).
//!
//! A read is never larger than what is left of the budget (at least
//! [`MEM_FLOOR`]), so the total passes the limit by less than two floors of
//! data per psock still read, in an allocation of at most
//! [`crate::stream::memory_bound`] of that (growth doubles), plus what a
//! driver holds below the parser for it (`set_rx_below`). `MuxStats::mem_peak`
//! is the most the budget counted at any read, to check that against. The
//! check costs O(sockets) per read; a pass over the
//! psocks happens when the total first passes the limit, when it is back at
//! the low mark, and when a grace period ends.
//!
//! # Idle, handshake and record deadlines
//!
//! Rare deadlines, looked for by one pass over the psocks when the earliest
//! may have passed (`scan_next`); an idle psock is looked at again no sooner
//! than a sixteenth of the idle timeout later, so active psocks cost no
//! pass per read.

use std::time::Duration;

use super::hub::Hub;
use super::sockets::ToPsock;
use super::{Event, Life, MuxRef, MuxView, PsockError, PsockId, RxError};
use crate::time::Timestamp;

/// Whether the memory budget lets a psock be read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MemState {
    Reading,
    /// Paused at `since`, holding `held` bytes then.
    Paused {
        since: Timestamp,
        held: usize,
    },
}

/// The read a psock is always allowed while the budget is used up.
pub const MEM_FLOOR: usize = 16 << 10;

/// Pass over the psocks for handshake deadlines at most this often.
const SCAN_FLOOR: Duration = Duration::from_millis(10);

/// How long a loan made ahead for a message only predicted
/// ([`Mux::rx_lend_ahead`]) may stay out with nothing read before it is
/// recalled: a peer that sent a large message and went quiet would keep
/// the memory of the next one it may never send (counted, and in the
/// process), up to half the budget for all such peers. A second: peers
/// that stream large messages send the next well within it; one that
/// comes later is read as the first was (its header, then a loan).
pub const AHEAD_QUIET: Duration = Duration::from_secs(1);

impl Hub {
    /// The budget's low mark: paused psocks read again at or below it.
    #[inline]
    fn mem_low(&self) -> usize {
        self.config.mem_limit / 2
    }

    /// [`Mux::memory_used`] in O(sockets): the psocks' part is kept as a sum.
    #[inline]
    pub(super) fn mem_total(&self) -> usize {
        let socks: usize = self.sk.socks.iter().map(|(_, _, s)| s.rx_mem + s.tx_mem).sum();
        self.rx_held_sum + socks + self.sk.hold_mem
    }

    /// The most one read may take under the budget: what is left of it, but
    /// never less than [`MEM_FLOOR`], so that psocks holding little are
    /// still read and answered while the largest are paused (a read counts
    /// the whole of it as held, a lent buffer from the moment it is lent).
    #[inline]
    pub(super) fn mem_room(&self) -> usize {
        self.config.mem_limit.saturating_sub(self.mem_total()).max(MEM_FLOOR)
    }

    /// Whether psock `p` is paused by the budget.
    #[inline]
    pub(super) fn mem_paused(&self, p: PsockId) -> bool {
        self.sk.share(p).is_some_and(|sh| sh.mem != MemState::Reading)
    }

    /// What of psock `p`'s share holds its reading back: the budget's
    /// pause, and its reply backlog (one look-up, on every read).
    #[inline]
    pub(super) fn holds_back(&self, p: PsockId) -> (bool, usize) {
        self.sk.share(p).map_or((false, 0), |sh| (sh.mem != MemState::Reading, sh.tx.addr_bytes))
    }

    /// Psock `p`'s transmit side for its idle time: whether a writer has a
    /// chunk out, and when it last wrote.
    #[inline]
    pub(super) fn tx_activity(&self, p: PsockId) -> (bool, Timestamp) {
        self.sk.share(p).map_or((false, Timestamp::ZERO), |sh| (sh.tx.state.busy(), sh.tx.last_write))
    }

    /// Psock `p`'s receive side holds `held` now: the sum follows, and
    /// past the limit the budget looks (the psock itself is paused here
    /// when the others were already: `mem_check`). The psock's owner calls
    /// this after every change of what it holds.
    #[inline]
    pub(super) fn count_held(&mut self, p: PsockId, held: usize, now: Timestamp) {
        let Some(sh) = self.sk.share_mut(p) else { return };
        self.rx_held_sum = self.rx_held_sum + held - sh.counted;
        sh.counted = held;
        let total = self.mem_total();
        self.mem_peak = self.mem_peak.max(total);
        if !self.mem_over {
            if total > self.config.mem_limit {
                self.mem_check(now);
            }
            return;
        }
        if total <= self.mem_low() {
            self.mem_check(now);
        } else if total > self.config.mem_limit {
            // Over the limit, every other reader holding much was paused
            // when it was last fed (its replies grow with its requests):
            // this one is the one to look at.
            let sh = self.sk.share_mut(p).expect("looked up above");
            let holding = sh.counted + sh.tx.addr_bytes;
            if sh.mem == MemState::Reading && sh.answers && holding >= MEM_FLOOR {
                sh.mem = MemState::Paused { since: now, held: holding };
                self.counters.mem_pauses += 1;
                let t = now.add(self.config.mem_grace);
                self.mem_next = Some(self.mem_next.map_or(t, |n| n.min(t)));
            }
        }
    }

    /// The budget's decision (module documentation): abort, pause, resume.
    /// What a psock holds, for the ranking, is what its share counts: its
    /// receive side and the replies queued for it.
    pub(super) fn mem_check(&mut self, now: Timestamp) {
        let limit = self.config.mem_limit;
        let low = self.mem_low();
        let mut total = self.mem_total();
        let grace_due = self.mem_next.is_some_and(|t| t <= now);
        if total <= low || (total <= limit && !grace_due) {
            if total <= low && self.mem_over {
                self.mem_resume_all();
            }
            return;
        }
        // Every psock still receiving with what it holds, largest first
        // (ties: lowest id first, so the decision is deterministic).
        let mut ranked: Vec<(usize, PsockId, MemState)> = self
            .sk
            .shares()
            .filter(|(_, sh)| sh.answers)
            .map(|(p, sh)| (sh.counted + sh.tx.addr_bytes, p, sh.mem))
            .collect();
        ranked.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        // 1. Abort the stuck: paused past their grace, holding no less.
        if grace_due {
            for &(held_now, p, state) in &ranked {
                if total <= low {
                    break;
                }
                let MemState::Paused { since, held } = state else { continue };
                if now < since.add(self.config.mem_grace) || held_now == 0 {
                    continue;
                }
                if held_now < held {
                    // It gave something back (its replies were read): judged
                    // again one grace from now, on what it holds now. Left
                    // paused without a new grace, a psock holding only the
                    // start of a message it cannot read the rest of would
                    // wait for good while such psocks keep the total over the
                    // low mark.
                    if let Some(sh) = self.sk.share_mut(p) {
                        sh.mem = MemState::Paused { since: now, held: held_now };
                    }
                    continue;
                }
                total -= self.mem_abort(p, held_now).min(total);
            }
        }
        if total <= low {
            self.mem_resume_all();
            return;
        }
        // 2. Over the limit: pause every reader holding much, largest first.
        if total > limit {
            self.mem_over = true;
            for &(held_now, p, state) in &ranked {
                if held_now < MEM_FLOOR {
                    break;
                }
                if state != MemState::Reading {
                    continue;
                }
                let Some(sh) = self.sk.share_mut(p) else { continue };
                if !sh.answers {
                    continue; // aborted above
                }
                sh.mem = MemState::Paused { since: now, held: held_now };
                self.counters.mem_pauses += 1;
                self.sk.told.push(ToPsock::MemPaused(p));
            }
        }
        let grace = self.config.mem_grace;
        self.mem_next = self
            .sk
            .shares()
            .filter_map(|(_, sh)| match sh.mem {
                MemState::Paused { since, .. } if sh.answers => Some(since.add(grace)),
                _ => None,
            })
            .min()
            // A grace that ran out without an abort (the total fell between
            // the marks) is looked at again one grace later.
            .map(|t| if t <= now { now.add(grace) } else { t });
    }

    /// Abort psock `p` for the budget (its owner stops its receive and
    /// frees its buffer: [`ToPsock::MemAbort`]); returns the bytes that
    /// frees: all its receive side holds but a ready message, which waits
    /// on the hub's list until a socket takes it.
    fn mem_abort(&mut self, p: PsockId, held: usize) -> usize {
        let limit = self.config.mem_limit;
        let ready = self.sk.psocks_ready.iter().find(|m| m.psock == p).map_or(0, |m| m.remaining());
        let Some(sh) = self.sk.share_mut(p) else { return 0 };
        sh.mem = MemState::Reading;
        sh.answers = false;
        let freed = sh.counted.saturating_sub(ready);
        self.counters.mem_aborts += 1;
        self.sk.told.push(ToPsock::MemAbort { p, held, limit });
        freed
    }

    /// Every psock paused by the budget is read again.
    fn mem_resume_all(&mut self) {
        let Hub { sk, .. } = self;
        let mut resumed = Vec::new();
        for (p, sh) in sk.shares_mut() {
            if let MemState::Paused { .. } = sh.mem {
                sh.mem = MemState::Reading;
                resumed.push(p);
            }
        }
        self.sk.told.extend(resumed.into_iter().map(ToPsock::MemResumed));
        self.mem_over = false;
        self.mem_next = None;
    }

    /// After a socket's queue was read: paused psocks may read again.
    #[inline]
    pub(super) fn mem_after_read(&mut self, now: Timestamp) {
        if self.mem_over && self.mem_total() <= self.mem_low() {
            self.mem_check(now);
        }
    }
}

impl<'a> MuxView<'a> {
    /// [`Hub::mem_room`].
    #[inline]
    pub(super) fn mem_room(&self) -> usize {
        self.h.mem_room()
    }

    /// [`Hub::mem_total`].
    #[inline]
    pub(super) fn mem_total(&self) -> usize {
        self.h.mem_total()
    }

    /// [`Mux::memory_used`] as the budget counts it (kept as reads go);
    /// the two are equal at all times.
    #[doc(hidden)]
    pub fn memory_counted(&self) -> usize {
        self.h.memory_counted()
    }

    /// Whether the memory budget is over its limit now (psocks holding much
    /// are paused, reads are at most what is left or [`MEM_FLOOR`]): a
    /// driver whose receives run ahead of the core (io_uring's multishot
    /// receive) then receives one buffer at a time.
    pub fn mem_tight(&self) -> bool {
        self.h.mem_over
    }

    /// Whether psock `p` is paused by the memory budget now.
    pub fn mem_paused(&self, p: PsockId) -> bool {
        self.psock(p).is_ok() && self.h.mem_paused(p)
    }

    /// The psock that has been idle longest (nothing received, nothing being
    /// written), and for how long at `now`: the one a server at its
    /// connection cap lets go to take a new connection, so that idle
    /// connections cannot hold every slot (`connmux::Service`). O(psocks);
    /// asked only at the cap.
    pub fn idlest(&self, now: Timestamp) -> Option<(PsockId, Duration)> {
        self.h
            .sk
            .shares()
            .filter(|(_, sh)| !sh.life.rx_over() && !sh.tx.state.busy())
            .map(|(p, sh)| (p, sh.rx.last_active.max(sh.tx.last_write)))
            .min_by_key(|(p, last)| (*last, p.index, p.generation))
            .map(|(p, last)| (p, now.since(last)))
    }
}

impl MuxRef<'_> {
    /// Bring psock `p`'s report to its share and its count in the budget
    /// up to date (after every call that changed its receive side).
    #[inline]
    pub(super) fn recount_only(&mut self, p: PsockId) {
        let Some(ps) = self.o.psocks.get(p.index, p.generation) else { return };
        let held = ps.rx_mem() + ps.below;
        let Some(sh) = self.h.sk.share_mut(p) else { return };
        sh.rx = ps.report();
        self.h.rx_held_sum = self.h.rx_held_sum + held - sh.counted;
        sh.counted = held;
        self.note_room(p);
    }

    /// Psock `p`'s report and count in the budget, then the budget's check
    /// when it may be needed ([`Hub::count_held`]).
    #[inline]
    pub(super) fn recount(&mut self, p: PsockId, now: Timestamp) {
        let Some(ps) = self.o.psocks.get(p.index, p.generation) else { return };
        let held = ps.rx_mem() + ps.below;
        let Some(sh) = self.h.sk.share_mut(p) else { return };
        sh.rx = ps.report();
        self.h.count_held(p, held, now);
        self.note_room(p);
        self.apply_told();
    }

    /// What psock `p`'s owner may do without asking the hub again
    /// (`Psock::hub_room`, `super::alone`): the budget's room, or 0 while
    /// the budget pauses it, its reply backlog is over the mark, any of its
    /// messages waits in a queue (framed alone, later ones would overtake
    /// them) or half the budget is used. Noted at each of its reports and
    /// after what is told to it.
    #[inline]
    pub(super) fn note_room(&mut self, p: PsockId) {
        let Some(queued) = self.h.sk.share(p).map(|sh| sh.queued) else { return };
        let (mem_paused, backlog) = self.h.holds_back(p);
        let room = self.h.mem_room();
        let free = !mem_paused
            && queued == 0
            && backlog < super::transmit::backlog_pause(&self.h.config)
            && room.saturating_mul(2) >= self.h.config.mem_limit;
        if let Some(ps) = self.o.psocks.get_mut(p.index, p.generation) {
            ps.hub_room = if free { room } else { 0 };
        }
    }

    /// [`Hub::mem_check`], applied.
    pub(super) fn mem_check(&mut self, now: Timestamp) {
        self.note_time(now);
        self.h.mem_check(now);
        self.apply_told();
    }

    /// [`ToPsock::MemAbort`]: psock `p`'s receive stops and its buffer is
    /// freed.
    pub(super) fn mem_abort(&mut self, p: PsockId, held: usize, limit: usize) {
        let Some(ps) = self.o.psocks.get_mut(p.index, p.generation) else { return };
        // The driver drops what it held below the parser with the psock.
        ps.below = 0;
        ps.stream.stop();
        let reported = ps.life.rx_over();
        ps.life = Life::Failed;
        self.h.sk.set_life(p, Life::Failed);
        if !reported {
            self.h.events.push_back(Event::PsockFailed(p, PsockError::Rx(RxError::MemLimit { held, limit })));
        }
        self.sync_deadline(p);
        self.recount_only(p);
    }

    /// After a socket's queue was read: paused psocks may read again.
    #[inline]
    pub(super) fn mem_after_read(&mut self) {
        self.h.mem_after_read(self.o.now);
        self.apply_told();
    }

    // ---- idle and handshake deadlines ----

    /// Tell the core the time without anything else happening (before an
    /// attach, so that the new psock's idle time and deadlines count from
    /// now rather than from the last call that carried a time).
    pub fn note_now(&mut self, now: Timestamp) {
        self.note_time(now);
        self.apply_told();
    }

    /// Make sure the next scan comes no later than an idle period from `now`.
    pub(super) fn arm_idle(&mut self, now: Timestamp) {
        if let Some(d) = self.h.config.idle_timeout {
            self.scan_at(now.add(d));
        }
    }

    /// A loan was made ahead at `at`: the scan looks at it once it may
    /// have been out for [`AHEAD_QUIET`].
    pub(super) fn ahead_scan_at(&mut self, at: Timestamp) {
        self.scan_at(at.add(AHEAD_QUIET));
    }

    /// The scan of the psocks' idle, handshake and record deadlines looks
    /// again by `t`.
    pub(super) fn scan_at(&mut self, t: Timestamp) {
        if self.o.scan_next.is_none_or(|n| t < n) {
            self.o.scan_next = Some(t);
        }
    }

    /// The driver holds `bytes` of psock `p`'s stream that it read but has
    /// not fed yet (the io_uring driver's copy of what a paused psock had in
    /// the ring's buffers): they count in the memory budget as the psock's,
    /// so a psock that holds much there is paused, and aborted if it stays
    /// stuck, like one that holds it in its assembly buffer.
    pub fn set_rx_below(&mut self, p: PsockId, bytes: usize) {
        self.apply_told();
        let Some(ps) = self.o.psocks.get_mut(p.index, p.generation) else { return };
        if ps.below == bytes {
            return;
        }
        ps.below = bytes;
        self.recount(p, self.o.now);
    }

    /// The layer below psock `p`'s parser (TLS) started (`Some(deadline)`)
    /// or finished (`None`) its handshake: past the deadline the psock fails
    /// with `RxError::HandshakeTimeout`. The runtime arms it at attach with
    /// `now + MuxConfig::handshake_timeout`.
    pub fn set_handshake_deadline(&mut self, p: PsockId, deadline: Option<Timestamp>) -> Result<(), super::MuxError> {
        self.apply_told();
        let ps = self.psock_mut(p)?;
        ps.handshake_deadline = deadline;
        if let Some(t) = deadline {
            self.scan_at(t);
        }
        Ok(())
    }

    /// The layer below psock `p`'s parser (TLS) holds the first bytes of a
    /// record (`Some(deadline)`, from its first byte plus the assembly
    /// timeout) or none (`None`). A partial record is the start of a message
    /// the parser has not seen yet, so the assembly timeout covers it: past
    /// the deadline the psock fails with `RxError::Timeout`, counted in
    /// `rx_msg_timeouts`.
    pub fn set_record_deadline(&mut self, p: PsockId, deadline: Option<Timestamp>) -> Result<(), super::MuxError> {
        self.apply_told();
        let ps = self.psock_mut(p)?;
        ps.record_deadline = deadline;
        if let Some(t) = deadline {
            self.scan_at(t);
        }
        Ok(())
    }

    /// One pass over the psocks: fail those past their handshake deadline or
    /// idle for the idle timeout, recall loans made ahead that stayed out
    /// [`AHEAD_QUIET`]; set when to look again.
    pub(super) fn scan_psock_deadlines(&mut self, now: Timestamp) {
        self.note_time(now);
        let idle = self.h.config.idle_timeout;
        let mut next: Option<Timestamp> = None;
        let mut failed: Vec<(PsockId, RxError)> = Vec::new();
        for (i, g, ps) in self.o.psocks.iter_mut() {
            if ps.life.rx_over() {
                continue;
            }
            let p = PsockId { index: i, generation: g };
            if let Some(at) = ps.ahead_since {
                let t = at.add(AHEAD_QUIET);
                if t <= now {
                    // Asked once; the loan comes back empty, and no other
                    // is made ahead until a message comes.
                    ps.ahead_since = None;
                    ps.stream.forget_prediction();
                    self.h.events.push_back(Event::PsockRxRecall(p));
                } else {
                    let t = t.max(now.add(SCAN_FLOOR));
                    next = Some(next.map_or(t, |n| n.min(t)));
                }
            }
            if let Some(t) = ps.handshake_deadline {
                if t <= now {
                    ps.handshake_deadline = None;
                    failed.push((p, RxError::HandshakeTimeout));
                    continue;
                }
                let t = t.max(now.add(SCAN_FLOOR));
                next = Some(next.map_or(t, |n| n.min(t)));
            }
            if let Some(t) = ps.record_deadline {
                if t <= now {
                    ps.record_deadline = None;
                    failed.push((p, RxError::Timeout));
                    continue;
                }
                let t = t.max(now.add(SCAN_FLOOR));
                next = Some(next.map_or(t, |n| n.min(t)));
            }
            if let Some(d) = idle {
                let (busy, wrote) = self.h.tx_activity(p);
                let due = ps.last_active.max(wrote).add(d);
                // Writing counts as activity only when it moved bytes; a
                // chunk out with the driver is activity in progress.
                if due <= now && !busy {
                    failed.push((p, RxError::IdleTimeout));
                    continue;
                }
                let t = due.max(now.add(d / 16));
                next = Some(next.map_or(t, |n| n.min(t)));
            }
        }
        self.o.scan_next = next;
        for (p, e) in failed {
            let Some(ps) = self.o.psocks.get_mut(p.index, p.generation) else { continue };
            match e {
                RxError::HandshakeTimeout => self.h.counters.handshake_timeouts += 1,
                RxError::Timeout => ps.record_timeouts += 1,
                _ => self.h.counters.idle_timeouts += 1,
            }
            ps.stream.stop();
            ps.life = Life::Failed;
            self.h.sk.set_life(p, Life::Failed);
            self.h.sk.no_answers(p);
            self.h.events.push_back(Event::PsockFailed(p, PsockError::Rx(e)));
            self.sync_deadline(p);
            self.recount_only(p);
        }
    }
}
