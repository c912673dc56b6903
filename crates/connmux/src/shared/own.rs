//! A worker's own hand-off state (`Own`): messages its reads handed
//! straight to its serving socket and writes it made and has not told the
//! core of; and the feeds of a read's bytes into the core on its behalf.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use connmux_core::mux::{FramedAlone, Owned, PsockId, SockId};
use connmux_core::{Bytes, Timestamp};

use super::{MuxHub, PsockRt, SockRt};

/// What a worker promised, at the end of a pass, about the commands
/// posted to it (`driver::worker::promise`), so that a lazy post
/// (`Inbox::post_lazy`: a corked reply's ask, `Shared::send_out`) need not
/// wake it.
///
/// ```text
///              pass read something,          wait bounded by CORK_WAIT,
///              serves nothing                then the commands taken
///   Nothing ───────────────────────► Within ──────────────────────────► Nothing
///      │  a stand-alone slot's pass
///      └───────────────────────────► First ─── its next pass takes the ─► Nothing
///                                            commands before it waits
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Promise {
    /// None: a post wakes it.
    #[default]
    Nothing,
    /// A worker that serves nothing and whose pass read something (handed
    /// to application threads, whose replies may come corked): it looks
    /// within `driver::worker::CORK_WAIT`.
    Within,
    /// A stand-alone socket's slot: it looks first thing in its next pass
    /// (which its socket's thread runs when it calls again).
    First,
}

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
    /// not yet served (a led pass's, for its leader: moved to `mine` at
    /// once).
    pub direct: Vec<(Bytes, PsockId)>,
    /// The worker's index: its psocks' owner tag (`Event::Wake` for it is
    /// its own to apply).
    pub owner: u32,
    /// What was told to this worker's psocks waits in the hub
    /// (`Event::Wake`): it applies it before its pass ends.
    pub told: bool,
    /// What the worker promised about its commands at the end of its last
    /// pass (`driver::worker::promise`).
    pub promise: Promise,
    /// The affinity tag of the socket it serves, when steering sends a
    /// psock of that tag there while its queue is empty (`Steering::Affinity`):
    /// a read of such a psock is framed with no hold of the hub lock
    /// (`Owned::frame_alone`).
    pub alone_tag: Option<u32>,
    /// What reads framed alone, for the hub to count in the worker's next
    /// hold (`Mux::report_alone`: in the hold that queues their replies),
    /// before any other call on their psocks.
    pub alone: Vec<FramedAlone>,
    /// Chunks this worker wrote whole and has not told the core of yet
    /// ([`super::Shared::write_owned`], an io_uring send's completion):
    /// told in its next hold of the hub lock, at the latest in its pass's
    /// ([`Own::open`]); the first `told_wrote` were told in the hold under
    /// way, and leave at its end ([`Own::close`]).
    pub wrote: Vec<(Arc<PsockRt>, usize)>,
    told_wrote: usize,
    /// Replies this worker wrote whole with no hold of the hub lock
    /// (`serve::write_alone`: socket, psock, bytes, messages), and the
    /// requests they answered (psock, count): counted and settled in its
    /// next hold ([`Own::open`]), after what its reads framed alone.
    pub sent: Vec<(SockId, PsockId, usize, u32)>,
    pub settle: Vec<(PsockId, u64)>,
    /// The messages this pass framed alone for the socket whose thread
    /// runs it (a stand-alone socket's slot, or a worker led by a plain
    /// socket's thread), kept for its receives ([`Mine`]).
    pub mine: Option<Mine>,
    /// The socket whose receiving thread runs this pass (`crate::lead`):
    /// it looks at its queue after the pass, so a message queued for it
    /// raises no readiness.
    pub led: Option<SockId>,
    /// No socket takes this worker's psocks by their affinity tag (the
    /// worker's index), as of the hold of its last led pass: a pass a
    /// socket's thread leads frames for that socket alone what steering
    /// gives it as the reader (`Owned::frame_alone_as_reader`). Stale by
    /// at most one led pass (a later one frames through the hub).
    pub tags_free: bool,
    /// The queue of the last `Mine` (empty), for the next: a led pass
    /// that keeps anything allocates none.
    spare: VecDeque<(Bytes, PsockId)>,
}

