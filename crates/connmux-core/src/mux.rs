//! The multiplexor: N KCM sockets × M psocks, as a sans-IO state machine.
//!
//! PUBLIC API CONTRACT (the runtime in `crates/connmux` is written against it;
//! bodies are being implemented — keep these signatures, add freely).
//!
//! The driver's loop:
//! 1. `rx_capacity(p)` bytes may be read from psock `p`'s TCP socket now (0 =
//!    paused by backpressure or stopped): read at most that many, `feed` them.
//! 2. After any call, drain `poll_event()` and act: wake readers of a socket,
//!    write a psock's pending bytes (`tx_begin`/`tx_complete`/`tx_failed`),
//!    report a psock error to the application, resume reading a psock.
//! 3. Call `handle_timeout(now)` at `poll_timeout()`.

use bytes::Bytes;
use std::time::Duration;

use crate::parser::Parser;
use crate::stats::{MuxStats, PsockStats, SockStats};
use crate::time::Timestamp;

/// KCM socket type (`socket(AF_KCM, type, 0)`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SockType {
    /// SOCK_DGRAM: a send without MORE ends the message; short reads truncate.
    Dgram,
    /// SOCK_SEQPACKET: a send with EOR ends the message; short reads continue.
    SeqPacket,
}

/// A KCM socket id. The generation makes a stale id a typed error, never a
/// reused slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SockId {
    pub index: u32,
    pub generation: u32,
}

/// A psock (attached connection) id, with a generation like [`SockId`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PsockId {
    pub index: u32,
    pub generation: u32,
}

/// Flags for `send` (the MSG_* bits that matter to KCM).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SendFlags {
    /// MSG_MORE: on DGRAM, the message continues in the next send.
    pub more: bool,
    /// MSG_EOR: on SEQPACKET, this send ends the message.
    pub eor: bool,
    /// MSG_BATCH: more messages follow; hold transmission until a send without it.
    pub batch: bool,
}

/// Flags for `recv`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecvFlags {
    /// MSG_PEEK: copy without consuming; no counters, no EOR/TRUNC.
    pub peek: bool,
}

/// What a `recv` returned besides the bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecvInfo {
    /// Bytes copied into the caller's buffer.
    pub len: usize,
    /// MSG_EOR: the message ended with this read.
    pub eor: bool,
    /// MSG_TRUNC: (DGRAM) the rest of the message was discarded.
    pub trunc: bool,
    /// The psock the message arrived on (addressed mode).
    pub psock: PsockId,
}

/// Steering policy: which waiting KCM socket gets a message that is ready.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Steering {
    /// KCM's: the first waiting socket takes every message of one read pass,
    /// then goes to the tail of the waiter list.
    RoundRobin,
    /// A psock's messages go to the socket with the same affinity tag while that
    /// socket's queue is short; once it holds more than `imbalance` messages
    /// and another socket is waiting, the message goes to the other one.
    #[default]
    Affinity,
    /// The parser's steering key picks the socket (hash over able sockets).
    Key,
}

/// Mux-wide configuration. Every limit has a default and names the AF_KCM knob
/// it stands for.
#[derive(Clone, Debug)]
pub struct MuxConfig {
    /// Largest message a psock accepts (AF_KCM: the TCP socket's SO_RCVBUF).
    pub max_msg_size: usize,
    /// Assembly deadline from a message's first byte (AF_KCM: the TCP socket's
    /// SO_RCVTIMEO). `None` waits forever.
    pub assembly_timeout: Option<Duration>,
    /// Default receive-queue bound per KCM socket in bytes (SO_RCVBUF on the KCM
    /// socket). A socket at or above it is not offered new messages.
    pub sock_rcvbuf: usize,
    /// Default send-queue bound per KCM socket in bytes (SO_SNDBUF), checked when
    /// a new message starts.
    pub sock_sndbuf: usize,
    /// Bytes a psock buffers beyond the message being assembled (read-ahead).
    pub psock_rx_buf: usize,
    /// Steering policy.
    pub steering: Steering,
    /// For `Steering::Affinity`: queue length beyond which messages go elsewhere.
    pub imbalance: usize,
}

impl Default for MuxConfig {
    fn default() -> Self {
        MuxConfig {
            max_msg_size: 1 << 20,
            assembly_timeout: None,
            sock_rcvbuf: 4 << 20,
            sock_sndbuf: 4 << 20,
            psock_rx_buf: 256 << 10,
            steering: Steering::default(),
            imbalance: 64,
        }
    }
}

/// Per-psock options given at attach.
#[derive(Clone, Debug, Default)]
pub struct PsockConfig {
    /// Overrides `MuxConfig::max_msg_size` for this psock.
    pub max_msg_size: Option<usize>,
    /// Overrides `MuxConfig::assembly_timeout` for this psock (Some(None) = never).
    pub assembly_timeout: Option<Option<Duration>>,
    /// Affinity tag (the runtime uses the owning worker's index).
    pub affinity: Option<u32>,
}

