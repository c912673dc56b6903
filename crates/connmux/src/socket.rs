//! KCM sockets: receive and send whole messages.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use connmux_core::mux::{MuxError, PsockId, RecvFlags, RecvInfo, SendFlags, SockId, SockType};
use connmux_core::parser::Parser;
use connmux_core::stats::SockStats;
use connmux_core::Bytes;

use crate::mux::{io_err, Mux};
use crate::shared::{Ctx, Ready, SockRt};

/// One received message and the connection it came from (addressed mode).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    pub data: Bytes,
    pub psock: PsockId,
}

/// A KCM socket: `recv` returns one whole message, `send` writes one message
/// atomically on one attached connection. Dropping it is `close()`.
///
/// Blocking by default (with optional timeouts, like SO_RCVTIMEO/SO_SNDTIMEO);
/// [`KcmSocket::set_nonblocking`] makes calls return `WouldBlock` instead.
/// [`KcmSocket::as_raw_fd`] is an eventfd that is readable while messages are
/// queued, so the socket fits into any event loop.
pub struct KcmSocket {
    mux: Mux,
    rt: Arc<SockRt>,
    ty: SockType,
}

impl KcmSocket {
    pub(crate) fn create(mux: Mux, ty: SockType) -> io::Result<KcmSocket> {
        let sh = mux.shared().clone();
        let mut core = sh.lock();
        let id = core.mux.socket(ty);
        Self::register(&mux, &mut core, id, ty)
    }

    fn register(mux: &Mux, core: &mut crate::shared::Core, id: SockId, ty: SockType) -> io::Result<KcmSocket> {
        let rt = Arc::new(SockRt {
            id,
            rx: Ready::new()?,
            tx: Ready::new()?,
            nonblocking: AtomicBool::new(false),
            rcvtimeo: Mutex::new(None),
            sndtimeo: Mutex::new(None),
        });
        // A new socket can always start a message until it fills its buffer.
        rt.tx.set();
        core.socks.insert(id, rt.clone());
        Ok(KcmSocket { mux: mux.clone(), rt, ty })
    }

    /// SIOCKCMCLONE: another socket on the same mux, same type, default options.
    pub fn try_clone(&self) -> io::Result<KcmSocket> {
        let sh = self.mux.shared().clone();
        let mut core = sh.lock();
        let id = core.mux.clone_sock(self.rt.id).map_err(io_err)?;
        let mut events = Vec::new();
        core.drain_events(&mut events);
        let s = Self::register(&self.mux, &mut core, id, self.ty);
        drop(core);
        sh.dispatch(&mut events, &mut Ctx::App);
        s
    }

    pub fn id(&self) -> SockId {
        self.rt.id
    }
    pub fn sock_type(&self) -> SockType {
        self.ty
    }
    pub fn mux(&self) -> &Mux {
        &self.mux
    }

    /// Attach a connection to this socket's mux (see [`Mux::attach`]).
    pub fn attach(&self, conn: &impl std::os::fd::AsFd, parser: Box<dyn Parser>) -> io::Result<PsockId> {
        self.mux.attach(conn, parser)
    }
    /// Unattach a connection (see [`Mux::unattach`]).
    pub fn unattach(&self, conn: &impl std::os::fd::AsFd) -> io::Result<()> {
        self.mux.unattach(conn)
    }

    pub fn set_nonblocking(&self, nb: bool) {
        self.rt.nonblocking.store(nb, Ordering::Relaxed);
    }
    /// SO_RCVTIMEO for blocking receives (`None`: wait forever).
    pub fn set_read_timeout(&self, t: Option<Duration>) {
        *self.rt.rcvtimeo.lock().unwrap() = t;
    }
    /// SO_SNDTIMEO for blocking sends (`None`: wait forever).
    pub fn set_write_timeout(&self, t: Option<Duration>) {
        *self.rt.sndtimeo.lock().unwrap() = t;
    }
    /// KCM_RECV_DISABLE.
    pub fn set_recv_disable(&self, disable: bool) -> io::Result<()> {
        self.with_core(|m, id| m.set_recv_disable(id, disable))
    }
    pub fn recv_disabled(&self) -> io::Result<bool> {
        self.mux.shared().lock().mux.recv_disabled(self.rt.id).map_err(io_err)
    }
    /// SO_RCVBUF of this socket (bytes of queued messages before it is skipped).
    pub fn set_rcvbuf(&self, bytes: usize) -> io::Result<()> {
        self.with_core(|m, id| m.set_rcvbuf(id, bytes))
    }
    /// SO_SNDBUF of this socket (checked when a new message starts).
    pub fn set_sndbuf(&self, bytes: usize) -> io::Result<()> {
        self.with_core(|m, id| m.set_sndbuf(id, bytes))
    }
    /// Affinity tag for the affinity steering policy (a worker index).
    pub fn set_affinity(&self, tag: Option<u32>) -> io::Result<()> {
        self.with_core(|m, id| m.set_affinity(id, tag))
    }

