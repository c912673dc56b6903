//! A psock's owner reading and framing with no look at the hub: what it
//! may read (`Owned::rx_room_alone`), and whole messages framed where they
//! lie for its own socket (`Owned::frame_alone`), whose effects on the
//! hub (the socket's and the share's counters, what the socket holds) the
//! owner reports in its next call on the hub (`Mux::report_alone`).
//!
//! Why: a runtime whose workers own their psocks takes the hub's lock
//! for each call on it; a served read that asked the hub what to read and
//! where its messages go took it three times, and workers on many CPUs
//! waited on each other for it (16 workers answered fewer calls than 8).
//! The owner decides alone only where the hub's answer cannot differ: the
//! hub, at the psock's last report, neither held it back nor had any of
//! its messages queued nor half its budget used (`Psock::hub_room`), and
//! the psock is at a message boundary. A stale answer costs one read: the
//! next call on the hub, which applies what was told first, decides.

use super::hub::Hub;
use super::{Owned, PsockId, SockId};
use crate::run::Run;
use crate::time::Timestamp;

/// Whole messages of a psock framed by its owner alone
/// ([`Owned::frame_alone`]), for the hub to count ([`super::Mux::report_alone`]).
#[derive(Debug)]
#[must_use = "the hub counts them only when reported"]
pub struct FramedAlone {
    p: PsockId,
    sock: SockId,
    taken: usize,
    msgs: u64,
    bytes: u64,
    last_active: Timestamp,
    /// Held until the caller settles them (`Mux::rx_settle`), whether or
    /// not the socket holds: kept for the socket's own receives, they are
    /// not yet delivered (the psock's close waits for them).
    held: bool,
}

impl FramedAlone {
    /// Bytes of the read framed (from its start).
    pub fn taken(&self) -> usize {
        self.taken
    }

    /// The psock read.
    pub fn psock(&self) -> PsockId {
        self.p
    }

    /// Whole messages framed.
    pub fn msgs(&self) -> u64 {
        self.msgs
    }

    /// The messages are kept by the caller until its socket receives
    /// them: held by the psock until settled (`Mux::rx_settle`, one per
    /// message), as a holding socket's are.
    pub fn held(mut self) -> FramedAlone {
        self.held = true;
        self
    }
}

impl Owned {
    /// What psock `p` may read now with no look at the hub (0: ask the
    /// hub, `MuxRef::rx_room`). Only at a message boundary (nothing
    /// buffered, nothing below the parser, no loan due), its receive side
    /// running and nothing of its own holding it back, and only while the
    /// hub at its last report let it go alone (`Psock::hub_room`). What is
    /// told since (a pause, an unattach) is applied at the owner's next
    /// call on the hub, which a read made meanwhile goes through. Why the
    /// budget's half: a read taken on a stale room retains at most its
    /// partial last message, so the budget goes over its limit only when
    /// the psocks reading at once could retain more than half of it.
    pub fn rx_room_alone(&self, p: PsockId) -> usize {
        let Some(ps) = self.psocks.get(p.index, p.generation) else { return 0 };
        if !ps.alone() || ps.stream.would_lend() {
            return 0;
        }
        ps.stream.want().min(ps.rx_limit).min(ps.hub_room)
    }

    /// [`super::Mux::feed_in_place`]'s framing, alone: the whole messages
    /// at the front of `data`, read from psock `p` at `now`, framed where
    /// they lie as runs onto `out`, for the caller's own socket `sock`,
    /// whose affinity tag is `tag` and whose queue the caller saw empty.
    /// `None` (nothing taken; feed it through the hub) unless the psock's
    /// affinity is `tag`, the hub let it go alone at its last report and
    /// it is at a message boundary. The caller reports what was framed
    /// ([`super::Mux::report_alone`]) before any other call on `p`, and
    /// feeds the rest of `data` through the hub.
    pub fn frame_alone(
        &mut self,
        p: PsockId,
        data: &[u8],
        now: Timestamp,
        sock: SockId,
        tag: u32,
        out: &mut Vec<Run>,
    ) -> Option<FramedAlone> {
        self.frame_here(p, data, now, sock, Some(tag), out)
    }

