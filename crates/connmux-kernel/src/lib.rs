//! connmux-kernel: the connmux socket API over Linux's own AF_KCM.
//!
//! [`KernelMux`] and [`KernelSocket`] have the shape of `connmux::Mux` and
//! `connmux::KcmSocket` (socket, try_clone, attach/unattach, send/recv with
//! KCM's flags, batches, receive-disable, statistics, psock failure events),
//! but every call goes to the kernel: a `KernelSocket` is an AF_KCM socket,
//! an attach is `SIOCKCMATTACH` with a BPF program loaded for that connection.
//!
//! ```no_run
//! use connmux_kernel::{KernelMux, KernelParser, SockType};
//! use std::net::TcpStream;
//! let mux = KernelMux::new()?;                    // KernelError::Unsupported without AF_KCM
//! let sock = mux.socket(SockType::Dgram)?;
//! let conn = TcpStream::connect("127.0.0.1:62049")?;
//! sock.attach(&conn, &KernelParser::spec("l4"))?;
//! sock.send(b"\0\0\0\x05hello")?;
//! let mut buf = [0u8; 1024];
//! let n = sock.recv(&mut buf)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Parsers
//! The kernel runs the parser on the TCP segment, not on the message (see
//! [`prog`]). Every program attached here is offset-correct: built-in
//! length-field specs (`l4`, `len:…`, `9p`, `thrift`, `kafka`) become generated
//! bytecode; an ELF object (connmux-bpf's loader) or raw instructions are
//! rewritten to read from the message start, and refused with
//! [`KernelError::NotOffsetSafe`] when that cannot be done. Nothing is ever
//! attached that would mis-frame silently. Specs that are not one length
//! field (`oncrpc`, `http2`, `memcached`) are refused with
//! [`KernelError::UnsupportedParser`].
//!
//! # Bad input
//! As in the userspace runtime: the kernel stops receiving on the connection
//! and posts the error on the TCP socket (EMSGSIZE, EPROTO, ETIMEDOUT, the
//! parser's errno; EPIPE when the peer closed); its counters
//! (`/proc/net/kcm_stats`) record it; [`KernelMux::wait_events`] returns a
//! typed [`PsockEvent`] and [`KernelMux::abort`] resets the connection.
//!
//! # Departures from the userspace runtime
//! The kernel does not say which connection a message came from (no addressed
//! receive or send); one kernel mux has one socket type (SIOCKCMCLONE copies
//! it); mux statistics are the network namespace's totals; the kernel's own
//! departures (docs/kcm-compat.md) apply unchanged.
//!
//! What this crate does not do: `unsafe` (the system calls are in
//! connmux-sys, the state map included), threads, or anything on a
//! kernel without AF_KCM beyond saying so.
#![forbid(unsafe_code)]

pub mod proc;
pub mod prog;

use std::collections::BTreeSet;
use std::io::{self, IoSlice};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use connmux_core::mux::{PsockError, PsockId, RecvFlags, RxError, SendFlags};
use connmux_core::parser::{ParseError, EMSGSIZE, EPIPE, EPROTO, ETIMEDOUT};
use connmux_core::stats::{MuxStats, PsockStats, SockStats};
use connmux_sys::epoll::{Epoll, Events, Interest};
use connmux_sys::kcm;

pub use connmux_core::mux::SockType;
pub use proc::ProcMux;

