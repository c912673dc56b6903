//! connmux's C API: `libconnmux.so`, `libconnmux.a` and `include/connmux.h`.
//!
//! Every exported function is a thin shell around the `connmux` crate: it
//! checks its pointers and lengths, runs the call inside [`error::guard`]
//! (errors become `-errno` plus a per-thread message, a panic becomes `-EIO`,
//! nothing unwinds into C), and converts ids, flags and statistics to plain C
//! types. The header is generated from this file by cbindgen (see
//! `tests/header.rs` and `README.md` in this crate); the doc comments here are
//! the header's documentation.
//!
//! `unsafe` here is what an FFI surface cannot avoid: dereferencing the
//! caller's pointers (each in a one-line block with its `// SAFETY:` reason)
//! and borrowing the caller's descriptor for the length of a call.
#![deny(unsafe_op_in_unsafe_fn)]
#![allow(non_camel_case_types)]

mod error;
mod service;
mod tls;

use std::ffi::{c_char, c_int, c_void, CStr};
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use connmux_bpf::{BpfParser, Program};
use connmux_rs::{
    AttachOptions, Backend, Config, Driver, KcmSocket, Mux, MuxStats, Parser, Placement, PsockError, PsockId,
    PsockStats, RecvFlags, RecvInfo, SendFlags, SockStats, SockType, Steering, TxPolicy,
};

use error::{guard, guard_int, Fail};

// ---------------------------------------------------------------------------
// Constants
// ---------------------------------------------------------------------------

/// Socket type: a send without `CONNMUX_MSG_MORE` ends the message; a receive
/// into a short buffer truncates it (`CONNMUX_MSG_TRUNC`). Equal to `SOCK_DGRAM`.
pub const CONNMUX_SOCK_DGRAM: c_int = 2;
/// Socket type: a send with `CONNMUX_MSG_EOR` ends the message; a receive into a
/// short buffer returns the rest in the next receives, the last with
/// `CONNMUX_MSG_EOR`. Equal to `SOCK_SEQPACKET`.
pub const CONNMUX_SOCK_SEQPACKET: c_int = 5;

/// Receive: copy without consuming (no counters, no EOR/TRUNC). Equal to `MSG_PEEK`.
pub const CONNMUX_MSG_PEEK: c_int = 0x2;
/// Receive/send: do not block for this call (`-EAGAIN` instead). Equal to `MSG_DONTWAIT`.
pub const CONNMUX_MSG_DONTWAIT: c_int = 0x40;
/// Send (SEQPACKET): this send ends the message. Receive (out): the message
/// ended with this read. Equal to `MSG_EOR`.
pub const CONNMUX_MSG_EOR: c_int = 0x80;
/// Receive (out, DGRAM): the message was longer than the buffer and its rest
/// was discarded. Equal to `MSG_TRUNC`.
pub const CONNMUX_MSG_TRUNC: c_int = 0x20;
/// Send (DGRAM): the message continues in the next send. Equal to `MSG_MORE`.
pub const CONNMUX_MSG_MORE: c_int = 0x8000;
/// Send: more messages follow; hold transmission until a send without it.
/// Equal to `MSG_BATCH`.
pub const CONNMUX_MSG_BATCH: c_int = 0x40000;
/// Send: accepted and ignored (no signal is ever raised). Equal to `MSG_NOSIGNAL`.
pub const CONNMUX_MSG_NOSIGNAL: c_int = 0x4000;

/// Steering: the first waiting socket takes every message of one read pass (KCM's policy).
pub const CONNMUX_STEER_ROUND_ROBIN: c_int = 0;
/// Steering (default): a connection's messages go to the socket on the worker
/// that read them until its queue exceeds `imbalance` and another socket waits.
pub const CONNMUX_STEER_AFFINITY: c_int = 1;
/// Steering: the parser's steering key picks the socket.
pub const CONNMUX_STEER_KEY: c_int = 2;

/// Transmit policy (default): a plain send takes the least recently used free
/// connection, so sends rotate over the connections (KCM's policy).
pub const CONNMUX_TX_ROUND_ROBIN: c_int = 0;
/// Transmit policy: each plain send goes to the connection with the fewest
/// requests not yet answered (messages sent on it minus messages received
/// from it), passing over connections whose peer closed or failed.
pub const CONNMUX_TX_LEAST_OUTSTANDING: c_int = 1;

/// Backend (default): connmux's own runtime, on any Linux; every call works.
pub const CONNMUX_BACKEND_USERSPACE: c_int = 0;
/// Backend: the kernel's AF_KCM. `connmux_mux_new` fails with -EOPNOTSUPP
/// where AF_KCM cannot be created. There are no worker threads; the calls
/// that name a connection (`connmux_send_to`, `connmux_send_batch` with a
/// `psock`), `connmux_sock_flush`, `connmux_attach_tls` and per-connection
/// size limits or deadlines are refused with -EOPNOTSUPP, and a received
/// message's `psock` is `CONNMUX_PSOCK_NONE` (AF_KCM does not say which
/// connection it came from). Statistics are the network namespace's.
pub const CONNMUX_BACKEND_KERNEL: c_int = 1;
/// Backend: `CONNMUX_BACKEND_KERNEL` where AF_KCM can be created, else
/// `CONNMUX_BACKEND_USERSPACE`; `connmux_mux_backend` says which was chosen.
pub const CONNMUX_BACKEND_AUTO: c_int = 2;

/// I/O driver of the userspace backend's workers (default): each worker
/// decides at its first use: io_uring (where it works here) if it is asked
/// to serve (`connmux_service_start`) before a connection is attached to
/// it, else epoll (where threads receiving on clones read the connections
/// themselves).
pub const CONNMUX_DRIVER_AUTO: c_int = 0;
/// I/O driver: readiness with epoll.
pub const CONNMUX_DRIVER_EPOLL: c_int = 1;
/// I/O driver: io_uring; `connmux_mux_new` fails where io_uring does not work.
pub const CONNMUX_DRIVER_URING: c_int = 2;

/// In `connmux_attach_opts`: use the mux's value.
pub const CONNMUX_ATTACH_MUX_DEFAULT: c_int = -1;

/// A psock failure: the receive side stopped (framing, size, timeout).
pub const CONNMUX_PSOCK_ERR_RX: c_int = 1;
/// A psock failure: transmit failed and stopped.
pub const CONNMUX_PSOCK_ERR_TX: c_int = 2;
/// A psock failure: the peer closed (FIN) or reset the connection.
pub const CONNMUX_PSOCK_ERR_CLOSED: c_int = 3;

/// "No connection": in `connmux_msg.psock` for a send, the mux picks one.
pub const CONNMUX_PSOCK_NONE: connmux_psock_id = 0;

/// An attached connection (psock). Never 0 (`CONNMUX_PSOCK_NONE`); a stale id
/// (after unattach) is refused with `-ENOENT`, never confused with a new one.
pub type connmux_psock_id = u64;

const MUX_MAGIC: u64 = 0x636f_6e6e_6d75_7831; // "connmux1"
const SOCK_MAGIC: u64 = 0x636f_6e6e_736f_636b; // "connsock"
const PARSER_MAGIC: u64 = 0x636f_6e6e_7061_7273; // "connpars"

fn psock_to_c(p: PsockId) -> connmux_psock_id {
    ((u64::from(p.generation) << 32) | u64::from(p.index)).wrapping_add(1)
}

fn psock_from_c(v: connmux_psock_id) -> Option<PsockId> {
    let x = v.checked_sub(1)?;
    Some(PsockId { index: x as u32, generation: (x >> 32) as u32 })
}

fn psock_required(v: connmux_psock_id) -> Result<PsockId, Fail> {
    psock_from_c(v).ok_or_else(|| Fail::new(libc::ENOENT, "CONNMUX_PSOCK_NONE names no connection"))
}

// ---------------------------------------------------------------------------
// Handles and plain structs
// ---------------------------------------------------------------------------

/// A multiplexor. Thread-safe: any thread may use it at any time, also while
/// other threads use its sockets. Created by `connmux_mux_new`, released by
/// `connmux_mux_free`.
pub struct connmux_mux {
    magic: u64,
    mux: Mux,
}

/// A KCM socket. One thread at a time may use a socket handle (give each
/// thread its own with `connmux_sock_clone`); `connmux_sock_fd` may be called
/// from any thread. Created by `connmux_socket`/`connmux_sock_clone`, closed
/// by `connmux_sock_close`.
pub struct connmux_sock {
    magic: u64,
    sock: KcmSocket,
    nonblocking: AtomicBool,
}

/// A parser template: each attach makes a fresh parser from it, so one
/// template serves any number of connections. Thread-safe, immutable.
/// Created by `connmux_parser_from_*`, released by `connmux_parser_free`.
pub struct connmux_parser {
    magic: u64,
    kind: ParserKind,
}

#[derive(Clone)]
enum ParserKind {
    Spec(String),
    Bpf { program: Arc<Program>, name: String },
}

impl ParserKind {
    fn build(&self) -> Result<Box<dyn Parser>, Fail> {
        match self {
            ParserKind::Spec(s) => connmux_rs::parsers::from_spec(s).map_err(|e| Fail::inval(e.to_string())),
            ParserKind::Bpf { program, name } => Ok(Box::new(BpfParser::new(program.clone(), name))),
        }
    }
}

