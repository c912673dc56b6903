//! A KCM socket's addressed sends waiting to be written (`Outs`, in
//! `SockRt::outs`): the whole messages a socket sent to each psock while it
//! had more to receive (the cork: replies to a backlog leave together, as a
//! server that read a connection's requests in one read answers them in
//! one write), written by the sending thread outside the hub in one
//! `sendmsg` a psock when the psock's writer word is free
//! (`sync::writer`), and counted in one hold of the hub lock for them all.
//!
//! Who writes them: the socket's thread, at its next send made with
//! nothing more to receive, before a send of its that goes through the hub
//! (one socket's sends keep their order), before it waits, at `flush` and
//! at close; and the worker of the psock first sent to, asked once and
//! lazily (`Command::WriteOuts`, within `driver::worker::CORK_WAIT`), so a
//! corked reply never waits for the application to call again. The asked
//! worker writes them only if no thread of the socket holds them: one that
//! does writes them or asks again (`Shared::write_outs_asked`).
//!
//! ```text
//!   send_to ─► a psock's out (appended; the psock looked up once) ─┐
//!                                                                   │ nothing more to
//!   the hub's path (TLS, large, the hub has some of the psock's)    │ receive, a wait,
//!     ◄── written first ── what waits                               ▼ flush, close, ask
//!                                       writer free: one sendmsg a psock, counted in
//!                                       one hold; else queued behind the hub's
//! ```
//!
//! Lock order: the socket's outs, then the hub lock (never the reverse).

use std::io::IoSlice;
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;

use connmux_core::mux::{PsockId, SockId};
use connmux_core::Bytes;

use super::{Command, Ctx, PsockRt, Rts, Shared, SockRt, Wrote};

/// How many written outs' buffers a socket keeps for its next sends (each
/// holds at most twice `Config::read_chunk`).
const SPARE_OUTS: usize = 8;

/// A socket's addressed sends waiting to be written (see the module).
#[derive(Default)]
pub(crate) struct Outs {
    outs: Vec<Out>,
    /// Their bytes: at most `Config::read_chunk` (past it, what waits is
    /// written first).
    bytes: usize,
    /// The out last sent to: a read's messages come a psock at a time, so
    /// their replies too.
    last: usize,
    /// The buffers of outs written, emptied, for the next: a send appends
    /// with no allocation.
    spare: Vec<Vec<u8>>,
    /// Written whole, to count: (psock, bytes, messages).
    sent: Vec<(PsockId, usize, u32)>,
    /// The psocks sent to, looked up with no hold of the hub lock.
    rts: Rts,
}

/// What a socket's send may wait for ([`Shared::send_out`]).
#[derive(Clone, Copy)]
pub(crate) struct Cork {
    /// Messages are kept for it (`SockRt::kept`).
    pub kept: bool,
    /// Its stand-alone slot (worker index), if it is one.
    pub slot: Option<usize>,
}

/// Whole messages for one psock, not yet written.
struct Out {
    rt: Arc<PsockRt>,
    data: Vec<u8>,
    msgs: u32,
}

impl Outs {
    /// Messages waiting.
    pub fn msgs(&self) -> usize {
        self.outs.iter().map(|o| o.msgs as usize).sum()
    }

    /// The index of the out waiting for psock `p`, if one does.
    fn out_of(&self, p: PsockId) -> Option<usize> {
        if self.outs.get(self.last).is_some_and(|o| o.rt.id == p) {
            return Some(self.last);
        }
        self.outs.iter().position(|o| o.rt.id == p)
    }

