//! A small service framework in the spirit of FreeBSD's ksf: a service owns a
//! listener and its connections (accept → attach, close → unattach), a pool of
//! workers pinned to cores, and a handler that turns each request message into
//! a reply on the connection it came from (addressed mode), run in place on the
//! worker that read it.
//!
//! Owns the listener, its accept thread and `Mux::serve` (the per-worker
//! serving sockets and the lane threads). The top of the runtime: nothing in
//! it names this module; the handler types it re-exports live in `handler`.

use std::io;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use connmux_core::mux::{PsockError, SockType};
use connmux_core::parser::Parser;

pub use crate::handler::{Handler, RunServed, ServiceStats, Verdict};
use crate::mux::Mux;
use crate::shared::Command;
use crate::socket::KcmSocket;
use crate::sync::crew::Taker;
pub use connmux_core::run::{Messages, RunView};

/// as long as it does.
pub struct Serving {
    _sockets: Vec<KcmSocket>,
    lanes: Arc<crate::handler::Lanes>,
    threads: Vec<JoinHandle<()>>,
}

impl Drop for Serving {
    fn drop(&mut self) {
        self.lanes.crew.stop();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Mux {
    /// Run `handler` in place on every worker: one KCM socket per worker with
    /// that worker's affinity, so a connection's requests are handled where
    /// they were read, and move to another worker only when this one falls
    /// behind (`MuxConfig::imbalance`).
    ///
    /// Each worker also has a heavy lane: a queue and a thread on the
    /// worker's CPU, a few nice steps lower, that take the requests of a
    /// connection whose handler runs long (50 µs or more, three times in a
    /// row), so the worker's other connections are not answered behind them
    /// (`Mux::lane_moves` counts such connections). A helper thread on every
    /// worker's CPU, which runs only in that CPU's spare time
    /// (`SCHED_IDLE`), takes from the other workers' lanes, so one
    /// heavy connection's requests are answered on every CPU at once and its
    /// replies may leave out of request order (`Config::lane_in_order`: no
    /// helpers, in order, one CPU). The replies are queued and written by
    /// the worker that reads the connection. A connection whose requests run
    /// short again (`Mux::lane_returns`) goes back to its worker.
    pub fn serve(&self, ty: SockType, handler: Arc<dyn Handler>) -> io::Result<Serving> {
        self.serve_counting(ty, handler, None)
    }

    /// [`Mux::serve`], counting the connections the handler closes in
    /// `stats.closed` (the workers count them as they act on the verdict).
    pub(crate) fn serve_counting(
        &self,
        ty: SockType,
        handler: Arc<dyn Handler>,
        stats: Option<Arc<ServiceStats>>,
    ) -> io::Result<Serving> {
        if self.user().ok_or_else(Mux::no_workers)?.serving.swap(true, Ordering::AcqRel) {
            return Err(io::Error::new(io::ErrorKind::AlreadyExists, "this mux already serves a handler"));
        }
        let first = self.socket(ty)?;
        let mut socks = vec![first];
        for _ in 1..self.workers() {
            let s = socks[0].try_clone()?;
            socks.push(s);
        }
        let sh = self.shared();
        let workers = sh.workers.len();
        let user = self.user().ok_or_else(Mux::no_workers)?;
        // Built first: an error below drops it, which stops and joins the
        // lane threads already started.
        let mut serving = Serving {
            _sockets: Vec::new(),
            lanes: Arc::new(crate::handler::Lanes::new(
                workers,
                user.lane_queue,
                user.lane_bytes,
                user.lane_in_order,
                crate::lane::LANE_STEAL_FROM,
            )),
            threads: Vec::new(),
        };
        let helpers = serving.lanes.crew.helpers() > 0;
        for i in 0..workers {
            let cpu = sh.workers[i].cpu;
            let mut takers = vec![(format!("connmux-lane{i}"), Taker::Home(i), sh.lane_nice)];
            if helpers {
                takers.push((format!("connmux-help{i}"), Taker::Helper(i), 0));
            }
            for (name, who, nice) in takers {
                let (sh, lanes, handler) = (sh.clone(), serving.lanes.clone(), handler.clone());
                let ctx = crate::lane::LaneCtx { who, cpu, nice };
                let t =
                    std::thread::Builder::new().name(name).spawn(move || crate::lane::run(sh, lanes, handler, ctx))?;
                serving.threads.push(t);
            }
        }
        if helpers {
            let cpus = sh.workers.iter().map(|w| w.cpu).collect();
            let lanes = serving.lanes.clone();
            let t = std::thread::Builder::new()
                .name("connmux-scout".into())
                .spawn(move || crate::lane::scout(lanes, cpus))?;
            serving.threads.push(t);
        }
        for (i, s) in socks.iter().enumerate() {
            s.set_affinity(Some(i as u32))?;
            // Replies are bounded per connection (MuxConfig::psock_sndbuf), not
            // by one budget that a single non-reading peer could use up.
            s.set_sndbuf(usize::MAX / 4)?;
            // Requests taken (by the worker, or offered to its lane) are
            // answered before a closing psock closes.
            let _ = sh.lock().mux.set_holds(s.id(), true);
            let rt = sh.sock_rt(s.id()).expect("socket just created");
            sh.workers[i].command(Command::Serve {
                sock: rt,
                handler: handler.clone(),
                stats: stats.clone(),
                lanes: serving.lanes.clone(),
                index: i,
            });
        }
        // Returns once every worker serves: a read a worker makes before it
        // has taken its command (a worker's wait reads before it takes its
        // commands) would go through the socket's queue and `handle`, not
        // in place, for the first requests of a connection accepted at once.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !sh.workers.iter().all(|w| w.serving.load(Ordering::Acquire)) {
            if std::time::Instant::now() > deadline {
                return Err(io::Error::new(io::ErrorKind::TimedOut, "the workers did not start serving"));
            }
            std::thread::sleep(std::time::Duration::from_micros(100));
        }
        serving._sockets = socks;
        Ok(serving)
    }
}

/// Configuration of a service.
pub struct ServiceConfig {
    pub listen: SocketAddr,
    pub sock_type: SockType,
    /// One parser per accepted connection.
    pub parser: Arc<dyn Fn() -> Box<dyn Parser> + Send + Sync>,
}

/// A running service: listener + mux + in-place handler.
pub struct Service {
    mux: Mux,
    local: SocketAddr,
    stop: Arc<AtomicBool>,
    /// Set to stop the accept thread alone ([`Service::stop_accepting`]).
    stop_accept: Arc<AtomicBool>,
    /// Most connections attached at once (0: no cap).
    max_conns: Arc<AtomicUsize>,
    threads: Vec<JoinHandle<()>>,
    stats: Arc<ServiceStats>,
    _serving: Serving,
}

impl Service {
    /// Bind, start accepting and serving.
    pub fn start(mux: Mux, cfg: ServiceConfig, handler: Arc<dyn Handler>) -> io::Result<Service> {
        Self::start_inner(mux, cfg, handler, None)
    }

