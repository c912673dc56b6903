//! The pool: its threads, the queue they take requests from, submitting a
//! request, running one, and stopping.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use connmux::{KcmSocket, Mux, PsockId, SockType};
use crossbeam::channel::{self, Receiver, Sender};

use crate::conn::{Conn, Conns};
use crate::send::Replier;
use crate::stats::PoolStats;
use crate::waker::Waker;
use crate::Serve;

/// How the pool is run.
#[derive(Clone, Debug)]
pub struct Options {
    /// Its threads are named `{name}-fs{i}` and `{name}-waker`.
    pub name: String,
    /// File-system threads.
    pub threads: usize,
    /// Requests one connection may have waiting in its own backlog, at
    /// most (more, and [`Pool::submit`] refuses). The threads' shared queue
    /// needs no bound of its own: it holds at most `share` requests of each
    /// connection. (It had one, and a worker that found it full waited for
    /// room: with more connections than `queue / share` busy, the workers
    /// stopped, and every client's requests answered on them with it.)
    pub queue: usize,
    /// Requests of one connection with the threads at a time, at most.
    pub share: usize,
    /// Nice steps of the threads below the workers (0: beside them).
    pub nice: i32,
    /// The scheduler slice each thread asks for
    /// (`connmux_sys::affinity::set_current_thread_slice`; Linux 6.12 and
    /// later, ignored before; [`SLICE`] is the shortest).
    /// `Duration::ZERO` (the default): the kernel's. Beside a positive
    /// `nice`, a short slice keeps a thread woken for a request cutting in
    /// soon on a CPU that others keep busy, as the runtime's heavy lanes do
    /// (a thread of lower weight gets a later deadline for the same slice,
    /// and with the kernel's slice it would wait for a busy process's turn
    /// to end).
    pub slice: Duration,
    /// Unwritten reply bytes of a connection above which its requests
    /// wait ([`ROOM`]). The threads' replies in the mux never take more
    /// than one and a half times it ([`Replier::send_gated`]): the rest of
    /// the mux's backlog (`psock_sndbuf`, twice the room by default) is
    /// left for the replies the I/O workers make, which are refused, and
    /// their connection aborted, where it is full.
    pub room: u64,
    /// How long a thread waits to queue a reply before it gives up on the
    /// connection ([`SEND_TIMEOUT`]).
    pub send_timeout: Duration,
}

/// The default room: half the mux's backlog of replies per connection
/// (4 MiB). The replies of the requests let through (up to `share` of
/// them, each up to the message size limit) may go past it, up to the
/// threads' ceiling of one and a half rooms ([`Options::room`]).
pub const ROOM: u64 = 2 << 20;

/// The shortest slice the kernel takes ([`Options::slice`]), what the
/// runtime's heavy lanes ask.
pub const SLICE: Duration = Duration::from_micros(100);

/// The default send timeout: a peer that reads nothing cannot hold a
/// thread longer.
pub const SEND_TIMEOUT: Duration = Duration::from_secs(10);

impl Default for Options {
    fn default() -> Options {
        Options {
            name: "connmux-fsd".into(),
            threads: 8,
            queue: 256,
            share: 4,
            nice: 0,
            slice: Duration::ZERO,
            room: ROOM,
            send_timeout: SEND_TIMEOUT,
        }
    }
}

/// A request for a thread.
pub(crate) struct Job<T: Serve> {
    pub(crate) conn: Arc<Conn<T>>,
    pub(crate) req: T::Req,
}

/// The file-system threads of a server `T`, and the state of the
/// connections it serves.
pub struct Pool<T: Serve> {
    server: T,
    pub(crate) mux: Mux,
    pub(crate) opts: Options,
    jobs: Receiver<Job<T>>,
    pub(crate) tx: Sender<Job<T>>,
    pub(crate) conns: Conns<T>,
    /// Connections paused for room, looked at by the waker thread.
    waker: Waker<T>,
    /// Set when the pool stops: every loop and wait of its threads ends.
    pub(crate) stopping: AtomicBool,
    /// Disconnected (its sender dropped) when the pool stops: the threads
    /// waiting for a request, and anyone waiting to queue one, end.
    pub(crate) quit: Receiver<()>,
    quit_tx: Mutex<Option<Sender<()>>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    pub stats: PoolStats,
}

