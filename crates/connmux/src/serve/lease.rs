//! Serving on a lease: a lent psock's reads framed, answered and written
//! by its worker with no hold of the core lock (`Own::leases`), replies
//! its connection did not take kept on the lease for its writable event
//! (`Backlog`), and the lease given back when a read is not for it or a
//! write falls short past that.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use connmux_core::mux::{Event, LeaseRead, PsockId};
use connmux_core::run::{Messages, Run};
use connmux_core::Bytes;

use super::{run_in_place, send_outs, Out, ReadView, ServeBufs, Serving};
use crate::shared::tls::PsockTls;
use crate::shared::{Own, PsockRt, Shared, Wrote};

/// Where a lent psock's replies are written: straight to its connection,
/// or made into records by its TLS session first.
#[derive(Clone, Copy)]
pub(crate) enum LentOut<'a> {
    Plain(std::os::fd::RawFd),
    /// `Plain`, but replies appended to the run wait for the caller's
    /// [`flush_deferred`] (the io_uring driver: one write for a psock's
    /// reads in a row; the caller flushes before anything else serves).
    Later(std::os::fd::RawFd),
    Tls(&'a PsockRt, &'a std::sync::Mutex<PsockTls>),
}

impl LentOut<'_> {
    /// One write of `iov`: the bytes taken (as `writev` counts them).
    #[inline]
    fn write(self, sh: &Shared, iov: &[std::io::IoSlice<'_>]) -> std::io::Result<usize> {
        match self {
            LentOut::Plain(fd) | LentOut::Later(fd) => connmux_sys::socket::writev(fd, iov),
            LentOut::Tls(rt, tls) => crate::shared::tls::lease_write(sh, rt, tls, iov),
        }
    }
}

/// Write the replies lent reads left for later ([`LentOut::Later`]), if
/// any: in the run, and (replies of their own buffers) in `outs`, which
/// then hold only replies to that psock.
#[inline(always)]
pub(crate) fn flush_deferred(sh: &Shared, bufs: &mut ServeBufs, events: &mut Vec<Event>) {
    let Some((p, fd)) = bufs.deferred.take() else { return };
    if bufs.outs.is_empty() {
        match bufs.run.take() {
            Some((q, n)) if q == p && n > 0 => write_run(sh, bufs, p, LentOut::Plain(fd), n, events),
            run => bufs.run = run,
        }
        return;
    }
    bufs.end_run();
    write_outs(sh, bufs, p, LentOut::Plain(fd), events);
}