    fn with_core<T>(&self, f: impl FnOnce(&mut connmux_core::mux::Mux, SockId) -> Result<T, MuxError>) -> io::Result<T> {
        let sh = self.mux.shared();
        let mut events = Vec::new();
        let r = {
            let mut core = sh.lock();
            let r = f(&mut core.mux, self.rt.id).map_err(io_err);
            core.drain_events(&mut events);
            r
        };
        sh.dispatch(&mut events, &mut Ctx::App);
        r
    }

    /// Wait until `ready` is set, honouring non-blocking mode and the timeout.
    fn wait(&self, ready: &Ready, deadline: Option<Instant>) -> io::Result<()> {
        if self.rt.nonblocking.load(Ordering::Relaxed) {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let timeout = match deadline {
            Some(d) => {
                let now = Instant::now();
                if now >= d {
                    return Err(io::ErrorKind::WouldBlock.into());
                }
                Some(d - now)
            }
            None => None,
        };
        connmux_sys::poll::poll_readable(ready.fd.as_raw_fd(), timeout)?;
        Ok(())
    }

    fn deadline(t: &Mutex<Option<Duration>>) -> Option<Instant> {
        t.lock().unwrap().map(|d| Instant::now() + d)
    }

    /// Receive loop shared by the recv forms: clear readiness, try, wait.
    fn recv_loop<T>(&self, mut attempt: impl FnMut(&mut crate::shared::Core) -> Result<T, MuxError>) -> io::Result<T> {
        let sh = self.mux.shared();
        let deadline = Self::deadline(&self.rt.rcvtimeo);
        let mut events = Vec::new();
        loop {
            self.rt.rx.clear();
            let r = {
                let mut core = sh.lock();
                let r = attempt(&mut core);
                // Re-arm readiness if messages remain (we cleared it above).
                if core.mux.rx_queued(self.rt.id).unwrap_or(0) > 0 {
                    self.rt.rx.set();
                }
                core.drain_events(&mut events);
                r
            };
            if !events.is_empty() {
                sh.dispatch(&mut events, &mut Ctx::App);
            }
            match r {
                Err(MuxError::WouldBlock) => self.wait(&self.rt.rx, deadline)?,
                other => return other.map_err(io_err),
            }
        }
    }

    /// recvmsg: copy one message (or the next part of it, SEQPACKET) into `buf`.
    /// DGRAM: a short buffer truncates (`trunc`), the rest is discarded.
    pub fn recv_flags(&self, buf: &mut [u8], flags: RecvFlags) -> io::Result<RecvInfo> {
        let id = self.rt.id;
        self.recv_loop(|core| core.mux.recv(id, buf, flags))
    }

    /// `recv_flags` with no flags; returns the bytes copied.
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.recv_flags(buf, RecvFlags::default()).map(|i| i.len)
    }

    /// Receive one whole message without copying, with the psock it came from.
    pub fn recv_msg(&self) -> io::Result<Message> {
        let id = self.rt.id;
        self.recv_loop(|core| core.mux.recv_msg(id)).map(|(data, psock)| Message { data, psock })
    }

    /// Addressed receive: the message and where to send the answer.
    pub fn recv_from(&self, buf: &mut [u8]) -> io::Result<RecvInfo> {
        self.recv_flags(buf, RecvFlags::default())
    }