impl<T: Serve> Pool<T> {
    /// Starts `opts.threads` file-system threads serving `server` and the
    /// waker, each thread with a socket of `mux` to send replies on.
    pub fn start(mux: &Mux, opts: Options, server: T) -> io::Result<Arc<Pool<T>>> {
        let opts = Options {
            threads: opts.threads.max(1),
            queue: opts.queue.max(1),
            share: opts.share.max(1),
            room: opts.room.max(1),
            ..opts
        };
        let mut senders = Vec::with_capacity(opts.threads);
        for _ in 0..opts.threads {
            let s = mux.socket(SockType::Dgram)?;
            // Only for sending: no request is steered here.
            s.set_recv_disable(true)?;
            s.set_sndbuf(usize::MAX / 4)?;
            s.set_write_timeout(Some(opts.send_timeout))?;
            // Never waits inside the mux: a full backlog is waited out by
            // the thread (`Replier`), which can also see the pool stop.
            s.set_nonblocking(true)?;
            senders.push(s);
        }
        let (tx, jobs) = channel::unbounded();
        let (quit_tx, quit) = channel::bounded(0);
        let pool = Arc::new(Pool {
            server,
            mux: mux.clone(),
            opts,
            jobs,
            tx,
            conns: Conns::new(),
            waker: Waker::new(),
            stopping: AtomicBool::new(false),
            quit,
            quit_tx: Mutex::new(Some(quit_tx)),
            threads: Mutex::default(),
            stats: PoolStats::default(),
        });
        let name = pool.opts.name.clone();
        let spawn = |tname: String, f: Box<dyn FnOnce() + Send>| std::thread::Builder::new().name(tname).spawn(f);
        let mut threads = Vec::with_capacity(pool.opts.threads + 1);
        let started = (|| -> io::Result<()> {
            let p = pool.clone();
            threads.push(spawn(format!("{name}-waker"), Box::new(move || p.wake_paused()))?);
            for (i, sock) in senders.into_iter().enumerate() {
                let p = pool.clone();
                threads.push(spawn(format!("{name}-fs{i}"), Box::new(move || p.run(sock)))?);
            }
            Ok(())
        })();
        *pool.threads.lock().unwrap() = threads;
        if let Err(e) = started {
            pool.stop();
            return Err(e);
        }
        Ok(pool)
    }

    /// The server the threads run requests for.
    pub fn server(&self) -> &T {
        &self.server
    }

    /// How it runs.
    pub fn options(&self) -> &Options {
        &self.opts
    }

    /// The state of connection `p`, made (with `data`) at its first request.
    pub fn conn(&self, p: PsockId, data: impl FnOnce() -> T::Conn) -> Arc<Conn<T>> {
        self.conns.get(p, data)
    }

    /// Connections with state.
    pub fn conns(&self) -> usize {
        self.conns.len()
    }

    /// Forgets the connections that are gone: not among `live()` and
    /// older than that look. The waker does it once a second with the
    /// mux's psocks; for a caller that knows better sooner.
    pub fn sweep(&self, live: impl FnOnce() -> Vec<PsockId>) {
        self.conns.sweep(live)
    }

    /// Whether a request of `conn` whose reply is at most `reply` bytes may
    /// be answered outside the pool, by the I/O worker that read it (when
    /// nothing in it can wait): the connection has nothing with the pool
    /// (running, waiting or paused), so every reply of it the mux holds was
    /// given by [`Conn::hold`], and those with this one are within the
    /// room. The replies built outside the pool keep to the pool's bound,
    /// and the connection's backlog below the mux's own (past which a
    /// worker's reply aborts the connection). Never waits.
    pub fn room_outside(&self, conn: &Conn<T>, reply: u64) -> bool {
        let q = conn.lock();
        q.running == 0 && q.backlog.is_empty() && !q.paused && conn.held() + reply <= self.opts.room
    }

    /// Hands a request to the threads, or to its connection's backlog
    /// while the connection has its share with the threads or waits for
    /// room. `make` builds it under the connection's lock (with the
    /// server's state kept there). `false`: the backlog is full (counted
    /// in `overloads`; the server closes the connection), or the pool
    /// stops.
    pub fn submit(&self, conn: &Arc<Conn<T>>, make: impl FnOnce(&mut T::Work) -> T::Req) -> bool {
        let mut q = conn.lock();
        let wait = q.paused || q.running >= self.opts.share;
        if wait && q.backlog.len() >= self.opts.queue {
            self.stats.overloads.fetch_add(1, Relaxed);
            return false;
        }
        let req = make(&mut q.work);
        if wait {
            q.backlog.push_back(req);
            return true;
        }
        q.running += 1;
        drop(q);
        self.queue(Job { conn: conn.clone(), req })
    }

    /// Puts a job on the queue, never waiting (every connection has at most
    /// its share there), unless the pool stops.
    pub(crate) fn queue(&self, job: Job<T>) -> bool {
        if self.stopping() {
            return false;
        }
        self.stats.queued.fetch_add(1, Relaxed);
        self.tx.send(job).is_ok()
    }