/// A read of psock `p`, lent to this worker (`Own::leases`; `fd` is its
/// connection): the handler answers its whole messages where they lie and
/// their replies are written here, with no hold of the core lock (the counts
/// reach the core in the worker's pass hold). A read that ends inside a
/// message leaves its start on the lease, and the next reads complete it
/// (`Lease::frame_read`, [`serve_kept`]). A close gives the lease back and
/// goes the usual way after the handler. `Err` when the read is not for the
/// lease (a message too large or bad to keep, the connection turned heavy,
/// the lease revoked): the lease is back with the core, which the caller
/// feeds the read's bytes from [`GivenBack::from`] on as usual. Inlined into
/// its three callers (the drivers' lent reads), as [`run_in_place`] is.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(crate) fn serve_leased(
    sh: &Shared,
    sv: &Serving,
    bufs: &mut ServeBufs,
    data: &[u8],
    p: PsockId,
    out: LentOut<'_>,
    started: u64,
    events: &mut Vec<Event>,
    dirty: &mut Vec<Arc<PsockRt>>,
) -> Result<(), GivenBack> {
    if bufs.deferred.is_some_and(|(q, _)| q != p) {
        // (The caller flushes before another psock's read: not reached.)
        flush_deferred(sh, bufs, events);
    }
    let Some(l) = bufs.own.leases.get_mut(&p) else { return Err(GivenBack { rt: None, from: 0 }) };
    if revoked(&l.rt) {
        return Err(give_back_read(sh, bufs, p, started, 0, events));
    }
    let heavy = bufs.heavy.contains(p);
    // Replies an earlier write left wait: this read's go behind them.
    let backed = !l.backlog.is_empty();
    let mut runs = std::mem::take(&mut bufs.runs);
    runs.clear();
    // The common read, all whole messages and nothing kept before it:
    // served where it lies. Anything else out of line.
    let from = match !l.lease.keeps() && l.lease.frame(data, &mut runs) == data.len() {
        true => 0,
        // A heavy connection's messages all go to its lane, in order, none
        // run here ahead of them: a read that is not all whole messages
        // goes the core's way, which frames them for the lane.
        false if heavy => {
            bufs.runs = runs;
            return Err(give_back_read(sh, bufs, p, started, 0, events));
        }
        false => match serve_kept(sh, sv, bufs, data, p, started, &mut runs, events) {
            Kept::Serve(from) => from,
            Kept::Nothing => {
                bufs.runs = runs;
                bufs.own.lease_used(p, 0, 0);
                return Ok(());
            }
            Kept::Back(g) => {
                bufs.runs = runs;
                return Err(g);
            }
        },
    };
    let mut msgs = Messages::new(&data[from..], &runs);
    if heavy {
        // To the lane; their verdicts come back to this worker
        // (`write_lane_verdicts`). Those the full lane refuses run here.
        msgs = bufs.offer_read(sv, p, msgs, true);
    }
    if !msgs.is_empty() {
        run_in_place(sv, bufs, ReadView { msgs, psock: p, started });
    }
    // Empty for the next read (its runs are pushed after what is here).
    runs.clear();
    bufs.runs = runs;
    // A message sent from elsewhere while the handler ran waits on the
    // psock's queue: these replies go behind it, the ordinary way.
    let behind = bufs.own.leases.get(&p).is_some_and(|l| revoked(&l.rt));
    if !behind && bufs.outs.is_empty() {
        // The common case: every reply appended to the run (none of its own
        // buffer, no close): written from the run's buffer, which is then
        // used again (no copy, no buffer handed anywhere).
        match (bufs.run.take(), out) {
            // (Behind a backlog they go at once, after it: never a
            // deferred write that would overtake it.)
            (Some((q, n)), LentOut::Later(fd)) if q == p && n > 0 && !backed => {
                bufs.run = Some((q, n));
                bufs.deferred = Some((p, fd));
            }
            (Some((q, n)), _) if q == p && n > 0 && !backed => write_run(sh, bufs, p, out, n, events),
            (Some((q, n)), _) if q == p && n > 0 => {
                let chunk = bufs.run_buf.split().freeze();
                write_behind(sh, bufs, p, chunk, n, events)
            }
            _ => bufs.own.lease_used(p, 0, 0),
        }
        return Ok(());
    }
    // (Replies left for later are in the run and `outs`: they go first.)
    bufs.deferred = None;
    bufs.end_run();
    if !outs_stay_lent(sh, sv, bufs, p, started, events, dirty) {
        return Ok(());
    }
    match out {
        // Replies of their own buffers (larger than the run takes) wait too.
        LentOut::Later(fd) => bufs.deferred = Some((p, fd)),
        _ => write_outs(sh, bufs, p, out, events),
    }
    Ok(())
}

/// Write the lanes' verdicts `done` (`serve::take_done`: each for a psock
/// lent to this worker when it was taken) on the leases, a psock's in the
/// order posted, with no hold of the core lock. A psock whose lease went
/// back meanwhile, or one the lane closes, goes the core's way.
pub(crate) fn write_lane_verdicts(
    sh: &Shared,
    sv: &Serving,
    bufs: &mut ServeBufs,
    done: &mut Vec<crate::handler::Done>,
    events: &mut Vec<Event>,
    dirty: &mut Vec<Arc<PsockRt>>,
) {
    // Replies of a lent read left for later go first.
    flush_deferred(sh, bufs, events);
    // A psock's verdicts together (a stable sort keeps their order); most
    // often they are all one psock's, and need none.
    if done.windows(2).any(|w| w[0].psock != w[1].psock) {
        done.sort_by_key(|d| (d.psock.index, d.psock.generation));
    }
    let mut cur = None;
    for d in done.drain(..) {
        if let Some(q) = cur.filter(|q| *q != d.psock) {
            write_verdicts(sh, sv, bufs, q, events, dirty);
        }
        cur = Some(d.psock);
        bufs.push(d.psock, d.verdict);
    }
    if let Some(q) = cur {
        write_verdicts(sh, sv, bufs, q, events, dirty);
    }
}

