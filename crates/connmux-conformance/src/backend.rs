//! The two backends behind one small interface, so that every case is written
//! once. Both are driven through connmux's public API (`Mux`, `KcmSocket`):
//! `Backend::Userspace` (the userspace runtime) and `Backend::Kernel` (AF_KCM,
//! `connmux-kernel` underneath).

use std::io;
use std::net::TcpStream;
use std::os::fd::{AsFd, BorrowedFd};
use std::time::{Duration, Instant};

use connmux::{Backend, Config, Driver, Mux, Placement, PsockError, PsockId, RecvFlags, SendFlags, SockType, Steering};
use connmux_core::stats::{PsockStats, SockStats};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    User,
    Kernel,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::User => "userspace",
            Kind::Kernel => "kernel",
        }
    }
}

/// Per-mux options a case may need.
#[derive(Clone, Copy, Debug, Default)]
pub struct Opts {
    /// Assembly timeout (`MuxConfig::assembly_timeout`; the kernel backend
    /// makes it the TCP socket's SO_RCVTIMEO).
    pub timeout: Option<Duration>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Got {
    pub len: usize,
    pub eor: bool,
    pub trunc: bool,
}

pub trait Ep: Send + Sync {
    fn send(&self, data: &[u8], flags: SendFlags) -> io::Result<usize>;
    fn recv(&self, buf: &mut [u8], peek: bool) -> io::Result<Got>;
    fn send_batch(&self, msgs: &[&[u8]]) -> io::Result<usize>;
    fn try_clone(&self) -> io::Result<Box<dyn Ep>>;
    fn set_recv_disable(&self, d: bool) -> io::Result<()>;
    fn recv_disabled(&self) -> io::Result<bool>;
    fn set_nonblocking(&self, nb: bool) -> io::Result<()>;
    fn set_timeout(&self, t: Option<Duration>) -> io::Result<()>;
    fn set_rcvbuf(&self, b: usize) -> io::Result<()>;
    fn set_sndbuf(&self, b: usize) -> io::Result<()>;
    fn stats(&self) -> io::Result<SockStats>;
    /// The AF_KCM fd (kernel only).
    fn raw(&self) -> Option<BorrowedFd<'_>>;
}

pub trait Mx {
    fn socket(&self, ty: SockType) -> io::Result<Box<dyn Ep>>;
    fn attach(&self, conn: BorrowedFd<'_>, spec: &str) -> io::Result<PsockId>;
    fn unattach(&self, conn: BorrowedFd<'_>) -> io::Result<()>;
    /// The first error of psock `p` within `timeout`: (errno, typed error).
    fn wait_error(&self, p: PsockId, timeout: Duration) -> Option<(i32, PsockError)>;
    /// Psock counters: this mux's (userspace) or the namespace's (kernel); cases use deltas.
    fn psock_totals(&self) -> PsockStats;
    /// Live KCM sockets on this mux as the backend reports them.
    fn kcms(&self) -> io::Result<usize>;
    fn psock_stats(&self, p: PsockId) -> io::Result<PsockStats>;
    /// The mux's counters (`Mux::stats`: the kernel's from /proc on that backend).
    fn mux_stats(&self) -> connmux_core::stats::MuxStats;
}

/// The public API's configuration for a backend.
pub fn config(kind: Kind, opts: Opts) -> Config {
    let mut cfg = Config {
        workers: 1,
        placement: Placement::Unpinned,
        driver: Driver::Epoll,
        backend: match kind {
            Kind::User => Backend::Userspace,
            Kind::Kernel => Backend::Kernel,
        },
        ..Config::default()
    };
    cfg.core.steering = Steering::RoundRobin;
    cfg.core.assembly_timeout = opts.timeout;
    cfg
}

pub fn new_mux(kind: Kind, opts: Opts) -> io::Result<Box<dyn Mx>> {
    let m = Mux::new(config(kind, opts))?;
    if m.backend() != config(kind, opts).backend {
        return Err(io::Error::other(format!("asked for {kind:?}, got {:?}", m.backend())));
    }
    Ok(Box::new(UserMx(m)))
}

struct UserMx(Mux);
struct UserEp(connmux::KcmSocket);

fn errno_of(e: &PsockError) -> i32 {
    match e {
        PsockError::Rx(rx) => rx.errno(),
        PsockError::Tx(e) => *e,
        PsockError::Closed => libc::EPIPE,
    }
}

impl Mx for UserMx {
    fn socket(&self, ty: SockType) -> io::Result<Box<dyn Ep>> {
        Ok(Box::new(UserEp(self.0.socket(ty)?)))
    }
    fn attach(&self, conn: BorrowedFd<'_>, spec: &str) -> io::Result<PsockId> {
        let p = connmux::parsers::from_spec(spec).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        self.0.attach(&conn, p)
    }
    fn unattach(&self, conn: BorrowedFd<'_>) -> io::Result<()> {
        self.0.unattach(&conn)
    }
    fn wait_error(&self, p: PsockId, timeout: Duration) -> Option<(i32, PsockError)> {
        let end = Instant::now() + timeout;
        while Instant::now() < end {
            if let Some(e) = self.0.psock_error(p) {
                return Some((errno_of(&e), e));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        None
    }
    fn psock_totals(&self) -> PsockStats {
        self.0.stats().psock
    }
    fn kcms(&self) -> io::Result<usize> {
        match self.0.kernel() {
            // The kernel's own count, from its /proc/net/kcm block.
            Some(k) => k.proc_mux().map(|m| m.kcms),
            None => Ok(self.0.stats().kcms),
        }
    }
    fn psock_stats(&self, p: PsockId) -> io::Result<PsockStats> {
        self.0.psock_stats(p)
    }
    fn mux_stats(&self) -> connmux_core::stats::MuxStats {
        self.0.stats()
    }
}

impl Ep for UserEp {
    fn send(&self, data: &[u8], flags: SendFlags) -> io::Result<usize> {
        self.0.send_flags(data, flags)
    }
    fn recv(&self, buf: &mut [u8], peek: bool) -> io::Result<Got> {
        let i = self.0.recv_flags(buf, RecvFlags { peek })?;
        Ok(Got { len: i.len, eor: i.eor, trunc: i.trunc })
    }
    fn send_batch(&self, msgs: &[&[u8]]) -> io::Result<usize> {
        self.0.send_batch(msgs)
    }
    fn try_clone(&self) -> io::Result<Box<dyn Ep>> {
        Ok(Box::new(UserEp(self.0.try_clone()?)))
    }
    fn set_recv_disable(&self, d: bool) -> io::Result<()> {
        self.0.set_recv_disable(d)
    }
    fn recv_disabled(&self) -> io::Result<bool> {
        self.0.recv_disabled()
    }
    fn set_nonblocking(&self, nb: bool) -> io::Result<()> {
        self.0.set_nonblocking(nb)
    }
    fn set_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        self.0.set_read_timeout(t)?;
        self.0.set_write_timeout(t)
    }
    fn set_rcvbuf(&self, b: usize) -> io::Result<()> {
        self.0.set_rcvbuf(b)
    }
    fn set_sndbuf(&self, b: usize) -> io::Result<()> {
        self.0.set_sndbuf(b)
    }
    fn stats(&self) -> io::Result<SockStats> {
        self.0.stats()
    }
    fn raw(&self) -> Option<BorrowedFd<'_>> {
        self.0.kernel().map(|k| k.as_fd())
    }
}

/// A connected loopback pair: (peer, the side to attach), TCP_NODELAY on both.
pub fn tcp_pair() -> io::Result<(TcpStream, TcpStream)> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    let c = TcpStream::connect(l.local_addr()?)?;
    let (s, _) = l.accept()?;
    c.set_nodelay(true)?;
    s.set_nodelay(true)?;
    Ok((c, s))
}

/// 4-byte big-endian length, then the body (the `l4` framing).
pub fn frame(body: &[u8]) -> Vec<u8> {
    let mut m = (body.len() as u32).to_be_bytes().to_vec();
    m.extend_from_slice(body);
    m
}