/// Mux configuration. Fill it with `connmux_config_init`, then change fields.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct connmux_config {
    /// I/O worker threads (each owns the connections attached to it). Default:
    /// one per CPU this process may run on; at least 1.
    pub workers: u32,
    /// 1: pin worker i to the i-th CPU this process may use (default); 0: no pinning.
    pub pin_workers: c_int,
    /// Bytes read from a connection per read call. Default 65536.
    pub read_chunk: usize,
    /// Capacity of the psock failure queue (`connmux_next_event`); failures
    /// beyond it are counted (`events_dropped`) and dropped. Default 4096.
    pub event_queue: usize,
    /// Largest message a connection accepts; a longer one fails the connection
    /// with EMSGSIZE. Default 1 MiB.
    pub max_msg_size: usize,
    /// Assembly deadline in milliseconds from a message's first byte (ETIMEDOUT);
    /// 0: wait forever. Default 10000.
    pub assembly_timeout_ms: u64,
    /// Receive-queue bound per socket in bytes (SO_RCVBUF). Default 4 MiB.
    pub sock_rcvbuf: usize,
    /// Send-queue bound per socket in bytes (SO_SNDBUF). Default 4 MiB.
    pub sock_sndbuf: usize,
    /// Bytes a connection buffers beyond the message being assembled. Default 256 KiB.
    pub psock_rx_buf: usize,
    /// `CONNMUX_STEER_*`. Default `CONNMUX_STEER_AFFINITY`.
    pub steering: c_int,
    /// For `CONNMUX_STEER_AFFINITY`: queue length beyond which messages go elsewhere. Default 64.
    pub imbalance: usize,
    /// `CONNMUX_TX_*`: which connection carries a plain send. Default
    /// `CONNMUX_TX_ROUND_ROBIN`.
    pub tx_policy: c_int,
    /// Bytes the mux holds for all connections together (assembly buffers,
    /// queued messages); past it the largest holders stop being read, and
    /// those still holding as much after `mem_grace_ms` fail with ENOBUFS.
    /// Default 256 MiB; 0: no limit beyond the per-connection ones.
    pub mem_limit: usize,
    /// How long a connection paused by `mem_limit` may stay so before it
    /// fails. Default 1000.
    pub mem_grace_ms: u64,
    /// A connection that sends nothing for this many milliseconds fails with
    /// ETIMEDOUT (`CONNMUX_PSOCK_ERR_RX`). 0: never (default, as AF_KCM).
    pub idle_timeout_ms: u64,
    /// `CONNMUX_BACKEND_*`: connmux's runtime or the kernel's AF_KCM.
    /// Default `CONNMUX_BACKEND_USERSPACE`, where every call works on every
    /// kernel. On the kernel backend only `max_msg_size` and
    /// `assembly_timeout_ms` of this structure apply.
    pub backend: c_int,
    /// `CONNMUX_DRIVER_*`: the userspace backend's I/O driver. Default
    /// `CONNMUX_DRIVER_AUTO`.
    pub driver: c_int,
    /// Stand-alone sockets the mux can make (`connmux_sock_stand_alone`):
    /// sockets whose own thread reads the connections attached to them.
    /// Default 0.
    pub stand_alone: u32,
}

/// Options of one attach (`connmux_attach_with`). Fill it with
/// `connmux_attach_opts_init`, then set `parser` and what differs from the
/// mux. AF_KCM has these limits per attached TCP socket (its SO_RCVBUF and
/// SO_RCVTIMEO); the mux's `connmux_config` values are the defaults.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct connmux_attach_opts {
    /// The parser template (required); the connection gets a fresh parser from it.
    pub parser: *const connmux_parser,
    /// Largest message this connection may send; a longer one fails it with
    /// EMSGSIZE. 0: the mux's `max_msg_size` (default).
    pub max_msg_size: usize,
    /// Assembly deadline of this connection's messages in milliseconds
    /// (ETIMEDOUT); 0: wait forever; `CONNMUX_ATTACH_MUX_DEFAULT`: the mux's
    /// `assembly_timeout_ms` (default).
    pub assembly_timeout_ms: i64,
    /// The worker that reads the connection (taken modulo the number of
    /// workers); `CONNMUX_ATTACH_MUX_DEFAULT`: chosen as by `connmux_attach` (default).
    pub worker: c_int,
}

/// One message for the batch and `*msg` calls.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct connmux_msg {
    /// Receive: where to copy the message. Send: the message (not written).
    pub buf: *mut c_void,
    /// Receive: the buffer's capacity. Send: the message's length.
    pub len: usize,
    /// Out: bytes copied (receive) or taken (send).
    pub n: usize,
    /// Out (receive): `CONNMUX_MSG_EOR` and/or `CONNMUX_MSG_TRUNC`.
    pub flags: c_int,
    /// Receive (out): the connection the message came from. Send (in): the
    /// connection to send on, or `CONNMUX_PSOCK_NONE` to let the mux choose.
    pub psock: connmux_psock_id,
}

/// A psock failure, as KCM reports it on the attached TCP socket (POLLERR + SO_ERROR).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct connmux_event {
    /// The failed connection: unattach (or abort) it.
    pub psock: connmux_psock_id,
    /// `CONNMUX_PSOCK_ERR_*`.
    pub kind: c_int,
    /// The errno (positive): EMSGSIZE, EPROTO, ETIMEDOUT, the parser's, the
    /// transmit error, or EPIPE for a closed connection.
    pub err: c_int,
}

/// Mux-wide counters (`/proc/net/kcm_stats`, MUX table).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct connmux_mux_stats {
    pub rx_msgs: u64,
    pub rx_bytes: u64,
    pub tx_msgs: u64,
    pub tx_bytes: u64,
    pub tx_retries: u64,
    pub psock_attach: u64,
    pub psock_unattach: u64,
    pub psock_unattach_rsvd: u64,
    pub rx_ready_drops: u64,
    /// Live sockets.
    pub kcms: u64,
    /// Live psocks.
    pub psocks: u64,
    /// Psock failures dropped because the event queue was full.
    pub events_dropped: u64,
    /// Sums over every psock, live and unattached.
    pub psock: connmux_psock_stats,
}

/// Per-connection counters (`/proc/net/kcm_stats`, Psock table).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct connmux_psock_stats {
    pub rx_msgs: u64,
    pub rx_bytes: u64,
    pub tx_msgs: u64,
    pub tx_bytes: u64,
    pub reserved: u64,
    pub unreserved: u64,
    pub rx_aborts: u64,
    pub rx_interrupted: u64,
    pub rx_unrecov_intr: u64,
    pub rx_mem_fail: u64,
    pub rx_need_more_hdr: u64,
    pub rx_bad_hdr_len: u64,
    pub rx_msg_too_big: u64,
    pub rx_msg_timeouts: u64,
    pub tx_aborts: u64,
    pub tx_addressed_drops: u64,
}

/// Per-socket counters (`/proc/net/kcm`, kcm-N lines).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct connmux_sock_stats {
    pub rx_msgs: u64,
    pub rx_bytes: u64,
    pub tx_msgs: u64,
    pub tx_bytes: u64,
    /// Messages waiting to be received.
    pub rx_queued: u64,
    pub rx_mem: u64,
    pub tx_queued: u64,
    pub tx_mem: u64,
}

impl From<&PsockStats> for connmux_psock_stats {
    fn from(s: &PsockStats) -> Self {
        connmux_psock_stats {
            rx_msgs: s.rx_msgs,
            rx_bytes: s.rx_bytes,
            tx_msgs: s.tx_msgs,
            tx_bytes: s.tx_bytes,
            reserved: s.reserved,
            unreserved: s.unreserved,
            rx_aborts: s.rx_aborts,
            rx_interrupted: s.rx_interrupted,
            rx_unrecov_intr: s.rx_unrecov_intr,
            rx_mem_fail: s.rx_mem_fail,
            rx_need_more_hdr: s.rx_need_more_hdr,
            rx_bad_hdr_len: s.rx_bad_hdr_len,
            rx_msg_too_big: s.rx_msg_too_big,
            rx_msg_timeouts: s.rx_msg_timeouts,
            tx_aborts: s.tx_aborts,
            tx_addressed_drops: s.tx_addressed_drops,
        }
    }
}

fn mux_stats_to_c(s: &MuxStats, events_dropped: u64) -> connmux_mux_stats {
    connmux_mux_stats {
        rx_msgs: s.rx_msgs,
        rx_bytes: s.rx_bytes,
        tx_msgs: s.tx_msgs,
        tx_bytes: s.tx_bytes,
        tx_retries: s.tx_retries,
        psock_attach: s.psock_attach,
        psock_unattach: s.psock_unattach,
        psock_unattach_rsvd: s.psock_unattach_rsvd,
        rx_ready_drops: s.rx_ready_drops,
        kcms: s.kcms as u64,
        psocks: s.psocks as u64,
        events_dropped,
        psock: (&s.psock).into(),
    }
}