/// Errors from mux calls (what a syscall on AF_KCM would return).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MuxError {
    #[error("no such KCM socket (stale or closed id)")]
    BadSock,
    #[error("psock not attached to this mux (ENOENT)")]
    NoPsock,
    #[error("operation would block (EAGAIN)")]
    WouldBlock,
    #[error("invalid argument (EINVAL)")]
    Invalid,
    #[error("psock transmit is stopped (EPIPE)")]
    Pipe,
}

impl MuxError {
    pub fn errno(&self) -> i32 {
        match self {
            MuxError::BadSock => 9,     // EBADF
            MuxError::NoPsock => 2,     // ENOENT
            MuxError::WouldBlock => 11, // EAGAIN
            MuxError::Invalid => 22,    // EINVAL
            MuxError::Pipe => 32,       // EPIPE
        }
    }
}

/// Why a psock stopped receiving (the errno KCM posts on the TCP socket).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RxError {
    #[error("message of {len} bytes exceeds the limit of {max} (EMSGSIZE)")]
    TooBig { len: usize, max: usize },
    #[error("length {len} does not reach past the {gathered} bytes already gathered (EPROTO)")]
    BadLength { len: usize, gathered: usize },
    #[error("parser refused the stream: {0}")]
    Parser(crate::parser::ParseError),
    #[error("message not complete within the assembly timeout (ETIMEDOUT)")]
    Timeout,
}

impl RxError {
    pub fn errno(&self) -> i32 {
        match self {
            RxError::TooBig { .. } => crate::parser::EMSGSIZE,
            RxError::BadLength { .. } => crate::parser::EPROTO,
            RxError::Parser(e) => e.errno(),
            RxError::Timeout => crate::parser::ETIMEDOUT,
        }
    }
}

/// Why a psock failed, as reported to the application.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PsockError {
    /// Receive side aborted (framing, size, timeout).
    Rx(RxError),
    /// The driver reported a transmit failure (errno) and transmit stopped.
    Tx(i32),
    /// The peer closed (FIN) or reset the connection (Linux: EPIPE on the TCP socket).
    Closed,
}

/// Something the driver must act on. Drain with [`Mux::poll_event`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// The socket's receive queue became non-empty (signal its readiness fd).
    SockReadable(SockId),
    /// The socket can accept a new message again (send-buffer space or a psock).
    SockWritable(SockId),
    /// The psock has bytes to write: call `tx_begin`.
    PsockTransmit(PsockId),
    /// The psock can take bytes again after backpressure (`rx_capacity` > 0).
    PsockRxResume(PsockId),
    /// The psock failed; the application should unattach it (KCM: POLLERR on the TCP fd).
    PsockFailed(PsockId, PsockError),
    /// The psock is fully released (after unattach or last-socket close): the
    /// driver may close or hand back its connection.
    PsockReleased(PsockId),
}

/// A view of the bytes a psock should write next: one or more whole-message
/// slices, in order. Valid until `tx_complete`/`tx_failed`.
#[derive(Clone, Debug, Default)]
pub struct TxChunk {
    pub slices: Vec<Bytes>,
}

impl TxChunk {
    pub fn len(&self) -> usize {
        self.slices.iter().map(|b| b.len()).sum()
    }
    pub fn is_empty(&self) -> bool {
        self.slices.iter().all(|b| b.is_empty())
    }
}

/// The multiplexor.
pub struct Mux {
    _private: (),
}

#[allow(unused_variables)]
impl Mux {
    pub fn new(config: MuxConfig) -> Mux {
        todo!()
    }
    pub fn config(&self) -> &MuxConfig {
        todo!()
    }

    // ---- KCM sockets ----
    /// Create a KCM socket (the first `socket(AF_KCM, ty, 0)`).
    pub fn socket(&mut self, ty: SockType) -> SockId {
        todo!()
    }
    /// SIOCKCMCLONE: a new socket on this mux, same type, default options.
    pub fn clone_sock(&mut self, s: SockId) -> Result<SockId, MuxError> {
        todo!()
    }
    /// close(): unsent messages are dropped, a reserved psock mid-message is
    /// aborted, queued received messages move to other sockets. Closing the last
    /// socket unattaches every psock.
    pub fn close(&mut self, s: SockId) -> Result<(), MuxError> {
        todo!()
    }
    pub fn sock_type(&self, s: SockId) -> Result<SockType, MuxError> {
        todo!()
    }
    /// KCM_RECV_DISABLE.
    pub fn set_recv_disable(&mut self, s: SockId, disable: bool) -> Result<(), MuxError> {
        todo!()
    }
    pub fn recv_disabled(&self, s: SockId) -> Result<bool, MuxError> {
        todo!()
    }
    /// SO_RCVBUF / SO_SNDBUF on a KCM socket.
    pub fn set_rcvbuf(&mut self, s: SockId, bytes: usize) -> Result<(), MuxError> {
        todo!()
    }
    pub fn set_sndbuf(&mut self, s: SockId, bytes: usize) -> Result<(), MuxError> {
        todo!()
    }
    /// Affinity tag for `Steering::Affinity` (the runtime: worker index).
    pub fn set_affinity(&mut self, s: SockId, tag: Option<u32>) -> Result<(), MuxError> {
        todo!()
    }
    pub fn sock_count(&self) -> usize {
        todo!()
    }