/// The messages a pass kept for the socket whose thread runs it, moved to
/// the socket as the pass ends ([`Own::end_keep`], `super::Kept`): those
/// it framed alone (`Owned::frame_alone`, or as the reader:
/// `Owned::frame_alone_as_reader`), and, in a led pass, those the hub's
/// steering handed the leader from a read fed through it ([`feed_read`]).
/// No hold of the hub lock to queue them nor to take them. The pass keeps
/// more only while it holds less than `bound` bytes (`Config::read_chunk`):
/// what it keeps is bounded by the configuration, beside the memory
/// budget, which counts the hub's queues.
pub(crate) struct Mine {
    /// The socket whose thread runs the pass.
    pub sock: Arc<SockRt>,
    msgs: VecDeque<(Bytes, PsockId)>,
    bytes: usize,
    bound: usize,
}

impl Own {
    /// What the passes keep from now on is for `sock` (`None`: nothing),
    /// at most `bound` bytes a pass ([`Mine`]).
    pub fn keep_for(&mut self, sock: Option<&Arc<SockRt>>, bound: usize) {
        // (Empty: a pass's end moved them on, `Own::end_keep`.)
        if let Some(m) = self.mine.take().filter(|m| m.msgs.is_empty()) {
            self.spare = m.msgs;
        }
        self.mine = sock.map(|s| Mine { sock: s.clone(), msgs: std::mem::take(&mut self.spare), bytes: 0, bound });
    }
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

    /// A worker's hold of the hub lock once per pass, before it waits:
    /// what it did alone is told ([`Own::open`], [`Own::close`]).
    pub fn hold(&mut self, core: &mut MuxHub) {
        self.open(core);
        self.close(core);
    }

    /// The start of a worker's hold of the hub lock: what its reads framed
    /// alone is counted and the chunks it wrote whole are told, before any
    /// other call on their psocks. A psock may begin its next chunk in
    /// the same hold (a read's replies: `serve::send_outs`).
    #[inline]
    pub fn open(&mut self, core: &mut MuxHub) {
        self.report(core);
        // (Looked at first: a drain of nothing still costs a few dozen
        // instructions, twice a served read.)
        if self.told_wrote < self.wrote.len() {
            for (rt, n) in &self.wrote[self.told_wrote..] {
                core.mux.tx_complete(rt.id, *n);
            }
            self.told_wrote = self.wrote.len();
        }
        if !self.sent.is_empty() {
            for (sock, p, len, msgs) in self.sent.drain(..) {
                core.mux.tx_direct(sock, p, len, msgs);
            }
        }
        if !self.settle.is_empty() {
            for (p, n) in self.settle.drain(..) {
                core.mux.rx_settle(p, n);
            }
        }
    }

    /// The end of that hold: a psock told of a chunk with more queued and
    /// none begun since is raised for a writer (`PsockTransmit`, in the
    /// core's events). Not in [`Own::open`]: a psock whose read's replies
    /// begin their chunk in the hold raises nothing.
    #[inline]
    pub fn close(&mut self, core: &mut MuxHub) {
        if self.told_wrote > 0 {
            for (rt, _) in &self.wrote[..self.told_wrote] {
                core.mux.tx_kick(rt.id);
                core.tx_settled(rt);
            }
            self.wrote.drain(..self.told_wrote);
            self.told_wrote = 0;
        }
    }

    /// The affinity tag to frame a read of `rt` alone with, for socket
    /// `sock` this worker serves (`Owned::frame_alone`), if it may: the
    /// socket's queue empty as far as its readiness says (a message of
    /// another psock queued meanwhile may be overtaken: KCM orders a
    /// psock's messages, not psocks), the socket open, the psock not
    /// released (an unattach that returned before this look frames
    /// nothing of it, as the hub's feed applies the release first),
    /// nothing of it in the direct list, nothing told to this worker's
    /// psocks waiting (the hub's feed applies it first).
    #[inline]
    pub fn alone_tag_for(&self, sock: &SockRt, rt: &PsockRt) -> Option<u32> {
        self.alone_tag.filter(|_| self.may_frame_alone(sock, rt))
    }

    #[inline]
    fn may_frame_alone(&self, sock: &SockRt, rt: &PsockRt) -> bool {
        !sock.rx.is_set()
            && !self.told
            && !rt.released.load(Ordering::Acquire)
            && !sock.closed.load(Ordering::Acquire)
            && !self.direct.iter().any(|(_, q)| *q == rt.id)
    }