fn sock_stats_to_c(s: &SockStats) -> connmux_sock_stats {
    connmux_sock_stats {
        rx_msgs: s.rx_msgs,
        rx_bytes: s.rx_bytes,
        tx_msgs: s.tx_msgs,
        tx_bytes: s.tx_bytes,
        rx_queued: s.rx_queued as u64,
        rx_mem: s.rx_mem as u64,
        tx_queued: s.tx_queued as u64,
        tx_mem: s.tx_mem as u64,
    }
}

// ---------------------------------------------------------------------------
// Pointer checks (the only places that turn C pointers into references)
// ---------------------------------------------------------------------------

/// A handle C holds: made by `Box::into_raw`, told apart by its magic.
trait Handle {
    /// Its magic, cleared as it is released (a use after that is refused
    /// as long as the memory still reads the same).
    fn magic(&mut self) -> &mut u64;
}

impl Handle for connmux_mux {
    fn magic(&mut self) -> &mut u64 {
        &mut self.magic
    }
}

impl Handle for connmux_sock {
    fn magic(&mut self) -> &mut u64 {
        &mut self.magic
    }
}

impl Handle for connmux_parser {
    fn magic(&mut self) -> &mut u64 {
        &mut self.magic
    }
}

/// Release handle `p` (NULL is ignored): `check`, its kind's `*_ref`,
/// refuses a pointer that is not a live handle of that kind; then its box is
/// dropped, its magic cleared.
///
/// # Safety
/// `p` is NULL or a live handle of its kind, not used again after this call.
unsafe fn release<'a, T: Handle + 'a>(p: *mut T, check: unsafe fn(*const T) -> Result<&'a T, Fail>) {
    guard(|| {
        if p.is_null() {
            return Ok(0);
        }
        // SAFETY: forwarded contract; checks the magic before taking ownership.
        unsafe { check(p) }?;
        // SAFETY: a live handle from Box::into_raw, never used again (contract).
        let mut b = unsafe { Box::from_raw(p) };
        *b.magic() = 0;
        drop(b);
        Ok(0)
    });
}

/// # Safety
/// `p` is null or a pointer from `connmux_mux_new` not yet freed.
unsafe fn mux_ref<'a>(p: *const connmux_mux) -> Result<&'a connmux_mux, Fail> {
    // SAFETY: by the header's contract `p` is null or a live handle.
    let m = unsafe { p.as_ref() }.ok_or_else(|| Fail::null("mux"))?;
    if m.magic != MUX_MAGIC {
        return Err(Fail::new(libc::EBADF, "not a live connmux_mux handle"));
    }
    Ok(m)
}

/// # Safety
/// `p` is null or a pointer from `connmux_socket`/`connmux_sock_clone` not yet closed.
unsafe fn sock_ref<'a>(p: *const connmux_sock) -> Result<&'a connmux_sock, Fail> {
    // SAFETY: by the header's contract `p` is null or a live handle.
    let s = unsafe { p.as_ref() }.ok_or_else(|| Fail::null("sock"))?;
    if s.magic != SOCK_MAGIC {
        return Err(Fail::new(libc::EBADF, "not a live connmux_sock handle"));
    }
    Ok(s)
}

/// # Safety
/// `p` is null or a pointer from `connmux_parser_from_*` not yet freed.
unsafe fn parser_ref<'a>(p: *const connmux_parser) -> Result<&'a connmux_parser, Fail> {
    // SAFETY: by the header's contract `p` is null or a live handle.
    let s = unsafe { p.as_ref() }.ok_or_else(|| Fail::null("parser"))?;
    if s.magic != PARSER_MAGIC {
        return Err(Fail::new(libc::EBADF, "not a live connmux_parser handle"));
    }
    Ok(s)
}

/// # Safety
/// `p` is null or valid for writing one `T`.
unsafe fn out<'a, T>(p: *mut T, what: &str) -> Result<&'a mut T, Fail> {
    // SAFETY: by the header's contract `p` is null or points to writable memory for a T.
    unsafe { p.as_mut() }.ok_or_else(|| Fail::null(what))
}

/// Write an attached connection's id where the caller asked for it
/// (`psock` NULL: not asked).
///
/// # Safety
/// `psock` is NULL or valid for writing one id.
unsafe fn put_psock(psock: *mut connmux_psock_id, id: PsockId) {
    // SAFETY: by the caller's contract `psock` is NULL or writable.
    if let Some(slot) = unsafe { psock.as_mut() } {
        *slot = psock_to_c(id);
    }
}

/// # Safety
/// `p` is null or valid for reading one `T`.
unsafe fn inp<'a, T>(p: *const T, what: &str) -> Result<&'a T, Fail> {
    // SAFETY: by the header's contract `p` is null or points to a readable T.
    unsafe { p.as_ref() }.ok_or_else(|| Fail::null(what))
}

fn check_len(len: usize) -> Result<(), Fail> {
    if len > isize::MAX as usize {
        return Err(Fail::inval("length larger than SSIZE_MAX"));
    }
    Ok(())
}

/// # Safety
/// `p` is valid for reading `len` bytes, or `len` is 0.
unsafe fn bytes<'a>(p: *const c_void, len: usize, what: &str) -> Result<&'a [u8], Fail> {
    check_len(len)?;
    if len == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(Fail::null(what));
    }
    // SAFETY: non-null, at most isize::MAX, and readable for `len` bytes by contract.
    Ok(unsafe { std::slice::from_raw_parts(p.cast::<u8>(), len) })
}

/// # Safety
/// `p` is valid for writing `len` bytes, or `len` is 0.
unsafe fn bytes_mut<'a>(p: *mut c_void, len: usize, what: &str) -> Result<&'a mut [u8], Fail> {
    check_len(len)?;
    if len == 0 {
        return Ok(&mut []);
    }
    if p.is_null() {
        return Err(Fail::null(what));
    }
    // SAFETY: non-null, at most isize::MAX, and writable for `len` bytes by contract.
    Ok(unsafe { std::slice::from_raw_parts_mut(p.cast::<u8>(), len) })
}

/// # Safety
/// `p` is valid for `n` elements, or `n` is 0.
unsafe fn msgs_mut<'a>(p: *mut connmux_msg, n: usize) -> Result<&'a mut [connmux_msg], Fail> {
    if n == 0 {
        return Ok(&mut []);
    }
    if p.is_null() {
        return Err(Fail::null("msgs"));
    }
    if n > (isize::MAX as usize) / std::mem::size_of::<connmux_msg>() {
        return Err(Fail::inval("too many messages"));
    }
    // SAFETY: non-null, size checked, valid for `n` messages by contract.
    Ok(unsafe { std::slice::from_raw_parts_mut(p, n) })
}

/// # Safety
/// `p` is null or a NUL-terminated string.
unsafe fn c_str<'a>(p: *const c_char, what: &str) -> Result<&'a str, Fail> {
    if p.is_null() {
        return Err(Fail::null(what));
    }
    // SAFETY: non-null and NUL-terminated by contract.
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str().map_err(|_| Fail::inval(format!("{what} is not UTF-8")))
}

/// # Safety
/// `fd` is open for the duration of the call (or not open at all: the
/// connection checks then fail with an errno).
unsafe fn borrow_fd<'a>(fd: c_int) -> Result<BorrowedFd<'a>, Fail> {
    if fd < 0 {
        return Err(Fail::new(libc::ENOENT, format!("bad descriptor {fd}")));
    }
    // SAFETY: fd is not -1; the caller keeps it open for this call (header contract).
    Ok(unsafe { BorrowedFd::borrow_raw(fd) })
}

fn ok(n: usize) -> Result<isize, Fail> {
    Ok(isize::try_from(n).unwrap_or(isize::MAX))
}

// ---------------------------------------------------------------------------
// Library, errors, configuration
// ---------------------------------------------------------------------------

/// The library's version, e.g. "0.1.0". Static; never free it.
#[no_mangle]
pub extern "C" fn connmux_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}

/// The message of the last call that failed on this thread, or NULL if none
/// has. Valid until the next failing call on this thread; do not free it.
#[no_mangle]
pub extern "C" fn connmux_last_error() -> *const c_char {
    error::last_ptr()
}

/// Fill `*cfg` with the defaults. Returns 0, or -EFAULT if `cfg` is NULL.
///
/// # Safety
/// `cfg` is NULL or points to writable memory for one `connmux_config`.
#[no_mangle]
pub unsafe extern "C" fn connmux_config_init(cfg: *mut connmux_config) -> c_int {
    guard_int(|| {
        // SAFETY: forwarded contract of this function.
        let cfg = unsafe { out(cfg, "cfg") }?;
        let d = Config::default();
        *cfg = connmux_config {
            workers: d.workers as u32,
            pin_workers: 1,
            read_chunk: d.read_chunk,
            event_queue: d.event_queue,
            max_msg_size: d.core.max_msg_size,
            assembly_timeout_ms: d.core.assembly_timeout.map_or(0, |t| t.as_millis() as u64),
            sock_rcvbuf: d.core.sock_rcvbuf,
            sock_sndbuf: d.core.sock_sndbuf,
            psock_rx_buf: d.core.psock_rx_buf,
            steering: CONNMUX_STEER_AFFINITY,
            imbalance: d.core.imbalance,
            tx_policy: CONNMUX_TX_ROUND_ROBIN,
            mem_limit: d.core.mem_limit,
            mem_grace_ms: d.core.mem_grace.as_millis() as u64,
            idle_timeout_ms: d.core.idle_timeout.map_or(0, |t| t.as_millis() as u64),
            backend: backend_to_c(d.backend),
            driver: driver_to_c(d.driver),
            stand_alone: d.stand_alone as u32,
        };
        Ok(0)
    })
}