/// Errors particular to the kernel backend (everything else is the kernel's
/// errno as an `io::Error`).
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// `socket(AF_KCM)` failed: the kernel has no KCM (EAFNOSUPPORT) or it is
    /// not allowed here.
    #[error("AF_KCM is not available on this kernel ({0}); use the userspace backend")]
    Unsupported(io::Error),
    /// The parser spec does not parse.
    #[error("parser spec: {0}")]
    Spec(String),
    /// A valid spec whose framing the kernel backend cannot express in BPF.
    #[error("parser {0:?} has no kernel program (only single length-field framings do); use the userspace backend")]
    UnsupportedParser(String),
    /// A user program that would read from the TCP segment start, not the message start.
    #[error("parser program is not offset-safe under KCM: {0}")]
    NotOffsetSafe(String),
    /// The ELF object or bytecode could not be read.
    #[error("parser program: {0}")]
    Program(#[from] connmux_bpf::LoadError),
    /// bpf(2) refused the map or the program (no CAP_BPF, verifier).
    #[error("loading the parser into the kernel: {0}")]
    Load(String),
    /// A system call failed.
    #[error(transparent)]
    Io(#[from] io::Error),
}

impl From<KernelError> for io::Error {
    fn from(e: KernelError) -> io::Error {
        match e {
            KernelError::Io(e) => e,
            KernelError::Unsupported(e) => {
                io::Error::new(e.kind(), KernelError::Unsupported(io::Error::from(e.kind())))
            }
            other => io::Error::new(io::ErrorKind::InvalidInput, other),
        }
    }
}

/// The parser for one attached connection.
#[derive(Clone, Debug)]
pub enum KernelParser {
    /// A `connmux_core::parsers::from_spec` spec (`l4`, `len:…`, `9p`, `thrift`, `kafka`).
    Spec(String),
    /// An ELF object from `clang -target bpf -O2 -c`, and the section or
    /// function to take (needed when it has several).
    Elf { object: Vec<u8>, section: Option<String> },
    /// Raw bytecode (8-byte instructions).
    Bytecode(Vec<u8>),
}

impl KernelParser {
    pub fn spec(s: &str) -> KernelParser {
        KernelParser::Spec(s.to_owned())
    }
    /// The kernel form of a userspace parser, by its canonical name.
    pub fn from_parser(p: &dyn connmux_core::Parser) -> KernelParser {
        KernelParser::Spec(p.name().to_owned())
    }
    /// The instructions to load, given the state map's fd.
    pub fn program(&self, map_fd: RawFd) -> Result<Vec<[u8; 8]>, KernelError> {
        self.program_limited(map_fd, None)
    }
    /// [`KernelParser::program`], refusing (EMSGSIZE) a message longer than
    /// `max` bytes, as the userspace runtime's `max_msg_size` does.
    pub fn program_limited(&self, map_fd: RawFd, max: Option<u32>) -> Result<Vec<[u8; 8]>, KernelError> {
        let insns = match self {
            KernelParser::Spec(s) => prog::field_program_limited(&prog::FieldSpec::from_spec(s)?, map_fd, max),
            KernelParser::Elf { object, section } => {
                let p =
                    connmux_bpf::elf::load_program(object, section.as_deref()).map_err(connmux_bpf::LoadError::from)?;
                prog::rewrite_program_limited(&p.insns, map_fd, max)?
            }
            KernelParser::Bytecode(code) => {
                let p = connmux_bpf::Program::from_bytes(code)?;
                prog::rewrite_program_limited(p.insns(), map_fd, max)?
            }
        };
        Ok(insns.into_iter().map(|i| i.to_bytes()).collect())
    }
    /// The header length of a generated length-field program (`None` for a
    /// user's program).
    fn field_header(&self) -> Option<usize> {
        match self {
            KernelParser::Spec(s) => prog::FieldSpec::from_spec(s).ok().map(|f| f.offset + f.width),
            _ => None,
        }
    }
    fn name(&self) -> String {
        match self {
            KernelParser::Spec(s) => s.clone(),
            KernelParser::Elf { section, .. } => format!("bpf:{}", section.as_deref().unwrap_or("elf")),
            KernelParser::Bytecode(_) => "bpf:raw".into(),
        }
    }
}

impl From<&str> for KernelParser {
    fn from(s: &str) -> Self {
        KernelParser::spec(s)
    }
}

/// A psock failure, as the kernel posts it on the TCP socket (`SO_ERROR`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PsockEvent {
    pub psock: PsockId,
    pub error: PsockError,
    /// The raw errno the kernel posted.
    pub errno: i32,
}

/// Map the errno on an attached TCP socket to the userspace runtime's error,
/// knowing which program was attached: a generated length-field program
/// returns `-EPROTO` only for a length below its header (the userspace
/// parsers' [`ParseError::LengthBelowHeader`]; strparser's own EPROTO, a
/// length inside bytes already gathered, cannot follow from such a program);
/// for a user's program EPROTO is ambiguous and read as strparser's.
/// Values the kernel does not report (the length, the limit) are 0.
pub fn classify_for(errno: i32, field_header: Option<usize>) -> PsockError {
    match (errno, field_header) {
        (EPROTO, Some(header)) => PsockError::Rx(RxError::Parser(ParseError::LengthBelowHeader { length: 0, header })),
        _ => classify(errno),
    }
}