    /// The socket whose receiving thread runs this worker's passes (a
    /// stand-alone socket's slot, `crate::alone`, until the socket
    /// closes): it looks at its queue after each pass, so a message queued
    /// for it raises no readiness.
    pub fn looks(&self) -> Option<SockId> {
        self.mine.as_ref().filter(|_| self.led.is_none()).map(|m| m.sock.id)
    }

    /// The whole messages at the front of `data` (read from `rt` at `now`)
    /// framed alone for the socket whose thread runs the pass and kept for
    /// its receives, if it may (as [`Own::alone_tag_for`], with the tag
    /// steering would send them to the socket with, `SockRt::kept_tag`,
    /// or as the reader of a pass it leads: the socket untagged and
    /// receiving, no socket taking the psocks by their tag; and while it
    /// keeps less than its bound): the bytes taken (the rest goes through
    /// the hub, after the report).
    pub fn frame_mine(
        &mut self,
        o: &mut Owned,
        rt: &PsockRt,
        data: &[u8],
        now: Timestamp,
        runs: &mut Vec<connmux_core::run::Run>,
    ) -> usize {
        let Some(m) = &self.mine else { return 0 };
        if m.bytes >= m.bound || !self.may_frame_alone(&m.sock, rt) {
            return 0;
        }
        runs.clear();
        let tag = m.sock.kept_tag.load(Ordering::Acquire);
        let framed = if tag != super::NO_TAG {
            o.frame_alone(rt.id, data, now, m.sock.id, tag, runs)
        } else if self.led == Some(m.sock.id) && self.tags_free && m.sock.untagged.load(Ordering::Acquire) {
            o.frame_alone_as_reader(rt.id, data, now, m.sock.id, runs)
        } else {
            None
        };
        let Some(f) = framed else { return 0 };
        let taken = f.taken();
        // One copy of the read: its messages are slices of it.
        let read = Bytes::copy_from_slice(&data[..taken]);
        let m = self.mine.as_mut().expect("looked at above");
        for r in runs.iter() {
            for range in r.ranges() {
                m.bytes += range.len();
                m.msgs.push_back((read.slice(range), rt.id));
            }
        }
        self.alone.push(f.held());
        taken
    }

    /// The pass ends: what it kept for its socket moves to the socket
    /// (`SockRt::kept`), where its receives take it; `tell`: the socket's
    /// readiness is raised for it (a led pass's: another thread of the
    /// socket, or a poller, sees it), else it is for the socket's own
    /// receives only (a stand-alone slot's). Kept for a socket
    /// receive-disabled meanwhile, it goes back to the hub instead.
    pub fn end_keep(&mut self, sh: &super::Shared, tell: bool) {
        let Some(m) = self.mine.as_mut().filter(|m| !m.msgs.is_empty()) else { return };
        m.bytes = 0;
        // (Refused once a receive-disable stopped the socket: `sync::keep`.)
        if m.sock.kept.deposit(|k| k.append(&mut m.msgs)) {
            if tell {
                m.sock.rx.set();
            }
            return;
        }
        let mut events = Vec::new();
        {
            let mut core = sh.lock();
            self.unkeep(&mut core.mux);
            core.drain_events(&mut events);
        }
        sh.dispatch(&mut events, &mut super::Ctx::App);
    }

    /// What the pass kept for its socket goes back to the socket's queue
    /// in the hub, unreceived (`Mux::unkeep`: the socket closes, or was
    /// receive-disabled), after the hub has counted it.
    pub fn unkeep(&mut self, m: &mut connmux_core::mux::Mux) {
        self.report_to(m);
        if let Some(mine) = self.mine.as_mut().filter(|k| !k.msgs.is_empty()) {
            mine.bytes = 0;
            m.unkeep(mine.sock.id, mine.msgs.drain(..).collect());
        }
    }

    /// What a read framed alone, counted by the hub (in a hold of the
    /// caller's, before its next call on that psock).
    #[inline]
    pub fn report(&mut self, core: &mut MuxHub) {
        if !self.alone.is_empty() {
            self.report_to(&mut core.mux);
        }
    }