fn config_from_c(c: &connmux_config) -> Result<Config, Fail> {
    let mut cfg = Config::default();
    if c.workers == 0 {
        return Err(Fail::inval("workers must be at least 1"));
    }
    if c.max_msg_size == 0 || c.read_chunk == 0 || c.event_queue == 0 {
        return Err(Fail::inval("max_msg_size, read_chunk and event_queue must be positive"));
    }
    cfg.workers = c.workers as usize;
    cfg.stand_alone = c.stand_alone as usize;
    cfg.placement = match c.pin_workers {
        0 => Placement::Unpinned,
        1 => Placement::Pinned,
        v => return Err(Fail::inval(format!("pin_workers must be 0 or 1, not {v}"))),
    };
    cfg.read_chunk = c.read_chunk;
    cfg.event_queue = c.event_queue;
    cfg.core.max_msg_size = c.max_msg_size;
    cfg.core.assembly_timeout = (c.assembly_timeout_ms > 0).then(|| Duration::from_millis(c.assembly_timeout_ms));
    cfg.core.sock_rcvbuf = c.sock_rcvbuf;
    cfg.core.sock_sndbuf = c.sock_sndbuf;
    cfg.core.psock_rx_buf = c.psock_rx_buf;
    cfg.core.steering = match c.steering {
        CONNMUX_STEER_ROUND_ROBIN => Steering::RoundRobin,
        CONNMUX_STEER_AFFINITY => Steering::Affinity,
        CONNMUX_STEER_KEY => Steering::Key,
        v => return Err(Fail::inval(format!("unknown steering policy {v}"))),
    };
    cfg.core.imbalance = c.imbalance;
    cfg.core.mem_limit = if c.mem_limit == 0 { usize::MAX } else { c.mem_limit };
    cfg.core.mem_grace = Duration::from_millis(c.mem_grace_ms);
    cfg.core.idle_timeout = (c.idle_timeout_ms > 0).then(|| Duration::from_millis(c.idle_timeout_ms));
    cfg.core.tx_policy = match c.tx_policy {
        CONNMUX_TX_ROUND_ROBIN => TxPolicy::RoundRobin,
        CONNMUX_TX_LEAST_OUTSTANDING => TxPolicy::LeastOutstanding,
        v => return Err(Fail::inval(format!("unknown transmit policy {v}"))),
    };
    cfg.backend = match c.backend {
        CONNMUX_BACKEND_USERSPACE => Backend::Userspace,
        CONNMUX_BACKEND_KERNEL => Backend::Kernel,
        CONNMUX_BACKEND_AUTO => Backend::Auto,
        v => return Err(Fail::inval(format!("unknown backend {v} (CONNMUX_BACKEND_USERSPACE, _KERNEL, _AUTO)"))),
    };
    cfg.driver = match c.driver {
        CONNMUX_DRIVER_AUTO => Driver::Auto,
        CONNMUX_DRIVER_EPOLL => Driver::Epoll,
        CONNMUX_DRIVER_URING => Driver::Uring,
        v => return Err(Fail::inval(format!("unknown driver {v} (CONNMUX_DRIVER_AUTO, _EPOLL, _URING)"))),
    };
    Ok(cfg)
}

fn backend_to_c(b: Backend) -> c_int {
    match b {
        Backend::Userspace => CONNMUX_BACKEND_USERSPACE,
        Backend::Kernel => CONNMUX_BACKEND_KERNEL,
        Backend::Auto => CONNMUX_BACKEND_AUTO,
    }
}

fn driver_to_c(d: Driver) -> c_int {
    match d {
        Driver::Auto => CONNMUX_DRIVER_AUTO,
        Driver::Epoll => CONNMUX_DRIVER_EPOLL,
        Driver::Uring => CONNMUX_DRIVER_URING,
    }
}

// ---------------------------------------------------------------------------
// Mux
// ---------------------------------------------------------------------------

/// Start a mux and its worker threads. `cfg` may be NULL for the defaults.
/// On success stores a new handle in `*out` and returns 0; the caller frees it
/// with `connmux_mux_free`. Errors: -EINVAL (bad configuration), -EFAULT
/// (`out` NULL), or the errno of a failed thread/epoll/eventfd creation.
///
/// # Safety
/// `cfg` is NULL or a readable `connmux_config`; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn connmux_mux_new(cfg: *const connmux_config, out_mux: *mut *mut connmux_mux) -> c_int {
    guard_int(|| {
        // SAFETY: forwarded contract of this function.
        let slot = unsafe { out(out_mux, "out") }?;
        *slot = std::ptr::null_mut();
        let config = if cfg.is_null() {
            Config::default()
        } else {
            // SAFETY: non-null and readable by contract.
            config_from_c(unsafe { inp(cfg, "cfg") }?)?
        };
        let mux = Mux::new(config)?;
        *slot = Box::into_raw(Box::new(connmux_mux { magic: MUX_MAGIC, mux }));
        Ok(0)
    })
}

/// Release a mux handle (NULL is ignored). The workers stop when the handle
/// and every socket of the mux are gone; sockets stay usable after this.
/// Must not race with other calls on the same handle.
///
/// # Safety
/// `mux` is NULL or a live handle, not used again after this call.
#[no_mangle]
pub unsafe extern "C" fn connmux_mux_free(mux: *mut connmux_mux) {
    // SAFETY: forwarded contract of this function.
    unsafe { release(mux, mux_ref) }
}

/// Number of I/O worker threads (0 on the kernel backend), or a negative errno.
///
/// # Safety
/// `mux` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn connmux_mux_workers(mux: *const connmux_mux) -> c_int {
    guard_int(|| {
        // SAFETY: forwarded contract of this function.
        let m = unsafe { mux_ref(mux) }?;
        ok(m.mux.workers())
    })
}

/// The backend this mux runs on: `CONNMUX_BACKEND_USERSPACE` or
/// `CONNMUX_BACKEND_KERNEL` (what `CONNMUX_BACKEND_AUTO` chose), or a
/// negative errno.
///
/// # Safety
/// `mux` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn connmux_mux_backend(mux: *const connmux_mux) -> c_int {
    guard_int(|| {
        // SAFETY: forwarded contract of this function.
        let m = unsafe { mux_ref(mux) }?;
        Ok(backend_to_c(m.mux.backend()) as isize)
    })
}

/// The I/O driver this mux's first worker runs: `CONNMUX_DRIVER_EPOLL` or
/// `CONNMUX_DRIVER_URING` (what `CONNMUX_DRIVER_AUTO` chose; still
/// `CONNMUX_DRIVER_AUTO` before the worker's first use);
/// `CONNMUX_DRIVER_AUTO` on the kernel backend, which has no workers; or a
/// negative errno.
///
/// # Safety
/// `mux` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn connmux_mux_driver(mux: *const connmux_mux) -> c_int {
    guard_int(|| {
        // SAFETY: forwarded contract of this function.
        let m = unsafe { mux_ref(mux) }?;
        Ok(driver_to_c(m.mux.driver()) as isize)
    })
}

// ---------------------------------------------------------------------------
// Parsers
// ---------------------------------------------------------------------------

fn new_parser(kind: ParserKind, out_p: &mut *mut connmux_parser) {
    *out_p = Box::into_raw(Box::new(connmux_parser { magic: PARSER_MAGIC, kind }));
}

/// A built-in parser from a spec string: `l4`, `len:offset=N,width=1..8,
/// endian=be|le,adjust=±N,includes_header=true|false`, `oncrpc[:strip]`,
/// `9p`, `thrift`, `http2`, `kafka`, `memcached`. Returns 0 and a template in
/// `*out` (free it with `connmux_parser_free`), or -EINVAL with the valid
/// forms in `connmux_last_error()`.
///
/// # Safety
/// `spec` is a NUL-terminated string; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn connmux_parser_from_spec(spec: *const c_char, out_parser: *mut *mut connmux_parser) -> c_int {
    guard_int(|| {
        // SAFETY: forwarded contract of this function.
        let slot = unsafe { out(out_parser, "out") }?;
        *slot = std::ptr::null_mut();
        // SAFETY: forwarded contract of this function.
        let spec = unsafe { c_str(spec, "spec") }?;
        connmux_rs::parsers::from_spec(spec).map_err(|e| Fail::inval(e.to_string()))?;
        new_parser(ParserKind::Spec(spec.to_owned()), slot);
        Ok(0)
    })
}

fn bpf_fail(e: connmux_bpf::LoadError) -> Fail {
    let errno = match &e {
        connmux_bpf::LoadError::Io { source, .. } => error::errno_of(source),
        _ => libc::EINVAL,
    };
    Fail::new(errno, e.to_string())
}