/// Write the verdicts in `bufs` (the run and `outs`), all for psock `p`, on
/// its lease; or, the lease gone, revoked or a close among them, give it
/// back and queue them the core's way.
fn write_verdicts(
    sh: &Shared,
    sv: &Serving,
    bufs: &mut ServeBufs,
    p: PsockId,
    events: &mut Vec<Event>,
    dirty: &mut Vec<Arc<PsockRt>>,
) {
    bufs.end_run();
    if !outs_stay_lent(sh, sv, bufs, p, connmux_sys::clock::now_nanos(), events, dirty) {
        return;
    }
    let Some(rt) = bufs.own.leases.get(&p).map(|l| l.rt.clone()) else { return };
    let out = match &rt.tls {
        Some(tls) => LentOut::Tls(&rt, tls),
        None => LentOut::Plain(rt.fd()),
    };
    write_outs(sh, bufs, p, out, events);
}

/// Whether the replies in `bufs.outs` (the run ended), all psock `p`'s,
/// are written on its lease: it is here, not revoked (a message sent from
/// elsewhere waits on the psock's queue, and these go behind it), and
/// none of them is a close. Otherwise the psock is the core's again before
/// anything else (`unlease` takes the lease's counts back with it) and
/// they are queued the core's way.
fn outs_stay_lent(
    sh: &Shared,
    sv: &Serving,
    bufs: &mut ServeBufs,
    p: PsockId,
    at: u64,
    events: &mut Vec<Event>,
    dirty: &mut Vec<Arc<PsockRt>>,
) -> bool {
    let lent = match bufs.own.leases.get(&p) {
        Some(l) => !revoked(&l.rt),
        None => {
            send_outs(sh, sv, bufs, events, dirty, None);
            return false;
        }
    };
    if lent && bufs.outs.iter().all(|o| matches!(o, Out::Replies(q, ..) if *q == p)) {
        return true;
    }
    bufs.own.give_back(sh, p, at, events);
    send_outs(sh, sv, bufs, events, dirty, None);
    false
}

/// Write the replies in `bufs.outs`, all of lent psock `p`, at once.
fn write_outs(sh: &Shared, bufs: &mut ServeBufs, p: PsockId, out: LentOut<'_>, events: &mut Vec<Event>) {
    bufs.slices.clear();
    bufs.slice_msgs.clear();
    for o in bufs.outs.drain(..) {
        if let Out::Replies(_, b, n) = o {
            bufs.slices.push(b);
            bufs.slice_msgs.push(n);
        }
    }
    write_leased(sh, bufs, p, out, events);
}

/// A lent read the lease did not take as it came (see [`serve_leased`]).
pub(crate) struct GivenBack {
    /// The connection, when the lease was here to give back.
    pub rt: Option<Arc<PsockRt>>,
    /// The read's bytes before this went to the core with the lease (the
    /// start of a message it kept): the caller feeds the rest.
    pub from: usize,
}

/// What [`serve_kept`] left to [`serve_leased`].
enum Kept {
    /// Serve the runs framed, which are of the read from this offset.
    Serve(usize),
    /// The read all went on a kept message: nothing to serve.
    Nothing,
    /// The lease went back.
    Back(GivenBack),
}