/// The psock counters the userspace runtime keeps for an error that stopped
/// receive, derived from the error the kernel posted (the kernel keeps these
/// counters per network namespace only): RX-Aborts and the matching one of
/// RX-TooBig, RX-BadLen, RX-Timeout, RX-Intr.
pub fn error_counters(s: &mut PsockStats, e: &PsockError) {
    let PsockError::Rx(rx) = e else { return };
    s.rx_aborts = 1;
    match rx {
        RxError::TooBig { .. } => s.rx_msg_too_big += 1,
        RxError::BadLength { .. } => s.rx_bad_hdr_len += 1,
        RxError::Timeout => s.rx_msg_timeouts += 1,
        RxError::Parser(_) => s.rx_interrupted += 1,
        // TLS and the mux-wide limits run only on userspace psocks.
        RxError::Tls(_) | RxError::MemLimit { .. } | RxError::IdleTimeout | RxError::HandshakeTimeout => {}
    }
}

/// Map the errno on an attached TCP socket to the userspace runtime's error.
pub fn classify(errno: i32) -> PsockError {
    match errno {
        EMSGSIZE => PsockError::Rx(RxError::TooBig { len: 0, max: 0 }),
        EPROTO => PsockError::Rx(RxError::BadLength { len: 0, gathered: 0 }),
        ETIMEDOUT => PsockError::Rx(RxError::Timeout),
        EPIPE => PsockError::Closed,
        e if e == libc::ECONNRESET => PsockError::Closed,
        e => PsockError::Rx(RxError::Parser(ParseError::Program(e))),
    }
}

struct SockSlot {
    key: u64,
    index: u32,
    fd: RawFd,
}

struct PsockSlot {
    id: PsockId,
    index: u32,
    ino: u64,
    /// Our own reference to the connection, to read its errors and unattach
    /// it; dropped when the kernel mux goes (last KCM socket closed).
    tcp: OwnedFd,
    error: Option<(PsockError, i32)>,
    parser: String,
    /// The header length of a generated program (see [`classify_for`]).
    field_header: Option<usize>,
}

impl PsockSlot {
    fn classify(&self, errno: i32) -> PsockError {
        classify_for(errno, self.field_header)
    }
}

/// Limits applied to every connection attached to a [`KernelMux`], as the
/// userspace runtime's `MuxConfig` applies them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Limits {
    /// Largest message: the parser program answers EMSGSIZE above it (the
    /// kernel also refuses anything above the TCP socket's SO_RCVBUF).
    pub max_msg_size: Option<usize>,
    /// Assembly timeout: set as the TCP socket's SO_RCVTIMEO before attach,
    /// which strparser uses as its message timer (ETIMEDOUT).
    pub assembly_timeout: Option<Duration>,
}

#[derive(Default)]
struct State {
    ty: Option<SockType>,
    socks: Vec<SockSlot>,
    psocks: Vec<PsockSlot>,
    next_key: u64,
    next_generation: u32,
    /// Failures reported through `wait_events`/`psock_error`.
    failures: u64,
    /// Connections reset by `abort`.
    aborts: u64,
}

struct Inner {
    st: Mutex<State>,
    errors: Epoll,
    limits: Limits,
}

/// A kernel multiplexor. A kernel mux exists while at least one of its KCM
/// sockets is open; [`KernelMux::socket`] makes the first (a new kernel mux)
/// or clones a live one. Cheap to clone (a handle).
#[derive(Clone)]
pub struct KernelMux {
    inner: Arc<Inner>,
}

fn lowest_unused(used: impl Iterator<Item = u32>) -> u32 {
    let used: BTreeSet<u32> = used.collect();
    (0..).find(|i| !used.contains(i)).unwrap_or(u32::MAX)
}

fn inode(fd: BorrowedFd<'_>) -> io::Result<u64> {
    let owned = fd.try_clone_to_owned().map_err(|_| io::Error::from_raw_os_error(libc::ENOENT))?;
    Ok(std::fs::File::from(owned).metadata()?.ino())
}

impl KernelMux {
    /// Checks that AF_KCM works here: [`KernelError::Unsupported`] otherwise.
    pub fn new() -> Result<KernelMux, KernelError> {
        Self::with_limits(Limits::default())
    }

    /// [`KernelMux::new`] with limits for every connection attached.
    pub fn with_limits(limits: Limits) -> Result<KernelMux, KernelError> {
        drop(kcm::kcm_socket(false).map_err(KernelError::Unsupported)?);
        Ok(KernelMux { inner: Arc::new(Inner { st: Mutex::new(State::default()), errors: Epoll::new()?, limits }) })
    }

    /// The limits given at creation.
    pub fn limits(&self) -> Limits {
        self.inner.limits
    }

