//! The public mux: creation, attach/unattach, errors, statistics.
//!
//! Owns the mux's start (the workers on the driver it picks, or the kernel
//! backend) and stop, and the attach path. Must not name `KcmSocket`
//! (`socket` adds `Mux::socket`), `tls` (which adds `Mux::attach_tls`) or
//! `service` (which adds `Mux::serve`): they stand on the mux.

use std::io;
use std::net::TcpStream;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::MetadataExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use connmux_core::mux::{MuxError, PsockConfig, PsockError, PsockId};
use connmux_core::parser::Parser;
use connmux_core::stats::{MuxStats, PsockStats};
use connmux_sys::epoll::{Epoll, Interest};
use connmux_sys::eventfd::EventFd;

use crate::config::{Backend, Config, Driver};
use crate::driver;
use crate::kernel::{self, KMux};
use crate::shared::{psock_token, Ctx, MuxHub, PsockInterest, PsockRt, Shared, WorkerIo, WorkerRef};
use crate::shared::{Command, ATTACHED};

/// Options of one attach: the parser, and the limits of this connection where
/// they differ from the mux's (`MuxConfig::max_msg_size`,
/// `MuxConfig::assembly_timeout`, the defaults). AF_KCM has these per attached
/// TCP socket: its SO_RCVBUF bounds a message, its SO_RCVTIMEO the assembly.
///
/// ```no_run
/// # use connmux::{AttachOptions, Config, Mux};
/// # use std::time::Duration;
/// # let mux = Mux::new(Config::default())?;
/// # let conn = std::net::TcpStream::connect("127.0.0.1:62049")?;
/// let opts = AttachOptions::new(connmux::parsers::from_spec("l4").unwrap())
///     .max_msg_size(64 << 10)
///     .assembly_timeout(Some(Duration::from_secs(2)));
/// mux.attach_with(&conn, opts)?;
/// # Ok::<(), std::io::Error>(())
/// ```
pub struct AttachOptions {
    /// Finds message boundaries in the connection's byte stream.
    pub parser: Box<dyn Parser>,
    /// Largest message this connection may send us; `None`: the mux's.
    pub max_msg_size: Option<usize>,
    /// Assembly deadline of this connection's messages; `None`: the mux's,
    /// `Some(None)`: none.
    pub assembly_timeout: Option<Option<std::time::Duration>>,
    /// The worker that reads it; `None`: as [`Mux::attach`] chooses.
    pub worker: Option<usize>,
}

impl AttachOptions {
    /// The parser, everything else from the mux.
    pub fn new(parser: Box<dyn Parser>) -> AttachOptions {
        AttachOptions { parser, max_msg_size: None, assembly_timeout: None, worker: None }
    }
    /// This connection's message size limit.
    pub fn max_msg_size(mut self, bytes: usize) -> AttachOptions {
        self.max_msg_size = Some(bytes);
        self
    }
    /// This connection's assembly deadline (`None`: wait forever).
    pub fn assembly_timeout(mut self, timeout: Option<std::time::Duration>) -> AttachOptions {
        self.assembly_timeout = Some(timeout);
        self
    }
    /// The worker that reads this connection.
    pub fn worker(mut self, worker: usize) -> AttachOptions {
        self.worker = Some(worker);
        self
    }
}

impl std::fmt::Debug for AttachOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AttachOptions")
            .field("parser", &self.parser.name())
            .field("max_msg_size", &self.max_msg_size)
            .field("assembly_timeout", &self.assembly_timeout)
            .field("worker", &self.worker)
            .finish()
    }
}

/// Map a core error onto the errno an AF_KCM call would return.
pub(crate) fn io_err(e: MuxError) -> io::Error {
    match e {
        MuxError::WouldBlock => io::Error::from(io::ErrorKind::WouldBlock),
        other => io::Error::from_raw_os_error(other.errno()),
    }
}

pub(crate) struct MuxInner {
    pub shared: Arc<Shared>,
    /// The worker threads, and the threads of closed stand-alone sockets'
    /// slots (`crate::alone`), joined when the mux goes.
    pub threads: Mutex<Vec<JoinHandle<()>>>,
    next_worker: AtomicU64,
    /// `Config::incoming_cpu`.
    incoming_cpu: bool,
    /// `Config::lane_in_order`.
    pub lane_in_order: bool,
    /// `Config::lane_queue`.
    pub lane_queue: usize,
    /// `Config::lane_bytes`.
    pub lane_bytes: usize,
    pub events_rx: crate::events::Events,
    pub serving: AtomicBool,
    /// `Config::max_conns`: a service's cap until it sets its own.
    pub max_conns: Option<usize>,
    /// The epoll workers' passes, which receiving threads may lead
    /// (`crate::lead`; none on io_uring).
    pub leads: Vec<Arc<crate::lead::Lead>>,
}