/// A lent read that is not all whole messages, or that goes on with a
/// message the lease kept: framed by `Lease::frame_read` within the room
/// the worker's bound leaves (`Keep::room_for`); a message it made whole
/// is served first, from the lease's own buffer. Out of line: the common
/// read never comes here.
#[allow(clippy::too_many_arguments)]
#[inline(never)]
fn serve_kept(
    sh: &Shared,
    sv: &Serving,
    bufs: &mut ServeBufs,
    data: &[u8],
    p: PsockId,
    started: u64,
    runs: &mut Vec<Run>,
    events: &mut Vec<Event>,
) -> Kept {
    runs.clear();
    let now = sh.timestamp(started);
    let Some(l) = bufs.own.leases.get_mut(&p) else { return Kept::Back(GivenBack { rt: None, from: 0 }) };
    let room = bufs.own.keep.room_for(l.lease.kept());
    let before = l.lease.kept();
    let read = l.lease.frame_read(data, now, room, runs);
    // (Counted before a give-back, which takes what the lease keeps now
    // off the worker's count.)
    bufs.own.keep.changed(before, l.lease.kept(), l.lease.kept_due());
    let (r, from, msg) = match read {
        LeaseRead::GiveBack { from } => return Kept::Back(give_back_read(sh, bufs, p, started, from, events)),
        LeaseRead::Kept => return Kept::Nothing,
        LeaseRead::Serve { done: None, from } => return Kept::Serve(from),
        LeaseRead::Serve { done: Some(r), from } => (r, from, l.lease.take_done()),
    };
    let done = [Run::one(0, msg.len(), r)];
    let closed = run_in_place(sv, bufs, ReadView { msgs: Messages::new(&msg, &done), psock: p, started });
    if closed {
        // Nothing after the close is answered.
        runs.clear();
    }
    Kept::Serve(from)
}

/// Give lease `p` back for a read it did not take (before `from`, what the
/// lease kept goes to the core with it; the caller feeds the rest). Replies
/// of its earlier reads left for later are written first.
fn give_back_read(
    sh: &Shared,
    bufs: &mut ServeBufs,
    p: PsockId,
    started: u64,
    from: usize,
    events: &mut Vec<Event>,
) -> GivenBack {
    flush_deferred(sh, bufs, events);
    let mut core = sh.lock();
    let rt = bufs.own.unlease_rt(&mut core, p, sh.timestamp(started));
    core.drain_events(events);
    GivenBack { rt, from }
}

/// Whether the lease of `rt` was revoked: a send from another thread waits
/// on its queue, and its worker has not been told yet. Such a send has
/// returned only after the flag was set (`Shared::dispatch`), so a reply
/// the handler made after it (having seen its effect) never overtakes it.
#[inline]
fn revoked(rt: &PsockRt) -> bool {
    rt.lease_revoked.load(Ordering::Acquire)
}

/// Write a leased psock's run of `msgs` appended replies straight from
/// `bufs.run_buf` (emptied after, its memory kept).
#[inline(always)]
fn write_run(sh: &Shared, bufs: &mut ServeBufs, p: PsockId, out: LentOut<'_>, msgs: u32, events: &mut Vec<Event>) {
    let want = bufs.run_buf.len();
    let res = out.write(sh, &[std::io::IoSlice::new(&bufs.run_buf)]);
    // One call: it took bytes or failed, never both.
    let (sent, failed) = match Wrote::of_io(&res) {
        Wrote::Bytes(n) if n >= want => {
            bufs.run_buf.clear();
            bufs.own.lease_used(p, msgs, want);
            return;
        }
        Wrote::Bytes(n) => (n, None),
        Wrote::Again => (0, None),
        Wrote::Failed(e) => (0, Some(e)),
    };
    let chunk = bufs.run_buf.split().freeze();
    lease_short(sh, bufs, p, Unsent { chunk, sent, msgs }, failed, events);
}