    fn report_to(&mut self, m: &mut connmux_core::mux::Mux) {
        for f in self.alone.drain(..) {
            let (p, mut n) = (f.psock(), f.msgs());
            if m.report_alone(f) {
                continue;
            }
            // Unattached before the hub heard of them: not delivered. They
            // are the psock's last kept (a read fed through the hub reports
            // what was framed before it first).
            let Some(mine) = &mut self.mine else { continue };
            let mut i = mine.msgs.len();
            while n > 0 && i > 0 {
                i -= 1;
                if mine.msgs[i].1 == p {
                    let (data, _) = mine.msgs.remove(i).expect("in range");
                    mine.bytes = mine.bytes.saturating_sub(data.len());
                    n -= 1;
                }
            }
        }
    }
}

/// Feed bytes read from a psock: straight to the worker's own serving socket
/// where steering sends them there and its queue is empty (held in
/// `own.direct` for its next `serve`, at most one serve batch), else queued.
pub(crate) fn feed_read(
    core: &mut MuxHub,
    o: &mut Owned,
    own: &mut Own,
    p: PsockId,
    data: &[u8],
    now: Timestamp,
) -> Result<(), connmux_core::mux::MuxError> {
    match own.serve {
        Some((sock, batch)) => {
            let mut d = connmux_core::mux::Direct { sock, out: &mut own.direct, limit: batch };
            core.mux.of(o).feed_direct(p, data, now, &mut d)
        }
        None => match own.mine.as_mut().filter(|m| own.led == Some(m.sock.id)) {
            // A led pass: what steering gives the leader is kept for it
            // with what it frames alone, not queued (a queued message of
            // the psock would keep its next reads from being framed alone).
            Some(mine) => {
                let sock = mine.sock.id;
                let limit = if mine.bytes < mine.bound { LED_DIRECT } else { 0 };
                let mut d = connmux_core::mux::Direct { sock, out: &mut own.direct, limit };
                let r = core.mux.of(o).feed_direct(p, data, now, &mut d);
                if !own.direct.is_empty() {
                    // (All of psock `p`: the list is emptied after each feed.)
                    core.mux.hold_direct(sock, p, own.direct.len() as u64);
                    for (data, q) in own.direct.drain(..) {
                        mine.bytes += data.len();
                        mine.msgs.push_back((data, q));
                    }
                }
                r
            }
            None => core.mux.of(o).feed(p, data, now),
        },
    }
}

/// The most messages one read of a led pass hands straight to the leader
/// ([`feed_read`]); the rest are queued.
const LED_DIRECT: usize = 256;

/// [`feed_read`] that also frames whole messages where they lie in `data`
/// (`Mux::feed_in_place`) for the caller to serve at once: their runs go to
/// `runs`, every whole message of the read (the read size bounds them;
/// queued one allocation each, the messages past a batch cost a pipelining
/// connection more than serving them). Not while messages of this psock
/// wait in the direct list (they are older and are served first, by
/// `serve`).
pub(crate) fn feed_read_in_place(
    core: &mut MuxHub,
    o: &mut Owned,
    own: &mut Own,
    p: PsockId,
    data: &[u8],
    now: Timestamp,
    runs: &mut Vec<connmux_core::run::Run>,
) -> Result<(), connmux_core::mux::MuxError> {
    match own.serve {
        Some((sock, batch)) => {
            let limit = if own.direct.iter().any(|(_, q)| *q == p) { 0 } else { usize::MAX };
            let mut d = connmux_core::mux::Direct { sock, out: &mut own.direct, limit: batch };
            core.mux.of(o).feed_in_place(p, data, now, &mut d, limit, runs)
        }
        None => core.mux.of(o).feed(p, data, now),
    }
}

/// [`feed_read`] for bytes read straight into a psock's assembly buffer
/// (`Mux::rx_lend`): the loan goes back, its bytes taken the same way.
pub(crate) fn commit_read(
    core: &mut MuxHub,
    o: &mut Owned,
    own: &mut Own,
    loan: connmux_core::mux::RxLoan,
    now: Timestamp,
) -> Result<(), connmux_core::mux::MuxError> {
    match own.serve {
        Some((sock, batch)) => {
            let mut d = connmux_core::mux::Direct { sock, out: &mut own.direct, limit: batch };
            core.mux.of(o).rx_commit_direct(loan, now, &mut d)
        }
        None => core.mux.of(o).rx_commit(loan, now),
    }
}