/// A BPF parser (KCM's `BPF_PROG_TYPE_SOCKET_FILTER` program) from an ELF
/// object file made by `clang -target bpf -O2 -c`. `section` names the
/// program's section or function, or is NULL when the object has one program.
/// The program is checked at load and run in connmux's interpreter. Returns 0
/// and a template in `*out`; -ENOENT/-EACCES/... if the file cannot be read;
/// -EINVAL if it is not a usable program (the reason in `connmux_last_error()`).
///
/// # Safety
/// `path` is a NUL-terminated string; `section` is NULL or one; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn connmux_parser_from_bpf_file(
    path: *const c_char,
    section: *const c_char,
    out_parser: *mut *mut connmux_parser,
) -> c_int {
    guard_int(|| {
        // SAFETY: forwarded contract of this function.
        let slot = unsafe { out(out_parser, "out") }?;
        *slot = std::ptr::null_mut();
        // SAFETY: forwarded contract of this function.
        let path = unsafe { c_str(path, "path") }?;
        let section = if section.is_null() {
            None
        } else {
            // SAFETY: not NULL here, and the caller promises a NUL-terminated string.
            Some(unsafe { c_str(section, "section") }?)
        };
        let p = BpfParser::from_elf_file(path, section).map_err(bpf_fail)?;
        let name = p.name().trim_start_matches("bpf:").to_owned();
        new_parser(ParserKind::Bpf { program: p.program().clone(), name }, slot);
        Ok(0)
    })
}

/// [`connmux_parser_from_bpf_file`] on an ELF object in memory (`len` bytes at
/// `data`, copied as needed; the caller keeps ownership of `data`).
///
/// # Safety
/// `data` is readable for `len` bytes; `section` is NULL or a NUL-terminated
/// string; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn connmux_parser_from_bpf_mem(
    data: *const c_void,
    len: usize,
    section: *const c_char,
    out_parser: *mut *mut connmux_parser,
) -> c_int {
    guard_int(|| {
        // SAFETY: forwarded contract of this function.
        let slot = unsafe { out(out_parser, "out") }?;
        *slot = std::ptr::null_mut();
        // SAFETY: forwarded contract of this function.
        let data = unsafe { bytes(data, len, "data") }?;
        let section = if section.is_null() {
            None
        } else {
            // SAFETY: not NULL here, and the caller promises a NUL-terminated string.
            Some(unsafe { c_str(section, "section") }?)
        };
        let p = BpfParser::from_elf_bytes(data, section).map_err(bpf_fail)?;
        let name = p.name().trim_start_matches("bpf:").to_owned();
        new_parser(ParserKind::Bpf { program: p.program().clone(), name }, slot);
        Ok(0)
    })
}

/// Release a parser template (NULL is ignored). Connections attached with it
/// keep their own parsers.
///
/// # Safety
/// `parser` is NULL or a live template, not used again after this call.
#[no_mangle]
pub unsafe extern "C" fn connmux_parser_free(parser: *mut connmux_parser) {
    // SAFETY: forwarded contract of this function.
    unsafe { release(parser, parser_ref) }
}

// ---------------------------------------------------------------------------
// Attach, unattach, failures, statistics
// ---------------------------------------------------------------------------

/// SIOCKCMATTACH: attach a connected TCP socket `fd` with a fresh parser made
/// from `parser`. connmux keeps its own duplicate of the descriptor, so the
/// caller may (and usually does) close `fd` afterwards; that neither detaches
/// nor closes the connection. Returns 0 and the connection's id in `*psock`
/// (`psock` may be NULL). Errors as AF_KCM: -EOPNOTSUPP for anything but a
/// connected TCP socket, -ENOENT for a bad descriptor, -EALREADY if already
/// attached to a mux.
///
/// # Safety
/// `mux` and `parser` are live handles; `fd` stays open during the call;
/// `psock` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn connmux_attach(
    mux: *const connmux_mux,
    fd: c_int,
    parser: *const connmux_parser,
    psock: *mut connmux_psock_id,
) -> c_int {
    guard_int(|| {
        // SAFETY: forwarded contract of this function.
        let m = unsafe { mux_ref(mux) }?;
        // SAFETY: forwarded contract of this function.
        let p = unsafe { parser_ref(parser) }?;
        // SAFETY: forwarded contract of this function.
        let conn = unsafe { borrow_fd(fd) }?;
        let id = m.mux.attach(&conn, p.kind.build()?)?;
        // SAFETY: forwarded contract of this function.
        unsafe { put_psock(psock, id) };
        Ok(0)
    })
}

/// [`connmux_attach`] with a built-in parser named by a spec string (see
/// `connmux_parser_from_spec`).
///
/// # Safety
/// As `connmux_attach`; `spec` is a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn connmux_attach_spec(
    mux: *const connmux_mux,
    fd: c_int,
    spec: *const c_char,
    psock: *mut connmux_psock_id,
) -> c_int {
    guard_int(|| {
        // SAFETY: forwarded contract of this function.
        let m = unsafe { mux_ref(mux) }?;
        // SAFETY: forwarded contract of this function.
        let spec = unsafe { c_str(spec, "spec") }?;
        let parser = connmux_rs::parsers::from_spec(spec).map_err(|e| Fail::inval(e.to_string()))?;
        // SAFETY: forwarded contract of this function.
        let conn = unsafe { borrow_fd(fd) }?;
        let id = m.mux.attach(&conn, parser)?;
        // SAFETY: forwarded contract of this function.
        unsafe { put_psock(psock, id) };
        Ok(0)
    })
}

/// Fill `*opts` with the defaults: no parser, every limit and the worker from
/// the mux. Returns 0, or -EFAULT if `opts` is NULL.
///
/// # Safety
/// `opts` is NULL or points to writable memory for one `connmux_attach_opts`.
#[no_mangle]
pub unsafe extern "C" fn connmux_attach_opts_init(opts: *mut connmux_attach_opts) -> c_int {
    guard_int(|| {
        // SAFETY: forwarded contract of this function.
        let opts = unsafe { out(opts, "opts") }?;
        *opts = connmux_attach_opts {
            parser: std::ptr::null(),
            max_msg_size: 0,
            assembly_timeout_ms: CONNMUX_ATTACH_MUX_DEFAULT.into(),
            worker: CONNMUX_ATTACH_MUX_DEFAULT,
        };
        Ok(0)
    })
}

/// [`connmux_attach`] with per-connection options: this connection's message
/// size limit, assembly deadline and worker. Returns 0 and the connection's id
/// in `*psock` (`psock` may be NULL); -EINVAL for a NULL parser or a negative
/// value other than `CONNMUX_ATTACH_MUX_DEFAULT`; otherwise as `connmux_attach`.
///
/// # Safety
/// `mux` is a live handle; `opts` is a readable `connmux_attach_opts` whose
/// `parser` is a live template; `fd` stays open during the call; `psock` is
/// NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn connmux_attach_with(
    mux: *const connmux_mux,
    fd: c_int,
    opts: *const connmux_attach_opts,
    psock: *mut connmux_psock_id,
) -> c_int {
    guard_int(|| {
        // SAFETY: forwarded contract of this function.
        let m = unsafe { mux_ref(mux) }?;
        // SAFETY: forwarded contract of this function.
        let o = *unsafe { inp(opts, "opts") }?;
        if o.parser.is_null() {
            return Err(Fail::inval("opts->parser is NULL"));
        }
        // SAFETY: a live template by contract.
        let p = unsafe { parser_ref(o.parser) }?;
        let mut a = AttachOptions::new(p.kind.build()?);
        if o.max_msg_size > 0 {
            a = a.max_msg_size(o.max_msg_size);
        }
        a.assembly_timeout = match o.assembly_timeout_ms {
            t if t == i64::from(CONNMUX_ATTACH_MUX_DEFAULT) => None,
            0 => Some(None),
            t if t > 0 => Some(Some(Duration::from_millis(t as u64))),
            t => return Err(Fail::inval(format!("assembly_timeout_ms {t} is negative"))),
        };
        a.worker = match o.worker {
            CONNMUX_ATTACH_MUX_DEFAULT => None,
            w if w >= 0 => Some(w as usize),
            w => return Err(Fail::inval(format!("worker {w} is negative"))),
        };
        // SAFETY: forwarded contract of this function.
        let conn = unsafe { borrow_fd(fd) }?;
        let id = m.mux.attach_with(&conn, a)?;
        // SAFETY: forwarded contract of this function.
        unsafe { put_psock(psock, id) };
        Ok(0)
    })
}

/// SIOCKCMUNATTACH by descriptor: `fd` is the caller's descriptor of an
/// attached connection (or any duplicate of it). -ENOENT if it is not
/// attached to this mux.
///
/// # Safety
/// `mux` is a live handle; `fd` stays open during the call.
#[no_mangle]
pub unsafe extern "C" fn connmux_unattach(mux: *const connmux_mux, fd: c_int) -> c_int {
    guard_int(|| {
        // SAFETY: forwarded contract of this function.
        let m = unsafe { mux_ref(mux) }?;
        // SAFETY: forwarded contract of this function.
        let conn = unsafe { borrow_fd(fd) }?;
        m.mux.unattach(&conn)?;
        Ok(0)
    })
}

