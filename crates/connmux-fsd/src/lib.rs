//! The file-system threads of a file server on a connmux [`Mux`](connmux::Mux):
//! the part the 9P server (`connmux-9p-server`) and the NFS server
//! (`connmux nfs-server`) share.
//!
//! Requests are decoded on the mux's I/O workers; those that may wait on
//! the disk are handed to a [`Pool`] of file-system threads, which run them
//! ([`Serve::serve`]) and send the reply on the connection themselves (an
//! addressed send on sockets of the same mux that take no messages,
//! [`Replier`]). A read, a directory listing or an fsync may wait for
//! milliseconds: on a worker that wait would hold every connection the
//! worker reads; here only the thread blocked in the file system waits.
//!
//! What the pool bounds, per connection ([`Conn`]):
//!
//! - **Share**: at most [`Options::share`] of a connection's requests are
//!   with the threads at a time; the rest wait in the connection's own
//!   backlog (at most [`Options::queue`] of them; one more and
//!   [`Pool::submit`] says no, and the server closes the connection). One
//!   client's slow requests hold at most its share of the threads, never
//!   the queue the others' requests pass through. That queue is bounded by
//!   the shares (connections × share) and never makes a worker wait: an
//!   I/O worker blocked on it would leave every connection it reads
//!   unanswered, also the requests it answers itself.
//! - **Room**: a request is run only while its connection's unwritten
//!   replies are under [`Options::room`]. A connection over it is paused
//!   (nothing of its backlog is run or built) until its peer has read
//!   enough ([`waker`], then `Pool::look`): a peer that sends reads and never collects the
//!   replies holds no thread, no CPU, and no more than the room plus its
//!   share of replies in memory. A request a server answers on the I/O
//!   worker instead (one that cannot wait) keeps to the room too
//!   ([`Pool::room_outside`], counted by [`Conn::hold`] without asking the
//!   mux, which a worker must not wait on).
//! - **Send**: a reply the mux refuses (the connection's own backlog is
//!   full), or one that would take the threads' replies in the mux past
//!   one and a half rooms, is retried with growing naps up to
//!   [`Options::send_timeout`]; past it the connection is aborted. The
//!   ceiling leaves the last part of the mux's backlog to the replies the
//!   I/O workers make: one refused there aborts its connection (a
//!   Tversion's reply, read while the threads' replies of 1 MiB reads
//!   filled the backlog, did).
//! - **Batch**: a thread that takes its connection's next request under the
//!   same hold of the lock as a reply's send (it runs it itself) sends that
//!   reply with BATCH: written with the next reply, in one write, at most
//!   a few held so ([`Replier`]); a lone reply is never held, and a batch
//!   the thread does not go on with is ended at once. A reply held so is
//!   on its connection's queue already: one the I/O worker makes after it
//!   (an Rversion, an Rflush) never leaves first.
//!
//! And for the whole: the connections whose state it keeps are swept once
//! a second (those the mux no longer has are forgotten), and
//! [`Pool::stop`] ends and joins every thread it started.

mod conn;
mod pool;
mod send;
mod stats;
pub mod waker;

pub use conn::{Conn, Queue};
pub use pool::{Options, Pool, ROOM, SEND_TIMEOUT, SLICE};
pub use send::{Replier, Sent};
pub use stats::PoolStats;

/// A file server's side of the pool: what a request is, what the server
/// keeps of a connection, and how a request is run.
pub trait Serve: Send + Sync + Sized + 'static {
    /// A request as it waits in a connection's backlog and in the queue.
    type Req: Send + 'static;
    /// The server's own state of a connection (its fids, its session),
    /// made at its first request ([`Pool::conn`]), read by any thread.
    type Conn: Send + Sync + 'static;
    /// What the server keeps of a connection's requests under the same
    /// lock as its backlog (the tags in flight, the flushes waiting).
    type Work: Default + Send + 'static;

    /// Runs one request on a file-system thread and queues its reply with
    /// `out` (nothing, for a request whose reply is not wanted). `false`:
    /// the reply could not be queued in time, and the pool aborts the
    /// connection. Not called for a request of a connection found gone.
    fn serve(&self, conn: &Conn<Self>, req: Self::Req, out: &Replier<'_, Self>) -> bool;
}
