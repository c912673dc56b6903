//! The multiplexor: N KCM sockets × M psocks, as a sans-IO state machine.
//!
//! PUBLIC API CONTRACT: the runtime in `crates/connmux` is written against the
//! signatures below; they stay, methods may be added.
//!
//! The driver's loop:
//! 1. `rx_capacity(p)` bytes may be read from psock `p`'s TCP socket now (0 =
//!    paused by backpressure or stopped): read at most that many, `feed` them.
//! 2. After any call, drain `poll_event()` and act: wake readers of a socket,
//!    write a psock's pending bytes (`tx_begin`/`tx_complete`/`tx_failed`),
//!    report a psock error to the application, resume reading a psock.
//! 3. Call `handle_timeout(now)` at `poll_timeout()`.
//!
//! # Receive (KCM `reserve_rx_kcm` / `kcm_rcv_ready`)
//!
//! A psock's stream parser cuts messages; each goes to a KCM socket chosen by
//! the [`Steering`] policy among the *able* sockets (receive enabled, receive
//! memory below SO_RCVBUF), kept in a FIFO waiter list. With round robin every
//! message completed in one `feed` goes to the same socket, which then moves
//! to the tail (KCM's per-read-pass batching). When no socket is able the
//! psock keeps that one message, pauses (`rx_capacity` = 0, so TCP pushes back
//! on the peer) and waits on the ready list; a socket that becomes able takes
//! first the hold queue (messages moved off disabled or closed sockets), then
//! the paused psocks' messages in FIFO order, then joins the waiter list.
//!
//! # Transmit (KCM `reserve_psock` / `kcm_write_msgs`)
//!
//! A socket builds a message (DGRAM: until a send without MORE; SEQPACKET:
//! until EOR), queues it, and reserves the first psock of the LRU list. It
//! keeps the reservation until its queue is fully written; the psock then goes
//! to the first socket waiting for one, or to the tail of the list. Each
//! message goes whole and contiguous on one psock. A psock whose write fails,
//! or that is unattached mid-message, gives the message back; it is resent
//! whole, from its first byte, on another psock. Addressed sends (`send_to`,
//! `send_msg(Some(p))`) append one whole message to that psock's queue
//! without reserving it.
//!
//! With [`TxPolicy::LeastOutstanding`] there is no reservation: each complete
//! message goes to the psock with the fewest requests not yet answered
//! (messages queued on it minus messages received from it), and a psock whose
//! receive side fails gives its unstarted messages back to be placed again.
//!
//! # Memory bound
//!
//! Every byte the core holds is counted by [`Mux::memory_used`] and stays at
//! or below [`Mux::memory_bound`]:
//!
//! ```text
//!   Σ psocks  stream::memory_bound(psock_rx_buf + max_msg_size_p)
//!                                                    assembly + read-ahead + the one ready message, as allocated
//! + Σ sockets (rcvbuf_peak + max_msg_size)           receive queue (exceeds SO_RCVBUF by ≤ 1 message)
//! + hold_budget                                      messages moved off closed sockets while no socket could take them
//! + Σ sockets (sndbuf_peak + tx_msg_peak)            send queue (one message may exceed SO_SNDBUF, case 35)
//! ```
//!
//! where `*_peak` is the largest value the socket's option has had (lowering
//! SO_RCVBUF does not drop queued messages), `max_msg_size` is the largest
//! message size any psock has allowed, `hold_budget` is the sum of the
//! receive terms of sockets closed while the hold queue was non-empty (reset
//! when it empties), and `tx_msg_peak` is the largest single message the
//! application itself built on that socket. The peer controls none of these:
//! the receive terms are configuration, the send terms are what the
//! application chose to send. Counted are message bytes; a message cut from a
//! read buffer keeps that buffer's allocation (≤ 64 KiB or the read size)
//! alive until it is taken, as a kernel skb keeps its truesize.
//!
//! What this module does not do: touch sockets, block, read a clock, or report
//! errors on KCM sockets for failures of attached connections (as in KCM, a
//! psock failure is an event for the application, not a socket error).

use std::fmt::Write as _;
use std::time::Duration;

use bytes::{Bytes, BytesMut};

use crate::parser::Parser;
pub use crate::rx_error::{RxError, EBADMSG, ENOBUFS};
use crate::stats::{MuxStats, PsockStats, SockStats};
use crate::stream::{Loan, StreamLimits, StreamParser, Unlend};
use crate::time::Timestamp;

mod alone;
mod deadlines;
mod hub;
mod limits;
mod psock;
mod sock;
mod sockets;
mod transmit;
pub use alone::FramedAlone;
pub use limits::{AHEAD_QUIET, MEM_FLOOR};
mod slab;
use deadlines::Deadlines;
pub use hub::Hub;
use psock::{Life, Psock};
use slab::Keyed;
use sock::Sock;
use sockets::{Share, ToPsock};

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
    /// Sockets with no tag (application threads' clones) are taken as
    /// round robin does, but a psock's next read goes on to the socket that
    /// took its last one if that one's reader has taken them all: a
    /// connection's light messages stay with one thread, and its replies
    /// leave in that thread's writes; a thread still busy with them gives
    /// the next read to another. A thread that reads the psocks itself
    /// (`Owned::set_reader`) takes what it reads while its queue is short.
    #[default]
    Affinity,
    /// The parser's steering key picks the socket (hash over able sockets).
    Key,
}

/// Transmit policy: which psock carries a plain send (one not addressed to a
/// psock).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum TxPolicy {
    /// KCM's: a socket reserves the least recently used free psock and keeps it
    /// until its queue is written, so successive sends rotate over the psocks.
    #[default]
    RoundRobin,
    /// Each message goes to the psock with the least outstanding work: the
    /// messages queued on it over its life minus the messages received from it
    /// ([`Mux::psock_outstanding`]); ties go to the psock after the last one
    /// chosen. For a client mux whose psocks lead to servers that answer each
    /// request with one reply, that is the requests a server has not answered
    /// yet, whether they wait in our queue, in TCP's buffers or in the server:
    /// a slow server keeps more of them and gets fewer new ones. (Queued
    /// transmit bytes alone would not see it: a slow server's TCP window stays
    /// open long after it fell behind.) Psocks whose receive side has failed or
    /// closed are passed over, and their unstarted messages go to the others,
    /// since no answer can come from them. Costs a walk of the psocks per
    /// message.
    LeastOutstanding,
}

/// Mux-wide configuration. Every limit has a default and names the AF_KCM knob
/// it stands for.
#[derive(Clone, Debug)]
pub struct MuxConfig {
    /// Largest message a psock accepts (AF_KCM: the TCP socket's SO_RCVBUF).
    pub max_msg_size: usize,
    /// Assembly deadline from a message's first byte (AF_KCM: the TCP socket's
    /// SO_RCVTIMEO). `None` waits forever. It measures the peer, not the
    /// server: while the mux itself does not read the psock (its replies
    /// backed up past half of `psock_sndbuf`, its messages not taken, the
    /// memory budget's pause) a deadline that comes due is held, and every
    /// resume (`PsockRxResume`) restarts it in full. AF_KCM's timer runs on.
    pub assembly_timeout: Option<Duration>,
    /// Default receive-queue bound per KCM socket in bytes (SO_RCVBUF on the KCM
    /// socket). A socket at or above it is not offered new messages.
    pub sock_rcvbuf: usize,
    /// Default send-queue bound per KCM socket in bytes (SO_SNDBUF), checked when
    /// a new message starts. It bounds the socket's plain (balanced) sends,
    /// as KCM's does. An addressed send over it is refused only to a psock
    /// whose own backlog is at least an eighth of it: a socket that sends
    /// to one peer is bounded as KCM's, while peers that do not read cannot
    /// hold up one socket's replies to the others.
    pub sock_sndbuf: usize,
    /// Bytes a psock buffers beyond the message being assembled (read-ahead).
    pub psock_rx_buf: usize,
    /// Bytes of addressed messages (`send_to`) waiting to be written on one
    /// psock. At half of it the psock is no longer read (a peer that does not
    /// read its replies stops being served, as TCP would push back); at the
    /// whole of it addressed sends to it are refused (`WouldBlock`, counted in
    /// `tx_backlog_refusals`). A refused addressed send always means its
    /// own peer is behind (see `sock_sndbuf`).
    pub psock_sndbuf: usize,
    /// Messages of one psock that may wait in KCM sockets' receive queues
    /// (not yet taken by a reader); past it the psock is not read until
    /// readers take half of them (`PsockRxResume`). Why: a socket's queue is
    /// one line for all its psocks, and `sock_rcvbuf` bytes of small
    /// messages from a few peers that send without end (the peers that do
    /// not read their replies, say) would put half a million messages ahead
    /// of everyone else's next one. With it, a message waits behind at most
    /// this many (plus one read's) per busy peer. KCM has no such bound.
    pub psock_queued_max: usize,
    /// Steering policy.
    pub steering: Steering,
    /// For `Steering::Affinity`: queue length beyond which messages go elsewhere.
    pub imbalance: usize,
    /// Budget in bytes for everything the core holds for all psocks together
    /// ([`Mux::memory_used`]: assembly buffers as allocated, not only the
    /// bytes in them, lent buffers, bytes a driver holds below the parser,
    /// ready messages, socket receive and send queues). The per-psock limits alone let N peers hold N times
    /// them; past this budget the largest holders stop being read, and those
    /// still stuck after `mem_grace` are aborted (`RxError::MemLimit`,
    /// counted in `mem_aborts`). AF_KCM has no such knob: the kernel's
    /// `tcp_mem`/`net.core.rmem_max` pressure plays that part.
    pub mem_limit: usize,
    /// How long a psock paused by the memory budget may stay paused, holding
    /// what it holds, while the mux is still over the budget's low mark
    /// (half of it), before it is aborted.
    pub mem_grace: Duration,
    /// Close a psock with no bytes received or written for this long
    /// (`RxError::IdleTimeout`, counted in `idle_timeouts`). `None` (the
    /// default) keeps idle connections forever, as AF_KCM does (its nearest
    /// knob is TCP keepalive on the attached socket).
    pub idle_timeout: Option<Duration>,
    /// How long the layer below the parser (TLS) may take to finish its
    /// handshake after attach ([`Mux::set_handshake_deadline`]); past it the
    /// psock fails with `RxError::HandshakeTimeout` (counted in
    /// `handshake_timeouts`). A peer that stalls before Finished would
    /// otherwise hold its connection forever, since nothing is framed before
    /// the handshake and no assembly deadline runs. AF_KCM has none (kTLS is
    /// set up after a handshake done elsewhere). `None` waits forever.
    pub handshake_timeout: Option<Duration>,
    /// Which psock carries a plain send.
    pub tx_policy: TxPolicy,
}

/// The default [`MuxConfig::mem_limit`]: 1 GiB, room for a thousand
/// largest messages at the default `max_msg_size`.
pub const DEFAULT_MEM_LIMIT: usize = 1 << 30;