/// SIOCKCMUNATTACH by id: stop using the connection and close connmux's
/// descriptor of it once its pending messages are written. -ENOENT if
/// `psock` is not attached.
///
/// # Safety
/// `mux` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn connmux_unattach_psock(mux: *const connmux_mux, psock: connmux_psock_id) -> c_int {
    guard_int(|| {
        // SAFETY: forwarded contract of this function.
        let m = unsafe { mux_ref(mux) }?;
        m.mux.unattach_id(psock_required(psock)?)?;
        Ok(0)
    })
}

/// Unattach and reset the connection (the peer sees RST): what a server does
/// with a connection whose peer misbehaved. -ENOENT if not attached.
///
/// # Safety
/// `mux` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn connmux_abort_psock(mux: *const connmux_mux, psock: connmux_psock_id) -> c_int {
    guard_int(|| {
        // SAFETY: forwarded contract of this function.
        let m = unsafe { mux_ref(mux) }?;
        m.mux.abort(psock_required(psock)?)?;
        Ok(0)
    })
}

/// The `CONNMUX_PSOCK_ERR_*` kind and the positive errno of a psock failure.
fn psock_error_to_c(e: &PsockError) -> (c_int, c_int) {
    match e {
        PsockError::Rx(rx) => (CONNMUX_PSOCK_ERR_RX, rx.errno()),
        PsockError::Tx(n) => (CONNMUX_PSOCK_ERR_TX, *n),
        PsockError::Closed => (CONNMUX_PSOCK_ERR_CLOSED, libc::EPIPE),
    }
}

/// Take the next psock failure (KCM: POLLERR on an attached TCP socket). Waits
/// up to `timeout_ms` milliseconds (0: do not wait; negative: wait until one
/// comes). Returns 1 and fills `*ev`, or 0 if none came. The application
/// should then unattach or abort `ev->psock`.
///
/// # Safety
/// `mux` is a live handle; `ev` is writable.
#[no_mangle]
pub unsafe extern "C" fn connmux_next_event(
    mux: *const connmux_mux,
    ev: *mut connmux_event,
    timeout_ms: c_int,
) -> c_int {
    guard_int(|| {
        // SAFETY: forwarded contract of this function.
        let m = unsafe { mux_ref(mux) }?;
        // SAFETY: forwarded contract of this function.
        let ev = unsafe { out(ev, "ev") }?;
        let rx = m.mux.events();
        let got = match timeout_ms {
            0 => rx.try_recv().ok(),
            t if t < 0 => rx.recv().ok(),
            t => rx.recv_timeout(Duration::from_millis(t as u64)).ok(),
        };
        match got {
            Some(e) => {
                let (kind, err) = psock_error_to_c(&e.error);
                *ev = connmux_event { psock: psock_to_c(e.psock), kind, err };
                Ok(1)
            }
            None => Ok(0),
        }
    })
}

/// The first error a connection reported (KCM: SO_ERROR on the TCP socket):
/// returns 1 and stores the positive errno in `*err` (`err` may be NULL), or 0
/// if the connection has not failed (or is not attached).
///
/// # Safety
/// `mux` is a live handle; `err` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn connmux_psock_error(
    mux: *const connmux_mux,
    psock: connmux_psock_id,
    err: *mut c_int,
) -> c_int {
    guard_int(|| {
        // SAFETY: forwarded contract of this function.
        let m = unsafe { mux_ref(mux) }?;
        let Some(e) = m.mux.psock_error(psock_required(psock)?) else {
            return Ok(0);
        };
        if !err.is_null() {
            // SAFETY: non-null and writable by contract.
            *unsafe { out(err, "err") }? = psock_error_to_c(&e).1;
        }
        Ok(1)
    })
}

/// Mux-wide statistics into `*st`. Returns 0 or a negative errno.
///
/// # Safety
/// `mux` is a live handle; `st` is writable.
#[no_mangle]
pub unsafe extern "C" fn connmux_mux_get_stats(mux: *const connmux_mux, st: *mut connmux_mux_stats) -> c_int {
    guard_int(|| {
        // SAFETY: forwarded contract of this function.
        let m = unsafe { mux_ref(mux) }?;
        // SAFETY: forwarded contract of this function.
        let st = unsafe { out(st, "st") }?;
        *st = mux_stats_to_c(&m.mux.stats(), m.mux.events_dropped());
        Ok(0)
    })
}

/// One connection's statistics into `*st`. -ENOENT if it is not attached.
///
/// # Safety
/// `mux` is a live handle; `st` is writable.
#[no_mangle]
pub unsafe extern "C" fn connmux_psock_get_stats(
    mux: *const connmux_mux,
    psock: connmux_psock_id,
    st: *mut connmux_psock_stats,
) -> c_int {
    guard_int(|| {
        // SAFETY: forwarded contract of this function.
        let m = unsafe { mux_ref(mux) }?;
        // SAFETY: forwarded contract of this function.
        let st = unsafe { out(st, "st") }?;
        *st = (&m.mux.psock_stats(psock_required(psock)?)?).into();
        Ok(0)
    })
}

// ---------------------------------------------------------------------------
// Sockets
// ---------------------------------------------------------------------------

fn new_sock(sock: KcmSocket) -> *mut connmux_sock {
    Box::into_raw(Box::new(connmux_sock { magic: SOCK_MAGIC, sock, nonblocking: AtomicBool::new(false) }))
}

/// `socket(AF_KCM, type, 0)`: a new socket on `mux`, blocking, type
/// `CONNMUX_SOCK_DGRAM` or `CONNMUX_SOCK_SEQPACKET`. Returns 0 and the handle in
/// `*out` (close it with `connmux_sock_close`), or -EINVAL for another type.
///
/// # Safety
/// `mux` is a live handle; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn connmux_socket(
    mux: *const connmux_mux,
    sock_type: c_int,
    out_sock: *mut *mut connmux_sock,
) -> c_int {
    guard_int(|| {
        // SAFETY: forwarded contract of this function.
        let slot = unsafe { out(out_sock, "out") }?;
        *slot = std::ptr::null_mut();
        // SAFETY: forwarded contract of this function.
        let m = unsafe { mux_ref(mux) }?;
        let ty = match sock_type {
            CONNMUX_SOCK_DGRAM => SockType::Dgram,
            CONNMUX_SOCK_SEQPACKET => SockType::SeqPacket,
            t => return Err(Fail::inval(format!("socket type {t} is neither DGRAM (2) nor SEQPACKET (5)"))),
        };
        *slot = new_sock(m.mux.socket(ty)?);
        Ok(0)
    })
}

/// SIOCKCMCLONE: another socket on the same mux, same type, default options
/// (blocking, receive enabled). Returns 0 and the handle in `*out`.
///
/// # Safety
/// `sock` is a live handle; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn connmux_sock_clone(sock: *const connmux_sock, out_sock: *mut *mut connmux_sock) -> c_int {
    guard_int(|| {
        // SAFETY: forwarded contract of this function.
        let slot = unsafe { out(out_sock, "out") }?;
        *slot = std::ptr::null_mut();
        // SAFETY: forwarded contract of this function.
        let s = unsafe { sock_ref(sock) }?;
        *slot = new_sock(s.sock.try_clone()?);
        Ok(0)
    })
}

/// A clone of `sock` that stands alone (`KcmSocket::stand_alone`): the
/// connections attached through it (`connmux_sock_attach_spec`) are read by
/// the thread that receives on it, in its receive calls, with no worker
/// thread between. They are read only while a thread receives on it;
/// closing it leaves them attached, read by a thread of the slot's own
/// (their messages go to the mux's other sockets) until the last is
/// unattached, when the slot is free again. Takes one of the mux's
/// `connmux_config.stand_alone` slots: ENOMEM when all are taken,
/// EOPNOTSUPP on the kernel backend. Returns 0 and the handle in `*out`.
///
/// # Safety
/// `sock` is a live handle; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn connmux_sock_stand_alone(
    sock: *const connmux_sock,
    out_sock: *mut *mut connmux_sock,
) -> c_int {
    guard_int(|| {
        // SAFETY: forwarded contract of this function.
        let slot = unsafe { out(out_sock, "out") }?;
        *slot = std::ptr::null_mut();
        // SAFETY: forwarded contract of this function.
        let s = unsafe { sock_ref(sock) }?;
        *slot = new_sock(s.sock.stand_alone()?);
        Ok(0)
    })
}

/// Attach connection `fd` with the built-in parser named by `spec` through
/// socket `sock`: on a stand-alone socket it is read by that socket's own
/// thread; on any other, as `connmux_attach_spec` on its mux. The
/// psock's id is written to `*psock` when `psock` is not NULL.
///
/// # Safety
/// `sock` is a live handle; `spec` is a NUL-terminated string; `psock` is
/// NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn connmux_sock_attach_spec(
    sock: *const connmux_sock,
    fd: c_int,
    spec: *const c_char,
    psock: *mut connmux_psock_id,
) -> c_int {
    guard_int(|| {
        // SAFETY: forwarded contract of this function.
        let s = unsafe { sock_ref(sock) }?;
        // SAFETY: forwarded contract of this function.
        let spec = unsafe { c_str(spec, "spec") }?;
        let parser = connmux_rs::parsers::from_spec(spec).map_err(|e| Fail::inval(e.to_string()))?;
        // SAFETY: forwarded contract of this function.
        let conn = unsafe { borrow_fd(fd) }?;
        let id = s.sock.attach(&conn, parser)?;
        // SAFETY: forwarded contract of this function.
        unsafe { put_psock(psock, id) };
        Ok(0)
    })
}

