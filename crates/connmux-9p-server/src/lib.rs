//! A 9P2000.L file server on the connmux runtime: one exported directory,
//! served to the Linux kernel's client, diod's tools or any 9P2000.L
//! client, on a [`Mux`] the program makes.
//!
//! ```no_run
//! use connmux::{Config as MuxConfig, Mux};
//! use connmux_9p_server::{Config, Server};
//!
//! let mux = Mux::new(MuxConfig::default())?;
//! let cfg = Config { export: "/srv/share".into(), listen: "127.0.0.1:5640".parse()?, ..Config::default() };
//! let server = Server::start(mux, cfg)?;
//! println!("9P on {}", server.local_addr());
//! // ... mount it: mount -t 9p -o trans=tcp,port=5640,version=9p2000.L 127.0.0.1 /mnt
//! server.shutdown();
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! What it does, how requests run and the security model are in
//! `docs/9p.md`. In short: requests are decoded on the mux's workers; those
//! that touch only the connection's fid table (or `fstat` a descriptor a
//! fid holds) are answered there, the rest by a pool of file-system threads
//! ([`serve`], on `connmux-fsd`'s pool); every path is resolved beneath the export, never following
//! a symlink ([`fs`]); a server run as root does each attach's operations as
//! the user it names ([`users`]); descriptors are spent from a budget
//! ([`fs::Budget`]).
//!
//! `connmux 9p-server` is this crate behind command-line flags.

mod budget;
pub mod fs;
pub mod locks;
pub mod serve;
pub mod users;

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use connmux::service::{Service, ServiceConfig};
use connmux::{Mux, SockType};

pub use serve::{NinepHandler, NinepStats};
pub use users::Users;

/// How the server is run. [`Config::default`] is what `connmux 9p-server`
/// runs with, but for `export`.
#[derive(Clone)]
pub struct Config {
    /// The directory to export.
    pub export: PathBuf,
    /// Where to listen.
    pub listen: SocketAddr,
    /// Refuse every change (EROFS).
    pub read_only: bool,
    /// Serve `user.*` extended attributes and POSIX ACLs.
    pub xattrs: bool,
    /// File-system threads.
    pub fs_threads: usize,
    /// Requests one connection may have waiting in its own backlog for a
    /// file-system thread, at most (more close it).
    pub fs_queue: usize,
    /// Requests of one connection with the file-system threads at a time
    /// (`None`: half of the threads).
    pub fs_share: Option<usize>,
    /// Nice steps of the file-system threads below the workers (3, as
    /// the runtime's heavy lanes: under CPU contention the requests
    /// answered on the workers, small reads and getattrs, are not shared
    /// out among eight threads of walks; `docs/9p.md`).
    pub fs_nice: i32,
    /// The scheduler slice the file-system threads ask for
    /// ([`connmux_fsd::SLICE`], as the heavy lanes: beside the nice value,
    /// a woken thread still cuts in soon on a CPU a busy process holds).
    /// `Duration::ZERO`: the kernel's.
    pub fs_slice: std::time::Duration,
    /// Fids one connection may hold.
    pub max_fids: usize,
    /// Open files in all (`None`: a quarter of the descriptor limit).
    pub max_open: Option<usize>,
    /// Open files of one connection (`None`: a quarter of `max_open`).
    pub max_open_conn: Option<usize>,
    /// The largest msize agreed in Tversion (at most the mux's largest
    /// message).
    pub max_msize: u32,
    /// Serve every attach as this process's user.
    pub squash_users: bool,
    /// Raise the soft `RLIMIT_NOFILE` to the hard limit at start (the
    /// process's, so an embedding program may want to say no).
    pub raise_fd_limit: bool,
    /// Serve TLS clients with this configuration.
    pub tls: Option<Arc<connmux::tls::rustls::ServerConfig>>,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            export: PathBuf::new(),
            listen: SocketAddr::from(([127, 0, 0, 1], 5640)),
            read_only: false,
            xattrs: true,
            fs_threads: 8,
            fs_queue: 256,
            fs_share: None,
            fs_nice: 3,
            fs_slice: connmux_fsd::SLICE,
            max_fids: 131_072,
            max_open: None,
            max_open_conn: None,
            max_msize: 1 << 20,
            squash_users: false,
            raise_fd_limit: true,
            tls: None,
        }
    }
}

/// A running 9P server: its service on the mux and the file-system
/// threads (with the waker of paused connections, which also forgets the
/// state of closed ones: `connmux-fsd`). Dropped or [`Server::shutdown`],
/// it stops them all.
pub struct Server {
    svc: Option<Arc<Service>>,
    handler: Arc<NinepHandler>,
}