    /// Whether this kernel has AF_KCM.
    pub fn supported() -> bool {
        kcm::kcm_socket(false).is_ok()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.inner.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A KCM socket on this mux: a clone of a live one, or the first of a new
    /// kernel mux. A kernel mux has one type: asking for the other one while
    /// sockets are open is `EINVAL`.
    pub fn socket(&self, ty: SockType) -> io::Result<KernelSocket> {
        let mut st = self.lock();
        let fd = match st.socks.first() {
            Some(s) => {
                if st.ty != Some(ty) {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        "a kernel KCM mux has one socket type (SIOCKCMCLONE copies it)",
                    ));
                }
                kcm::kcm_clone(s.fd)?
            }
            None => {
                // The previous kernel mux (if any) is gone with its last socket.
                st.psocks.clear();
                st.ty = Some(ty);
                kcm::kcm_socket(ty == SockType::SeqPacket)?
            }
        };
        Ok(self.register(&mut st, fd, ty))
    }

    fn register(&self, st: &mut State, fd: OwnedFd, ty: SockType) -> KernelSocket {
        let index = lowest_unused(st.socks.iter().map(|s| s.index));
        st.next_key += 1;
        let key = st.next_key;
        st.socks.push(SockSlot { key, index, fd: fd.as_raw_fd() });
        KernelSocket { mux: self.clone(), fd, ty, key, nonblocking: std::sync::atomic::AtomicBool::new(false) }
    }

    /// SIOCKCMATTACH through any open socket of this mux.
    pub fn attach(&self, conn: &impl AsFd, parser: &KernelParser) -> io::Result<PsockId> {
        let fd = self
            .lock()
            .socks
            .first()
            .map(|s| s.fd)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotConnected, "no KCM socket open on this mux"))?;
        self.attach_via(fd, conn.as_fd(), parser)
    }

    fn attach_via(&self, kfd: RawFd, conn: BorrowedFd<'_>, parser: &KernelParser) -> io::Result<PsockId> {
        // The state map lives as long as the program that references it.
        let map = connmux_sys::bpf::map_create_array(prog::STATE_SIZE, 1).map_err(|e| match e.raw_os_error() {
            Some(libc::EPERM) => e,
            _ => io::Error::from(KernelError::Load(format!("BPF_MAP_CREATE: {e}"))),
        })?;
        let map_fd = map.as_raw_fd();
        let limits = self.inner.limits;
        let max = limits.max_msg_size.map(|m| u32::try_from(m).unwrap_or(u32::MAX));
        let insns = parser.program_limited(map_fd, max)?;
        if let Some(t) = limits.assembly_timeout {
            connmux_sys::socket::set_rcvtimeo(conn.as_raw_fd(), Some(t))?;
        }
        let prog = connmux_sys::bpf::prog_load_socket_filter(&insns, "GPL").map_err(|e| match e.raw_os_error() {
            Some(libc::EPERM) => e,
            _ => io::Error::from(KernelError::Load(e.to_string())),
        })?;
        let mut st = self.lock();
        kcm::kcm_attach(kfd, conn.as_raw_fd(), prog.as_raw_fd())?;
        drop((prog, map));
        let ino = inode(conn)?;
        let tcp = conn.try_clone_to_owned()?;
        let index = lowest_unused(st.psocks.iter().map(|p| p.index));
        st.next_generation = st.next_generation.wrapping_add(1);
        let id = PsockId { index, generation: st.next_generation };
        let _ = self.inner.errors.add(
            tcp.as_raw_fd(),
            token(id),
            Interest { readable: false, writable: false, edge: false },
        );
        st.psocks.push(PsockSlot {
            id,
            index,
            ino,
            tcp,
            error: None,
            parser: parser.name(),
            field_header: parser.field_header(),
        });
        Ok(id)
    }

    /// SIOCKCMUNATTACH by connection: `ENOENT` if not attached to this mux.
    pub fn unattach(&self, conn: &impl AsFd) -> io::Result<()> {
        let ino = inode(conn.as_fd())?;
        let id = self.lock().psocks.iter().find(|p| p.ino == ino).map(|p| p.id);
        match id {
            Some(id) => self.unattach_id(id),
            None => {
                // Not ours: let the kernel answer (ENOENT, or a mux we do not know).
                let fd = self.lock().socks.first().map(|s| s.fd);
                match fd {
                    Some(k) => kcm::kcm_unattach(k, conn.as_fd().as_raw_fd()),
                    None => Err(io::Error::from_raw_os_error(libc::ENOENT)),
                }
            }
        }
    }

    /// SIOCKCMUNATTACH by psock id.
    pub fn unattach_id(&self, p: PsockId) -> io::Result<()> {
        let mut st = self.lock();
        let at = st.psocks.iter().position(|s| s.id == p).ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))?;
        let k = st.socks.first().map(|s| s.fd).ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))?;
        kcm::kcm_unattach(k, st.psocks[at].tcp.as_raw_fd())?;
        let slot = st.psocks.remove(at);
        let _ = self.inner.errors.delete(slot.tcp.as_raw_fd());
        Ok(())
    }

    /// Unattach and reset the connection (the peer sees RST), as
    /// `connmux::Mux::abort`.
    pub fn abort(&self, p: PsockId) -> io::Result<()> {
        let tcp = {
            let st = self.lock();
            st.psocks.iter().find(|s| s.id == p).map(|s| s.tcp.try_clone()).transpose()?
        };
        let tcp = tcp.ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))?;
        let r = self.unattach_id(p);
        connmux_sys::socket::abort(tcp.as_raw_fd())?;
        self.lock().aborts += 1;
        r
    }

    /// KCM sockets open on this mux.
    pub fn sockets(&self) -> usize {
        self.lock().socks.len()
    }

    /// The attached psocks.
    pub fn psocks(&self) -> Vec<PsockId> {
        self.lock().psocks.iter().map(|p| p.id).collect()
    }

    /// The parser a psock was attached with (its spec, or `bpf:…`).
    pub fn psock_parser(&self, p: PsockId) -> Option<String> {
        self.lock().psocks.iter().find(|s| s.id == p).map(|s| s.parser.clone())
    }

    /// The first error the kernel posted on a psock's TCP socket, if any.
    pub fn psock_error(&self, p: PsockId) -> Option<PsockError> {
        let mut st = self.lock();
        let slot = st.psocks.iter_mut().find(|s| s.id == p)?;
        if slot.error.is_none() {
            if let Ok(Some(e)) = connmux_sys::socket::take_error(slot.tcp.as_raw_fd()) {
                slot.error = Some((slot.classify(e), e));
                st.failures += 1;
                let slot = st.psocks.iter().find(|s| s.id == p)?;
                return slot.error.as_ref().map(|e| e.0.clone());
            }
        }
        slot.error.as_ref().map(|e| e.0.clone())
    }

    /// Wait up to `timeout` for psock failures (KCM: POLLERR on the TCP
    /// socket) and return the new ones. Each is returned once.
    pub fn wait_events(&self, timeout: Duration) -> io::Result<Vec<PsockEvent>> {
        let mut events = Events::with_capacity(64);
        self.inner.errors.wait(&mut events, Some(timeout))?;
        let mut out = Vec::new();
        let mut st = self.lock();
        let mut new_failures = 0;
        for ev in events.iter() {
            let Some(slot) = st.psocks.iter_mut().find(|s| token(s.id) == ev.token) else {
                continue;
            };
            if slot.error.is_none() {
                match connmux_sys::socket::take_error(slot.tcp.as_raw_fd()) {
                    Ok(Some(e)) => slot.error = Some((slot.classify(e), e)),
                    _ if ev.hup => slot.error = Some((PsockError::Closed, EPIPE)),
                    _ => continue,
                }
                new_failures += 1;
                let (error, errno) = slot.error.clone().expect("just set");
                out.push(PsockEvent { psock: slot.id, error, errno });
            }
            // Reported once: stop watching it.
            let _ = self.inner.errors.delete(slot.tcp.as_raw_fd());
        }
        st.failures += new_failures;
        Ok(out)
    }

    /// Failures reported so far, and connections reset by [`KernelMux::abort`].
    pub fn failure_counts(&self) -> (u64, u64) {
        let st = self.lock();
        (st.failures, st.aborts)
    }

    /// Namespace-wide totals from `/proc/net/kcm_stats` (the kernel has no
    /// per-mux totals), with this mux's live socket and psock counts.
    pub fn stats(&self) -> io::Result<MuxStats> {
        let text = std::fs::read_to_string("/proc/net/kcm_stats")?;
        let mut s = proc::parse_kcm_stats(&text)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "unexpected /proc/net/kcm_stats layout"))?;
        {
            let st = self.lock();
            s.kcms = st.socks.len();
            s.psocks = st.psocks.len();
        }
        Ok(s)
    }

    /// This mux's block of `/proc/net/kcm`: the one whose KCM socket indexes and
    /// psock count are ours. `NotFound` if none or several match.
    pub fn proc_mux(&self) -> io::Result<ProcMux> {
        let text = self.proc_kcm()?;
        let (mine, psocks): (BTreeSet<u32>, usize) = {
            let st = self.lock();
            (st.socks.iter().map(|s| s.index).collect(), st.psocks.len())
        };
        let mut found: Vec<ProcMux> = proc::parse_kcm(&text)
            .into_iter()
            .filter(|m| m.psocks == psocks && m.socks.iter().map(|s| s.0).collect::<BTreeSet<u32>>() == mine)
            .collect();
        match found.len() {
            1 => Ok(found.remove(0)),
            0 => Err(io::Error::new(io::ErrorKind::NotFound, "this mux is not in /proc/net/kcm")),
            n => Err(io::Error::new(io::ErrorKind::NotFound, format!("{n} muxes in /proc/net/kcm look like this one"))),
        }
    }

    /// One psock's counters: messages and bytes from its `/proc/net/kcm`
    /// line; the receive-abort counters from the error the kernel posted on
    /// it ([`error_counters`]; the kernel keeps those per namespace only).
    pub fn psock_stats(&self, p: PsockId) -> io::Result<PsockStats> {
        let index = self
            .lock()
            .psocks
            .iter()
            .find(|s| s.id == p)
            .map(|s| s.index)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))?;
        let m = self.proc_mux()?;
        let mut s = m
            .psock_lines
            .into_iter()
            .find(|l| l.0 == index)
            .map(|l| l.1)
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
        if let Some(e) = self.psock_error(p) {
            error_counters(&mut s, &e);
        }
        Ok(s)
    }

    /// `/proc/net/kcm` as the kernel prints it.
    pub fn proc_kcm(&self) -> io::Result<String> {
        std::fs::read_to_string("/proc/net/kcm")
    }

    fn sock_index(&self, key: u64) -> Option<u32> {
        self.lock().socks.iter().find(|s| s.key == key).map(|s| s.index)
    }

    fn close_sock(&self, key: u64) {
        let mut st = self.lock();
        st.socks.retain(|s| s.key != key);
        if st.socks.is_empty() {
            // The kernel mux goes with its last socket: it unattaches every
            // psock and drops its references; drop ours too.
            for p in st.psocks.drain(..) {
                let _ = self.inner.errors.delete(p.tcp.as_raw_fd());
            }
            st.ty = None;
        }
    }
}