impl MuxInner {
    /// The worker a new connection is attached to (see `Config::incoming_cpu`).
    pub(crate) fn pick_worker(&self, conn: std::os::fd::BorrowedFd<'_>) -> usize {
        let workers = &self.shared.workers;
        let in_turn = || (self.next_worker.fetch_add(1, Ordering::Relaxed) as usize) % workers.len();
        if !self.incoming_cpu || workers.len() == 1 {
            return in_turn();
        }
        let Ok(cpu) = socket2::SockRef::from(&conn).cpu_affinity() else { return in_turn() };
        let count = |i: usize| workers[i].psocks.load(Ordering::Acquire);
        // Of the workers on that CPU, the one with the fewest connections.
        let Some(here) = (0..workers.len()).filter(|&i| workers[i].cpu == Some(cpu)).min_by_key(|&i| count(i)) else {
            return in_turn();
        };
        let least = (0..workers.len()).min_by_key(|&i| count(i)).unwrap_or(here);
        if count(here) > 2 * count(least) + 8 {
            least
        } else {
            here
        }
    }
}

impl Drop for MuxInner {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        for w in self.shared.workers.iter().chain(&self.shared.alone) {
            let _ = w.wake();
        }
        for t in self.threads.lock().unwrap().drain(..) {
            let _ = t.join();
        }
    }
}

/// A multiplexor: attached connections on one side, KCM sockets on the other.
/// Cheap to clone (a handle); the workers stop when the last handle and the
/// last socket are gone.
///
/// It runs on the backend [`Config::backend`] chose ([`Mux::backend`]): the
/// userspace runtime, or the kernel's AF_KCM (see [`Backend`] for what each
/// call does there).
#[derive(Clone)]
pub struct Mux {
    pub(crate) imp: MuxImp,
}

#[derive(Clone)]
pub(crate) enum MuxImp {
    User(Arc<MuxInner>),
    Kernel(Arc<KMux>),
}

/// Why `Mux::serve` is refused on the kernel backend.
const NO_WORKERS: &str =
    "AF_KCM has no worker threads to serve on (use recv/send on KCM sockets, or Backend::Userspace)";

impl Mux {
    /// Start a mux on the backend `config.backend` picks (see [`Backend`]).
    /// Userspace: its worker threads, with the driver `config.driver` picks
    /// (`Auto`: io_uring where it works here, else epoll). Kernel: an
    /// `Unsupported` error holding [`kernel::BackendError::KernelUnavailable`]
    /// where AF_KCM cannot be created; `Auto` then takes the userspace runtime.
    pub fn new(config: Config) -> io::Result<Mux> {
        match config.backend {
            Backend::Userspace => Self::new_user(config),
            Backend::Kernel => match KMux::new(&config)? {
                Ok(k) => Ok(Mux { imp: MuxImp::Kernel(Arc::new(k)) }),
                Err(why) => {
                    Err(io::Error::new(io::ErrorKind::Unsupported, kernel::BackendError::KernelUnavailable(why)))
                }
            },
            Backend::Auto => match KMux::new(&config)? {
                Ok(k) => Ok(Mux { imp: MuxImp::Kernel(Arc::new(k)) }),
                Err(_) => Self::new_user(config),
            },
        }
    }

    /// The backend this mux runs on (never `Auto`).
    pub fn backend(&self) -> Backend {
        match self.imp {
            MuxImp::User(_) => Backend::Userspace,
            MuxImp::Kernel(_) => Backend::Kernel,
        }
    }

    /// The userspace runtime's state, if this mux runs on it.
    pub(crate) fn user(&self) -> Option<&Arc<MuxInner>> {
        match &self.imp {
            MuxImp::User(u) => Some(u),
            MuxImp::Kernel(_) => None,
        }
    }

    fn new_user(config: Config) -> io::Result<Mux> {
        match config.driver {
            Driver::Epoll => Self::start(&config, Driver::Epoll),
            Driver::Uring => Self::start(&config, Driver::Uring),
            // Each worker decides at its first use (`auto_worker`).
            Driver::Auto if connmux_sys::uring::supported() => Self::start(&config, Driver::Auto),
            Driver::Auto => Self::start(&config, Driver::Epoll),
        }
    }