    /// [`Service::start`] for TLS clients: every accepted connection is
    /// attached with a server connection of `tls` ([`Mux::attach_tls`]).
    pub fn start_tls(
        mux: Mux,
        cfg: ServiceConfig,
        handler: Arc<dyn Handler>,
        tls: Arc<crate::tls::rustls::ServerConfig>,
    ) -> io::Result<Service> {
        Self::start_inner(mux, cfg, handler, Some(tls))
    }

    fn start_inner(
        mux: Mux,
        cfg: ServiceConfig,
        handler: Arc<dyn Handler>,
        tls: Option<Arc<crate::tls::rustls::ServerConfig>>,
    ) -> io::Result<Service> {
        let listener = listen(cfg.listen)?;
        let local = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        let stats = Arc::new(ServiceStats::default());
        // The service owns its connections: a drained one is let go.
        if let Some(u) = mux.user() {
            u.shared.unattach_drained.store(true, Ordering::Release);
        }
        let serving = mux.serve_counting(cfg.sock_type, handler, Some(stats.clone()))?;
        let stop = Arc::new(AtomicBool::new(false));
        let stop_accept = Arc::new(AtomicBool::new(false));
        let max_conns = Arc::new(AtomicUsize::new(mux.user().and_then(|u| u.max_conns).unwrap_or(0)));
        let mut threads = Vec::new();
        {
            let (mux, stop, stats, parser) = (mux.clone(), stop_accept.clone(), stats.clone(), cfg.parser.clone());
            let limit = Accept { max_conns: max_conns.clone() };
            threads.push(
                std::thread::Builder::new()
                    .name("connmux-accept".into())
                    .spawn(move || accept_loop(&mux, &listener, &stop, &stats, &*parser, tls.as_ref(), &limit))?,
            );
        }
        {
            // Reaper: a failed connection is reset and unattached (its
            // descriptor closes). One whose peer only closed its write side
            // is answered, then closed in order by the mux itself.
            let (mux, stop, stats) = (mux.clone(), stop.clone(), stats.clone());
            threads.push(std::thread::Builder::new().name("connmux-reaper".into()).spawn(move || {
                while !stop.load(Ordering::Acquire) {
                    if let Ok(ev) = mux.events().recv_timeout(Duration::from_millis(100)) {
                        stats.closed.fetch_add(1, Ordering::Relaxed);
                        if ev.error == PsockError::Closed && mux.closes_in_order(ev.psock) {
                            continue;
                        }
                        let _ = mux.abort(ev.psock);
                    }
                }
            })?);
        }
        Ok(Service { mux, local, stop, stop_accept, max_conns, threads, stats, _serving: serving })
    }

