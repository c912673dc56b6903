//! The async KCM socket (cargo feature `tokio`): [`AsyncKcmSocket`], a
//! [`KcmSocket`] whose receives and sends `.await` on a tokio runtime.
//!
//! Owns nothing of the runtime: it puts the socket in non-blocking mode and
//! waits on its readiness descriptors with tokio's `AsyncFd`. Names only
//! `socket` (and the types `lib.rs` re-exports from the core).

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::task::{ready, Context, Poll};

use connmux_core::mux::{PsockId, RecvFlags, RecvInfo, SendFlags};
use connmux_core::Bytes;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use crate::socket::{KcmSocket, Message};

/// A [`KcmSocket`] for tokio: the same calls, each an `async fn` that waits
/// for its socket without holding a thread.
///
/// Made from a `KcmSocket` ([`AsyncKcmSocket::new`]), inside a tokio runtime
/// with its I/O driver enabled (`Runtime::new`, `#[tokio::main]`, or a
/// builder's `enable_io`). The socket is put in non-blocking mode and its
/// readiness descriptors ([`KcmSocket`]'s `AsFd`: an eventfd readable while
/// messages are queued; another while a send can start) are registered with
/// tokio's reactor (`tokio::io::unix::AsyncFd`, on a duplicate of each
/// descriptor). A receive tries the socket, and when it finds nothing waits
/// for the descriptor to become readable and tries again; a send likewise.
/// The socket's timeouts do not apply: bound a call with
/// `tokio::time::timeout`. On the kernel backend the descriptor is the AF_KCM
/// socket itself, and the addressed calls are refused as on a `KcmSocket`
/// ([`crate::Backend`]).
///
/// Every call takes `&self`: one socket may be shared by tasks (in an `Arc`),
/// each message going to one of them. For several tasks each with their own
/// socket (each message to one socket, balanced over those that wait, as on
/// AF_KCM), clone it: [`AsyncKcmSocket::try_clone`].
///
/// It is a [`futures_core::Stream`] of received messages
/// ([`AsyncKcmSocket::recv_msg`]: each `Some(Ok(message))`, or
/// `Some(Err(e))` for a failed receive; the stream does not end).
///
/// ```no_run
/// # async fn serve(mux: connmux::Mux) -> std::io::Result<()> {
/// use connmux::{AsyncKcmSocket, SockType};
/// let sock = AsyncKcmSocket::new(mux.socket(SockType::Dgram)?)?;
/// loop {
///     let msg = sock.recv_msg().await?;           // one whole request
///     sock.send_to(&msg.data, msg.psock).await?;  // its answer, on its connection
/// }
/// # }
/// ```
pub struct AsyncKcmSocket {
    // Dropped before the socket: each deregisters and closes its duplicate.
    rx: AsyncFd<OwnedFd>,
    tx: AsyncFd<OwnedFd>,
    /// Whether `tx` waits for writability (the kernel backend's socket) or
    /// readability (the userspace backend's eventfd).
    tx_writable: bool,
    sock: KcmSocket,
    /// The mode to give back in [`AsyncKcmSocket::into_inner`].
    was_nonblocking: bool,
}

impl AsyncKcmSocket {
    /// Wrap `sock`: non-blocking mode, its readiness registered with the
    /// current tokio runtime. Fails outside a runtime (or one without its I/O
    /// driver), and if a descriptor cannot be duplicated or registered; the
    /// socket is then closed.
    pub fn new(sock: KcmSocket) -> io::Result<AsyncKcmSocket> {
        let rx_fd = sock.as_fd().try_clone_to_owned()?;
        let (tx_fd, tx_writable) = sock.send_ready_fd();
        let tx_fd = tx_fd.try_clone_to_owned()?;
        let tx_interest = if tx_writable { Interest::WRITABLE } else { Interest::READABLE };
        let rx = connmux_sys::async_fd::register(rx_fd, Interest::READABLE)?;
        let tx = connmux_sys::async_fd::register(tx_fd, tx_interest)?;
        let was_nonblocking = sock.nonblocking();
        sock.set_nonblocking(true)?;
        Ok(AsyncKcmSocket { rx, tx, tx_writable, sock, was_nonblocking })
    }

    /// Another socket on the same mux ([`KcmSocket::try_clone`], AF_KCM's
    /// `SIOCKCMCLONE`), wrapped for the current runtime.
    pub fn try_clone(&self) -> io::Result<AsyncKcmSocket> {
        AsyncKcmSocket::new(self.sock.try_clone()?)
    }

    /// The socket, for the calls that do not wait (`stats`, `set_rcvbuf`,
    /// `set_recv_disable`, `mux`…). It is in non-blocking mode: its own
    /// receives and sends return `WouldBlock` rather than wait.
    pub fn get_ref(&self) -> &KcmSocket {
        &self.sock
    }

    /// The socket back, out of the runtime's reactor, in the mode it had
    /// before [`AsyncKcmSocket::new`].
    pub fn into_inner(self) -> io::Result<KcmSocket> {
        let AsyncKcmSocket { rx, tx, sock, was_nonblocking, .. } = self;
        drop((rx, tx));
        sock.set_nonblocking(was_nonblocking)?;
        Ok(sock)
    }