    /// Stops the threads and joins them: a thread waiting for a request
    /// ends at once, one running a request when that request's reply is
    /// queued or given up (a reply waiting for room is given up at once).
    /// The requests not yet run are dropped. Idempotent.
    pub fn stop(&self) {
        self.stopping.store(true, SeqCst);
        drop(self.quit_tx.lock().unwrap().take());
        self.waker.stop();
        let threads = std::mem::take(&mut *self.threads.lock().unwrap());
        let me = std::thread::current().id();
        for t in threads {
            // (A thread of the pool that stops it cannot join itself.)
            if t.thread().id() != me {
                let _ = t.join();
            }
        }
    }

    /// The waker thread: until the pool stops, resumes each paused
    /// connection once it has room ([`Pool::look`]) and sweeps the state of
    /// connections the mux no longer has.
    fn wake_paused(&self) {
        self.waker.run(&self.stopping, || self.conns.sweep(|| self.mux.psocks()), |conn| self.look(conn));
    }

    /// Looks at one paused connection: resumes it if it has room (its
    /// backlog up to its share back to the queue), drops its backlog if it
    /// is gone. `false`: still no room.
    fn look(&self, conn: &Arc<Conn<T>>) -> bool {
        match conn.unwritten(self.opts.room, &self.mux) {
            None => conn.set_gone(),
            Some(n) if n >= self.opts.room => return false,
            Some(_) => {}
        }
        let mut q = conn.lock();
        q.paused = false;
        if conn.gone() {
            q.backlog.clear();
            return true;
        }
        let mut resumed = Vec::new();
        while q.running < self.opts.share {
            let Some(req) = q.backlog.pop_front() else { break };
            q.running += 1;
            resumed.push(req);
        }
        drop(q);
        for req in resumed {
            if !self.queue(Job { conn: conn.clone(), req }) {
                break;
            }
        }
        true
    }

    /// Whether [`Pool::stop`] was called.
    pub fn stopping(&self) -> bool {
        self.stopping.load(SeqCst)
    }

    /// Runs one file-system thread until the pool stops.
    fn run(&self, sock: KcmSocket) {
        if self.opts.nice != 0 {
            let _ = connmux_sys::affinity::renice_current_thread(self.opts.nice);
        }
        if !self.opts.slice.is_zero() {
            let _ = connmux_sys::affinity::set_current_thread_slice(self.opts.slice);
        }
        let out = Replier::new(
            &sock,
            self.opts.room.saturating_add(self.opts.room / 2),
            self.opts.send_timeout,
            &self.stopping,
            &self.stats,
        );
        loop {
            let job = channel::select! {
                recv(self.jobs) -> j => match j {
                    Ok(j) => j,
                    Err(_) => return,
                },
                recv(self.quit) -> _ => return,
            };
            let mut next = Some(job);
            // Bounded: each turn runs a request of a backlog, which the
            // connection's peer must send.
            while let Some(job) = next.take() {
                if self.stopping() {
                    out.end_batch();
                    return;
                }
                next = self.run_one(job, &out);
                if next.is_none() {
                    // Not running its connection's next request: the
                    // replies held for it go now.
                    out.end_batch();
                }
            }
        }
    }

    /// Runs one request; returns the next of its connection's backlog for
    /// this thread to run when no other request waits, else queues it.
    fn run_one(&self, job: Job<T>, out: &Replier<'_, T>) -> Option<Job<T>> {
        let Job { conn, req } = job;
        if !conn.gone() {
            match conn.unwritten(self.opts.room, &self.mux) {
                None => conn.set_gone(),
                Some(n) if n >= self.opts.room => {
                    // No room: the request waits, first in line, and the
                    // connection is paused until its peer reads. (Every
                    // request, not only reads: a peer that collects no
                    // reply would otherwise hold threads in the replier
                    // with small ones too.)
                    let mut q = conn.lock();
                    q.running -= 1;
                    q.backlog.push_front(req);
                    if !q.paused {
                        q.paused = true;
                        drop(q);
                        self.stats.paused.fetch_add(1, Relaxed);
                        self.waker.pause(conn);
                    }
                    return None;
                }
                Some(_) => {}
            }
        }
        let mut finished = None;
        if !conn.gone() {
            out.arm(&conn);
            let ok = self.server.serve(&conn, req, out);
            finished = out.take_finished();
            if !ok {
                self.stats.send_failures.fetch_add(1, Relaxed);
                let _ = self.mux.abort(conn.psock());
                conn.set_gone();
            }
        }
        // Ended with its reply (under the lock that reply was queued
        // under), or here.
        let next = match finished {
            Some(next) => next?,
            None => conn.lock().end_run(conn.gone())?,
        };
        let job = Job { conn, req: next };
        // Behind the others' requests when there are some; else run here:
        // queued, it would wake a sleeping thread (a futex wake and a
        // context switch for each request of a pipelined connection) while
        // this one, awake, goes to sleep.
        if !self.jobs.is_empty() {
            self.queue(job);
            return None;
        }
        self.stats.queued.fetch_add(1, Relaxed);
        Some(job)
    }
}