/// `close()`: messages received but not yet read move to the mux's other
/// sockets; messages not yet written are dropped, silently, as KCM's close
/// drops them (a connection reserved mid-message is aborted): call
/// `connmux_sock_flush` first to wait for them. Closing the last socket of a
/// mux unattaches every connection. NULL is ignored. Must not race with other
/// calls on the same handle.
///
/// # Safety
/// `sock` is NULL or a live handle, not used again after this call.
#[no_mangle]
pub unsafe extern "C" fn connmux_sock_close(sock: *mut connmux_sock) {
    // SAFETY: forwarded contract of this function.
    unsafe { release(sock, sock_ref) }
}

/// A descriptor that is readable (POLLIN) while messages wait on this socket,
/// for poll/epoll/select. Owned by the socket: do not read, write or close
/// it; it is valid until `connmux_sock_close`. Any thread may call this.
///
/// # Safety
/// `sock` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn connmux_sock_fd(sock: *const connmux_sock) -> c_int {
    guard_int(|| {
        // SAFETY: forwarded contract of this function.
        let s = unsafe { sock_ref(sock) }?;
        Ok(s.sock.as_raw_fd() as isize)
    })
}

/// O_NONBLOCK: with `nonblocking` non-zero, calls that would wait return
/// -EAGAIN instead.
///
/// # Safety
/// `sock` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn connmux_set_nonblocking(sock: *const connmux_sock, nonblocking: c_int) -> c_int {
    guard_int(|| {
        // SAFETY: forwarded contract of this function.
        let s = unsafe { sock_ref(sock) }?;
        s.sock.set_nonblocking(nonblocking != 0)?;
        s.nonblocking.store(nonblocking != 0, Ordering::Relaxed);
        Ok(0)
    })
}

/// SO_RCVTIMEO / SO_SNDTIMEO in milliseconds for blocking calls (0: wait
/// forever). A call that times out returns -EAGAIN.
///
/// # Safety
/// `sock` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn connmux_set_timeouts(sock: *const connmux_sock, recv_ms: u64, send_ms: u64) -> c_int {
    guard_int(|| {
        // SAFETY: forwarded contract of this function.
        let s = unsafe { sock_ref(sock) }?;
        s.sock.set_read_timeout((recv_ms > 0).then(|| Duration::from_millis(recv_ms)))?;
        s.sock.set_write_timeout((send_ms > 0).then(|| Duration::from_millis(send_ms)))?;
        Ok(0)
    })
}

/// KCM_RECV_DISABLE: with `disable` non-zero the socket is offered no new
/// messages and the ones queued on it move to other sockets that can take
/// them; 0 enables it again.
///
/// # Safety
/// `sock` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn connmux_set_recv_disable(sock: *const connmux_sock, disable: c_int) -> c_int {
    guard_int(|| {
        // SAFETY: forwarded contract of this function.
        let s = unsafe { sock_ref(sock) }?;
        s.sock.set_recv_disable(disable != 0)?;
        Ok(0)
    })
}

/// SO_RCVBUF of this socket in bytes (a socket holding this much is offered no
/// more messages).
///
/// # Safety
/// `sock` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn connmux_set_rcvbuf(sock: *const connmux_sock, bytes: usize) -> c_int {
    guard_int(|| {
        // SAFETY: forwarded contract of this function.
        let s = unsafe { sock_ref(sock) }?;
        s.sock.set_rcvbuf(bytes)?;
        Ok(0)
    })
}

/// SO_SNDBUF of this socket in bytes (checked when a new message starts).
///
/// # Safety
/// `sock` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn connmux_set_sndbuf(sock: *const connmux_sock, bytes: usize) -> c_int {
    guard_int(|| {
        // SAFETY: forwarded contract of this function.
        let s = unsafe { sock_ref(sock) }?;
        s.sock.set_sndbuf(bytes)?;
        Ok(0)
    })
}

/// This socket's counters into `*st`.
///
/// # Safety
/// `sock` is a live handle; `st` is writable.
#[no_mangle]
pub unsafe extern "C" fn connmux_sock_get_stats(sock: *const connmux_sock, st: *mut connmux_sock_stats) -> c_int {
    guard_int(|| {
        // SAFETY: forwarded contract of this function.
        let s = unsafe { sock_ref(sock) }?;
        // SAFETY: forwarded contract of this function.
        let st = unsafe { out(st, "st") }?;
        *st = sock_stats_to_c(&s.sock.stats()?);
        Ok(0)
    })
}

// ---------------------------------------------------------------------------
// Receive and send
// ---------------------------------------------------------------------------

/// Runs `f` non-blocking if `dontwait` asks for it and the socket is
/// blocking; restores blocking mode afterwards (also on unwind).
fn with_mode<T>(
    s: &connmux_sock,
    dontwait: bool,
    f: impl FnOnce(&KcmSocket) -> std::io::Result<T>,
) -> std::io::Result<T> {
    struct Restore<'a>(&'a KcmSocket);
    impl Drop for Restore<'_> {
        fn drop(&mut self) {
            // (A drop has no caller to tell; the mode is a flag, which
            // setting does not fail.)
            let _ = self.0.set_nonblocking(false);
        }
    }
    if dontwait && !s.nonblocking.load(Ordering::Relaxed) {
        s.sock.set_nonblocking(true)?;
        let _restore = Restore(&s.sock);
        f(&s.sock)
    } else {
        f(&s.sock)
    }
}

fn check_flags(flags: c_int, allowed: c_int, call: &str) -> Result<(), Fail> {
    if flags & !allowed != 0 {
        return Err(Fail::inval(format!("{call}: unsupported flags {:#x}", flags & !allowed)));
    }
    Ok(())
}

fn info_flags(i: &RecvInfo) -> c_int {
    (if i.eor { CONNMUX_MSG_EOR } else { 0 }) | (if i.trunc { CONNMUX_MSG_TRUNC } else { 0 })
}

fn recv_one(s: &connmux_sock, buf: &mut [u8], flags: c_int) -> Result<RecvInfo, Fail> {
    check_flags(flags, CONNMUX_MSG_PEEK | CONNMUX_MSG_DONTWAIT, "recv")?;
    let rf = RecvFlags { peek: flags & CONNMUX_MSG_PEEK != 0 };
    Ok(with_mode(s, flags & CONNMUX_MSG_DONTWAIT != 0, |k| k.recv_flags(buf, rf))?)
}

/// recv(): copy one message (SEQPACKET: the next part of it) into `buf`.
/// Returns the bytes copied; on DGRAM a message longer than `len` is cut and
/// its rest discarded (use `connmux_recvmsg` to see `CONNMUX_MSG_TRUNC`).
/// `flags`: `CONNMUX_MSG_PEEK`, `CONNMUX_MSG_DONTWAIT`. Errors: -EAGAIN
/// (non-blocking or timed out, nothing queued), -EINVAL (flags), -EFAULT.
///
/// # Safety
/// `sock` is a live handle; `buf` is writable for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn connmux_recv(sock: *const connmux_sock, buf: *mut c_void, len: usize, flags: c_int) -> isize {
    guard(|| {
        // SAFETY: forwarded contract of this function.
        let s = unsafe { sock_ref(sock) }?;
        // SAFETY: forwarded contract of this function.
        let buf = unsafe { bytes_mut(buf, len, "buf") }?;
        ok(recv_one(s, buf, flags)?.len)
    })
}

/// recvmsg(): as `connmux_recv` into `msg->buf`/`msg->len`, and fills
/// `msg->n` (bytes copied), `msg->flags` (`CONNMUX_MSG_EOR` when the message
/// ended, `CONNMUX_MSG_TRUNC` when its rest was discarded) and `msg->psock`
/// (the connection it came from: reply there with `connmux_send_to`).
/// Returns the bytes copied.
///
/// # Safety
/// `sock` is a live handle; `msg` is writable and `msg->buf` writable for `msg->len` bytes.
#[no_mangle]
pub unsafe extern "C" fn connmux_recvmsg(sock: *const connmux_sock, msg: *mut connmux_msg, flags: c_int) -> isize {
    guard(|| {
        // SAFETY: forwarded contract of this function.
        let s = unsafe { sock_ref(sock) }?;
        // SAFETY: forwarded contract of this function.
        let m = unsafe { out(msg, "msg") }?;
        // SAFETY: forwarded contract of this function.
        let buf = unsafe { bytes_mut(m.buf, m.len, "msg->buf") }?;
        let info = recv_one(s, buf, flags)?;
        m.n = info.len;
        m.flags = info_flags(&info);
        m.psock = psock_to_c(info.psock);
        ok(info.len)
    })
}