    fn start(config: &Config, driver: Driver) -> io::Result<Mux> {
        let workers = config.workers.max(1);
        let cpus = driver::cpus_for(&config.placement, workers);
        let mut refs = Vec::with_capacity(workers);
        for &cpu in &cpus {
            let waker = EventFd::new()?;
            let (io, spare) = match driver {
                Driver::Uring => (Some(WorkerIo::Uring), None),
                Driver::Epoll => (Some(WorkerIo::Epoll(epoll_waking(&waker)?)), None),
                Driver::Auto => (None, Some(epoll_waking(&waker)?)),
            };
            refs.push(WorkerRef::new(io, spare, waker, cpu));
        }
        // Stand-alone sockets' slots: epoll always (the thread that runs a
        // slot's pass is an application thread, in its `recv`; a ring is
        // best entered by one thread only).
        let mut alone = Vec::with_capacity(config.stand_alone);
        for _ in 0..config.stand_alone {
            let waker = EventFd::new()?;
            let epoll = epoll_waking(&waker)?;
            alone.push(WorkerRef::new(Some(WorkerIo::Epoll(epoll)), None, waker, None));
        }
        let (events_tx, events_rx) = crate::events::Events::bounded(config.event_queue);
        let shared = Arc::new(Shared {
            hub: Mutex::new(MuxHub {
                mux: connmux_core::mux::Mux::with_owner(config.core.clone(), (workers + config.stand_alone) as u32),
                psocks: Default::default(),
                socks: Default::default(),
            }),
            workers: refs,
            alone_free: Mutex::new((workers..workers + config.stand_alone).rev().collect()),
            alone,
            stop: AtomicBool::new(false),
            read_chunk: config.read_chunk.max(512),
            recv_spin: config.recv_spin,
            lane_nice: config.lane_nice,
            lane_worker_slice: config.lane_worker_slice,
            lane_slice: config.lane_slice,
            events_tx,
            events_dropped: AtomicU64::new(0),
            clock_origin: connmux_sys::clock::now_nanos(),
            tls: Default::default(),
            lane_moves: AtomicU64::new(0),
            lane_returns: AtomicU64::new(0),
            lane_quiet: AtomicU64::new(0),
            unattach_drained: AtomicBool::new(false),
            tuning: config.tuning,
        });
        // An epoll worker's pass may be led by a receiving thread
        // (`crate::lead`); a ring is entered by its own thread only.
        let leads: Vec<Arc<crate::lead::Lead>> = match driver {
            Driver::Uring => Vec::new(),
            _ => (0..workers).map(|i| Arc::new(crate::lead::Lead::new(&shared, i))).collect(),
        };
        let mut threads = Vec::with_capacity(workers);
        let (init_tx, init_rx) = std::sync::mpsc::channel();
        let mut failed = None;
        for (i, cpu) in cpus.into_iter().enumerate() {
            let sh = shared.clone();
            let init = init_tx.clone();
            let lead = leads.get(i).cloned();
            let spawned = std::thread::Builder::new().name(format!("connmux-w{i}")).spawn(move || match driver {
                Driver::Uring => driver::uring::run(sh, i, cpu, init),
                Driver::Epoll => {
                    let _ = init.send(Ok(()));
                    crate::lead::run(sh, lead.expect("an epoll worker's lead"), cpu)
                }
                Driver::Auto => {
                    let _ = init.send(Ok(()));
                    auto_worker(sh, i, cpu, lead.expect("an undecided worker's lead"))
                }
            });
            match spawned {
                Ok(t) => threads.push(t),
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        drop(init_tx);
        // Each worker says whether it could set up its I/O (its ring is created on
        // its own thread: a ring that defers completion work has one issuer).
        for _ in 0..threads.len() {
            match init_rx.recv() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => failed = failed.or(Some(e)),
                Err(_) => failed = failed.or(Some(io::Error::other("worker exited during start"))),
            }
        }
        let inner = MuxInner {
            shared,
            threads: Mutex::new(threads),
            next_worker: AtomicU64::new(0),
            incoming_cpu: config.incoming_cpu,
            lane_in_order: config.lane_in_order,
            lane_queue: config.lane_queue,
            lane_bytes: config.lane_bytes,
            events_rx,
            serving: AtomicBool::new(false),
            max_conns: config.max_conns,
            leads,
        };
        match failed {
            // Dropping `inner` stops and joins the workers that did start.
            Some(e) => Err(e),
            None => Ok(Mux { imp: MuxImp::User(Arc::new(inner)) }),
        }
    }

    /// The I/O driver the first worker runs: `Config::driver` when it
    /// names one; with `Driver::Auto`, io_uring once the worker was asked
    /// to serve ([`Mux::serve`]) before any connection was attached to it,
    /// epoll once a connection came first, `Auto` until then (and on the
    /// kernel backend, which has no workers).
    pub fn driver(&self) -> Driver {
        let Some(u) = self.user() else { return Driver::Auto };
        match u.shared.workers[0].io_decided() {
            Some(WorkerIo::Epoll(_)) => Driver::Epoll,
            Some(WorkerIo::Uring) => Driver::Uring,
            None => Driver::Auto,
        }
    }

    /// The userspace runtime's shared state. Only for paths that have already
    /// dispatched on the backend (or that only a userspace mux reaches).
    pub(crate) fn shared(&self) -> &Arc<Shared> {
        match &self.imp {
            MuxImp::User(u) => &u.shared,
            MuxImp::Kernel(_) => unreachable!("a userspace-only path reached on the kernel backend"),
        }
    }

    /// Number of I/O workers (0 on the kernel backend).
    pub fn workers(&self) -> usize {
        match &self.imp {
            MuxImp::User(u) => u.shared.workers.len(),
            MuxImp::Kernel(_) => 0,
        }
    }

    /// SIOCKCMATTACH: attach a connected TCP socket with a parser. connmux keeps
    /// its own descriptor for the connection (as KCM keeps a file reference), so
    /// closing the caller's descriptor neither detaches nor closes it.
    ///
    /// Its descriptor shares the caller's open file, whose mode is the
    /// mux's while attached: non-blocking (`O_NONBLOCK` set here).
    ///
    /// Userspace: the connection is read by the worker pinned on the CPU where
    /// its packets arrive (`Config::incoming_cpu`), else by the workers in
    /// turn; [`Mux::attach_on`] chooses the worker.
    ///
    /// Errors as AF_KCM: `EOPNOTSUPP` for anything but a connected TCP socket,
    /// `ENOENT` for a bad descriptor, `EALREADY` if already attached to a mux.
    ///
    /// On the kernel backend the parser's kernel form is chosen by its name
    /// ([`Parser::name`], the spec of a built-in parser): the length-field
    /// parsers become generated BPF programs; any other parser is refused
    /// with an `Unsupported` error naming it ([`kernel::BackendError::Parser`]).
    pub fn attach(&self, conn: &impl AsFd, parser: Box<dyn Parser>) -> io::Result<PsockId> {
        match &self.imp {
            MuxImp::User(u) => {
                let w = u.pick_worker(conn.as_fd());
                self.attach_on(conn, parser, w)
            }
            MuxImp::Kernel(k) => k.k.attach(conn, &kernel::kernel_parser_for(parser.name())?),
        }
    }

    /// Attach with a parser given as a BPF program (an ELF object from
    /// `clang -target bpf -O2 -c`, or raw bytecode). Userspace: it runs in
    /// connmux's interpreter (`connmux-bpf`) on each message from its first
    /// byte. Kernel: it is rewritten to read from the message start and
    /// loaded; a program that cannot be rewritten is refused
    /// ([`kernel::BackendError::Parser`]), never attached to mis-frame.
    pub fn attach_bpf(&self, conn: &impl AsFd, program: &BpfProgram) -> io::Result<PsockId> {
        match &self.imp {
            MuxImp::User(_) => {
                let parser = match program {
                    BpfProgram::Elf { object, section } => {
                        connmux_bpf::BpfParser::from_elf_bytes(object, section.as_deref())
                    }
                    BpfProgram::Bytecode(code) => connmux_bpf::BpfParser::from_raw(code),
                }
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
                self.attach(conn, Box::new(parser))
            }
            MuxImp::Kernel(k) => {
                let (p, name) = match program {
                    BpfProgram::Elf { object, section } => (
                        connmux_kernel::KernelParser::Elf { object: object.clone(), section: section.clone() },
                        format!("bpf:{}", section.as_deref().unwrap_or("elf")),
                    ),
                    BpfProgram::Bytecode(code) => {
                        (connmux_kernel::KernelParser::Bytecode(code.clone()), "bpf:raw".to_owned())
                    }
                };
                kernel::check_program(&p, &name)?;
                k.k.attach(conn, &p)
            }
        }
    }

    /// [`Mux::attach`] on a chosen worker (the worker is ignored on the kernel backend).
    pub fn attach_on(&self, conn: &impl AsFd, parser: Box<dyn Parser>, worker: usize) -> io::Result<PsockId> {
        if self.user().is_none() {
            return self.attach(conn, parser);
        }
        self.attach_inner(conn, parser, worker % self.shared().workers.len(), None)
    }

    /// [`Mux::attach`] with per-connection options: the size limit and
    /// assembly deadline of this psock (the mux's are the defaults), and
    /// optionally its worker. On the kernel backend the limits are the mux's
    /// (they are built into the parser program and the TCP socket's options
    /// at attach), so options that set them are refused (`Unsupported`).
    pub fn attach_with(&self, conn: &impl AsFd, opts: AttachOptions) -> io::Result<PsockId> {
        if self.user().is_none() {
            if opts.max_msg_size.is_some() || opts.assembly_timeout.is_some() {
                return Err(kernel::unsupported(
                    "Mux::attach_with with a size limit or assembly timeout",
                    "the kernel backend applies the mux's limits to every attached socket",
                ));
            }
            return self.attach(conn, opts.parser);
        }
        if opts.max_msg_size == Some(0) {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "max_msg_size must be positive"));
        }
        let worker = match opts.worker {
            Some(w) => w % self.shared().workers.len(),
            None => self.user().expect("userspace").pick_worker(conn.as_fd()),
        };
        let limits = PsockConfig {
            max_msg_size: opts.max_msg_size,
            assembly_timeout: opts.assembly_timeout,
            ..PsockConfig::default()
        };
        self.attach_limited(conn, opts.parser, worker, None, limits)
    }

    /// The userspace attach, with the TLS state of a TLS psock, on worker
    /// `worker` (a worker thread's index, or past them a stand-alone
    /// socket's slot: `Shared::worker`).
    pub(crate) fn attach_inner(
        &self,
        conn: &impl AsFd,
        parser: Box<dyn Parser>,
        worker: usize,
        tls: Option<crate::shared::tls::PsockTls>,
    ) -> io::Result<PsockId> {
        self.attach_limited(conn, parser, worker, tls, PsockConfig::default())
    }

    /// [`Mux::attach_inner`] with the psock's own limits (`limits.affinity`
    /// is set here: the worker's index).
    fn attach_limited(
        &self,
        conn: &impl AsFd,
        parser: Box<dyn Parser>,
        worker: usize,
        tls: Option<crate::shared::tls::PsockTls>,
        limits: PsockConfig,
    ) -> io::Result<PsockId> {
        let sh = self.shared();
        let raw = conn.as_fd().as_raw_fd();
        connmux_sys::socket::tcp_check_attachable(raw)?;
        // (`Driver::Auto`: a psock before any ask to serve makes the
        // worker an epoll one; its thread learns it from its waker.)
        let me = sh.worker(worker);
        if me.io_decided().is_none() {
            me.io_for_psock();
            let _ = me.waker.notify();
        }
        let owned = conn.as_fd().try_clone_to_owned().map_err(|_| io::Error::from_raw_os_error(libc::ENOENT))?;
        let ino = std::fs::File::from(owned.try_clone()?).metadata()?.ino();
        let stream = TcpStream::from(owned);
        stream.set_nonblocking(true)?;
        let _ = stream.set_nodelay(true);
        let mut events = Vec::new();
        let rt = {
            let mut core = sh.lock();
            if ATTACHED.lock().unwrap().contains(&ino) {
                return Err(io::Error::from_raw_os_error(libc::EALREADY));
            }
            // A TLS handshake that never ends must not hold the connection
            // (nothing is framed before it, so no assembly deadline runs).
            let handshake_timeout = if tls.is_some() { core.mux.config().handshake_timeout } else { None };
            let cfg = PsockConfig { affinity: Some(worker as u32), handshake_timeout, ..limits };
            core.mux.note_now(sh.now());
            let id = core.mux.attach_to(worker as u32, parser, cfg);
            sh.worker(worker).psocks.fetch_add(1, Ordering::AcqRel);
            let rt = Arc::new(PsockRt {
                id,
                stream,
                worker,
                ino,
                interest: Mutex::new(PsockInterest { read: true, write: false, registered: true }),
                error: Mutex::new(None),
                flush_queued: AtomicBool::new(false),
                writer: Default::default(),
                released: AtomicBool::new(false),
                tls: tls.map(Mutex::new),
                tls_peer: std::sync::OnceLock::new(),
            });
            core.psocks.insert(id, rt.clone());
            ATTACHED.lock().unwrap().insert(ino);
            core.drain_events(&mut events);
            rt
        };
        match sh.worker(worker).io() {
            WorkerIo::Epoll(epoll) => {
                if let Err(e) = epoll.add(rt.fd(), psock_token(rt.id), Interest::READ) {
                    let _ = self.unattach_id(rt.id);
                    return Err(e);
                }
            }
            WorkerIo::Uring => sh.worker(worker).command(Command::Attach(rt.clone())),
        }
        sh.dispatch(&mut events, &mut Ctx::App);
        Ok(rt.id)
    }

    /// SIOCKCMUNATTACH by connection. `ENOENT` if it is not attached to this mux.
    pub fn unattach(&self, conn: &impl AsFd) -> io::Result<()> {
        if let MuxImp::Kernel(k) = &self.imp {
            return k.k.unattach(conn);
        }
        let ino = std::fs::File::from(
            conn.as_fd().try_clone_to_owned().map_err(|_| io::Error::from_raw_os_error(libc::ENOENT))?,
        )
        .metadata()?
        .ino();
        let id = {
            let core = self.shared().lock();
            core.psocks.values().find(|p| p.ino == ino).map(|p| p.id)
        };
        match id {
            Some(id) => self.unattach_id(id),
            None => Err(io::Error::from_raw_os_error(libc::ENOENT)),
        }
    }

    /// SIOCKCMUNATTACH by psock id.
    pub fn unattach_id(&self, p: PsockId) -> io::Result<()> {
        if let MuxImp::Kernel(k) = &self.imp {
            return k.k.unattach_id(p);
        }
        let sh = self.shared();
        let mut events = Vec::new();
        {
            let mut core = sh.lock();
            core.mux.unattach(p).map_err(io_err)?;
            core.drain_events(&mut events);
        }
        sh.dispatch(&mut events, &mut Ctx::App);
        Ok(())
    }

    /// Unattach and reset the connection (the peer sees RST): what a server does
    /// with a connection whose peer misbehaved. A psock that is no longer
    /// attached is left alone (`NotFound`): one the mux closed in order
    /// (its peer closed, every reply written, then FIN: a service lets it
    /// go) keeps its descriptor open while its worker finishes with it, and
    /// a reset then would throw away the last replies its peer has not read
    /// yet. So the psock is unattached first, in the same hold of the core
    /// lock that finds it attached, and reset after.
    pub fn abort(&self, p: PsockId) -> io::Result<()> {
        if let MuxImp::Kernel(k) = &self.imp {
            return k.k.abort(p);
        }
        let sh = self.shared();
        let mut events = Vec::new();
        let rt = {
            let mut core = sh.lock();
            core.mux.unattach(p).map_err(io_err)?;
            core.drain_events(&mut events);
            core.psocks.get(&p).cloned()
        };
        // (The connection's descriptor lives as long as `rt`.)
        if let Some(rt) = rt {
            let _ = connmux_sys::socket::abort(rt.fd());
        }
        sh.dispatch(&mut events, &mut Ctx::App);
        Ok(())
    }

    /// Whether psock `p`'s peer closed its write side in order (FIN) and the
    /// mux closes the connection in order itself: once every message it sent
    /// has been delivered and answered and every reply written, the mux
    /// shuts its write side down (FIN) — see [`Mux::psock_drained`]. A
    /// `PsockEvent` with `PsockError::Closed` for such a psock needs no
    /// action yet: unattaching or aborting it before it is drained drops the
    /// replies still queued for it (counted in `tx_addressed_drops`). A
    /// [`crate::service::Service`] also unattaches it then; otherwise it
    /// stays attached until the application unattaches it (as with KCM).
    /// A TLS psock sends close_notify behind its last reply, then the FIN.
    /// False on the kernel backend.
    pub fn closes_in_order(&self, p: PsockId) -> bool {
        match &self.imp {
            MuxImp::User(u) => {
                let core = u.shared.lock();
                core.mux.peer_closed(p) && core.psocks.contains_key(&p)
            }
            MuxImp::Kernel(_) => false,
        }
    }

    /// Whether psock `p` is drained: its peer closed its write side, every
    /// message it sent has been delivered and answered, every reply written,
    /// and the mux has shut the connection's write side down (FIN; a TLS
    /// psock's close_notify and last records before it). Now it can be
    /// unattached without losing anything. False for a psock that is not
    /// attached (a service unattaches drained psocks itself).
    pub fn psock_drained(&self, p: PsockId) -> bool {
        match &self.imp {
            MuxImp::User(u) => {
                let (drained, rt) = {
                    let core = u.shared.lock();
                    (core.mux.drained(p), core.psocks.get(&p).cloned())
                };
                // (TLS's lock is taken before the core's, never inside it.)
                let tls_shut = rt.as_ref().and_then(|rt| rt.tls.as_ref()).is_none_or(crate::shared::tls::shut);
                drained && tls_shut
            }
            MuxImp::Kernel(_) => false,
        }
    }

    /// The psock failures reported so far (KCM: POLLERR on each TCP socket).
    pub fn events(&self) -> &crate::events::Events {
        match &self.imp {
            MuxImp::User(u) => &u.events_rx,
            MuxImp::Kernel(k) => &k.events_rx,
        }
    }

    /// The first error a psock reported, if any (KCM: SO_ERROR on the TCP socket).
    pub fn psock_error(&self, p: PsockId) -> Option<PsockError> {
        match &self.imp {
            MuxImp::User(u) => u.shared.psock_rt(p).and_then(|rt| rt.error.lock().unwrap().clone()),
            MuxImp::Kernel(k) => k.k.psock_error(p),
        }
    }

    /// The attached psocks.
    pub fn psocks(&self) -> Vec<PsockId> {
        match &self.imp {
            MuxImp::User(u) => u.shared.lock().mux.psocks(),
            MuxImp::Kernel(k) => k.k.psocks(),
        }
    }

    /// Mux-wide statistics (`/proc/net/kcm_stats`). On the kernel backend the counters are the network namespace's (the kernel
    /// has no per-mux totals; compare deltas), `kcms` and `psocks` this
    /// mux's; if the file cannot be read, only those two are set.
    pub fn stats(&self) -> MuxStats {
        match &self.imp {
            MuxImp::User(u) => u.shared.lock().mux.stats(),
            MuxImp::Kernel(k) => k.k.stats().unwrap_or_else(|_| MuxStats {
                psocks: k.k.psocks().len(),
                kcms: k.k.sockets(),
                ..MuxStats::default()
            }),
        }
    }

    /// Bytes the multiplexor holds now (`MuxStats::mem_used`, against
    /// `mem_limit`). The kernel backend keeps no such figure: 0 there.
    pub fn memory_used(&self) -> usize {
        match &self.imp {
            MuxImp::User(u) => u.shared.lock().mux.memory_used(),
            MuxImp::Kernel(_) => 0,
        }
    }

    /// How many psocks are attached now (without listing them).
    pub fn psock_count(&self) -> usize {
        match &self.imp {
            MuxImp::User(u) => u.shared.lock().mux.psock_count(),
            MuxImp::Kernel(k) => k.k.psocks().len(),
        }
    }

    /// The psock idle longest (nothing received, nothing being written) and
    /// for how long; `None` with no psock, and on the kernel backend, which
    /// keeps no such time.
    pub fn idlest(&self) -> Option<(PsockId, std::time::Duration)> {
        match &self.imp {
            MuxImp::User(u) => {
                let now = u.shared.now();
                u.shared.lock().mux.idlest(now)
            }
            MuxImp::Kernel(_) => None,
        }
    }

    /// One psock's statistics.
    pub fn psock_stats(&self, p: PsockId) -> io::Result<PsockStats> {
        match &self.imp {
            MuxImp::User(u) => u.shared.lock().mux.psock_stats(p).map_err(io_err),
            MuxImp::Kernel(k) => k.k.psock_stats(p),
        }
    }

    /// The `/proc/net/kcm`-style live view (the kernel's own file on the
    /// kernel backend; empty if it cannot be read).
    pub fn proc_kcm(&self) -> String {
        match &self.imp {
            MuxImp::User(u) => u.shared.lock().mux.proc_kcm(),
            MuxImp::Kernel(k) => k.k.proc_kcm().unwrap_or_default(),
        }
    }

    /// The `/proc/net/kcm_stats`-style totals of this mux and of its psocks
    /// (the kernel's own file on the kernel backend; empty if it cannot be
    /// read).
    pub fn proc_kcm_stats(&self) -> String {
        match &self.imp {
            MuxImp::User(u) => u.shared.lock().mux.proc_kcm_stats(),
            MuxImp::Kernel(_) => std::fs::read_to_string("/proc/net/kcm_stats").unwrap_or_default(),
        }
    }

    /// The worker that reads psock `p`. `None` for a psock not attached
    /// here, and on the kernel backend (no workers).
    pub fn psock_worker(&self, p: PsockId) -> Option<usize> {
        match &self.imp {
            MuxImp::User(u) => u.shared.lock().psocks.get(&p).map(|rt| rt.worker()),
            MuxImp::Kernel(_) => None,
        }
    }

    /// Connections whose requests were handed to a worker's heavy lane
    /// because the handler ran long on them ([`Mux::serve`]). Always 0 on the
    /// kernel backend.
    pub fn lane_moves(&self) -> u64 {
        match &self.imp {
            MuxImp::User(u) => u.shared.lane_moves.load(Ordering::Relaxed),
            MuxImp::Kernel(_) => 0,
        }
    }

    /// Passes of epoll workers run by application threads in a blocking
    /// receive, which read the connections themselves while nothing was
    /// queued for them (`docs/architecture.md`, "Receiving threads lead
    /// the workers"). Always 0 on io_uring workers and on the kernel
    /// backend.
    pub fn led_passes(&self) -> u64 {
        match &self.imp {
            MuxImp::User(u) => crate::lead::led_passes(&u.leads),
            MuxImp::Kernel(_) => 0,
        }
    }

    /// Connections steered back from a heavy lane to their worker after
    /// their requests ran short again (64 in a row).
    /// Always 0 on the kernel backend.
    pub fn lane_returns(&self) -> u64 {
        match &self.imp {
            MuxImp::User(u) => u.shared.lane_returns.load(Ordering::Relaxed),
            MuxImp::Kernel(_) => 0,
        }
    }

    /// Replies of a heavy lane posted to their worker without waking it,
    /// because the lane held 8 messages or more: the
    /// worker wrote them with others, within 1 ms.
    /// Always 0 on the kernel backend.
    pub fn lane_quiet_replies(&self) -> u64 {
        match &self.imp {
            MuxImp::User(u) => u.shared.lane_quiet.load(Ordering::Relaxed),
            MuxImp::Kernel(_) => 0,
        }
    }

    /// Events dropped because [`Mux::events`] was full.
    pub fn events_dropped(&self) -> u64 {
        match &self.imp {
            MuxImp::User(u) => u.shared.events_dropped.load(Ordering::Relaxed),
            MuxImp::Kernel(k) => k.dropped.load(Ordering::Relaxed),
        }
    }

    /// The kernel mux behind this one (kernel backend), for what only the
    /// kernel has (its `/proc/net/kcm` block, the raw errno of a failure).
    pub fn kernel(&self) -> Option<&connmux_kernel::KernelMux> {
        match &self.imp {
            MuxImp::User(_) => None,
            MuxImp::Kernel(k) => Some(&k.k),
        }
    }

    pub(crate) fn no_workers() -> io::Error {
        kernel::unsupported("Mux::serve", NO_WORKERS)
    }
}