fn token(id: PsockId) -> u64 {
    (u64::from(id.generation) << 32) | u64::from(id.index)
}

/// What a receive returned besides the bytes. The kernel does not say which
/// connection a message came from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecvInfo {
    /// Bytes copied.
    pub len: usize,
    /// MSG_EOR.
    pub eor: bool,
    /// MSG_TRUNC.
    pub trunc: bool,
}

/// An AF_KCM socket. Dropping it is `close()`.
pub struct KernelSocket {
    mux: KernelMux,
    fd: OwnedFd,
    ty: SockType,
    key: u64,
    nonblocking: std::sync::atomic::AtomicBool,
}

impl KernelSocket {
    pub fn sock_type(&self) -> SockType {
        self.ty
    }
    pub fn mux(&self) -> &KernelMux {
        &self.mux
    }

    /// SIOCKCMCLONE: another socket on the same mux (default options).
    pub fn try_clone(&self) -> io::Result<KernelSocket> {
        let fd = kcm::kcm_clone(self.fd.as_raw_fd())?;
        let mut st = self.mux.lock();
        Ok(self.mux.register(&mut st, fd, self.ty))
    }

    /// Attach a connection to this socket's mux.
    pub fn attach(&self, conn: &impl AsFd, parser: &KernelParser) -> io::Result<PsockId> {
        self.mux.attach_via(self.fd.as_raw_fd(), conn.as_fd(), parser)
    }
    /// Unattach a connection (see [`KernelMux::unattach`]).
    pub fn unattach(&self, conn: &impl AsFd) -> io::Result<()> {
        self.mux.unattach(conn)
    }