/// recvmmsg(): receive up to `count` messages into `msgs[0..count]`, each as
/// `connmux_recvmsg` does. Waits (per the socket's mode, or not at all with
/// `CONNMUX_MSG_DONTWAIT`) only for the first; returns how many were filled
/// (at least 1), or a negative errno if none was. `flags`: `CONNMUX_MSG_DONTWAIT`.
///
/// # Safety
/// `sock` is a live handle; `msgs` is writable for `count` entries, each
/// `buf` writable for its `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn connmux_recv_batch(
    sock: *const connmux_sock,
    msgs: *mut connmux_msg,
    count: usize,
    flags: c_int,
) -> isize {
    guard(|| {
        // SAFETY: forwarded contract of this function.
        let s = unsafe { sock_ref(sock) }?;
        check_flags(flags, CONNMUX_MSG_DONTWAIT, "recv_batch")?;
        // SAFETY: forwarded contract of this function.
        let msgs = unsafe { msgs_mut(msgs, count) }?;
        if msgs.is_empty() {
            return Ok(0);
        }
        let fill = |m: &mut connmux_msg, dontwait: bool| -> Result<(), Fail> {
            // SAFETY: forwarded contract of this function (each entry's buffer).
            let buf = unsafe { bytes_mut(m.buf, m.len, "msgs[i].buf") }?;
            let info = with_mode(s, dontwait, |k| k.recv_flags(buf, RecvFlags::default()))?;
            m.n = info.len;
            m.flags = info_flags(&info);
            m.psock = psock_to_c(info.psock);
            Ok(())
        };
        fill(&mut msgs[0], flags & CONNMUX_MSG_DONTWAIT != 0)?;
        let mut n = 1;
        // The rest only while they are already queued: stop at the first
        // -EAGAIN (or other error, which the next call reports).
        while n < msgs.len() && fill(&mut msgs[n], true).is_ok() {
            n += 1;
        }
        ok(n)
    })
}

fn send_flags_of(flags: c_int) -> Result<SendFlags, Fail> {
    check_flags(
        flags,
        CONNMUX_MSG_MORE | CONNMUX_MSG_EOR | CONNMUX_MSG_BATCH | CONNMUX_MSG_DONTWAIT | CONNMUX_MSG_NOSIGNAL,
        "send",
    )?;
    Ok(SendFlags {
        more: flags & CONNMUX_MSG_MORE != 0,
        eor: flags & CONNMUX_MSG_EOR != 0,
        batch: flags & CONNMUX_MSG_BATCH != 0,
    })
}

/// sendmsg(): send `len` bytes at `buf` as (part of) one message on a
/// connection the mux picks. DGRAM: the message ends here unless
/// `CONNMUX_MSG_MORE`. SEQPACKET: the message ends only with `CONNMUX_MSG_EOR`.
/// `CONNMUX_MSG_BATCH` holds transmission until a send without it;
/// `CONNMUX_MSG_DONTWAIT` does not wait for buffer space or a connection.
/// Returns the bytes taken (all of them). Errors: -EAGAIN (non-blocking, no
/// space or no connection), -EPIPE, -EINVAL (flags), -EFAULT.
///
/// # Safety
/// `sock` is a live handle; `buf` is readable for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn connmux_send(
    sock: *const connmux_sock,
    buf: *const c_void,
    len: usize,
    flags: c_int,
) -> isize {
    guard(|| {
        // SAFETY: forwarded contract of this function.
        let s = unsafe { sock_ref(sock) }?;
        // SAFETY: forwarded contract of this function.
        let data = unsafe { bytes(buf, len, "buf") }?;
        let sf = send_flags_of(flags)?;
        ok(with_mode(s, flags & CONNMUX_MSG_DONTWAIT != 0, |k| k.send_flags(data, sf))?)
    })
}

fn send_to_one(s: &connmux_sock, data: &[u8], psock: connmux_psock_id, flags: c_int) -> Result<usize, Fail> {
    check_flags(flags, CONNMUX_MSG_EOR | CONNMUX_MSG_DONTWAIT | CONNMUX_MSG_NOSIGNAL, "send_to")?;
    let p = psock_required(psock)?;
    Ok(with_mode(s, flags & CONNMUX_MSG_DONTWAIT != 0, |k| k.send_to(data, p))?)
}

/// Addressed send: `len` bytes at `buf` as one whole message on connection
/// `psock` (typically a reply to a message received from it). `flags`:
/// `CONNMUX_MSG_DONTWAIT` (`CONNMUX_MSG_EOR` is implied). Returns the bytes
/// taken. Errors: -ENOENT (not attached), -EPIPE (its transmit stopped),
/// -EAGAIN, -EINVAL (other flags).
///
/// # Safety
/// `sock` is a live handle; `buf` is readable for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn connmux_send_to(
    sock: *const connmux_sock,
    buf: *const c_void,
    len: usize,
    psock: connmux_psock_id,
    flags: c_int,
) -> isize {
    guard(|| {
        // SAFETY: forwarded contract of this function.
        let s = unsafe { sock_ref(sock) }?;
        // SAFETY: forwarded contract of this function.
        let data = unsafe { bytes(buf, len, "buf") }?;
        ok(send_to_one(s, data, psock, flags)?)
    })
}

/// sendmmsg(): send `msgs[0..count]`, each a whole message (`buf`, `len`), on
/// `msgs[i].psock` or, where that is `CONNMUX_PSOCK_NONE`, on a connection the
/// mux picks; sets each sent entry's `n`. The batch goes out together
/// (`CONNMUX_MSG_BATCH` on all but the last): each connection's messages of
/// it in one write, the replies to a `connmux_recv_batch` too. `flags`:
/// `CONNMUX_MSG_DONTWAIT`. Returns how many were sent: fewer than `count` when
/// one failed after the first, or a negative errno if the first failed.
///
/// # Safety
/// `sock` is a live handle; `msgs` is writable for `count` entries, each
/// `buf` readable for its `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn connmux_send_batch(
    sock: *const connmux_sock,
    msgs: *mut connmux_msg,
    count: usize,
    flags: c_int,
) -> isize {
    guard(|| {
        // SAFETY: forwarded contract of this function.
        let s = unsafe { sock_ref(sock) }?;
        check_flags(flags, CONNMUX_MSG_DONTWAIT | CONNMUX_MSG_NOSIGNAL, "send_batch")?;
        // SAFETY: forwarded contract of this function.
        let msgs = unsafe { msgs_mut(msgs, count) }?;
        let dontwait = flags & CONNMUX_MSG_DONTWAIT != 0;
        let mut to: Vec<(Option<PsockId>, &[u8])> = Vec::with_capacity(msgs.len());
        for m in msgs.iter() {
            // SAFETY: forwarded contract of this function (each entry's buffer).
            to.push((psock_from_c(m.psock), unsafe { bytes(m.buf, m.len, "msgs[i].buf") }?));
        }
        let sent = with_mode(s, dontwait, |k| k.send_batch_to(&to))?;
        for (m, (_, d)) in msgs.iter_mut().zip(&to).take(sent) {
            m.n = d.len();
        }
        ok(sent)
    })
}

/// Wait, at most `timeout_ms` milliseconds, until every message this socket
/// accepted with a send call has been written to its connection, so that
/// `connmux_sock_close` then drops nothing. 0 when all are written;
/// -ETIMEDOUT when some are still unsent at the deadline (nothing is dropped
/// by this call); -EOPNOTSUPP on the kernel backend; another negative errno
/// on error. Any thread may call this.
///
/// # Safety
/// `sock` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn connmux_sock_flush(sock: *const connmux_sock, timeout_ms: u64) -> c_int {
    guard_int(|| {
        // SAFETY: forwarded contract of this function.
        let s = unsafe { sock_ref(sock) }?;
        s.sock.flush(std::time::Duration::from_millis(timeout_ms))?;
        Ok(0)
    })
}

/// Messages waiting on this socket (0 or more), or a negative errno.
///
/// # Safety
/// `sock` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn connmux_sock_queued(sock: *const connmux_sock) -> isize {
    guard(|| {
        // SAFETY: forwarded contract of this function.
        let s = unsafe { sock_ref(sock) }?;
        ok(s.sock.queued())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io;

    #[test]
    fn psock_ids_round_trip_and_never_zero() {
        for (index, generation) in [(0, 0), (1, 0), (0, 1), (u32::MAX, 7), (5, u32::MAX - 1)] {
            let p = PsockId { index, generation };
            let c = psock_to_c(p);
            assert_ne!(c, CONNMUX_PSOCK_NONE);
            assert_eq!(psock_from_c(c), Some(p));
        }
        assert_eq!(psock_from_c(CONNMUX_PSOCK_NONE), None);
    }

    #[test]
    fn io_errors_map_to_errno() {
        assert_eq!(error::errno_of(&io::Error::from(io::ErrorKind::WouldBlock)), libc::EAGAIN);
        assert_eq!(error::errno_of(&io::Error::from_raw_os_error(libc::EALREADY)), libc::EALREADY);
        assert_eq!(error::errno_of(&io::Error::other("x")), libc::EIO);
    }

    #[test]
    fn a_panic_becomes_eio_with_a_message() {
        let r = guard(|| panic!("boom"));
        assert_eq!(r, -(libc::EIO as isize));
        // SAFETY: last_ptr is a NUL-terminated string owned by this thread.
        let msg = unsafe { CStr::from_ptr(error::last_ptr()) }.to_str().unwrap();
        assert!(msg.contains("boom"), "{msg}");
    }
}