impl Default for MuxConfig {
    fn default() -> Self {
        MuxConfig {
            max_msg_size: 1 << 20,
            assembly_timeout: None,
            sock_rcvbuf: 4 << 20,
            sock_sndbuf: 4 << 20,
            psock_rx_buf: 256 << 10,
            psock_sndbuf: 4 << 20,
            psock_queued_max: 1024,
            steering: Steering::default(),
            imbalance: 64,
            mem_limit: DEFAULT_MEM_LIMIT,
            mem_grace: Duration::from_secs(1),
            idle_timeout: None,
            handshake_timeout: Some(Duration::from_secs(5)),
            tx_policy: TxPolicy::RoundRobin,
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
    /// The handshake of the layer below the parser (TLS) must end within
    /// this from attach (as [`MuxRef::set_handshake_deadline`] would set;
    /// given here, it is set by whoever creates the psock's receive side).
    pub handshake_timeout: Option<Duration>,
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
    /// The psock's peer closed its write side (FIN) and everything it sent
    /// has been delivered, answered (no hold left, [`Mux::rx_settle`]) and
    /// written: the driver may close the connection in order (FIN). Raised
    /// once, after `PsockFailed(p, Closed)`.
    PsockDrained(PsockId),
    /// End the read that holds psock `p`'s loan of its assembly buffer
    /// ([`Mux::rx_lend`]) and give it back ([`Mux::rx_commit`]): the memory
    /// budget paused the psock while the buffer was lent, or a loan made
    /// ahead for a message only predicted ([`Mux::rx_lend_ahead`]) stayed
    /// out [`AHEAD_QUIET`] with nothing read. A loan counts whole while it
    /// is out, and one made ahead stays out for as long as the peer is
    /// quiet: kept, it would have the budget abort a peer that sends
    /// nothing, and hold memory for a message that may never come. A
    /// driver whose loans come back by themselves (a read at once) has
    /// nothing to do.
    PsockRxRecall(PsockId),
    /// What was told to the psocks of owner `o` (an [`Owned`]'s tag, never
    /// the caller's) waits for it: wake it, to apply it
    /// ([`MuxRef::apply_pending`]). Raised once until it applies; never
    /// with one owner.
    Wake(u32),
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

/// Most whole messages handed out by one `tx_begin` (one writev).
pub(super) const TX_CHUNK_SLICES: usize = 64;
/// Bytes after which `tx_begin` stops adding whole messages to a chunk.
pub(super) const TX_CHUNK_BYTES: usize = 256 << 10;
/// EPIPE, posted on a psock whose transmit KCM aborts.
const EPIPE: i32 = crate::parser::EPIPE;

/// A received message in a socket's queue (or the hold queue, or a psock's
/// ready slot). `off` > 0 only for a SEQPACKET message partly read.
#[derive(Debug)]
struct RxMsg {
    data: Bytes,
    off: usize,
    psock: PsockId,
}

impl RxMsg {
    #[inline]
    fn remaining(&self) -> usize {
        self.data.len() - self.off
    }
}

/// Where [`Mux::feed_direct`] hands messages for the caller's own socket.
pub struct Direct<'a> {
    pub sock: SockId,
    pub out: &'a mut Vec<(Bytes, PsockId)>,
    pub limit: usize,
}

/// A psock's assembly buffer lent to the driver ([`Mux::rx_lend`]): read at
/// most [`RxLoan::limit`] bytes from the connection onto the end of
/// [`RxLoan::buf`], then give it back with [`Mux::rx_commit`] (also when
/// nothing was read).
#[derive(Debug)]
pub struct RxLoan {
    psock: PsockId,
    loan: Loan,
}

impl RxLoan {
    /// The psock whose buffer this is.
    pub fn psock(&self) -> PsockId {
        self.psock
    }
    /// The most bytes that may be appended (the buffer has room for them).
    pub fn limit(&self) -> usize {
        self.loan.limit()
    }
    /// The buffer: append to it, change nothing before its end.
    pub fn buf(&mut self) -> &mut BytesMut {
        self.loan.buf()
    }
    /// Bytes appended so far.
    pub fn appended(&self) -> usize {
        self.loan.appended()
    }
}

/// A message on a psock's transmit queue.
#[derive(Debug)]
struct TxMsg {
    data: Bytes,
    /// Bytes already written (a short write resumes here).
    sent: usize,
    /// The socket whose send buffer it is charged to.
    owner: SockId,
    /// How it came to this psock (what becomes of it if the psock fails).
    placed: Placed,
    /// Whole messages in `data`, back to back (more than one only from
    /// `send_msgs_to`); counted one by one in the statistics.
    msgs: u32,
}

/// How a message came to a psock's transmit queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Placed {
    /// By its socket's reservation of the psock: if the psock fails first,
    /// it goes back to the head of its socket's queue, to be sent whole on
    /// the next reservation.
    Reserved,
    /// By `TxPolicy::LeastOutstanding`: if the psock fails first, it goes
    /// back to its owner to be placed again.
    Balanced,
    /// By `send_to`/`send_msg(Some(p))`: for this psock's peer only, dropped
    /// with the psock.
    Addressed,
}

impl TxMsg {
    fn new(data: Bytes, owner: SockId, placed: Placed, msgs: u32) -> TxMsg {
        TxMsg { data, sent: 0, owner, placed, msgs }
    }
    #[inline]
    fn addressed(&self) -> bool {
        self.placed == Placed::Addressed
    }
}

/// The chunk a writer had out (`tx_begin`) when its psock was unattached.
/// Writers write without the hub lock and report after, and the connection
/// stays open until they are done: the chunk's addressed messages may be on
/// the wire already, so they are counted when the writer reports
/// (`tx_complete` on the released psock: sent if written whole, else
/// dropped), not dropped at the unattach. The chunk's other messages went
/// back to their sockets at the unattach, to be sent whole elsewhere; their
/// bytes are only skipped here.
#[derive(Debug)]
struct OutAtRelease {
    p: PsockId,
    /// The chunk's messages in order: `Ok` kept for the writer's report,
    /// `Err(n)` gone elsewhere, with the `n` bytes the chunk had of it.
    msgs: Vec<Result<TxMsg, usize>>,
}

/// Mux-level counters (`struct kcm_mux_stats`).
#[derive(Clone, Debug, Default)]
struct MuxCounters {
    tx_retries: u64,
    psock_attach: u64,
    psock_unattach: u64,
    psock_unattach_rsvd: u64,
    rx_ready_drops: u64,
    mem_pauses: u64,
    mem_aborts: u64,
    idle_timeouts: u64,
    handshake_timeouts: u64,
}

/// The multiplexor: what its psocks' owner holds and what they share.
///
/// The two halves are apart so that a runtime can give each worker its
/// own psocks (`Owned`) and share only the sockets (`Hub`); a single-threaded
/// mux, as here, holds one of each. A runtime whose workers own the psocks
/// keeps the hub in one with an owner of no psocks ([`Mux::with_owner`]),
/// through which application threads call it, and calls on a worker's
/// psocks with the worker's own ([`Mux::of`]).
pub struct Mux {
    o: Owned,
    h: Hub,
}

/// What the owner of the psocks holds: their receive sides (the psocks as
/// [`Psock`]) and their deadlines.
pub struct Owned {
    /// Its tag: the hub's share of each of its psocks names it, and what is
    /// told to them comes here.
    id: u32,
    /// What each attached connection owns, under the hub's ids.
    psocks: Keyed<Psock>,
    /// Assembly deadlines of the psocks, earliest first.
    deadlines: Deadlines,
    /// The latest time any call told us.
    now: Timestamp,
    /// Psocks read again after the server held them back, whose assembly
    /// deadline restarts at the next time the mux is told
    /// ([`Mux::rx_resume`]: the calls that resume carry no time).
    restarts: Vec<PsockId>,
    /// When the next idle or handshake deadline may have passed.
    scan_next: Option<Timestamp>,
    /// The socket whose receiving thread reads these psocks now
    /// ([`Owned::set_reader`]).
    reader: Option<SockId>,
}

impl std::fmt::Debug for Mux {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mux").field("socks", &self.h.sk.socks.len()).field("psocks", &self.o.psocks.len()).finish()
    }
}

#[inline]
pub(super) fn sid(i: (u32, u32)) -> SockId {
    SockId { index: i.0, generation: i.1 }
}
#[inline]
fn pid(i: (u32, u32)) -> PsockId {
    PsockId { index: i.0, generation: i.1 }
}

/// splitmix64 finaliser: spreads steering keys evenly.
pub(super) fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d049bb133111eb);
    x ^ (x >> 31)
}

impl Owned {
    /// The psocks of owner `id` (a tag of the caller's choice, the same for
    /// no two owners of one hub that hold psocks; small numbers: a tag
    /// indexes the hub's queues of what is told): none yet.
    pub fn new(id: u32) -> Owned {
        Owned {
            id,
            psocks: Keyed::default(),
            deadlines: Deadlines::default(),
            now: Timestamp::ZERO,
            restarts: Vec::new(),
            scan_next: None,
            reader: None,
        }
    }

    /// The socket whose receiving thread reads these psocks now, if any
    /// (a thread that runs their owner's pass while nothing is queued for
    /// it). With `Steering::Affinity` a read goes to it while its queue is
    /// short (able, untagged, at most `imbalance` queued:
    /// `Sockets::reads_on`), before the socket that took the psock's last
    /// read: it takes its queue right after, in the same thread, with no
    /// wake-up.
    pub fn set_reader(&mut self, s: Option<SockId>) {
        self.reader = s;
    }

    /// Its tag ([`Owned::new`]).
    pub fn id(&self) -> u32 {
        self.id
    }
}

/// A mux to read: one owner's psocks and the hub (the whole mux when the
/// owner is the only one: [`Mux`]).
#[derive(Clone, Copy)]
pub struct MuxView<'a> {
    o: &'a Owned,
    h: &'a Hub,
}

/// A mux to change: one owner's psocks and the hub, both held for the
/// call. A runtime whose workers own their psocks makes one per call from
/// the worker's [`Owned`] and the locked [`Hub`]; [`Mux`] makes one from
/// its own pair.
pub struct MuxRef<'a> {
    o: &'a mut Owned,
    h: &'a mut Hub,
}

impl<'a> MuxRef<'a> {
    /// Owner `o`'s psocks and hub `h`, to change.
    #[inline]
    pub fn new(o: &'a mut Owned, h: &'a mut Hub) -> MuxRef<'a> {
        MuxRef { o, h }
    }

    #[inline]
    fn v(&self) -> MuxView<'_> {
        MuxView { o: self.o, h: self.h }
    }

    /// Apply what the hub told this owner's psocks while other owners (or
    /// application threads) held it, in the order it was told: what an
    /// owner does when the hub asked for it to be woken
    /// ([`Event::Wake`]). Every call through this `MuxRef` that tells
    /// anything does it too.
    pub fn apply_pending(&mut self) {
        self.apply_told();
    }
}

impl<'a> MuxView<'a> {
    /// Owner `o`'s psocks and hub `h`, to read.
    #[inline]
    pub fn new(o: &'a Owned, h: &'a Hub) -> MuxView<'a> {
        MuxView { o, h }
    }
}