/// A parser given as a BPF socket-filter program, for [`Mux::attach_bpf`]:
/// it returns the message's length, 0 for "need more", or a negative errno.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BpfProgram {
    /// An ELF object (`clang -target bpf -O2 -c`) and the section or function
    /// to take (needed when it has several).
    Elf { object: Vec<u8>, section: Option<String> },
    /// Raw bytecode: 8-byte instructions as the kernel takes them.
    Bytecode(Vec<u8>),
}

/// A worker's epoll, watching its waker.
fn epoll_waking(waker: &EventFd) -> io::Result<Epoll> {
    let epoll = Epoll::new()?;
    epoll.add(waker.as_raw_fd(), driver::WAKER_TOKEN, Interest::READ)?;
    Ok(epoll)
}

/// A worker of `Driver::Auto` (where io_uring works): its I/O is decided
/// at its first use. Asked to serve first (`Mux::serve`, a `Service`: the
/// served path is faster on a ring) it makes a ring on this thread and
/// runs it; a psock attached first (application threads on clones, which
/// lead an epoll worker's pass: `crate::lead`) makes it an epoll worker.
///
/// ```text
///   Undecided ── Command::Serve first (ring made) ──► io_uring worker
///       │
///       └──── a psock attached first (or no ring) ──► epoll worker
/// ```
fn auto_worker(sh: Arc<Shared>, index: usize, cpu: Option<usize>, lead: Arc<crate::lead::Lead>) {
    if let Some(cpu) = cpu {
        let _ = connmux_sys::affinity::pin_current_thread(cpu);
    }
    let me = &sh.workers[index];
    let mut kept = Vec::new();
    while !sh.stop.load(Ordering::Acquire) && me.io_decided().is_none() {
        // (The mux's stop and an attach write the waker too.)
        let _ = connmux_sys::poll::poll_readable(me.waker.as_raw_fd(), None);
        let _ = me.waker.drain();
        me.commands.take_all(&mut kept);
        if kept.iter().any(|c| matches!(c, Command::Serve { .. })) {
            if let Ok(ring) = driver::uring::WorkerRing::new(&sh) {
                if me.take_ring() {
                    repost(me, kept);
                    return ring.run(&sh, index);
                }
            }
            // No ring, or a psock came first: epoll.
            me.io_for_psock();
        }
    }
    repost(me, kept);
    // (Pinned already: `lead::run` pins again, to the same CPU.)
    crate::lead::run(sh, lead, cpu)
}

/// What an undecided worker took, posted again for its driver's loop.
fn repost(me: &WorkerRef, kept: Vec<Command>) {
    if kept.is_empty() {
        return;
    }
    for c in kept {
        let _ = me.commands.post(c);
    }
    let _ = me.waker.notify();
}
