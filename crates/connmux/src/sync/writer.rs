//! Who writes a psock's connection now: its owner, writing a served read's
//! replies with no hold of the hub lock, or the hub's writers (any thread
//! that begins a chunk of the psock's transmit queue, under the lock).
//!
//! One word, so the two never write at once (a message is never cut by
//! another) and the owner never writes past a message the hub has for the
//! psock that it may have queued itself (its replies leave in the order it
//! made them). Messages of other senders queued meanwhile may be overtaken
//! by the owner's: KCM orders one socket's sends, not those of different
//! sockets. One queued before the owner's reply was made is not, also one
//! whose write a batch holds (a file server answers a flush or a new
//! session only once the replies its threads sent are on their way).
//!
//! ```text
//!            own                          disown (no WANT)
//!   free ───────────────► owner ─────────────────────────────► free
//!    │ ▲                    │ a hub writer's claim: WANT        (or hub, if
//!    │ │ idle (nothing      │ (it leaves its chunk unbegun);     marked meanwhile)
//!    │ │ queued, none out)  │ mark: + HUB
//!    ▼ │                    ▼
//!    hub ◄───────────── owner + HUB/WANT: disown returns WANT, and the
//!    (claim, mark)                        owner writes the hub's queue
//! ```
//!
//! `mark`, `claim` and `idle` are called under the hub lock, `own` and
//! `disown` by the owner with no lock. What the word promises: while a
//! chunk of the psock is out with a hub writer, or a message of the
//! owner's own waits on its queue, `HUB` is set (a chunk is claimed before
//! it is begun; a queued message marks it in the hold that drains its
//! `PsockTransmit`, or, held by a batch, in the hold that queued it
//! (`MuxHub::mark_queued`); the owner marks its own replies' hold); it is
//! cleared only in a hold that finds nothing queued and nothing out.

use super::prim::{AtomicU8, Ordering};

/// The owner is writing outside the hub.
const OWNER: u8 = 1;
/// The hub has the psock: a chunk out, or messages queued (as far as a
/// hold of the lock has seen).
const HUB: u8 = 2;
/// A hub writer found the owner writing and left its chunk unbegun: the
/// owner writes the hub's queue once done.
const WANT: u8 = 4;

/// Who writes one psock's connection (see the module's diagram).
pub struct Writer(AtomicU8);

impl Default for Writer {
    fn default() -> Writer {
        Writer(AtomicU8::new(0))
    }
}

impl Writer {
    /// Whether nobody has it now (a look: the owner's `own` decides).
    pub fn is_free(&self) -> bool {
        self.0.load(Ordering::Acquire) == 0
    }

    /// The owner takes the connection for a write of its own: only while
    /// the hub has nothing of the psock's (no chunk out, nothing queued).
    pub fn own(&self) -> bool {
        self.0.compare_exchange(0, OWNER, Ordering::Acquire, Ordering::Relaxed).is_ok()
    }

    /// The owner's write is done (whole, or its rest handed to the hub):
    /// `true` when a hub writer found it writing, so the owner now writes
    /// what the hub has.
    pub fn disown(&self) -> bool {
        self.0.fetch_and(!(OWNER | WANT), Ordering::AcqRel) & WANT != 0
    }

    /// A hub writer, under the lock, before it begins a chunk: `false`
    /// while the owner writes (it writes the hub's chunk when done).
    pub fn claim(&self) -> bool {
        let mut w = self.0.load(Ordering::Acquire);
        loop {
            let (next, ok) = match w {
                w if w & OWNER != 0 => (w | WANT, false),
                w => (w | HUB, true),
            };
            if next == w {
                return ok;
            }
            match self.0.compare_exchange_weak(w, next, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return ok,
                Err(now) => w = now,
            }
        }
    }

    /// Under the lock: a message was queued on the psock (the owner
    /// writes none of its own until it has gone).
    pub fn mark(&self) {
        self.0.fetch_or(HUB, Ordering::AcqRel);
    }

    /// Under the lock, with nothing queued and no chunk out: the owner may
    /// write again.
    pub fn idle(&self) {
        self.0.fetch_and(!HUB, Ordering::Release);
    }
}