/// Write a leased psock's replies (`bufs.slices`, with `bufs.slice_msgs`
/// replies each) at once.
fn write_leased(sh: &Shared, bufs: &mut ServeBufs, p: PsockId, out: LentOut<'_>, events: &mut Vec<Event>) {
    let want: usize = bufs.slices.iter().map(|b| b.len()).sum();
    let msgs = bufs.slice_msgs.iter().fold(0u32, |a, n| a.saturating_add(*n));
    if bufs.own.leases.get(&p).is_some_and(|l| !l.backlog.is_empty()) {
        if bufs.own.backlog_fits(p, want) {
            // Behind what waits, each reply slice as it is.
            let slices = bufs.slices.drain(..).zip(bufs.slice_msgs.drain(..));
            bufs.own.back_up_all(p, want, slices);
            return write_backlog(sh, bufs, p, events);
        }
        // Past the room: as one chunk, which goes back with the lease.
        let mut all = bytes::BytesMut::with_capacity(want);
        for b in bufs.slices.drain(..) {
            all.extend_from_slice(&b);
        }
        return write_behind(sh, bufs, p, all.freeze(), msgs, events);
    }
    let mut sent = 0;
    let mut failed = None;
    // Bounded: each round writes all of its slices or stops.
    for chunk in bufs.slices.chunks(crate::shared::MAX_IOV) {
        let len: usize = chunk.iter().map(|b| b.len()).sum();
        match Wrote::of_io(&crate::shared::with_iov(chunk, |iov| out.write(sh, iov))) {
            Wrote::Bytes(n) if n >= len => sent += n,
            Wrote::Bytes(n) => {
                sent += n;
                break;
            }
            Wrote::Again => break,
            // After earlier rounds went out: what they wrote stays written.
            Wrote::Failed(e) => {
                failed = Some(e);
                break;
            }
        }
    }
    if sent >= want {
        bufs.slices.clear();
        bufs.own.lease_used(p, msgs, want);
        return;
    }
    // The slices written whole are counted as written; the rest, from the
    // one cut short, goes back (one copy where it is several: a slow peer).
    let (mut whole, mut whole_bytes, mut whole_msgs) = (0, 0, 0u32);
    for (b, n) in bufs.slices.iter().zip(&bufs.slice_msgs) {
        if whole_bytes + b.len() > sent {
            break;
        }
        (whole, whole_bytes, whole_msgs) = (whole + 1, whole_bytes + b.len(), whole_msgs.saturating_add(*n));
    }
    if whole_msgs > 0 {
        bufs.own.lease_used(p, whole_msgs, whole_bytes);
    }
    let chunk = match &bufs.slices[whole..] {
        [one] => one.clone(),
        rest => {
            let mut all = bytes::BytesMut::with_capacity(want - whole_bytes);
            for b in rest {
                all.extend_from_slice(b);
            }
            all.freeze()
        }
    };
    bufs.slices.clear();
    let unsent = Unsent { chunk, sent: sent - whole_bytes, msgs: msgs - whole_msgs };
    lease_short(sh, bufs, p, unsent, failed, events);
}

/// What of a leased psock's replies did not go out: `chunk`, `msgs` whole
/// replies, of which the first `sent` bytes did.
struct Unsent {
    chunk: Bytes,
    sent: usize,
    msgs: u32,
}

/// A leased psock's replies went out only in part (`unsent`), because the
/// connection would block or failed (`failed`: its errno). Would block,
/// within the backlog's room (`Own::back_up`; a driver that waits on
/// leases): the rest waits on the lease, and the worker watches the
/// connection's writability ([`write_backlog`]). Otherwise the lease goes
/// back with the rest (behind what its backlog held) first on the psock's
/// queue, for its writable event; a
/// failure then fails the psock's transmit as any write's would (the rest
/// is dropped, counted as addressed drops). An interrupted write is not
/// here: `connmux_sys::socket::writev` writes again on EINTR (bounded), as
/// every write does, and what still ends interrupted waits for the writable
/// event as one that would block.
fn lease_short(
    sh: &Shared,
    bufs: &mut ServeBufs,
    p: PsockId,
    unsent: Unsent,
    failed: Option<i32>,
    events: &mut Vec<Event>,
) {
    if failed.is_none() {
        // Kept on the lease, within its room, for its writable event.
        if let Ok(was_empty) = bufs.own.back_up(p, unsent.chunk.slice(unsent.sent..), unsent.msgs) {
            // (Also what tells the core of the backlog at the next hold.)
            bufs.own.lease_used(p, 0, unsent.sent);
            if let Some(l) = bufs.own.leases.get_mut(&p).filter(|_| was_empty) {
                l.lease.backed_up();
                // (Watched by the driver before its next wait.)
                bufs.own.to_watch.push(l.rt.clone());
            }
            return;
        }
    }
    let Some(mut l) = bufs.own.take_lease(p) else { return };
    // The written part is the lease's; the rest goes behind what earlier
    // writes left, all of it first on the psock's queue.
    l.lease.wrote(0, unsent.sent);
    l.backlog.push(unsent.chunk.slice(unsent.sent..), unsent.msgs);
    let now = sh.now();
    let mut core = sh.lock();
    let rt = Own::return_lease(&mut core, l, now);
    if let Some(errno) = failed {
        core.mux.tx_failed(p, errno);
    }
    core.drain_events(events);
    drop(core);
    if failed.is_none() {
        sh.want_write(&rt);
    }
}