    /// [`Owned::frame_alone`] for the socket whose thread reads these
    /// psocks now ([`Owned::set_reader`]), which steering gives a read
    /// while its queue is short (`Steering::Affinity`, the reader
    /// untagged): `None` unless `sock` is that reader. The caller has
    /// seen, as for a tag, the socket's queue empty, the socket untagged
    /// and receiving, and no socket taking these psocks by their tag.
    pub fn frame_alone_as_reader(
        &mut self,
        p: PsockId,
        data: &[u8],
        now: Timestamp,
        sock: SockId,
        out: &mut Vec<Run>,
    ) -> Option<FramedAlone> {
        if self.reader != Some(sock) {
            return None;
        }
        self.frame_here(p, data, now, sock, None, out)
    }

    /// The framing of [`Owned::frame_alone`] (`tag`: the psock's affinity
    /// must be it) and of [`Owned::frame_alone_as_reader`] (`None`).
    #[inline(always)]
    fn frame_here(
        &mut self,
        p: PsockId,
        data: &[u8],
        now: Timestamp,
        sock: SockId,
        tag: Option<u32>,
        out: &mut Vec<Run>,
    ) -> Option<FramedAlone> {
        let ps = self.psocks.get_mut(p.index, p.generation)?;
        if tag.is_some_and(|t| ps.affinity != Some(t)) || !ps.alone() {
            return None;
        }
        let first = out.len();
        let taken = ps.stream.frame_in_place(data, usize::MAX, out);
        if taken == 0 {
            return None;
        }
        let bytes = match ps.stream.delivers_whole() {
            true => taken as u64,
            false => out[first..].iter().map(|r| (r.len * r.count) as u64).sum(),
        };
        // Bytes served in place are traffic too (idle timeout).
        ps.last_active = now;
        let msgs = crate::run::count(&out[first..]) as u64;
        Some(FramedAlone { p, sock, taken, msgs, bytes, last_active: now, held: false })
    }
}

impl super::psock::Psock {
    /// Whether its owner may read and frame it alone: the hub let it at
    /// its last report (`hub_room`), its receive side runs, nothing of its
    /// own holds it back, and it is at a message boundary (nothing
    /// buffered, nothing below the parser).
    #[inline]
    fn alone(&self) -> bool {
        self.hub_room > 0
            && self.rx_running()
            && self.ready.is_none()
            && !self.readers_hold
            && self.below == 0
            && self.stream.buffered() == 0
    }
}

impl Hub {
    /// `framed` messages (`bytes` of them, `wire` bytes of the stream) of
    /// psock `p` framed in place for socket `sock`: counted as received by
    /// the socket, as `recv_msg` would, held if it holds (or `held`: the
    /// caller keeps them for the socket's reader); the psock's counters
    /// and last read told to its share (its buffer is unchanged by framing
    /// in place, and so is the rest of its report; framing in place counts
    /// only messages and their bytes, added here to the share's copy, which
    /// the owner's reports keep in order). `false`: the psock is
    /// unattached, and nothing is counted.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn framed_in_place(
        &mut self,
        p: PsockId,
        sock: SockId,
        framed: u64,
        bytes: u64,
        wire: u64,
        last_active: Timestamp,
        held: bool,
    ) -> bool {
        let Some((sh, s)) = self.sk.share_and_sock(p, sock) else { return false };
        if framed > 0 {
            let mut holds = held;
            if let Some(s) = s {
                s.stats.rx_msgs += framed;
                s.stats.rx_bytes += bytes;
                holds |= s.holds;
            }
            if holds {
                sh.holds += framed;
            }
        }
        sh.rx.stream.msgs += framed;
        sh.rx.stream.bytes += wire;
        sh.rx.last_active = last_active;
        true
    }

    /// [`super::Mux::report_alone`].
    pub(super) fn report_alone(&mut self, f: FramedAlone) -> bool {
        self.framed_in_place(f.p, f.sock, f.msgs, f.bytes, f.taken as u64, f.last_active, f.held)
    }
}