    /// recvmmsg: up to `max` whole messages; blocks (per the socket's mode) only
    /// for the first.
    pub fn recv_batch(&self, out: &mut Vec<Message>, max: usize) -> io::Result<usize> {
        let id = self.rt.id;
        let start = out.len();
        self.recv_loop(|core| {
            let mut n = 0;
            while n < max {
                match core.mux.recv_msg(id) {
                    Ok((data, psock)) => {
                        out.push(Message { data, psock });
                        n += 1;
                    }
                    Err(MuxError::WouldBlock) if n > 0 => break,
                    Err(e) => return Err(e),
                }
            }
            Ok(n)
        })?;
        Ok(out.len() - start)
    }

    fn send_loop(&self, mut attempt: impl FnMut(&mut connmux_core::mux::Mux) -> Result<usize, MuxError>) -> io::Result<usize> {
        let sh = self.mux.shared();
        let deadline = Self::deadline(&self.rt.sndtimeo);
        let mut events = Vec::new();
        loop {
            self.rt.tx.clear();
            let r = {
                let mut core = sh.lock();
                let r = attempt(&mut core.mux);
                if !matches!(r, Err(MuxError::WouldBlock)) || core.mux.writable(self.rt.id).unwrap_or(false) {
                    self.rt.tx.set();
                }
                core.drain_events(&mut events);
                r
            };
            if !events.is_empty() {
                sh.dispatch(&mut events, &mut Ctx::App);
            }
            match r {
                Err(MuxError::WouldBlock) => self.wait(&self.rt.tx, deadline)?,
                other => return other.map_err(io_err),
            }
        }
    }

    /// sendmsg with KCM flags (MORE on DGRAM, EOR on SEQPACKET, BATCH).
    pub fn send_flags(&self, data: &[u8], flags: SendFlags) -> io::Result<usize> {
        let id = self.rt.id;
        self.send_loop(|m| m.send(id, data, flags))
    }

    /// Send one complete message (`write()` semantics: EOR on SEQPACKET).
    pub fn send(&self, data: &[u8]) -> io::Result<usize> {
        self.send_flags(data, SendFlags { eor: true, ..Default::default() })
    }

    /// Addressed send: one whole message on the connection `psock`.
    pub fn send_to(&self, data: &[u8], psock: PsockId) -> io::Result<usize> {
        let id = self.rt.id;
        self.send_loop(|m| m.send_to(id, psock, data, SendFlags { eor: true, ..Default::default() }))
    }

    /// Addressed send of a message already in a `Bytes` (no copy).
    pub fn send_msg(&self, msg: Bytes, psock: Option<PsockId>) -> io::Result<()> {
        let id = self.rt.id;
        let len = msg.len();
        self.send_loop(|m| m.send_msg(id, psock, msg.clone(), false).map(|_| len)).map(|_| ())
    }

    /// sendmmsg: every message but the last carries BATCH, so the batch goes out
    /// together on one connection. Returns the number of messages sent.
    pub fn send_batch(&self, msgs: &[&[u8]]) -> io::Result<usize> {
        for (i, m) in msgs.iter().enumerate() {
            let last = i + 1 == msgs.len();
            let r = self.send_flags(m, SendFlags { eor: true, batch: !last, more: false });
            if let Err(e) = r {
                if i > 0 {
                    // sendmmsg returns a short count; the core pushes out what
                    // was batched before it refuses a message (kcm_push).
                    return Ok(i);
                }
                return Err(e);
            }
        }
        Ok(msgs.len())
    }

    /// This socket's counters (`/proc/net/kcm` kcm-N line).
    pub fn stats(&self) -> io::Result<SockStats> {
        self.mux.shared().lock().mux.sock_stats(self.rt.id).map_err(io_err)
    }

    /// Messages waiting to be received.
    pub fn queued(&self) -> usize {
        self.mux.shared().lock().mux.rx_queued(self.rt.id).unwrap_or(0)
    }
}

impl AsRawFd for KcmSocket {
    /// Readable while messages are queued (an eventfd).
    fn as_raw_fd(&self) -> RawFd {
        self.rt.rx.fd.as_raw_fd()
    }
}

impl Drop for KcmSocket {
    fn drop(&mut self) {
        let sh = self.mux.shared().clone();
        let mut events = Vec::new();
        {
            let mut core = sh.lock();
            let _ = core.mux.close(self.rt.id);
            core.socks.remove(&self.rt.id);
            core.drain_events(&mut events);
        }
        sh.dispatch(&mut events, &mut Ctx::App);
    }
}