    fn dontwait(&self) -> libc::c_int {
        if self.nonblocking.load(std::sync::atomic::Ordering::Relaxed) {
            libc::MSG_DONTWAIT
        } else {
            0
        }
    }

    /// Calls return `WouldBlock` instead of waiting.
    pub fn set_nonblocking(&self, nb: bool) {
        self.nonblocking.store(nb, std::sync::atomic::Ordering::Relaxed);
    }
    /// Whether calls are non-blocking (`set_nonblocking`).
    pub fn nonblocking(&self) -> bool {
        self.nonblocking.load(std::sync::atomic::Ordering::Relaxed)
    }
    /// SO_RCVTIMEO (`None`: wait forever).
    pub fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        connmux_sys::socket::set_rcvtimeo(self.fd.as_raw_fd(), t)
    }
    /// SO_SNDTIMEO (`None`: wait forever).
    pub fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        connmux_sys::socket::set_sndtimeo(self.fd.as_raw_fd(), t)
    }
    /// KCM_RECV_DISABLE.
    pub fn set_recv_disable(&self, disable: bool) -> io::Result<()> {
        kcm::kcm_set_recv_disable(self.fd.as_raw_fd(), disable)
    }
    pub fn recv_disabled(&self) -> io::Result<bool> {
        kcm::kcm_recv_disabled(self.fd.as_raw_fd())
    }
    /// SO_RCVBUF (the kernel doubles the value and has a floor).
    pub fn set_rcvbuf(&self, bytes: usize) -> io::Result<()> {
        connmux_sys::socket::set_rcvbuf(self.fd.as_raw_fd(), bytes)
    }
    /// SO_SNDBUF (the kernel doubles the value and has a floor).
    pub fn set_sndbuf(&self, bytes: usize) -> io::Result<()> {
        connmux_sys::socket::set_sndbuf(self.fd.as_raw_fd(), bytes)
    }

    /// recvmsg with KCM's flags.
    pub fn recv_flags(&self, buf: &mut [u8], flags: RecvFlags) -> io::Result<RecvInfo> {
        let f = self.dontwait() | if flags.peek { libc::MSG_PEEK } else { 0 };
        let (len, fl) = kcm::recvmsg(self.fd.as_raw_fd(), buf, f)?;
        Ok(RecvInfo { len, eor: fl & libc::MSG_EOR != 0, trunc: fl & libc::MSG_TRUNC != 0 })
    }
    /// One message (or its first `buf.len()` bytes); returns the bytes copied.
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.recv_flags(buf, RecvFlags::default()).map(|i| i.len)
    }
    /// recvmmsg: up to `bufs.len()` messages, blocking (per the mode) for the
    /// first only; returns how many, with each one's length and flags.
    pub fn recv_batch(&self, bufs: &mut [&mut [u8]], meta: &mut [kcm::RecvMeta]) -> io::Result<usize> {
        kcm::recvmmsg(self.fd.as_raw_fd(), bufs, meta, self.dontwait() | libc::MSG_WAITFORONE)
    }

    /// sendmsg with KCM's flags (MORE on DGRAM, EOR on SEQPACKET, BATCH).
    pub fn send_flags(&self, data: &[u8], flags: SendFlags) -> io::Result<usize> {
        let mut f = self.dontwait() | libc::MSG_NOSIGNAL;
        if flags.more {
            f |= libc::MSG_MORE;
        }
        if flags.eor {
            f |= libc::MSG_EOR;
        }
        if flags.batch {
            f |= kcm::MSG_BATCH;
        }
        kcm::sendmsg(self.fd.as_raw_fd(), &[IoSlice::new(data)], f)
    }
    /// One complete message (`write()` semantics: EOR on SEQPACKET).
    pub fn send(&self, data: &[u8]) -> io::Result<usize> {
        self.send_flags(data, SendFlags { eor: true, ..Default::default() })
    }
    /// sendmmsg of whole messages (the kernel batches all but the last);
    /// returns how many were sent.
    pub fn send_batch(&self, msgs: &[&[u8]]) -> io::Result<usize> {
        let with: Vec<(&[u8], libc::c_int)> = msgs.iter().map(|m| (*m, libc::MSG_EOR)).collect();
        kcm::sendmmsg_flags(self.fd.as_raw_fd(), &with, self.dontwait() | libc::MSG_NOSIGNAL)
    }

    /// This socket's `/proc/net/kcm` line.
    pub fn stats(&self) -> io::Result<SockStats> {
        let index = self.mux.sock_index(self.key).ok_or_else(|| io::Error::from_raw_os_error(libc::EBADF))?;
        let m = self.mux.proc_mux()?;
        m.socks.into_iter().find(|s| s.0 == index).map(|s| s.1).ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))
    }

    /// A number that tells this socket from every other one this mux made
    /// (indexes are reused, as the kernel reuses them).
    pub fn key(&self) -> u64 {
        self.key
    }

    /// This socket's index in `/proc/net/kcm` (`kcm-N`).
    pub fn index(&self) -> Option<u32> {
        self.mux.sock_index(self.key)
    }
}