    /// Whole message `data` sent by socket `sock` to psock `p`, to wait
    /// with the rest, if it may: not TLS (rustls writes its records), not
    /// released, the hub has nothing of the psock's to write (its backlog
    /// and its limits are the hub's) unless sends to it wait here already
    /// (they keep their order), and at most `Config::read_chunk` bytes.
    /// `false`: send it through the hub.
    pub fn push(&mut self, sh: &Shared, sock: SockId, p: PsockId, data: &[u8]) -> bool {
        if data.is_empty() || data.len() > sh.read_chunk {
            return false;
        }
        if self.bytes + data.len() > sh.read_chunk {
            self.write(sh, sock);
        }
        let i = match self.out_of(p) {
            Some(i) if self.outs[i].rt.released.load(Ordering::Acquire) => return false,
            Some(i) => i,
            None => {
                let Some(rt) = self.rts.get(sh, p) else { return false };
                if rt.tls.is_some() || rt.released.load(Ordering::Acquire) || !rt.writer.is_free() {
                    return false;
                }
                let data = self.spare.pop().unwrap_or_default();
                self.outs.push(Out { rt, data, msgs: 0 });
                self.outs.len() - 1
            }
        };
        let o = &mut self.outs[i];
        o.data.extend_from_slice(data);
        o.msgs += 1;
        self.bytes += data.len();
        self.last = i;
        true
    }

    /// Write what waits, each psock's in one `sendmsg` when its writer is
    /// free (`Writer::own`), counted in one hold of the hub lock for them
    /// all (the rest of a short write handed to the hub first on its
    /// queue); otherwise (another thread queued on it since) queued on it
    /// in the hub behind what waits there (`Mux::send_msgs_to_accepted`:
    /// past its backlog limit too, as they were accepted; the socket's next
    /// send to it is the hub's, refused as any is).
    pub fn write(&mut self, sh: &Shared, sock: SockId) {
        if self.outs.is_empty() {
            return;
        }
        self.bytes = 0;
        self.last = 0;
        let mut events = Vec::new();
        for mut o in self.outs.drain(..) {
            if o.rt.released.load(Ordering::Acquire) {
                // Unattached since: never written to a connection the mux
                // has let go; dropped and counted, as its queued ones are.
                let mut core = sh.lock();
                core.mux.tx_direct_rest(sock, o.rt.id, Bytes::new(), 0, o.msgs);
                core.drain_events(&mut events);
                continue;
            }
            let len = o.data.len();
            let owned = o.rt.writer.own();
            let sent = match owned {
                true => match Wrote::of_io(&connmux_sys::socket::writev(o.rt.fd(), &[IoSlice::new(&o.data)])) {
                    Wrote::Bytes(n) => n,
                    // Nothing out: the hub's writer meets the same again.
                    _ => 0,
                },
                false => 0,
            };
            if owned && sent == len {
                self.sent.push((o.rt.id, len, o.msgs));
            } else {
                let mut core = sh.lock();
                // (The buffer goes with them: not kept for the next.)
                let data = Bytes::from(std::mem::take(&mut o.data));
                match owned {
                    // (Nothing may be out: this thread has the writer.)
                    true => core.mux.tx_direct_rest(sock, o.rt.id, data, sent, o.msgs),
                    false => {
                        let _ = core.mux.send_msgs_to_accepted(sock, o.rt.id, data, o.msgs);
                    }
                }
                // Raises the psock for a writer (`PsockTransmit`): marked
                // the hub's before this thread lets go of it.
                core.drain_events(&mut events);
            }
            if owned && o.rt.writer.disown() {
                // A hub writer found it writing and left its chunk.
                sh.flush(&o.rt, &mut events);
            }
            if self.spare.len() < SPARE_OUTS && o.data.capacity() > 0 {
                let mut data = o.data;
                data.clear();
                self.spare.push(data);
            }
        }
        if !self.sent.is_empty() {
            // Counted now: a psock whose peer closed drains once its last
            // replies are counted.
            let mut core = sh.lock();
            for (p, len, msgs) in self.sent.drain(..) {
                core.mux.tx_direct(sock, p, len, msgs);
            }
            core.drain_events(&mut events);
        }
        if !events.is_empty() {
            sh.dispatch(&mut events, &mut Ctx::App);
        }
    }
}