    // ---- psocks ----
    /// SIOCKCMATTACH. Bytes the connection already holds are simply fed after.
    pub fn attach(&mut self, parser: Box<dyn Parser>, cfg: PsockConfig) -> PsockId {
        todo!()
    }
    /// SIOCKCMUNATTACH: ENOENT (`NoPsock`) if not attached. A ready message is
    /// dropped (rx_ready_drops); a partly written message is resent whole on
    /// another psock (psock_unattach_rsvd).
    pub fn unattach(&mut self, p: PsockId) -> Result<(), MuxError> {
        todo!()
    }
    pub fn psock_count(&self) -> usize {
        todo!()
    }
    pub fn psocks(&self) -> Vec<PsockId> {
        todo!()
    }

    // ---- receive path ----
    /// Bytes the psock will accept now (0 = paused or stopped).
    pub fn rx_capacity(&self, p: PsockId) -> usize {
        todo!()
    }
    /// The need-bytes hint: bytes still missing from the current message, if known.
    pub fn rx_need(&self, p: PsockId) -> Option<usize> {
        todo!()
    }
    /// Bytes read from the psock's connection (at most `rx_capacity`).
    pub fn feed(&mut self, p: PsockId, data: &[u8], now: Timestamp) -> Result<(), MuxError> {
        todo!()
    }
    /// The peer closed its side (FIN) or the connection failed on read.
    pub fn rx_closed(&mut self, p: PsockId, errno: Option<i32>) -> Result<(), MuxError> {
        todo!()
    }
    /// recvmsg on a KCM socket (WouldBlock when empty).
    pub fn recv(&mut self, s: SockId, buf: &mut [u8], flags: RecvFlags) -> Result<RecvInfo, MuxError> {
        todo!()
    }
    /// Take the whole head message (addressed form; zero-copy). WouldBlock when empty.
    pub fn recv_msg(&mut self, s: SockId) -> Result<(Bytes, PsockId), MuxError> {
        todo!()
    }
    /// Messages waiting in a socket's receive queue.
    pub fn rx_queued(&self, s: SockId) -> Result<usize, MuxError> {
        todo!()
    }

    // ---- transmit path ----
    /// sendmsg: returns bytes accepted. WouldBlock when a new message would start
    /// with the send buffer full.
    pub fn send(&mut self, s: SockId, data: &[u8], flags: SendFlags) -> Result<usize, MuxError> {
        todo!()
    }
    /// Addressed send of one whole message on psock `p`.
    pub fn send_to(&mut self, s: SockId, p: PsockId, data: &[u8], flags: SendFlags) -> Result<usize, MuxError> {
        todo!()
    }
    /// A whole message, zero-copy, on psock `p` (`None`: the socket's psock).
    pub fn send_msg(&mut self, s: SockId, p: Option<PsockId>, msg: Bytes, batch: bool) -> Result<(), MuxError> {
        todo!()
    }
    /// Discard a DGRAM socket's open MORE message (a send failed while copying).
    pub fn send_abort(&mut self, s: SockId) -> Result<(), MuxError> {
        todo!()
    }
    /// Whether a new message can start on this socket now.
    pub fn writable(&self, s: SockId) -> Result<bool, MuxError> {
        todo!()
    }
    /// The bytes to write next on psock `p`, or None. Marks the psock busy until
    /// `tx_complete`/`tx_failed`: one writer at a time.
    pub fn tx_begin(&mut self, p: PsockId) -> Option<TxChunk> {
        todo!()
    }
    /// `n` bytes of the chunk were written (a short write keeps the rest first).
    pub fn tx_complete(&mut self, p: PsockId, n: usize) {
        todo!()
    }
    /// The write failed with a hard error: abort the psock's transmit, resend the
    /// message in progress whole on another psock (tx_retries, tx_aborts).
    pub fn tx_failed(&mut self, p: PsockId, errno: i32) {
        todo!()
    }

    // ---- time ----
    pub fn poll_timeout(&self) -> Option<Timestamp> {
        todo!()
    }
    pub fn handle_timeout(&mut self, now: Timestamp) {
        todo!()
    }

    // ---- events and statistics ----
    pub fn poll_event(&mut self) -> Option<Event> {
        todo!()
    }
    pub fn stats(&self) -> MuxStats {
        todo!()
    }
    pub fn sock_stats(&self, s: SockId) -> Result<SockStats, MuxError> {
        todo!()
    }
    pub fn psock_stats(&self, p: PsockId) -> Result<PsockStats, MuxError> {
        todo!()
    }
    /// The `/proc/net/kcm`-style live view of this mux.
    pub fn proc_kcm(&self) -> String {
        todo!()
    }
}