impl AsFd for KernelSocket {
    /// The AF_KCM socket itself (pollable: POLLIN while messages are queued).
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl AsRawFd for KernelSocket {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl Drop for KernelSocket {
    fn drop(&mut self) {
        // Forget the slot before the fd closes (drop order: this, then fields).
        self.mux.close_sock(self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_says_why_without_af_kcm() {
        match KernelMux::new() {
            Ok(_) => assert!(KernelMux::supported()),
            Err(KernelError::Unsupported(e)) => {
                assert_eq!(e.raw_os_error(), Some(libc::EAFNOSUPPORT));
                let msg = KernelError::Unsupported(e).to_string();
                assert!(msg.contains("AF_KCM is not available"), "{msg}");
            }
            Err(e) => panic!("unexpected {e}"),
        }
    }

    #[test]
    fn a_generated_program_refusing_a_short_length_is_a_parser_error() {
        // EPROTO from a generated length-field program: the userspace parsers'
        // LengthBelowHeader; from a user's program: strparser's BadLength.
        assert_eq!(
            classify_for(EPROTO, Some(4)),
            PsockError::Rx(RxError::Parser(ParseError::LengthBelowHeader { length: 0, header: 4 }))
        );
        assert_eq!(classify_for(EPROTO, None), PsockError::Rx(RxError::BadLength { len: 0, gathered: 0 }));
        assert_eq!(classify_for(EMSGSIZE, Some(4)), classify(EMSGSIZE));
        let mut s = PsockStats::default();
        error_counters(&mut s, &classify(EMSGSIZE));
        assert_eq!((s.rx_aborts, s.rx_msg_too_big, s.rx_interrupted), (1, 1, 0));
        let mut s = PsockStats::default();
        error_counters(&mut s, &classify_for(EPROTO, Some(4)));
        assert_eq!((s.rx_aborts, s.rx_interrupted, s.rx_bad_hdr_len), (1, 1, 0));
        let mut s = PsockStats::default();
        error_counters(&mut s, &PsockError::Closed);
        assert_eq!(s, PsockStats::default());
    }

    #[test]
    fn errno_classification_matches_the_userspace_errors() {
        assert_eq!(classify(EMSGSIZE).clone(), PsockError::Rx(RxError::TooBig { len: 0, max: 0 }));
        assert_eq!(classify(ETIMEDOUT), PsockError::Rx(RxError::Timeout));
        assert_eq!(classify(EPIPE), PsockError::Closed);
        assert_eq!(classify(22), PsockError::Rx(RxError::Parser(ParseError::Program(22))));
        for e in [EMSGSIZE, EPROTO, ETIMEDOUT, 22] {
            if let PsockError::Rx(rx) = classify(e) {
                assert_eq!(rx.errno(), e);
            }
        }
    }

    /// Every generated program and a rewritten textbook program pass this
    /// kernel's verifier (bpf(2) works without AF_KCM; needs root, as CI is).
    #[test]
    fn programs_pass_the_kernel_verifier() {
        use connmux_bpf::asm;
        use connmux_bpf::insn::{alu, size};
        // SAFETY-free check of root: BPF_PROG_LOAD of a socket filter needs CAP_BPF here.
        assert_eq!(
            std::fs::read_to_string("/proc/self/status")
                .unwrap()
                .lines()
                .find(|l| l.starts_with("Uid:"))
                .unwrap()
                .split_whitespace()
                .nth(1),
            Some("0"),
            "needs root"
        );
        let textbook: Vec<u8> =
            [asm::mov64_reg(6, 1), asm::ld_abs(size::W, 0), asm::alu64_imm(alu::ADD, 0, 4), asm::exit()]
                .iter()
                .flat_map(|i| i.to_bytes())
                .collect();
        let parsers = [
            "l4",
            "9p",
            "thrift",
            "kafka",
            "len:width=8",
            "len:width=3,endian=le,adjust=-5,includes_header=true",
            "len:offset=6,width=2",
        ]
        .iter()
        .map(|s| KernelParser::spec(s))
        .chain([KernelParser::Bytecode(textbook)]);
        for p in parsers {
            let map = connmux_sys::bpf::map_create_array(prog::STATE_SIZE, 1).unwrap();
            let fd = map.as_raw_fd();
            for max in [None, Some(1 << 20)] {
                let insns = p.program_limited(fd, max).unwrap();
                if let Err(e) = connmux_sys::bpf::prog_load_socket_filter(&insns, "GPL") {
                    panic!("{p:?} (limit {max:?}): {e}");
                }
            }
        }
    }
}