/// `Mux`'s calls, each that of its view ([`Mux::v`]) or its `MuxRef`
/// ([`Mux::r`]) of the same name.
macro_rules! delegate {
    (view; $($(#[$attr:meta])* fn $name:ident$(<$lt:lifetime>)?($($arg:ident: $argty:ty),*) $(-> $ret:ty)?;)*) => {
        $(
            #[doc = concat!("[`MuxView::", stringify!($name), "`].")]
            $(#[$attr])*
            #[inline]
            pub fn $name$(<$lt>)?(&self, $($arg: $argty),*) $(-> $ret)? {
                self.v().$name($($arg),*)
            }
        )*
    };
    (change; $($(#[$attr:meta])* fn $name:ident$(<$lt:lifetime>)?($($arg:ident: $argty:ty),*) $(-> $ret:ty)?;)*) => {
        $(
            #[doc = concat!("[`MuxRef::", stringify!($name), "`].")]
            $(#[$attr])*
            #[inline]
            pub fn $name$(<$lt>)?(&mut self, $($arg: $argty),*) $(-> $ret)? {
                self.r().$name($($arg),*)
            }
        )*
    };
}

impl Mux {
    pub fn new(config: MuxConfig) -> Mux {
        Mux::with_owner(config, 0)
    }

    /// A mux whose own psocks are owner `tag`'s (see [`Owned::new`]).
    pub fn with_owner(config: MuxConfig, tag: u32) -> Mux {
        Mux { o: Owned::new(tag), h: Hub::new(config) }
    }

    /// The hub with another owner's psocks `o`, to change (a runtime's
    /// worker calling on its own psocks).
    #[inline]
    pub fn of<'a>(&'a mut self, o: &'a mut Owned) -> MuxRef<'a> {
        MuxRef { o, h: &mut self.h }
    }

    /// The hub with another owner's psocks `o`, to read, what was told to
    /// them applied first.
    #[inline]
    pub fn view_of<'a>(&'a mut self, o: &'a mut Owned) -> MuxView<'a> {
        MuxRef { o: &mut *o, h: &mut self.h }.apply_pending();
        MuxView { o, h: &self.h }
    }

    /// Its own psocks' receive sides (what their owner does alone:
    /// [`Owned::rx_room_alone`], [`Owned::frame_alone`]).
    pub fn owned(&mut self) -> &mut Owned {
        &mut self.o
    }

    /// What an owner framed alone ([`Owned::frame_alone`]), counted by the
    /// hub as [`Mux::feed_in_place`] counts what it frames: the socket's
    /// counters and holds, the psock's counters and last read. `false`:
    /// the psock was unattached first, and nothing is counted: its
    /// messages framed alone were not delivered (the caller drops those it
    /// keeps), as an unattach drops a partial message.
    pub fn report_alone(&mut self, f: FramedAlone) -> bool {
        self.h.report_alone(f)
    }

    /// `n` messages of psock `p` that [`Mux::feed_direct`] handed the
    /// caller for socket `s`, kept by it for the socket's reader until
    /// taken: held by the psock until settled ([`Mux::rx_settle`]), as a
    /// holding socket's are (if `s` holds, they are already).
    pub fn hold_direct(&mut self, s: SockId, p: PsockId, n: u64) {
        if self.h.sk.socks.get(s.index, s.generation).is_some_and(|k| !k.holds) {
            self.h.sk.handed(p, n, true);
        }
    }

    /// The mux to read.
    #[inline]
    pub fn v(&self) -> MuxView<'_> {
        MuxView { o: &self.o, h: &self.h }
    }

    /// The mux to change.
    #[inline]
    pub fn r(&mut self) -> MuxRef<'_> {
        MuxRef { o: &mut self.o, h: &mut self.h }
    }

    delegate! { view;
        fn config() -> &MuxConfig;
        fn sock_type(s: SockId) -> Result<SockType, MuxError>;
        fn recv_disabled(s: SockId) -> Result<bool, MuxError>;
        fn rcvbuf(s: SockId) -> Result<usize, MuxError>;
        fn sndbuf(s: SockId) -> Result<usize, MuxError>;
        fn sock_count() -> usize;
        fn socks() -> Vec<SockId>;
        fn psock_count() -> usize;
        fn psocks() -> Vec<PsockId>;
        fn rx_capacity(p: PsockId) -> usize;
        fn rx_need(p: PsockId) -> Option<usize>;
        fn rx_would_lend(p: PsockId) -> bool;
        fn rx_would_lend_ahead(p: PsockId) -> bool;
        fn peer_closed(p: PsockId) -> bool;
        fn drained(p: PsockId) -> bool;
        fn rx_holds(p: PsockId) -> u64;
        fn tx_unsent(s: SockId) -> Result<usize, MuxError>;
        fn rx_queued(s: SockId) -> Result<usize, MuxError>;
        fn rx_queued_from(s: SockId, p: PsockId) -> Result<usize, MuxError>;
        fn writable(s: SockId) -> Result<bool, MuxError>;
        fn psock_outstanding(p: PsockId) -> Result<u64, MuxError>;
        #[doc(hidden)] fn shares_exact() -> Result<(), String>;
        fn poll_timeout() -> Option<Timestamp>;
        #[doc(hidden)] fn deadline_entries() -> usize;
        fn stats() -> MuxStats;
        fn sock_stats(s: SockId) -> Result<SockStats, MuxError>;
        fn psock_stats(p: PsockId) -> Result<PsockStats, MuxError>;
        fn memory_used() -> usize;
        fn memory_bound() -> usize;
        fn proc_kcm() -> String;
        fn proc_kcm_stats() -> String;
        #[doc(hidden)] fn memory_counted() -> usize;
        fn mem_tight() -> bool;
        fn mem_paused(p: PsockId) -> bool;
        fn idlest(now: Timestamp) -> Option<(PsockId, Duration)>;
    }
    delegate! { change;
        fn socket(ty: SockType) -> SockId;
        fn clone_sock(s: SockId) -> Result<SockId, MuxError>;
        fn close(s: SockId) -> Result<(), MuxError>;
        fn set_recv_disable(s: SockId, disable: bool) -> Result<(), MuxError>;
        fn set_rcvbuf(s: SockId, bytes: usize) -> Result<(), MuxError>;
        fn set_sndbuf(s: SockId, bytes: usize) -> Result<(), MuxError>;
        fn set_psock_affinity(p: PsockId, tag: Option<u32>) -> Result<(), MuxError>;
        fn set_affinity(s: SockId, tag: Option<u32>) -> Result<(), MuxError>;
        fn set_tag_only(s: SockId, on: bool) -> Result<(), MuxError>;
        fn attach(parser: Box<dyn Parser>, cfg: PsockConfig) -> PsockId;
        fn attach_to(owner: u32, parser: Box<dyn Parser>, cfg: PsockConfig) -> PsockId;
        fn unattach(p: PsockId) -> Result<(), MuxError>;
        fn feed(p: PsockId, data: &[u8], now: Timestamp) -> Result<(), MuxError>;
        fn feed_direct(p: PsockId, data: &[u8], now: Timestamp, direct: &mut Direct<'_>) -> Result<(), MuxError>;
        fn feed_in_place(p: PsockId, data: &[u8], now: Timestamp, direct: &mut Direct<'_>, limit: usize, out: &mut Vec<crate::run::Run>) -> Result<(), MuxError>;
        fn rx_lend(p: PsockId) -> Option<RxLoan>;
        fn rx_room(p: PsockId) -> (usize, Option<RxLoan>);
        fn rx_lend_ahead(p: PsockId) -> Option<RxLoan>;
        fn rx_commit(loan: RxLoan, now: Timestamp) -> Result<(), MuxError>;
        fn rx_commit_direct(loan: RxLoan, now: Timestamp, direct: &mut Direct<'_>) -> Result<(), MuxError>;
        fn rx_closed(p: PsockId, errno: Option<i32>) -> Result<(), MuxError>;
        fn set_holds(s: SockId, on: bool) -> Result<(), MuxError>;
        fn rx_settle(p: PsockId, n: u64);
        fn unkeep(s: SockId, msgs: Vec<(Bytes, PsockId)>);
        fn rx_abort(p: PsockId, err: RxError) -> Result<(), MuxError>;
        fn recv(s: SockId, buf: &mut [u8], flags: RecvFlags) -> Result<RecvInfo, MuxError>;
        fn recv_msg(s: SockId) -> Result<(Bytes, PsockId), MuxError>;
        fn send(s: SockId, data: &[u8], flags: SendFlags) -> Result<usize, MuxError>;
        fn end_batch(s: SockId) -> Result<(), MuxError>;
        fn send_to(s: SockId, p: PsockId, data: &[u8], flags: SendFlags) -> Result<usize, MuxError>;
        fn send_msg(s: SockId, p: Option<PsockId>, msg: Bytes, batch: bool) -> Result<(), MuxError>;
        fn send_msgs_to(s: SockId, p: PsockId, data: Bytes, count: u32) -> Result<(), MuxError>;
        fn send_msgs_to_accepted(s: SockId, p: PsockId, data: Bytes, count: u32) -> Result<(), MuxError>;
        fn send_msgs_to_begin(s: SockId, p: PsockId, data: Bytes, count: u32, slices: &mut Vec<Bytes>) -> Result<bool, MuxError>;
        fn send_abort(s: SockId) -> Result<(), MuxError>;
        fn tx_kick(p: PsockId);
        fn tx_begin(p: PsockId) -> Option<TxChunk>;
        fn tx_begin_into(p: PsockId, slices: &mut Vec<Bytes>) -> bool;
        fn tx_complete(p: PsockId, n: usize);
        fn tx_failed(p: PsockId, errno: i32);
        fn tx_idle(p: PsockId) -> bool;
        fn tx_direct(s: SockId, p: PsockId, len: usize, msgs: u32);
        fn tx_direct_rest(s: SockId, p: PsockId, data: Bytes, sent: usize, msgs: u32);
        fn handle_timeout(now: Timestamp);
        fn poll_event() -> Option<Event>;
        fn note_now(now: Timestamp);
        fn set_rx_below(p: PsockId, bytes: usize);
        fn set_handshake_deadline(p: PsockId, deadline: Option<Timestamp>) -> Result<(), MuxError>;
        fn set_record_deadline(p: PsockId, deadline: Option<Timestamp>) -> Result<(), MuxError>;
    }
}

impl<'a> MuxView<'a> {
    pub fn config(&self) -> &'a MuxConfig {
        &self.h.config
    }

    #[inline]
    fn sock(&self, s: SockId) -> Result<&'a Sock, MuxError> {
        self.h.sk.socks.get(s.index, s.generation).ok_or(MuxError::BadSock)
    }
    #[inline]
    fn psock(&self, p: PsockId) -> Result<&'a Psock, MuxError> {
        self.o.psocks.get(p.index, p.generation).ok_or(MuxError::NoPsock)
    }

    pub fn sock_type(&self, s: SockId) -> Result<SockType, MuxError> {
        Ok(self.sock(s)?.ty)
    }
    pub fn recv_disabled(&self, s: SockId) -> Result<bool, MuxError> {
        Ok(self.sock(s)?.rx_disabled)
    }
    /// getsockopt(SO_RCVBUF) on a KCM socket.
    pub fn rcvbuf(&self, s: SockId) -> Result<usize, MuxError> {
        Ok(self.sock(s)?.rcvbuf)
    }
    /// getsockopt(SO_SNDBUF) on a KCM socket.
    pub fn sndbuf(&self, s: SockId) -> Result<usize, MuxError> {
        Ok(self.sock(s)?.sndbuf)
    }
    pub fn sock_count(&self) -> usize {
        self.h.sk.socks.len()
    }
    /// Live KCM sockets, in index order.
    pub fn socks(&self) -> Vec<SockId> {
        self.h.sk.socks.iter().map(|(i, g, _)| sid((i, g))).collect()
    }
    /// Attached psocks, whoever owns them.
    pub fn psock_count(&self) -> usize {
        self.h.sk.shares().count()
    }
    /// Attached psocks, whoever owns them, in index order.
    pub fn psocks(&self) -> Vec<PsockId> {
        self.h.sk.shares().map(|(p, _)| p).collect()
    }

    // ---- receive path ----

    /// Bytes the psock will accept now (0 = paused or stopped).
    pub fn rx_capacity(&self, p: PsockId) -> usize {
        let held = |ps: &Psock| {
            let (mem_paused, backlog) = self.h.holds_back(p);
            ps.held_back(&self.h.config, mem_paused, backlog)
        };
        match self.psock(p) {
            Ok(ps) if ps.rx_running() && !held(ps) => {
                ps.stream.want().min(ps.rx_limit.saturating_sub(ps.rx_held())).min(self.mem_room())
            }
            _ => 0,
        }
    }
    /// The need-bytes hint: bytes still missing from the current message, if known.
    pub fn rx_need(&self, p: PsockId) -> Option<usize> {
        self.psock(p).ok()?.stream.need()
    }

    /// Whether [`Mux::rx_lend`] would lend now (without lending).
    pub fn rx_would_lend(&self, p: PsockId) -> bool {
        self.rx_capacity(p) > 0 && self.psock(p).is_ok_and(|ps| ps.stream.would_lend())
    }

    /// Whether [`Mux::rx_lend_ahead`] would lend now (without lending).
    pub fn rx_would_lend_ahead(&self, p: PsockId) -> bool {
        self.ahead_check(p).is_some() && self.rx_would_lend(p)
    }

    /// Whether a lend now is allowed by the rule of [`Mux::rx_lend_ahead`]
    /// (`None`: not), and if so whether it would be for a message only
    /// predicted.
    fn ahead_check(&self, p: PsockId) -> Option<bool> {
        match self.psock(p).ok()?.stream.lend_predicted() {
            Some(len) => (self.mem_total().saturating_add(len) <= self.h.config.mem_limit / 2).then_some(true),
            None => Some(false),
        }
    }

    /// Whether psock `p`'s peer closed its write side in order (FIN) and the
    /// psock has not failed since: it is being drained, or is drained.
    pub fn peer_closed(&self, p: PsockId) -> bool {
        self.h.peer_closed(p)
    }

    /// Whether psock `p` is `Drained` (its `PsockDrained` was raised).
    pub fn drained(&self, p: PsockId) -> bool {
        self.h.drained(p)
    }

    /// Messages of psock `p` taken from holding sockets and not yet settled.
    pub fn rx_holds(&self, p: PsockId) -> u64 {
        self.h.sk.share(p).map_or(0, |sh| sh.holds)
    }

    /// Whole messages socket `s` accepted (`send`) that are not yet fully
    /// written to a connection (its Send-Q). Closing the socket drops them.
    pub fn tx_unsent(&self, s: SockId) -> Result<usize, MuxError> {
        Ok(self.sock(s)?.tx_msgs)
    }

    /// Messages waiting in a socket's receive queue.
    pub fn rx_queued(&self, s: SockId) -> Result<usize, MuxError> {
        Ok(self.sock(s)?.rx_queue.len())
    }

    /// Messages of psock `p` waiting on socket `s` (a walk of the queue:
    /// for rare decisions, such as whether a psock may be steered elsewhere
    /// without its messages being answered out of order).
    pub fn rx_queued_from(&self, s: SockId, p: PsockId) -> Result<usize, MuxError> {
        Ok(self.sock(s)?.rx_queue.iter().filter(|m| m.psock == p).count())
    }
    /// Whether a new message can start on this socket now.
    pub fn writable(&self, s: SockId) -> Result<bool, MuxError> {
        let sock = self.sock(s)?;
        Ok(sock.tx_mem < sock.sndbuf)
    }

    /// Messages queued on psock `p` over its life minus messages received
    /// from it (never below 0): what `TxPolicy::LeastOutstanding` compares.
    pub fn psock_outstanding(&self, p: PsockId) -> Result<u64, MuxError> {
        self.psock(p)?;
        Ok(self.h.sk.share(p).map_or(0, Share::outstanding))
    }

    /// Whether every psock's share holds what the psock itself has of its
    /// transmit side (addressed backlog, messages received,
    /// whether it can answer), and every share has a psock: the sockets'
    /// side decides from the shares, so an update the glue missed shows
    /// here. `Err` names the first difference. For tests (a walk of the
    /// psocks).
    #[doc(hidden)]
    pub fn shares_exact(&self) -> Result<(), String> {
        for (i, g, ps) in self.o.psocks.iter() {
            let p = pid((i, g));
            let Some(sh) = self.h.sk.share(p) else { return Err(format!("{p:?}: no share")) };
            let mine = (ps.report(), ps.rx_mem() + ps.below, !sh.tx.stopped() && ps.rx_running(), ps.life);
            let told = (sh.rx.clone(), sh.counted, sh.answers, sh.life);
            if mine != told {
                return Err(format!("{p:?}: (report, counted, answers, life) {mine:?}, its share {told:?}"));
            }
        }
        let shares = self.h.sk.shares().filter(|(_, sh)| sh.owner == self.o.id).count();
        if shares != self.o.psocks.len() {
            return Err(format!("{shares} shares for {} psocks", self.o.psocks.len()));
        }
        Ok(())
    }

    // ---- time ----

    /// The earliest assembly deadline of any psock (O(1)), or the time the
    /// memory budget, an idle or a handshake deadline wants a look.
    pub fn poll_timeout(&self) -> Option<Timestamp> {
        // Deadlines to restart: at once, with the caller's time.
        let restart = (!self.o.restarts.is_empty()).then_some(self.o.now);
        [self.o.deadlines.next(), self.h.mem_next, self.o.scan_next, restart].into_iter().flatten().min()
    }

    /// Deadline entries held (live and stale): at most 2 × armed + 64.
    #[doc(hidden)]
    pub fn deadline_entries(&self) -> usize {
        self.o.deadlines.len()
    }
    /// Mux totals: live psocks, whoever owns them, plus every unattached
    /// one (totals never drop). Read on the hub alone: each psock's
    /// share has what its owner last reported.
    pub fn stats(&self) -> MuxStats {
        self.h.stats()
    }
    /// Socket `s`'s affinity tag (`set_affinity`), if it is live and has one.
    pub fn sock_affinity(&self, s: SockId) -> Option<u32> {
        self.sock(s).ok()?.affinity
    }
    /// Whether a socket has affinity tag `tag` (steering gives it the
    /// messages of psocks with that tag before any reader's).
    pub fn tag_taken(&self, tag: u32) -> bool {
        self.h.sk.socks.iter().any(|(_, _, s)| s.affinity == Some(tag))
    }
    pub fn sock_stats(&self, s: SockId) -> Result<SockStats, MuxError> {
        let sock = self.sock(s)?;
        let mut st = sock.stats.clone();
        st.rx_queued = sock.rx_queue.len();
        st.rx_mem = sock.rx_mem;
        st.tx_queued = sock.tx_msgs;
        st.tx_mem = sock.tx_mem;
        Ok(st)
    }
    /// Psock `p`'s statistics, whoever owns it.
    pub fn psock_stats(&self, p: PsockId) -> Result<PsockStats, MuxError> {
        self.h.sk.share(p).map(Share::stats).ok_or(MuxError::NoPsock)
    }

    /// Every byte the core holds now: psock buffers and ready messages, socket
    /// receive and send queues (open messages included), the hold queue.
    pub fn memory_used(&self) -> usize {
        self.h.mem_total()
    }
    /// The most [`Mux::memory_used`] can be, from configuration and the
    /// options set (formula in the module documentation).
    pub fn memory_bound(&self) -> usize {
        // Saturating: a socket may set an effectively unlimited SO_SNDBUF
        // (the in-place service does; its replies are bounded per psock).
        // A psock's buffer is counted as allocated (`StreamParser::memory`).
        let psocks: usize = self
            .o
            .psocks
            .iter()
            .map(|(_, _, ps)| crate::stream::memory_bound(ps.rx_limit))
            .fold(0, usize::saturating_add);
        let socks: usize = self
            .h
            .sk
            .socks
            .iter()
            .map(|(_, _, s)| {
                (s.rcvbuf_peak + self.h.max_msg_peak).saturating_add(s.sndbuf_peak).saturating_add(s.tx_msg_peak)
            })
            .fold(0, usize::saturating_add);
        psocks.saturating_add(socks).saturating_add(self.h.sk.hold_budget)
    }

    /// The `/proc/net/kcm`-style live view of this mux.
    ///
    /// Columns as the kernel prints them. Socket lines: Recv-Q messages, Rmem
    /// bytes, Send-Q messages, Smem bytes charged to SO_SNDBUF (the kernel
    /// prints `-`). Psock lines: Recv-Q is 1 while a ready message waits, Rmem
    /// the bytes held, Send-Q and Smem the transmit queue in messages and
    /// unwritten bytes (the kernel shows the TCP socket's queues).
    pub fn proc_kcm(&self) -> String {
        let st = self.stats();
        let mut out = String::new();
        let _ = writeln!(out, "*** KCM statistics (1 MUX) ****");
        let _ = writeln!(
            out,
            "{:<14} {:<10} {:<16} {:<10} {:<16} {:<8} {:<8} {:<8} {:<8} Status",
            "Object", "RX-Msgs", "RX-Bytes", "TX-Msgs", "TX-Bytes", "Recv-Q", "Rmem", "Send-Q", "Smem"
        );
        let _ = writeln!(
            out,
            "{:<6}{:<8} {:<10} {:<16} {:<10} {:<16} {:<8} {:<8} {:<8} {:<8} KCMs: {}, Psocks {}",
            "mux", "", st.rx_msgs, st.rx_bytes, st.tx_msgs, st.tx_bytes, "-", "-", "-", "-", st.kcms, st.psocks
        );
        for (i, _, s) in self.h.sk.socks.iter() {
            let _ = write!(
                out,
                "   kcm-{:<7} {:<10} {:<16} {:<10} {:<16} {:<8} {:<8} {:<8} {:<8} ",
                i,
                s.stats.rx_msgs,
                s.stats.rx_bytes,
                s.stats.tx_msgs,
                s.stats.tx_bytes,
                s.rx_queue.len(),
                s.rx_mem,
                s.tx_msgs,
                s.tx_mem
            );
            if let Some(p) = s.tx_psock {
                let _ = write!(out, "Psck-{} ", p.index);
            }
            if s.tx_waiting {
                out.push_str("TxWait ");
            }
            if s.wait_more {
                out.push_str("WMore ");
            }
            if s.on_waiters {
                out.push_str("RxWait ");
            }
            out.push('\n');
        }
        for (p, sh) in self.h.sk.shares() {
            let fs = sh.stats();
            let rx = &sh.rx;
            let (tx_queued, tx_pending) = sh.tx.pending();
            let _ = write!(
                out,
                "   psock-{:<5} {:<10} {:<16} {:<10} {:<16} {:<8} {:<8} {:<8} {:<8} ",
                p.index,
                fs.rx_msgs,
                fs.rx_bytes,
                fs.tx_msgs,
                fs.tx_bytes,
                usize::from(rx.ready),
                rx.held,
                tx_queued,
                tx_pending
            );
            if sh.tx.stopped() {
                out.push_str("TxStop ");
            }
            if rx.stopped {
                out.push_str("RxStop ");
            }
            if let Some(s) = sh.tx_kcm {
                let _ = write!(out, "Rsvd-{} ", s.index);
            }
            match rx.wait {
                Some(Some(n)) if n > 0 => {
                    let _ = write!(out, "RxWait={n} ");
                }
                Some(_) => out.push_str("RxWait "),
                None => {}
            }
            if rx.ready {
                // (KCM prints both for a psock holding a message no socket
                // could take: it is paused because of it.)
                out.push_str("RxPause RdyRx ");
            }
            out.push('\n');
        }
        out
    }

    /// The `/proc/net/kcm_stats`-style totals of this mux, with the labels
    /// over the right values (the kernel swaps Unattach and UnattchRsvd) and
    /// TX-Retries kept after unattach. RX-Aborts counts psocks whose receive
    /// was stopped by an error (the kernel prints 0). TX-AddrDrops is ours.
    pub fn proc_kcm_stats(&self) -> String {
        proc_kcm_stats_of(&self.stats())
    }
}

/// [`MuxView::proc_kcm_stats`] of statistics `st` (over every owner).
pub fn proc_kcm_stats_of(st: &MuxStats) -> String {
    let ps = &st.psock;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<8} {:<10} {:<16} {:<10} {:<16} {:<10} {:<10} {:<10} {:<10} {:<10}",
        "MUX",
        "RX-Msgs",
        "RX-Bytes",
        "TX-Msgs",
        "TX-Bytes",
        "TX-Retries",
        "Attach",
        "Unattach",
        "UnattchRsvd",
        "RX-RdyDrops"
    );
    let _ = writeln!(
        out,
        "{:<8} {:<10} {:<16} {:<10} {:<16} {:<10} {:<10} {:<10} {:<10} {:<10}",
        "",
        st.rx_msgs,
        st.rx_bytes,
        st.tx_msgs,
        st.tx_bytes,
        st.tx_retries,
        st.psock_attach,
        st.psock_unattach,
        st.psock_unattach_rsvd,
        st.rx_ready_drops
    );
    let _ = writeln!(
            out,
            "{:<8} {:<10} {:<16} {:<10} {:<16} {:<10} {:<10} {:<10} {:<10} {:<10} {:<10} {:<10} {:<10} {:<10} {:<10} {:<10} {:<10}",
            "Psock", "RX-Msgs", "RX-Bytes", "TX-Msgs", "TX-Bytes", "Reserved", "Unreserved", "RX-Aborts", "RX-Intr",
            "RX-Unrecov", "RX-MemFail", "RX-NeedMor", "RX-BadLen", "RX-TooBig", "RX-Timeout", "TX-Aborts", "TX-AddrDrops"
        );
    let _ = writeln!(
            out,
            "{:<8} {:<10} {:<16} {:<10} {:<16} {:<10} {:<10} {:<10} {:<10} {:<10} {:<10} {:<10} {:<10} {:<10} {:<10} {:<10} {:<10}",
            "",
            ps.rx_msgs,
            ps.rx_bytes,
            ps.tx_msgs,
            ps.tx_bytes,
            ps.reserved,
            ps.unreserved,
            ps.rx_aborts,
            ps.rx_interrupted,
            ps.rx_unrecov_intr,
            ps.rx_mem_fail,
            ps.rx_need_more_hdr,
            ps.rx_bad_hdr_len,
            ps.rx_msg_too_big,
            ps.rx_msg_timeouts,
            ps.tx_aborts,
            ps.tx_addressed_drops
        );
    out
}

impl MuxRef<'_> {
    #[inline]
    fn sock_mut(&mut self, s: SockId) -> Result<&mut Sock, MuxError> {
        self.h.sk.socks.get_mut(s.index, s.generation).ok_or(MuxError::BadSock)
    }
    #[inline]
    fn psock_mut(&mut self, p: PsockId) -> Result<&mut Psock, MuxError> {
        self.o.psocks.get_mut(p.index, p.generation).ok_or(MuxError::NoPsock)
    }
    fn note_time(&mut self, now: Timestamp) {
        if now > self.o.now {
            self.o.now = now;
        }
        if now > self.h.now {
            self.h.now = now;
        }
        if !self.o.restarts.is_empty() {
            self.restart_deadlines();
        }
    }

    /// The deadlines [`Mux::rx_resume`] held run again, in full, from now.
    #[cold]
    fn restart_deadlines(&mut self) {
        for p in std::mem::take(&mut self.o.restarts) {
            if let Some(ps) = self.o.psocks.get_mut(p.index, p.generation) {
                ps.stream.restart_deadline(self.o.now);
            }
            self.sync_deadline(p);
        }
    }

    // ---- KCM sockets ----

    /// Create a KCM socket (the first `socket(AF_KCM, ty, 0)`).
    pub fn socket(&mut self, ty: SockType) -> SockId {
        let s = sid(self.h.sk.socks.insert(Sock::new(ty, &self.h.config)));
        // A new socket is able at once: it takes held messages, then joins.
        self.rcv_ready(s);
        s
    }
    /// SIOCKCMCLONE: a new socket on this mux, same type, default options.
    pub fn clone_sock(&mut self, s: SockId) -> Result<SockId, MuxError> {
        let ty = self.v().sock(s)?.ty;
        Ok(self.socket(ty))
    }
    /// close(): unsent messages are dropped, a reserved psock mid-message is
    /// aborted, queued received messages move to other sockets. Closing the last
    /// socket unattaches every psock.
    pub fn close(&mut self, s: SockId) -> Result<(), MuxError> {
        let r = self.h.close(s);
        self.apply_told();
        // The last socket: every psock is unattached, whoever owns it, as
        // KCM releases them with the mux.
        for p in r? {
            let _ = self.unattach(p);
        }
        Ok(())
    }
    /// KCM_RECV_DISABLE.
    pub fn set_recv_disable(&mut self, s: SockId, disable: bool) -> Result<(), MuxError> {
        let sock = self.sock_mut(s)?;
        if sock.rx_disabled == disable {
            return Ok(());
        }
        sock.rx_disabled = disable;
        if disable {
            let was_waiting = std::mem::replace(&mut sock.on_waiters, false);
            let msgs = std::mem::take(&mut sock.rx_queue);
            sock.rx_mem = 0;
            if was_waiting {
                self.h.sk.rx_waiters.retain(|w| *w != s);
            }
            self.h.requeue(msgs);
        } else {
            self.rcv_ready(s);
        }
        Ok(())
    }
    /// SO_RCVBUF / SO_SNDBUF on a KCM socket.
    pub fn set_rcvbuf(&mut self, s: SockId, bytes: usize) -> Result<(), MuxError> {
        let sock = self.sock_mut(s)?;
        sock.rcvbuf = bytes.max(1);
        sock.rcvbuf_peak = sock.rcvbuf_peak.max(sock.rcvbuf);
        if sock.on_waiters && !sock.able() {
            sock.on_waiters = false;
            self.h.sk.rx_waiters.retain(|w| *w != s);
        } else {
            self.rcv_ready(s);
        }
        Ok(())
    }
    pub fn set_sndbuf(&mut self, s: SockId, bytes: usize) -> Result<(), MuxError> {
        let sock = self.sock_mut(s)?;
        sock.sndbuf = bytes.max(1);
        sock.sndbuf_peak = sock.sndbuf_peak.max(sock.sndbuf);
        self.h.sk.check_writable(&mut self.h.events, s);
        Ok(())
    }
    /// Affinity tag for `Steering::Affinity` (the runtime: worker index).
    /// Change a psock's affinity tag: its next messages are steered to the
    /// socket with that tag (the runtime moves a connection between workers).
    pub fn set_psock_affinity(&mut self, p: PsockId, tag: Option<u32>) -> Result<(), MuxError> {
        let ps = self.o.psocks.get_mut(p.index, p.generation).ok_or(MuxError::NoPsock)?;
        ps.affinity = tag;
        Ok(())
    }
    pub fn set_affinity(&mut self, s: SockId, tag: Option<u32>) -> Result<(), MuxError> {
        self.sock_mut(s)?.affinity = tag;
        Ok(())
    }
    /// With `Steering::Affinity`, socket `s` takes only the messages of psocks
    /// whose affinity tag is its own, and no other psock's messages spill
    /// over to it (the runtime's heavy lanes: nothing else waits behind a
    /// psock steered there; its messages are taken in arrival order by the
    /// lane's thread and by helpers on other CPUs).
    /// Under the other steering policies it is never chosen.
    pub fn set_tag_only(&mut self, s: SockId, on: bool) -> Result<(), MuxError> {
        self.sock_mut(s)?.tag_only = on;
        Ok(())
    }

    // ---- psocks ----

    /// SIOCKCMATTACH. Bytes the connection already holds are simply fed after.
    pub fn attach(&mut self, parser: Box<dyn Parser>, cfg: PsockConfig) -> PsockId {
        let me = self.o.id;
        self.attach_to(me, parser, cfg)
    }
    /// SIOCKCMATTACH for owner `owner` (a tag of an [`Owned`] of this hub):
    /// the psock is attached at once as far as the sockets go (it may be
    /// reserved, placed on and written), and its owner creates its receive
    /// side when it applies what it was told ([`MuxRef::apply_pending`]; at
    /// once when `owner` is this one).
    pub fn attach_to(&mut self, owner: u32, parser: Box<dyn Parser>, cfg: PsockConfig) -> PsockId {
        let p = self.h.attach(owner, parser, cfg);
        self.apply_told();
        p
    }
    /// What an owner told to attach `p` creates: its receive side.
    fn attached(&mut self, p: PsockId, parser: Box<dyn Parser>, cfg: PsockConfig) {
        if self.h.sk.share(p).is_none() {
            return; // unattached before its owner took it
        }
        // Its clocks start no earlier than the attach, which told the hub
        // its time: an owner that slept since has not been told a later one.
        self.note_time(self.h.now);
        let (limits, rx_limit) = stream_limits(&self.h.config, &cfg);
        let ps = Psock {
            stream: StreamParser::new(parser, limits),
            affinity: cfg.affinity,
            rx_last: None,
            rx_limit,
            ready: None,
            life: Life::Open,
            readers_hold: false,
            timer: None,
            below: 0,
            last_active: self.o.now,
            handshake_deadline: cfg.handshake_timeout.map(|d| self.o.now.add(d)),
            record_deadline: None,
            ahead_since: None,
            record_timeouts: 0,
            hub_room: 0,
        };
        let handshake = ps.handshake_deadline;
        self.o.psocks.insert_at(p.index, p.generation, ps);
        self.recount_only(p);
        self.arm_idle(self.o.now);
        if let Some(t) = handshake {
            self.scan_at(t);
        }
    }
    /// SIOCKCMUNATTACH: ENOENT (`NoPsock`) if not attached. A ready message is
    /// dropped (rx_ready_drops); a partly written message is resent whole on
    /// another psock (psock_unattach_rsvd).
    ///
    /// Any owner (or the application's) may unattach any psock: the hub's
    /// part is done at once (its share, its transmit side, its ready
    /// message, its counters folded into the totals from its last report,
    /// `PsockReleased`); its owner drops the receive side when it applies
    /// [`ToPsock::Released`], at once when that is this owner. Until then
    /// its owner's calls on it find it gone: each receive call applies what
    /// was told first.
    pub fn unattach(&mut self, p: PsockId) -> Result<(), MuxError> {
        // What was told to this owner's psocks before goes first: a message
        // for `p` still waiting would otherwise reach it during its
        // evacuation (below) and leave with it, never written nor uncharged.
        self.apply_told();
        let owner = self.h.sk.owner(p).ok_or(MuxError::NoPsock)?;
        if owner == self.o.id {
            self.released(p);
        } else {
            // Routed by the owner named: the share is gone by then.
            self.h.sk.told.push(ToPsock::Released { p, owner });
        }
        self.h.unattach(p);
        // What it held is free: psocks paused by the budget may read again.
        if self.h.mem_over {
            self.mem_check(self.o.now);
        }
        self.apply_told();
        Ok(())
    }
    /// The receive side of unattached psock `p` dropped ([`ToPsock::Released`]).
    fn released(&mut self, p: PsockId) {
        let Some(mut ps) = self.o.psocks.remove(p.index, p.generation) else { return };
        ps.stream.stop();
        if self.o.deadlines.forget(ps.timer) {
            self.clean_deadlines();
        }
    }
    /// Bytes read from the psock's connection (at most `rx_capacity`).
    ///
    /// Bytes beyond the psock's hard cap (`max_msg_size + psock_rx_buf` held)
    /// are refused with `Invalid` and nothing is taken; bytes fed to a psock
    /// whose receive side stopped are dropped (`Ok`).
    pub fn feed(&mut self, p: PsockId, data: &[u8], now: Timestamp) -> Result<(), MuxError> {
        self.feed_inner(p, data, now, None)
    }

    /// [`Mux::feed`] for a driver that serves socket `direct.sock` itself: a
    /// message steered to that socket while its queue is empty is handed to
    /// the caller in `direct.out` (counted as received by the socket, as
    /// `recv_msg` would) instead of being queued and taken back, up to
    /// `direct.limit` messages in the list. Order is kept: once the queue holds
    /// a message, later ones queue behind it.
    pub fn feed_direct(
        &mut self,
        p: PsockId,
        data: &[u8],
        now: Timestamp,
        direct: &mut Direct<'_>,
    ) -> Result<(), MuxError> {
        self.feed_inner(p, data, now, Some(direct))
    }

    /// [`Mux::feed_direct`] for a driver that can also run its handler on
    /// messages where they lie in `data`: while psock `p`'s messages would be
    /// steered to `direct.sock` (affinity steering, the socket able and its
    /// queue empty, nothing of `p` buffered or held back), complete messages
    /// at the front of `data` are framed in place
    /// ([`StreamParser::frame_in_place`], up to `limit`; 0 turns it off) and
    /// pushed onto `out` as runs, counted as received by the socket as
    /// `recv_msg` would; the rest of `data` is fed as by `feed_direct`. The
    /// caller must hand the messages of `out` to the socket's reader before
    /// anything it takes from its queue or `direct.out` later (they are older).
    pub fn feed_in_place(
        &mut self,
        p: PsockId,
        data: &[u8],
        now: Timestamp,
        direct: &mut Direct<'_>,
        limit: usize,
        out: &mut Vec<crate::run::Run>,
    ) -> Result<(), MuxError> {
        self.note_time(now);
        self.apply_told();
        let first = out.len();
        let sock = direct.sock;
        let (taken, whole) = if limit > 0 { self.frame_in_place(p, data, sock, limit, out)? } else { (0, false) };
        let framed = crate::run::count(&out[first..]) as u64;
        if taken > 0 || framed > 0 {
            let bytes = match whole {
                true => taken as u64,
                false => out[first..].iter().map(|r| (r.len * r.count) as u64).sum::<u64>(),
            };
            if let Some(ps) = self.o.psocks.get_mut(p.index, p.generation) {
                if taken > 0 {
                    // Bytes served in place are traffic too (idle timeout).
                    ps.last_active = now;
                }
                // What it framed, told to its share (its outstanding work,
                // its counters): framed where they lie, its buffer is
                // unchanged, and so is the rest of its report (a part left
                // over is fed below, which reports it all).
                self.h.framed_in_place(p, sock, framed, bytes, taken as u64, ps.last_active, false);
            }
            self.note_room(p);
            if taken == data.len() {
                // All of it framed in place: nothing left for the stream
                // (feeding nothing would only look the psock up again).
                return Ok(());
            }
        }
        self.feed_inner(p, &data[taken..], now, Some(direct))
    }

    /// The in-place part of [`Mux::feed_in_place`]: bytes of `data` taken,
    /// and whether the messages framed are delivered whole.
    fn frame_in_place(
        &mut self,
        p: PsockId,
        data: &[u8],
        sock: SockId,
        limit: usize,
        out: &mut Vec<crate::run::Run>,
    ) -> Result<(usize, bool), MuxError> {
        let (Owned { psocks, .. }, Hub { sk, config, .. }) = (&mut self.o, &self.h);
        let ps = psocks.get_mut(p.index, p.generation).ok_or(MuxError::NoPsock)?;
        if !sk.steers_here(config, sock, ps.affinity) || ps.ready.is_some() || ps.life.rx_over() {
            return Ok((0, false));
        }
        let taken = ps.stream.frame_in_place(data, limit, out);
        Ok((taken, taken > 0 && ps.stream.delivers_whole()))
    }

    fn feed_inner(
        &mut self,
        p: PsockId,
        data: &[u8],
        now: Timestamp,
        direct: Option<&mut Direct<'_>>,
    ) -> Result<(), MuxError> {
        self.note_time(now);
        self.apply_told();
        let ps = self.psock_mut(p)?;
        if ps.stream.is_stopped() || ps.life.rx_over() || data.is_empty() {
            return Ok(());
        }
        if ps.rx_held() + data.len() > ps.rx_limit || ps.stream.is_lent() {
            return Err(MuxError::Invalid);
        }
        ps.stream.feed(data);
        ps.last_active = now;
        if ps.ready.is_none() {
            self.rx_pass(p, now, direct);
        }
        self.recount(p, now);
        Ok(())
    }
    /// Lend psock `p`'s assembly buffer for one read straight into it: a large
    /// message's body (at least [`crate::stream::LEND_MIN`] bytes), or the
    /// next message after a large one, is then read where it will be cut from
    /// instead of into the driver's buffer and copied by `feed`. The loan's
    /// limit is within `rx_capacity` and what the message still needs, so
    /// reads stop at message boundaries and every receive limit holds.
    ///
    /// `None`: read and `feed` as usual (small messages, backpressure, a
    /// stopped receive side). While the loan is out the psock takes no other
    /// bytes (`rx_capacity` is 0, `feed` is refused); its limit counts as held.
    pub fn rx_lend(&mut self, p: PsockId) -> Option<RxLoan> {
        self.rx_room(p).1
    }

    /// [`Mux::rx_capacity`] and [`Mux::rx_lend`] together, the capacity
    /// worked out once (a driver asks both before every read).
    pub fn rx_room(&mut self, p: PsockId) -> (usize, Option<RxLoan>) {
        self.apply_told();
        let cap = self.v().rx_capacity(p);
        if cap == 0 {
            return (0, None);
        }
        let loan = self.o.psocks.get_mut(p.index, p.generation).and_then(|ps| ps.stream.lend(cap));
        if loan.is_some() {
            // The loan's limit counts as held from now.
            self.recount(p, self.o.now);
        }
        (cap, loan.map(|loan| RxLoan { psock: p, loan }))
    }

    /// [`Mux::rx_lend`] for a driver that arms a receive before the bytes
    /// come (io_uring). A loan counts whole from the moment it is made, and
    /// one for a message only predicted (the last was large) stays out for
    /// as long as the peer sends nothing: every quiet peer that once sent a
    /// large message would hold one against the memory budget, whose pauses
    /// then abort them. So a predicted loan is made only while the budget's
    /// low mark (half of `mem_limit`) has room for it; past it, the driver
    /// receives as for small messages until a message begins.
    ///
    /// A loan for a message only predicted that is still out, nothing read,
    /// [`AHEAD_QUIET`] later is recalled ([`Event::PsockRxRecall`], from the
    /// deadline scan: [`Mux::poll_timeout`]) and the prediction forgotten:
    /// a peer that went quiet holds nothing until it sends again.
    pub fn rx_lend_ahead(&mut self, p: PsockId) -> Option<RxLoan> {
        self.apply_told();
        let predicted = self.v().ahead_check(p)?;
        let loan = self.rx_lend(p)?;
        if predicted {
            let at = self.o.now;
            if let Some(ps) = self.o.psocks.get_mut(p.index, p.generation) {
                ps.ahead_since = Some(at);
            }
            self.ahead_scan_at(at);
        }
        Some(loan)
    }

    /// Give back a loan of [`Mux::rx_lend`]: the bytes appended to it are
    /// taken as [`Mux::feed`] takes bytes (complete messages are steered).
    ///
    /// Nothing appended: just the buffer back. The psock's receive stopped
    /// while the buffer was out (assembly timeout, close): the bytes are
    /// dropped (`Ok`). More than the limit appended: `Invalid`, nothing
    /// taken. The psock is gone: `NoPsock`.
    pub fn rx_commit(&mut self, loan: RxLoan, now: Timestamp) -> Result<(), MuxError> {
        self.commit_inner(loan, now, None)
    }

    /// [`Mux::rx_commit`] with the hand-over of [`Mux::feed_direct`].
    pub fn rx_commit_direct(&mut self, loan: RxLoan, now: Timestamp, direct: &mut Direct<'_>) -> Result<(), MuxError> {
        self.commit_inner(loan, now, Some(direct))
    }

    fn commit_inner(&mut self, loan: RxLoan, now: Timestamp, direct: Option<&mut Direct<'_>>) -> Result<(), MuxError> {
        self.note_time(now);
        self.apply_told();
        let p = loan.psock;
        let ps = self.psock_mut(p)?;
        ps.ahead_since = None;
        match ps.stream.unlend(loan.loan) {
            Unlend::Took(0) | Unlend::Stale => {
                self.recount(p, now);
                return Ok(());
            }
            Unlend::Refused => return Err(MuxError::Invalid),
            Unlend::Took(_) => {}
        }
        ps.last_active = now;
        if ps.ready.is_none() {
            self.rx_pass(p, now, direct);
        }
        self.recount(p, now);
        Ok(())
    }

    /// The peer closed its side (FIN: `errno` None) or the connection failed
    /// on read (`Some(errno)`).
    ///
    /// Receive stops: messages already buffered whole are still delivered, the
    /// partial one is dropped, `PsockFailed(p, Closed)` is raised once (KCM
    /// reports EPIPE whatever the cause). After a FIN the psock is
    /// `PeerClosed`: transmit goes on, and once every message it sent has been
    /// delivered and settled and its queue written, `PsockDrained(p)` says it
    /// may be closed in order. After a read error it has failed.
    pub fn rx_closed(&mut self, p: PsockId, errno: Option<i32>) -> Result<(), MuxError> {
        self.apply_told();
        let ps = self.psock_mut(p)?;
        if ps.life.rx_over() {
            return Ok(());
        }
        let life = if errno.is_none() { Life::PeerClosed } else { Life::Failed };
        ps.life = life;
        if ps.ready.is_none() {
            ps.stream.stop();
            self.sync_deadline(p);
        }
        self.h.sk.set_life(p, life);
        self.h.sk.no_answers(p);
        self.h.events.push_back(Event::PsockFailed(p, PsockError::Closed));
        self.tx_take_back(p);
        self.recount(p, self.o.now);
        self.check_drained(p);
        Ok(())
    }

    /// Mark socket `s` as *holding*: every message its reader takes (`recv`,
    /// `recv_msg`, direct and in-place hand-outs) is a request its psock
    /// still owes an answer for, until the reader calls [`Mux::rx_settle`].
    /// A psock whose peer closed is not drained while it has holds, so the
    /// answers to its last requests are still written before it closes.
    pub fn set_holds(&mut self, s: SockId, on: bool) -> Result<(), MuxError> {
        self.sock_mut(s)?.holds = on;
        Ok(())
    }

    /// `n` messages of psock `p` taken from a holding socket have been
    /// answered (their replies queued) or dropped. Unknown psocks are ignored.
    pub fn rx_settle(&mut self, p: PsockId, n: u64) {
        self.h.sk.settle(p, n);
        self.apply_told();
    }

    /// Messages framed alone for socket `s` and kept by its owner
    /// (`FramedAlone::held`), in order, that it gives back unreceived (the
    /// socket closes or was receive-disabled): counted as received no
    /// more, their holds ended, and back at the front of `s`'s queue,
    /// which a close or a disable then moves to the other sockets with the
    /// rest (KCM's requeue); if `s` is disabled already, moved at once.
    pub fn unkeep(&mut self, s: SockId, msgs: Vec<(Bytes, PsockId)>) {
        let mut q = std::collections::VecDeque::with_capacity(msgs.len());
        for (data, p) in msgs {
            if let Some(sh) = self.h.sk.share_mut(p) {
                // Held by `s` → waiting in a queue.
                sh.holds = sh.holds.saturating_sub(1);
                sh.queued += 1;
            }
            q.push_back(RxMsg { data, off: 0, psock: p });
        }
        let Some(sock) = self.h.sk.socks.get_mut(s.index, s.generation) else { return self.h.requeue(q) };
        for m in &q {
            sock.stats.rx_msgs = sock.stats.rx_msgs.saturating_sub(1);
            sock.stats.rx_bytes = sock.stats.rx_bytes.saturating_sub(m.data.len() as u64);
        }
        if sock.rx_disabled {
            self.h.requeue(q);
        } else {
            let was_empty = sock.rx_queue.is_empty();
            sock.rx_mem += q.iter().map(|m| m.data.len()).sum::<usize>();
            while let Some(m) = q.pop_back() {
                sock.rx_queue.push_front(m);
            }
            if was_empty && !sock.rx_queue.is_empty() {
                self.h.events.push_back(Event::SockReadable(s));
            }
        }
    }

    /// `PeerClosed` → `Drained` when nothing of psock `p` is left to deliver,
    /// answer or write.
    #[inline]
    fn check_drained(&mut self, p: PsockId) {
        // Called after every write and settle: only a psock whose peer
        // closed goes on to the full check.
        if self.o.psocks.get(p.index, p.generation).is_some_and(|ps| ps.life == Life::PeerClosed) {
            self.check_drained_closed(p);
        }
    }

    /// [`Mux::check_drained`] for a psock whose peer closed.
    #[inline(never)]
    fn check_drained_closed(&mut self, p: PsockId) {
        let Some(ps) = self.o.psocks.get(p.index, p.generation) else { return };
        if ps.life != Life::PeerClosed || ps.ready.is_some() || !ps.stream.is_stopped() {
            return;
        }
        if !self.h.sk.share(p).is_none_or(|sh| sh.readers_done() && sh.tx.idle_empty()) {
            return;
        }
        self.o.psocks.get_mut(p.index, p.generation).expect("live").life = Life::Drained;
        self.h.sk.set_life(p, Life::Drained);
        self.h.events.push_back(Event::PsockDrained(p));
    }

    /// The driver found the byte stream below the parser unusable (a TLS
    /// record that fails to authenticate, an alert, a failed handshake).
    ///
    /// Receive stops as after `rx_closed` (messages already parsed whole are
    /// still delivered, the partial one is dropped) but the error is raised:
    /// `PsockFailed(p, Rx(err))`, once. Transmit goes on until a write fails.
    pub fn rx_abort(&mut self, p: PsockId, err: RxError) -> Result<(), MuxError> {
        self.apply_told();
        let ps = self.psock_mut(p)?;
        if ps.life.rx_over() {
            return Ok(());
        }
        ps.life = Life::Failed;
        if ps.ready.is_none() {
            ps.stream.stop();
        }
        self.h.sk.set_life(p, Life::Failed);
        self.h.sk.no_answers(p);
        self.h.events.push_back(Event::PsockFailed(p, PsockError::Rx(err)));
        self.tx_take_back(p);
        self.recount(p, self.o.now);
        Ok(())
    }

    /// One receive pass of psock `p` (KCM: one `tcp_read_sock` run): cut every
    /// complete message and steer it; stop when none is left or nobody can take one.
    fn rx_pass(&mut self, p: PsockId, now: Timestamp, mut direct: Option<&mut Direct<'_>>) {
        // Disjoint borrows of the mux's parts: this loop runs once per message.
        let (Owned { psocks, reader, .. }, Hub { sk, events, config, .. }) = (&mut self.o, &mut self.h);
        let Some(ps) = psocks.get_mut(p.index, p.generation) else { return };
        // Round robin: the socket reserved for this pass (affinity: the
        // reading thread's while its queue is short, else the one that
        // took the last pass's messages while it keeps up).
        let mut target = match config.steering {
            Steering::Affinity => sk.reads_on(config, *reader).or_else(|| sk.keeps_up(ps.rx_last)),
            _ => None,
        };
        let mut failed = false;
        loop {
            let data = match ps.stream.next_msg(now) {
                Ok(Some(m)) => m,
                Ok(None) => {
                    if ps.life.rx_over() {
                        ps.stream.stop();
                    }
                    break;
                }
                Err(e) => {
                    // Bad bytes before a FIN fail the psock all the same
                    // (reported again: it is no longer closing in order).
                    if matches!(ps.life, Life::Open | Life::PeerClosed) {
                        ps.life = Life::Failed;
                        sk.set_life(p, Life::Failed);
                        events.push_back(Event::PsockFailed(p, PsockError::Rx(e)));
                    }
                    failed = true;
                    break;
                }
            };
            let key = match config.steering {
                Steering::Key => ps.stream.parser().steering_key(&data),
                _ => None,
            };
            let msg = RxMsg { data, off: 0, psock: p };
            match sk.steer(config, ps.affinity, key, &mut target) {
                Some(s) => match direct.as_deref_mut() {
                    // In place, to the caller's list, when nothing waits in
                    // the socket's queue before it.
                    Some(d) if d.sock == s && d.out.len() < d.limit && sk.hand_direct(s, p, msg.data.len()) => {
                        d.out.push((msg.data, p));
                    }
                    _ => ps.readers_hold |= sk.deliver(config, events, s, msg),
                },
                None => {
                    // Nobody can take it: keep it, pause (TCP pushes back).
                    ps.ready = Some(msg.remaining());
                    sk.wait_offer(msg);
                    break;
                }
            }
        }
        if let Some(t) = target {
            ps.rx_last = Some(t);
            sk.end_pass(t);
        }
        // Whether it can still answer, told to its share
        // (`TxPolicy::LeastOutstanding` reads it there; what it framed is
        // reported by the caller's recount).
        if failed {
            if let Some(sh) = sk.share_mut(p) {
                sh.answers = false;
            }
        }
        // A message left partial starts (or keeps) its deadline; a completed
        // or aborted one clears it.
        self.sync_deadline(p);
        if failed {
            self.tx_take_back(p);
        }
        self.check_drained(p);
    }

    /// Make psock `p`'s armed deadline what its stream says (after any call
    /// that may have started, finished or stopped a message).
    #[inline]
    fn sync_deadline(&mut self, p: PsockId) {
        let Some(ps) = self.o.psocks.get_mut(p.index, p.generation) else { return };
        let want = ps.stream.deadline();
        if self.o.deadlines.sync(p.index, p.generation, &mut ps.timer, want) {
            self.clean_deadlines();
        }
    }

    /// Drop deadline entries that no longer match their psock.
    fn clean_deadlines(&mut self) {
        let psocks = &self.o.psocks;
        self.o.deadlines.clean(|i, g| psocks.get(i, g).and_then(|ps| ps.timer));
    }

    /// A socket became able (created, enabled, drained below SO_RCVBUF): it
    /// takes the hold queue, then paused psocks' messages, then joins the
    /// waiter list (KCM `kcm_rcv_ready`).
    fn rcv_ready(&mut self, s: SockId) {
        self.h.rcv_ready(s);
        self.apply_told();
    }

    /// After a read made room: rejoin the waiters if the socket is able again.
    /// (D) KCM re-offers a full socket only once it is empty (SO_RCVLOWAT = 1);
    /// here it is offered again as soon as it is below SO_RCVBUF.
    #[inline]
    fn after_read(&mut self, s: SockId) {
        if let Some(sock) = self.h.sk.socks.get(s.index, s.generation) {
            if !sock.on_waiters && sock.able() {
                self.rcv_ready(s);
            }
        }
        self.mem_after_read();
    }

    /// recvmsg on a KCM socket (WouldBlock when empty).
    ///
    /// Short reads: DGRAM returns TRUNC|EOR and the rest of the message is
    /// gone; SEQPACKET keeps the rest for the next read (KCM's designed
    /// behaviour, case 19 (D)). A read that finishes a message sets EOR on
    /// both types; PEEK copies, consumes nothing and sets neither flag.
    pub fn recv(&mut self, s: SockId, buf: &mut [u8], flags: RecvFlags) -> Result<RecvInfo, MuxError> {
        let info = self.h.sk.recv(&self.h.config, s, buf, flags)?;
        if !flags.peek {
            self.apply_told();
            self.after_read(s);
        }
        Ok(info)
    }
    /// Take the whole head message (addressed form; zero-copy). WouldBlock when empty.
    pub fn recv_msg(&mut self, s: SockId) -> Result<(Bytes, PsockId), MuxError> {
        let (data, p, rejoin) = self.h.sk.recv_msg(&self.h.config, s)?;
        self.apply_told();
        if rejoin {
            self.rcv_ready(s);
        }
        self.mem_after_read();
        Ok((data, p))
    }
    /// Apply what the sockets' side told psocks ([`ToPsock`]), in order.
    #[inline]
    fn apply_told(&mut self) {
        // Nothing told, nothing waiting: the common case, on every read.
        if self.h.sk.told.is_empty() && self.h.pending_for(self.o.id).is_none_or(|q| q.is_empty()) {
            return;
        }
        self.apply_told_slow();
    }

    #[inline(never)]
    fn apply_told_slow(&mut self) {
        let me = self.o.id;
        loop {
            self.h.route_told(me);
            // All that waits now, in order; what applying it tells comes
            // in the next round (a nested call applies only that).
            let Some(q) = self.h.pending_for(me) else { return };
            if q.is_empty() {
                return;
            }
            let mut batch = std::mem::take(q);
            for t in batch.drain(..) {
                self.apply(t);
            }
            // (Keep the queue's memory: told again on the next call.)
            if let Some(q) = self.h.pending_for(me) {
                if q.is_empty() {
                    *q = batch;
                }
            }
        }
    }

    /// What the hub told psock `p`'s owner, done.
    fn apply(&mut self, t: ToPsock) {
        // Told before another thread unattached it: nothing more of it
        // happens (its messages must not reach a socket after).
        if !matches!(t, ToPsock::Released { .. }) && self.h.sk.owner(t.psock()) != Some(self.o.id) {
            return;
        }
        let p = t.psock();
        self.apply_one(t);
        // (What the hub lets it read alone may have changed: a pause, a
        // resume, its backlog written.)
        self.note_room(p);
    }

    fn apply_one(&mut self, t: ToPsock) {
        match t {
            ToPsock::Resume(p) => {
                let Some(ps) = self.o.psocks.get_mut(p.index, p.generation) else { return };
                ps.readers_hold = false;
                if self.v().rx_capacity(p) > 0 {
                    self.rx_resume(p);
                }
            }
            ToPsock::MayDrain(p) => self.check_drained(p),
            ToPsock::Backlog(p) => {
                if self.o.psocks.get(p.index, p.generation).is_some() {
                    self.rx_resume(p);
                }
            }
            // (`apply` notes what the hub lets it do now: nothing alone.)
            ToPsock::BacklogOver(_) => {}
            // (Its share's life was set by the hub.)
            ToPsock::TxAborted(p) => {
                if let Some(ps) = self.o.psocks.get_mut(p.index, p.generation) {
                    ps.life = Life::Failed;
                }
            }
            ToPsock::MemPaused(p) => {
                if self.o.psocks.get(p.index, p.generation).is_some_and(|ps| ps.stream.is_lent()) {
                    // What the loan counts may never come: have it back, so
                    // that a quiet psock holds nothing at its grace's end.
                    self.h.events.push_back(Event::PsockRxRecall(p));
                }
            }
            ToPsock::MemResumed(p) => {
                if self.v().rx_capacity(p) > 0 {
                    self.rx_resume(p);
                }
            }
            ToPsock::MemAbort { p, held, limit } => self.mem_abort(p, held, limit),
            ToPsock::Attach(p, a) => {
                let sockets::Attaching { parser, cfg } = *a;
                self.attached(p, parser, cfg);
            }
            ToPsock::Released { p, .. } => self.released(p),
            ToPsock::Offered { p, hold } => {
                let Some(ps) = self.o.psocks.get_mut(p.index, p.generation) else { return };
                ps.ready = None;
                ps.readers_hold |= hold;
                // It parses what it had buffered, then reads again.
                self.rx_pass(p, self.o.now, None);
                self.recount_only(p);
                if self.v().rx_capacity(p) > 0 {
                    self.rx_resume(p);
                }
            }
        }
    }

    // ---- transmit path ----

    /// sendmsg: returns bytes accepted. WouldBlock when a new message would start
    /// with the send buffer full.
    ///
    /// DGRAM: a send without MORE ends the message. SEQPACKET: only EOR ends
    /// it (MORE is ignored). A zero-length send with no open message makes no
    /// message; a zero-length EOR send completes an open SEQPACKET message.
    /// BATCH on a completing send holds transmission until a completing send
    /// without it.
    pub fn send(&mut self, s: SockId, data: &[u8], flags: SendFlags) -> Result<usize, MuxError> {
        let r = self.h.send(s, data, flags);
        self.apply_told();
        r
    }

    /// End the batch socket `s` has open (sends with `batch` and none
    /// without it since): what it holds goes out now, as the next send
    /// without `batch` would have taken it (KCM's `kcm_push`). For a caller
    /// whose batch stops early (a send of it failed): the messages already
    /// accepted must not wait for a send that is not coming. Nothing to do
    /// for a socket with no batch open.
    pub fn end_batch(&mut self, s: SockId) -> Result<(), MuxError> {
        let r = self.h.end_batch(s);
        self.apply_told();
        r
    }

    /// Addressed send of one whole message on psock `p`.
    pub fn send_to(&mut self, s: SockId, p: PsockId, data: &[u8], flags: SendFlags) -> Result<usize, MuxError> {
        self.h.sock(s)?;
        self.h.check_addressed(p)?;
        if data.is_empty() {
            return Ok(0);
        }
        let r = self.h.send_addressed(s, p, crate::copied(data), flags.batch, 1, true);
        self.apply_told();
        r.map(|()| data.len())
    }
    /// A whole message, zero-copy, on psock `p` (`None`: the socket's psock).
    pub fn send_msg(&mut self, s: SockId, p: Option<PsockId>, msg: Bytes, batch: bool) -> Result<(), MuxError> {
        self.h.sock(s)?;
        let r = match p {
            Some(p) => {
                self.h.check_addressed(p)?;
                if msg.is_empty() {
                    return Ok(());
                }
                self.h.send_addressed(s, p, msg, batch, 1, true)
            }
            None => self.h.send_msg(s, msg, batch),
        };
        self.apply_told();
        r
    }

    /// `count` whole messages, already back to back in `data`, on psock `p`,
    /// in order and together: what `count` calls of `send_msg(s, Some(p), ..)`
    /// with each message would do, counted the same, for a fraction of the
    /// work (a server answering a batch of requests from one connection).
    /// The caller vouches that `data` is exactly `count` whole messages.
    pub fn send_msgs_to(&mut self, s: SockId, p: PsockId, data: Bytes, count: u32) -> Result<(), MuxError> {
        self.h.sock(s)?;
        self.h.check_addressed(p)?;
        if data.is_empty() || count == 0 {
            return Ok(());
        }
        let r = self.h.send_addressed(s, p, data, false, count, true);
        self.apply_told();
        r
    }

    /// [`Mux::send_msgs_to`] of messages the caller accepted already and
    /// could not write (a socket's waiting replies, bounded by the
    /// runtime's read chunk): queued past the psock's backlog limit and the
    /// socket's send buffer rather than refused; the next send is refused
    /// as any is. Dropped with `Err` if `p` is gone or stopped.
    pub fn send_msgs_to_accepted(&mut self, s: SockId, p: PsockId, data: Bytes, count: u32) -> Result<(), MuxError> {
        self.h.sock(s)?;
        self.h.check_addressed(p)?;
        if data.is_empty() || count == 0 {
            return Ok(());
        }
        self.h.queue_addressed(s, p, data, false, count, true);
        self.apply_told();
        Ok(())
    }

    /// [`Mux::send_msgs_to`] that also hands out psock `p`'s next chunk to
    /// write ([`Mux::tx_begin_into`]) when none is out: for a driver that
    /// writes a served read's replies at once, with no `PsockTransmit` round
    /// trip. Returns whether `slices` holds a chunk (then the caller must
    /// `tx_complete` it); when another writer has a chunk out, the messages
    /// wait on the queue for that writer's next `tx_begin`, as after a
    /// `send_msgs_to`.
    pub fn send_msgs_to_begin(
        &mut self,
        s: SockId,
        p: PsockId,
        data: Bytes,
        count: u32,
        slices: &mut Vec<Bytes>,
    ) -> Result<bool, MuxError> {
        slices.clear();
        self.h.sock(s)?;
        self.h.check_addressed(p)?;
        if data.is_empty() || count == 0 {
            return Ok(false);
        }
        let r = self.h.send_addressed(s, p, data, false, count, false);
        self.apply_told();
        r?;
        if self.h.tx_begin_into(p, slices) {
            return Ok(true);
        }
        self.h.kick(p);
        Ok(false)
    }

    /// Discard a DGRAM socket's open MORE message (a send failed while copying).
    /// A SEQPACKET socket keeps its open message (KCM returns the partial count).
    pub fn send_abort(&mut self, s: SockId) -> Result<(), MuxError> {
        let sock = self.sock_mut(s)?;
        if sock.ty == SockType::Dgram {
            if let Some(open) = sock.open.take() {
                sock.tx_mem -= open.len();
            }
            self.h.sk.check_writable(&mut self.h.events, s);
        }
        Ok(())
    }

    /// Raise `PsockTransmit` for `p` if it has bytes queued and no chunk out
    /// (for a writer that completed a chunk later than it wrote it, and so
    /// did not take the next one in the same step).
    pub fn tx_kick(&mut self, p: PsockId) {
        self.h.kick(p);
    }

    /// Nothing is queued on psock `p`, no chunk of it is out, no writer is
    /// raised for it and its transmit has not stopped: a writer outside the
    /// hub may write it now (`tx_direct`), if the runtime keeps every other
    /// writer off meanwhile. `false` for a psock not attached.
    pub fn tx_idle(&mut self, p: PsockId) -> bool {
        self.h.tx_idle(p)
    }

    /// Socket `s`'s `msgs` addressed messages to psock `p`, `len` bytes,
    /// were written whole by a writer outside the hub, at a moment when `p`
    /// had nothing queued and no chunk out and no other writer could begin
    /// one (the runtime's to guarantee: a served read's replies written by
    /// the psock's owner). Counted as a send queued and written at once:
    /// the socket's and the psock's counters, the psock's last write, and a
    /// psock whose peer closed may drain.
    pub fn tx_direct(&mut self, s: SockId, p: PsockId, len: usize, msgs: u32) {
        self.h.tx_direct(s, p, len, msgs);
        self.apply_told();
    }

    /// [`Mux::tx_direct`] for a write that took only the first `sent` bytes
    /// of `data` (0: none; a failed write is found again by the next
    /// writer): `data` joins `p`'s queue first, as an addressed send of
    /// `msgs` messages `sent` bytes into its write, and `PsockTransmit` is
    /// raised for a writer to write the rest. Dropped (counted) if `p` is
    /// gone or its transmit stopped.
    pub fn tx_direct_rest(&mut self, s: SockId, p: PsockId, data: Bytes, sent: usize, msgs: u32) {
        self.h.tx_direct_rest(s, p, data, sent, msgs);
        self.apply_told();
    }

    /// `TxPolicy::LeastOutstanding`: psock `p` can no longer answer (its
    /// receive side failed or closed), so its messages not yet started go
    /// back to their sockets, in order, to be placed on the others.
    fn tx_take_back(&mut self, p: PsockId) {
        self.h.tx_take_back(p);
        self.apply_told();
    }

    /// The bytes to write next on psock `p`, or None. Marks the psock busy until
    /// `tx_complete`/`tx_failed`: one writer at a time.
    ///
    /// After `tx_complete`, call `tx_begin` again: it returns the rest of a
    /// short write and whatever was queued meanwhile. `PsockTransmit` is raised
    /// only for a psock with no chunk out.
    pub fn tx_begin(&mut self, p: PsockId) -> Option<TxChunk> {
        let mut slices = Vec::new();
        self.tx_begin_into(p, &mut slices).then_some(TxChunk { slices })
    }

    /// [`Mux::tx_begin`] into the caller's vector (cleared first), so a driver
    /// that writes many times reuses one allocation. Returns whether there is
    /// a chunk to write.
    pub fn tx_begin_into(&mut self, p: PsockId, slices: &mut Vec<Bytes>) -> bool {
        self.h.tx_begin_into(p, slices)
    }
    /// `n` bytes of the chunk were written (a short write keeps the rest first).
    pub fn tx_complete(&mut self, p: PsockId, n: usize) {
        self.h.tx_complete(p, n);
        self.apply_told();
    }
    /// The write failed with a hard error: abort the psock's transmit, resend the
    /// message in progress whole on another psock (tx_retries, tx_aborts).
    pub fn tx_failed(&mut self, p: PsockId, errno: i32) {
        self.h.tx_failed(p, errno);
        self.apply_told();
    }
    /// Abort, with ETIMEDOUT, every psock whose message's deadline is at or
    /// before `now`, earliest deadline first. Costs O(log n) per deadline that
    /// expires (plus stale entries dropped on the way), not a walk of every
    /// psock.
    pub fn handle_timeout(&mut self, now: Timestamp) {
        self.note_time(now);
        self.apply_told();
        while let Some((index, generation, armed)) = self.o.deadlines.pop_due(now) {
            let p = pid((index, generation));
            let Some(ps) = self.o.psocks.get_mut(index, generation) else { continue };
            if ps.timer != Some(armed) {
                continue; // stale: cleared, re-armed, or another psock in the slot
            }
            self.o.deadlines.fired(&mut ps.timer);
            let (mem_paused, backlog) = self.h.holds_back(p);
            if ps.rx_running() && ps.held_back(&self.h.config, mem_paused, backlog) {
                // The server is not reading this psock (its replies backed
                // up, its messages not taken, the memory budget): the time
                // is the server's. The deadline runs again, in full, when
                // reading resumes (`rx_resume`).
                ps.stream.hold_deadline();
                self.sync_deadline(p);
                continue;
            }
            if let Err(e) = ps.stream.check_timeout(now) {
                if matches!(ps.life, Life::Open | Life::PeerClosed) {
                    ps.life = Life::Failed;
                    self.h.sk.set_life(p, Life::Failed);
                    self.h.events.push_back(Event::PsockFailed(p, PsockError::Rx(e)));
                }
                self.h.sk.no_answers(p);
                self.tx_take_back(p);
            }
            self.sync_deadline(p);
            self.recount_only(p);
        }
        self.clean_deadlines();
        if self.o.scan_next.is_some_and(|t| t <= now) {
            self.scan_psock_deadlines(now);
        }
        if self.h.mem_next.is_some_and(|t| t <= now) {
            self.mem_check(now);
        }
    }
    /// Psock `p` is read again after the server held it back: its current
    /// message's assembly deadline restarts from now (the peer gets its
    /// whole timeout to send the rest), and the driver is told to read
    /// (`PsockRxResume`).
    fn rx_resume(&mut self, p: PsockId) {
        // Held until the next call that carries the time (this one may
        // carry none, and the mux's last reading may be older than the
        // timeout): `poll_timeout` asks for that call at once.
        if let Some(ps) = self.o.psocks.get_mut(p.index, p.generation) {
            ps.stream.hold_deadline();
            self.o.restarts.push(p);
        }
        self.sync_deadline(p);
        self.h.events.push_back(Event::PsockRxResume(p));
    }

    // ---- events and statistics ----

    pub fn poll_event(&mut self) -> Option<Event> {
        self.h.events.pop_front()
    }
}

/// A psock's stream limits under `config` and its own `cfg`, and its hard
/// cap on receive bytes held (buffer + ready message).
fn stream_limits(config: &MuxConfig, cfg: &PsockConfig) -> (StreamLimits, usize) {
    let max_msg_size = cfg.max_msg_size.unwrap_or(config.max_msg_size).max(1);
    let assembly_timeout = cfg.assembly_timeout.unwrap_or(config.assembly_timeout);
    let read_ahead = config.psock_rx_buf.max(1);
    (StreamLimits { max_msg_size, assembly_timeout, read_ahead }, max_msg_size + read_ahead)
}

/// `b`'s counters added to `a`'s.
fn add_psock_stats(a: &mut PsockStats, b: &PsockStats) {
    a.rx_msgs += b.rx_msgs;
    a.rx_bytes += b.rx_bytes;
    a.tx_msgs += b.tx_msgs;
    a.tx_bytes += b.tx_bytes;
    a.reserved += b.reserved;
    a.unreserved += b.unreserved;
    a.rx_aborts += b.rx_aborts;
    a.rx_interrupted += b.rx_interrupted;
    a.rx_unrecov_intr += b.rx_unrecov_intr;
    a.rx_mem_fail += b.rx_mem_fail;
    a.rx_need_more_hdr += b.rx_need_more_hdr;
    a.rx_bad_hdr_len += b.rx_bad_hdr_len;
    a.rx_msg_too_big += b.rx_msg_too_big;
    a.rx_msg_timeouts += b.rx_msg_timeouts;
    a.tx_aborts += b.tx_aborts;
    a.tx_addressed_drops += b.tx_addressed_drops;
    a.tx_backlog_refusals += b.tx_backlog_refusals;
}