impl Server {
    /// Opens the export and serves it on `mux`, listening on `cfg.listen`
    /// (the mux's configuration caps the connections and their messages).
    pub fn start(mux: Mux, cfg: Config) -> io::Result<Server> {
        // Descriptors: open files and fids' O_PATH handles take a quarter
        // of the limit each, at most, so sockets and the descriptors an
        // operation opens for its length keep the rest.
        let limit = if cfg.raise_fd_limit {
            connmux_sys::fileserver::raise_nofile_limit()?
        } else {
            connmux_sys::fileserver::nofile_limit()?
        };
        let quarter = (limit / 4).max(16) as usize;
        let max_open = cfg.max_open.unwrap_or(quarter).max(1);
        let max_open_conn = cfg.max_open_conn.unwrap_or(max_open / 4).clamp(1, max_open);
        let open_files = fs::Budget::new(max_open, max_open_conn);
        let handles = fs::Budget::new(quarter, max_open_conn.min(quarter));
        let opts = fs::Options { read_only: cfg.read_only, xattrs: cfg.xattrs, open_files, handles };
        let export = Arc::new(fs::Export::open(&cfg.export, opts)?);
        let threads = cfg.fs_threads.max(1);
        let pool = connmux_fsd::Options {
            name: "connmux-9p".into(),
            threads,
            queue: cfg.fs_queue,
            // Half: one connection (a kernel mount is one) keeps much of the
            // parallelism, and the other half is always left to the others.
            share: cfg.fs_share.unwrap_or(threads / 2).max(1),
            nice: cfg.fs_nice,
            slice: cfg.fs_slice,
            ..connmux_fsd::Options::default()
        };
        let users = Arc::new(Users::for_this_process(cfg.squash_users));
        let handler = NinepHandler::start(&mux, export, cfg.max_msize, cfg.max_fids, users, pool)?;
        let scfg = ServiceConfig {
            listen: cfg.listen,
            sock_type: SockType::Dgram,
            parser: Arc::new(|| connmux::parsers::from_spec("9p").expect("built-in")),
        };
        let svc = match &cfg.tls {
            None => Service::start(mux, scfg, handler.clone()),
            Some(t) => Service::start_tls(mux, scfg, handler.clone(), t.clone()),
        };
        let svc = match svc {
            Ok(s) => Arc::new(s),
            Err(e) => {
                handler.pool().stop();
                return Err(e);
            }
        };
        Ok(Server { svc: Some(svc), handler })
    }

    /// The service: its address, statistics and mux.
    pub fn service(&self) -> &Service {
        self.svc.as_ref().expect("running")
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.service().local_addr()
    }

    /// The export served.
    pub fn export(&self) -> &fs::Export {
        self.handler.export()
    }

    /// The handler's counters.
    pub fn stats(&self) -> &NinepStats {
        &self.handler.stats
    }

    /// Whom attaches are served as.
    pub fn users(&self) -> &Users {
        self.handler.pool().server().users()
    }

    /// File-system threads.
    pub fn fs_threads(&self) -> usize {
        self.handler.pool().options().threads
    }

    /// The file-system threads' counters.
    pub fn pool_stats(&self) -> &connmux_fsd::PoolStats {
        &self.handler.pool().stats
    }

    /// Connections with state.
    pub fn connections(&self) -> usize {
        self.handler.conns()
    }

    /// Stops accepting connections; those attached go on being served.
    pub fn stop_accepting(&self) {
        self.service().stop_accepting();
    }

    /// The counters as `connmux stat` shows them, one `name=value` a line.
    pub fn counters(&self) -> String {
        let (st, n, x) = (self.service().stats(), self.stats(), self.export());
        let p = self.pool_stats();
        let fds = std::fs::read_dir("/proc/self/fd").map(|d| d.count()).unwrap_or(0);
        let mut out = String::new();
        for (k, v) in [
            ("accepted", st.accepted.load(Relaxed)),
            ("closed", st.closed.load(Relaxed)),
            ("connections", self.connections() as u64),
            ("requests", n.requests.load(Relaxed)),
            ("fs_thread_requests", p.queued.load(Relaxed)),
            ("errors", n.errors.load(Relaxed)),
            ("flushes", n.flushes.load(Relaxed)),
            ("flushes_deferred", n.flushes_deferred.load(Relaxed)),
            ("replies_dropped", n.replies_dropped.load(Relaxed)),
            ("paused", p.paused.load(Relaxed)),
            ("bad_messages", n.bad_messages.load(Relaxed)),
            ("overloads", p.overloads.load(Relaxed)),
            ("send_waits", p.send_waits.load(Relaxed)),
            ("send_failures", p.send_failures.load(Relaxed)),
            ("open_files", x.open_files.used() as u64),
            ("max_open", x.open_files.max_total as u64),
            ("open_refused", x.open_files.refused.load(Relaxed)),
            ("handles", x.handles.used() as u64),
            ("fds", fds as u64),
            ("fd_limit", connmux_sys::fileserver::nofile_limit().unwrap_or(0)),
        ] {
            out.push_str(&format!("{k}={v}\n"));
        }
        out
    }

    /// Stops the service (every connection unattached) and the file-system
    /// threads with their waker, and joins them.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        // The service first: no request reaches the pool after it.
        drop(self.svc.take());
        self.handler.pool().stop();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}