impl Shared {
    /// Addressed send of `data` to `p` by socket `sock`, made to wait in
    /// its outs ([`Outs::push`]) and written now if `more` is false and the
    /// socket has nothing more to receive (none queued, none kept for it:
    /// `Cork::kept`); else, the first time since the last ask
    /// was taken, the worker of `p` is asked to write them (lazily). A
    /// stand-alone socket's next receive writes what waits for its own
    /// slot's connections ([`Cork::slot`]); a send to another slot's
    /// connection waits for nobody (no worker is asked for it): written
    /// now. `false`: not taken; send it through the hub.
    pub fn send_out(&self, sock: &Arc<SockRt>, p: PsockId, data: &[u8], more: bool, cork: Cork) -> bool {
        let mut outs = sock.outs.lock().unwrap();
        if !outs.push(self, sock.id, p, data) {
            return false;
        }
        // (The psock just sent to: its out is the last.)
        let worker = outs.outs[outs.last].rt.worker();
        let someone_writes = worker < self.workers.len() || cork.slot == Some(worker);
        if !more && (!cork.kept && !sock.rx.is_set() || !someone_writes) {
            outs.write(self, sock.id);
            return true;
        }
        drop(outs);
        self.ask_write(sock, worker);
        true
    }

    /// Socket `sock`'s outs, just let go with some waiting, are written by
    /// `worker` (the first time since the last ask was taken; lazily).
    fn ask_write(&self, sock: &Arc<SockRt>, worker: usize) {
        // Paired with `write_outs_asked`'s: an ask it took while this
        // thread held the outs is seen here (asked again), or it saw them
        // let go (and wrote them).
        fence(Ordering::SeqCst);
        // A stand-alone slot's psock is asked of nobody: the slot's thread
        // is the socket's, whose next wait writes them.
        if worker < self.workers.len()
            && !sock.outs_asked.load(Ordering::Relaxed)
            && !sock.outs_asked.swap(true, Ordering::AcqRel)
        {
            self.worker(worker).command_lazy(Command::WriteOuts(sock.clone()));
        }
    }

    /// Write what socket `sock`'s sends left waiting ([`Outs::write`]).
    pub fn write_outs(&self, sock: &SockRt) {
        sock.outs.lock().unwrap().write(self, sock.id);
    }

    /// Messages socket `sock`'s sends left waiting. (Asked again after:
    /// an ask taken while this look held them was left to it.)
    pub fn outs_msgs(&self, sock: &Arc<SockRt>) -> usize {
        let outs = sock.outs.lock().unwrap();
        let (n, worker) = (outs.msgs(), outs.outs.get(outs.last).map(|o| o.rt.worker()));
        drop(outs);
        if let (1.., Some(w)) = (n, worker) {
            self.ask_write(sock, w);
        }
        n
    }

    /// A worker asked to write socket `sock`'s outs (`Command::WriteOuts`):
    /// the ask is taken first, so a send after it asks again. Left to the
    /// thread of the socket that holds them now: every holder writes them
    /// or asks again (a send that corks asks after it lets go, and sees
    /// the ask taken). Waiting for that thread instead (a `sendmsg`, or a
    /// burst of sends) was the futex of a receiving thread leading a
    /// worker (`crate::lead`) whose psocks another socket answered.
    pub fn write_outs_asked(&self, sock: &SockRt) {
        sock.outs_asked.store(false, Ordering::Relaxed);
        // Either the holder's fence comes after this one (its look at the
        // ask sees it taken) or before (this look at the lock sees it let
        // go): see `send_out`.
        fence(Ordering::SeqCst);
        match sock.outs.try_lock() {
            Ok(mut outs) => outs.write(self, sock.id),
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner().write(self, sock.id),
            Err(std::sync::TryLockError::WouldBlock) => {}
        }
    }
}
