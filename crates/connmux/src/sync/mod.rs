//! The runtime's cross-thread primitives: everything that carries work or a
//! wake-up from one thread to another outside the hub lock.
//!
//! - [`inbox::Inbox`]: many threads post items to one owner (a worker) and
//!   wake it once; the owner takes them all in its next pass (quiet and
//!   lazy posts: no wake-up while the owner will look anyway).
//! - [`crew::Crew`]: the heavy lanes' queues and the threads that take from
//!   them (a worker's own lane thread, helpers on the other CPUs): a worker
//!   offers a message, a sleeping taker is woken, idle CPUs steal.
//! - [`ready::Ready`]: a KCM socket's readiness, a flag and an eventfd
//!   readable while its condition holds (written only while someone may
//!   wait on it), set by whoever makes it true (a worker queueing a
//!   message), cleared by the reader before it looks again.
//! - [`writer::Writer`]: who writes a psock's connection now, its owner
//!   with no hold of the hub lock or the hub's writers under it.
//! - [`keep::Keep`]: what a socket's own passes kept for its receives,
//!   taken with no hold of the hub lock, given back when it stops
//!   receiving.
//!
//! These files use only the names in `prim` (atomics, a mutex, parking,
//! queues, the eventfd), and
//! `connmux-model` compiles the same files with loom's types in its own
//! `prim`, so loom checks this code, not a copy of it. Nothing here blocks
//! while holding anything another thread waits for: a thread preempted
//! anywhere (a helper runs under `SCHED_IDLE`) delays only its own work
//! (but for `ready`'s transition lock, held for a flag and one eventfd
//! call, on a transition only).

pub mod crew;
pub mod inbox;
pub mod keep;
pub mod prim;
pub mod ready;
pub mod writer;