/// Replies of lent psock `p` (`chunk`, `msgs` whole ones) made while its
/// backlog waits: behind it, then as much of it all written as the
/// connection takes. Past the backlog's room the lease goes back with all
/// of it.
#[inline(never)]
fn write_behind(sh: &Shared, bufs: &mut ServeBufs, p: PsockId, chunk: Bytes, msgs: u32, events: &mut Vec<Event>) {
    match bufs.own.back_up(p, chunk, msgs) {
        Ok(_) => write_backlog(sh, bufs, p, events),
        Err(chunk) => lease_short(sh, bufs, p, Unsent { chunk, sent: 0, msgs }, None, events),
    }
}

/// Write lease `p`'s backlog, as much as its connection takes now (it was
/// reported writable, or replies were queued behind). All of it out: the
/// connection's writability is no longer watched. A failed write gives the
/// lease back and fails the psock's transmit, as any write's failure does
/// (what is left is dropped, counted).
pub(crate) fn write_backlog(sh: &Shared, bufs: &mut ServeBufs, p: PsockId, events: &mut Vec<Event>) {
    let Some(l) = bufs.own.leases.get_mut(&p) else { return };
    let fd = l.rt.fd();
    let (mut wrote, mut msgs, mut failed) = (0, 0u32, None);
    let backed_up = !l.backlog.is_empty();
    // Bounded: each round writes all it offers or stops.
    while !l.backlog.is_empty() {
        let chunks = l.backlog.chunks();
        let offer = &chunks[..chunks.len().min(crate::shared::MAX_IOV)];
        let len: usize = offer.iter().map(|b| b.len()).sum();
        match Wrote::of_io(&crate::shared::with_iov(offer, |iov| connmux_sys::socket::writev(fd, iov))) {
            Wrote::Bytes(n) => {
                wrote += n;
                msgs = msgs.saturating_add(l.backlog.advance(n));
                if n < len {
                    break;
                }
            }
            Wrote::Again => break,
            Wrote::Failed(e) => {
                failed = Some(e);
                break;
            }
        }
    }
    let mut restarted = None;
    if l.backlog.is_empty() && failed.is_none() {
        sh.set_interest(&l.rt, |i| i.write = false);
        if backed_up && l.lease.kept() > 0 {
            // Read again: a message begun gets its whole assembly timeout
            // from now (its deadline was held while replies backed up).
            l.lease.restart_kept(sh.now());
            restarted = l.lease.kept_due();
        }
    }
    if let Some(due) = restarted {
        bufs.own.keep.due = Some(bufs.own.keep.due.map_or(due, |d| d.min(due)));
    }
    bufs.own.backlog.held = bufs.own.backlog.held.saturating_sub(wrote);
    // (Even with nothing written: a read whose replies all went behind the
    // backlog is told to the core by the next hold, as any lent read is.)
    bufs.own.lease_used(p, msgs, wrote);
    if let Some(errno) = failed {
        let Some(l) = bufs.own.take_lease(p) else { return };
        let now = sh.now();
        let mut core = sh.lock();
        Own::return_lease(&mut core, l, now);
        core.mux.tx_failed(p, errno);
        core.drain_events(events);
    }
}