    /// Run `f` until it does not find the socket empty, waiting for `rx`
    /// between tries.
    async fn receive<T>(&self, mut f: impl FnMut(&KcmSocket) -> io::Result<T>) -> io::Result<T> {
        // Each turn either returns or clears the readiness it saw, so the
        // next waits for the runtime to post the descriptor again.
        loop {
            let mut guard = self.rx.readable().await?;
            match guard.try_io(|_| f(&self.sock)) {
                Ok(r) => return r,
                Err(_would_block) => continue,
            }
        }
    }

    /// Run `f` until it does not find the send buffer full, waiting for
    /// `tx` between tries.
    async fn transmit<T>(&self, mut f: impl FnMut(&KcmSocket) -> io::Result<T>) -> io::Result<T> {
        loop {
            let mut guard = if self.tx_writable { self.tx.writable().await? } else { self.tx.readable().await? };
            match guard.try_io(|_| f(&self.sock)) {
                Ok(r) => return r,
                Err(_would_block) => continue,
            }
        }
    }

    /// [`KcmSocket::recv`]: one message (DGRAM: a short buffer truncates it)
    /// copied into `buf`; the bytes copied.
    pub async fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.receive(|s| s.recv(buf)).await
    }

    /// [`KcmSocket::recv_flags`]: `recv` with flags (PEEK), and what it got.
    pub async fn recv_flags(&self, buf: &mut [u8], flags: RecvFlags) -> io::Result<RecvInfo> {
        self.receive(|s| s.recv_flags(buf, flags)).await
    }

    /// [`KcmSocket::recv_from`]: `recv` with the connection the message came
    /// from (`RecvInfo::psock`), where [`AsyncKcmSocket::send_to`] answers.
    pub async fn recv_from(&self, buf: &mut [u8]) -> io::Result<RecvInfo> {
        self.receive(|s| s.recv_from(buf)).await
    }

    /// [`KcmSocket::recv_msg`]: one whole message without a copy, with its
    /// connection.
    pub async fn recv_msg(&self) -> io::Result<Message> {
        self.receive(|s| s.recv_msg()).await
    }

    /// [`KcmSocket::recv_batch`]: up to `max` whole messages, waiting only
    /// for the first; how many were appended to `out`.
    pub async fn recv_batch(&self, out: &mut Vec<Message>, max: usize) -> io::Result<usize> {
        self.receive(|s| s.recv_batch(out, max)).await
    }

    /// The poll form of [`AsyncKcmSocket::recv_msg`] (what the `Stream`
    /// calls): `Pending` with `cx`'s waker registered while no message is
    /// queued.
    pub fn poll_recv_msg(&self, cx: &mut Context<'_>) -> Poll<io::Result<Message>> {
        // As `receive`: each turn returns or clears what it saw.
        loop {
            let mut guard = ready!(self.rx.poll_read_ready(cx))?;
            match guard.try_io(|_| self.sock.recv_msg()) {
                Ok(r) => return Poll::Ready(r),
                Err(_would_block) => continue,
            }
        }
    }

    /// [`KcmSocket::send`]: one whole message on a connection the mux picks;
    /// the bytes accepted. Waits while the socket's send buffer is full.
    pub async fn send(&self, data: &[u8]) -> io::Result<usize> {
        self.transmit(|s| s.send(data)).await
    }

    /// [`KcmSocket::send_flags`]: `send` with KCM's flags (MORE, EOR, BATCH).
    pub async fn send_flags(&self, data: &[u8], flags: SendFlags) -> io::Result<usize> {
        self.transmit(|s| s.send_flags(data, flags)).await
    }

    /// [`KcmSocket::send_to`]: one whole message on the connection `psock`
    /// (a received message's, to answer it).
    pub async fn send_to(&self, data: &[u8], psock: PsockId) -> io::Result<usize> {
        self.transmit(|s| s.send_to(data, psock)).await
    }

    /// [`KcmSocket::send_msg`]: a message already in `Bytes`, without a
    /// copy, on `psock` (or, with `None`, a connection the mux picks).
    pub async fn send_msg(&self, msg: Bytes, psock: Option<PsockId>) -> io::Result<()> {
        self.transmit(|s| s.send_msg(msg.clone(), psock)).await
    }

    /// [`KcmSocket::send_batch_to`]: messages each whole on its connection,
    /// accepted together; how many were sent.
    pub async fn send_batch_to(&self, msgs: &[(Option<PsockId>, &[u8])]) -> io::Result<usize> {
        self.transmit(|s| s.send_batch_to(msgs)).await
    }
}

impl futures_core::Stream for AsyncKcmSocket {
    type Item = io::Result<Message>;

    /// The next message ([`AsyncKcmSocket::poll_recv_msg`]); never `None`.
    fn poll_next(self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.poll_recv_msg(cx).map(Some)
    }
}

impl std::fmt::Debug for AsyncKcmSocket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncKcmSocket").field("id", &self.sock.id()).finish()
    }
}