    /// Cap the connections attached at once: past `max`, the connection
    /// idle longest makes room for the new one if it has been idle (nothing
    /// received, nothing being written) for [`EVICT_IDLE`] or longer: it is
    /// reset and counted in [`ServiceStats::evicted`]. Otherwise the new
    /// connection is closed with a reset as soon as it is accepted, and
    /// counted in [`ServiceStats::refused`] (`None`: no cap). So connections
    /// that never send cannot keep every new client out. It starts at the
    /// mux's [`Config::max_conns`](crate::Config::max_conns) (by default
    /// [`DEFAULT_MAX_CONNS`](crate::DEFAULT_MAX_CONNS)). Why: every
    /// connection costs a descriptor and its buffers; without a cap a peer
    /// that opens connections faster than they fail uses them all. AF_KCM has
    /// no such knob (the listener's backlog and `RLIMIT_NOFILE` are the
    /// nearest).
    pub fn set_max_conns(&self, max: Option<usize>) {
        self.max_conns.store(max.unwrap_or(0), Ordering::Release);
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }
    pub fn mux(&self) -> &Mux {
        &self.mux
    }
    pub fn stats(&self) -> &ServiceStats {
        &self.stats
    }

    /// Stop accepting new connections (the listener closes within 100 ms, as
    /// the accept thread ends); those attached go on being served. The first
    /// step of a graceful stop.
    pub fn stop_accepting(&self) {
        self.stop_accept.store(true, Ordering::Release);
    }

    /// Stop accepting, unattach every connection, stop the threads.
    pub fn shutdown(mut self) {
        self.stop_threads();
    }

    fn stop_threads(&mut self) {
        self.stop.store(true, Ordering::Release);
        self.stop_accept.store(true, Ordering::Release);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        for p in self.mux.psocks() {
            let _ = self.mux.unattach_id(p);
        }
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        self.stop_threads();
    }
}

/// Connections the kernel completes and queues for the accept thread
/// before it drops new ones (`listen(2)`'s backlog; the kernel caps it at
/// `net.core.somaxconn`, 4096 by default). Why this many and not std's 128:
/// a flood of connections that reset at once (or a burst of honest ones)
/// while the accept thread waits for a CPU fills 128 in a moment, and a
/// dropped SYN costs its client a whole second (the first retransmission).
pub const LISTEN_BACKLOG: i32 = 4096;

/// A listening socket on `addr` as `TcpListener::bind` makes it
/// (`SO_REUSEADDR`), with [`LISTEN_BACKLOG`].
fn listen(addr: SocketAddr) -> io::Result<TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let sock = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    sock.set_reuse_address(true)?;
    sock.bind(&addr.into())?;
    sock.listen(LISTEN_BACKLOG)?;
    Ok(sock.into())
}

/// How long a connection must have been idle for a new one to take its
/// place at the connection cap ([`Service::set_max_conns`]). A second: a
/// peer that holds slots without sending loses them as soon as others
/// want them, and a client between two requests of a busy exchange is not
/// one of them.
pub const EVICT_IDLE: Duration = Duration::from_secs(1);

/// What the accept loop checks before attaching.
struct Accept {
    max_conns: Arc<AtomicUsize>,
}

fn accept_loop(
    mux: &Mux,
    listener: &TcpListener,
    stop: &AtomicBool,
    stats: &ServiceStats,
    parser: &(dyn Fn() -> Box<dyn Parser> + Send + Sync),
    tls: Option<&Arc<crate::tls::rustls::ServerConfig>>,
    limit: &Accept,
) {
    // No connection can have been idle for EVICT_IDLE before this: the
    // look over every psock (under the hub lock) is not made again for
    // each connection of a flood at the cap.
    let mut no_idlest_until = std::time::Instant::now();
    while !stop.load(Ordering::Acquire) {
        match listener.accept() {
            Ok((conn, _)) => {
                stats.accepted.fetch_add(1, Ordering::Relaxed);
                let max = limit.max_conns.load(Ordering::Acquire);
                if max > 0 && mux.psock_count() >= max {
                    // At the cap, the connection idle longest makes room if
                    // it has been idle for EVICT_IDLE: connections that
                    // never send cannot keep every new client out.
                    let now = std::time::Instant::now();
                    let idlest = match now >= no_idlest_until {
                        true => mux.idlest(),
                        false => None,
                    };
                    match idlest {
                        Some((p, idle)) if idle >= EVICT_IDLE && mux.abort(p).is_ok() => {
                            stats.evicted.fetch_add(1, Ordering::Relaxed);
                        }
                        _ => {
                            if now >= no_idlest_until {
                                let idle = idlest.map_or(Duration::ZERO, |(_, idle)| idle);
                                no_idlest_until = now + EVICT_IDLE.saturating_sub(idle);
                            }
                            stats.refused.fetch_add(1, Ordering::Relaxed);
                            let _ = connmux_sys::socket::abort(conn.as_raw_fd());
                            continue;
                        }
                    }
                }
                // The mux keeps its own descriptor; ours closes at the end of scope.
                let attached = match tls {
                    None => mux.attach(&conn, parser()).map(drop),
                    Some(cfg) => crate::tls::rustls::ServerConnection::new(cfg.clone())
                        .map_err(io::Error::other)
                        .and_then(|tc| mux.attach_tls(conn, tc, parser()).map(drop)),
                };
                if attached.is_err() {
                    stats.attach_errors.fetch_add(1, Ordering::Relaxed);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                let _ = connmux_sys::poll::poll_readable(listener.as_raw_fd(), Some(Duration::from_millis(100)));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}
