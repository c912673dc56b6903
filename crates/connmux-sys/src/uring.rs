//! io_uring for the runtime's io_uring driver: multishot receives into a ring of
//! provided buffers, single receives into a caller's buffer, vectored sends, one-shot readiness polls and cancellation, with
//! completions reported as a safe enum.
//!
//! A [`Ring`] owns one io_uring instance and one provided-buffer ring ("buffer group
//! 0") of `buf_count` buffers of `buf_size` bytes each. A multishot receive
//! ([`Ring::recv_multishot`]) keeps delivering data from one socket, each piece in a
//! buffer the kernel picks from that group, until it ends (end of stream, an error,
//! no free buffer, cancellation). The buffer then belongs to the caller: read it with
//! [`Ring::buffer`] and hand it back with [`Ring::recycle`]. Receive memory is
//! therefore fixed by the configuration, never by the peer: with every buffer held,
//! a receive ends with `ENOBUFS` instead of growing anything.
//!
//! Ownership of memory the kernel touches, which is what keeps the API safe:
//! - a buffer is in the kernel's ring, held by the caller, or free on the ring's spare
//!   stack ([`RingConfig::buf_hot`]), tracked per buffer; only held buffers can be read,
//!   only held buffers can be recycled (once);
//! - the bytes of a send are moved into the ring and dropped when its completion is
//!   reaped, so they outlive the kernel's use;
//! - the buffer of a [`Ring::recv_into`] is moved into the ring too, and handed back
//!   ([`Ring::take_filled`]) only once its completion is reaped;
//! - dropping a `Ring` with operations in flight cancels them and waits for them (at
//!   most [`DROP_WAIT`]); if some still do not finish, their memory is leaked rather
//!   than freed under the kernel.
//!
//! Each submitted operation takes a caller `token` (a `u64` the kernel never sees;
//! the ring's own `user_data` is a slot number) that comes back in its
//! [`Completion`]s.
//!
//! What it does **not** do: register files or fixed buffers, `SQPOLL`, zero-copy
//! sends, bundled receives, or ordering between operations. Two sends in flight on
//! one socket may interleave their bytes: keep at most one send per socket in flight.
//! A multishot receive holds a reference on its socket: closing the fd does not end
//! it; call [`Ring::cancel_fd`] (or shut the socket down) first.

use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use io_uring::{cqueue, opcode, squeue, types, IoUring};

/// The buffer group id of the ring's provided buffers.
const BGID: u16 = 0;

/// The longest a dropped [`Ring`] waits for its cancelled operations to finish.
pub const DROP_WAIT: Duration = Duration::from_secs(2);

/// Sizes of a [`Ring`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingConfig {
    /// Submission queue entries (rounded up to a power of two by the kernel).
    pub entries: u32,
    /// Completion queue entries; a multishot receive posts many completions per
    /// submission, so this should be well above `entries`.
    pub cq_entries: u32,
    /// Provided buffers: a power of two, at most 32768.
    pub buf_count: u16,
    /// Bytes per provided buffer (the most one receive completion carries).
    pub buf_size: u32,
    /// Keep only some of the free buffers in the kernel's ring, at least this many
    /// (0: all of them). The kernel takes buffers in the order they were given, so
    /// with every free buffer queued a receive lands in the buffer used longest
    /// ago, and the ring's whole memory passes through the caches; with fewer
    /// queued, the rest wait on a stack and the most recently used go in first, so
    /// receives land in memory still in the cache. The number queued doubles when
    /// a receive ends with `ENOBUFS` while free buffers were kept back (so a
    /// receive may end that way before every buffer is held; the caller submits
    /// it again, as after any `ENOBUFS`) and halves, down to this, after a run of
    /// deliveries that never used half of it.
    pub buf_hot: u16,
    /// Run the kernel's completion work only when this ring waits
    /// (`IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN`, Linux 6.1+): nothing
    /// is delivered between two waits, so what one wait reaps is all that arrived.
    /// The ring must then be created, used and dropped on one thread.
    pub defer_taskrun: bool,
}

impl Default for RingConfig {
    /// 256 submissions, 1024 completions, 256 buffers of 16 KiB (4 MiB of receive
    /// memory per ring).
    fn default() -> Self {
        RingConfig {
            entries: 256,
            cq_entries: 1024,
            buf_count: 256,
            buf_size: 16 * 1024,
            buf_hot: 0,
            defer_taskrun: false,
        }
    }
}

/// One completion, as reaped by [`Ring::reap`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Completion {
    /// `len` bytes arrived in provided buffer `buf_id` (now held by the caller until
    /// [`Ring::recycle`]). `more == false`: the multishot receive ended with this
    /// completion; submit a new one to go on receiving.
    Recv { token: u64, buf_id: u16, len: usize, more: bool },
    /// The multishot receive ended without data: `res == 0` is end of stream, else
    /// `-errno` (`-ENOBUFS`: no buffer in the kernel's ring, every buffer held or,
    /// with [`RingConfig::buf_hot`], fewer queued than this wait needed;
    /// `-ECANCELED`; a socket error).
    RecvEnd { token: u64, res: i32 },
    /// A send finished: `res` is the number of bytes sent (all of them unless the
    /// connection failed part way) or `-errno` (`-EPIPE`, `-ECONNRESET`, `-ECANCELED`).
    Send { token: u64, res: i32 },
    /// A receive into a caller's buffer ([`Ring::recv_into`]) finished: `res` bytes
    /// were appended (0: end of stream) or `-errno` (`-ECANCELED`, a socket error).
    /// The buffer is waiting in [`Ring::take_filled`].
    RecvInto { token: u64, res: i32 },
    /// A readiness poll finished: `res` is the `poll(2)` event mask (`POLLIN`, …) or
    /// `-errno` (`-ECANCELED`).
    Poll { token: u64, res: i32 },
}

/// Whether io_uring works here as the runtime needs it: a ring can be created, a
/// provided-buffer ring registered, and a multishot receive delivers data into a
/// provided buffer. Probed once (a real receive on a socket pair) and remembered. False
/// where io_uring is disabled (`kernel.io_uring_disabled`, seccomp) or too old (< 6.0).
pub fn supported() -> bool {
    static SUPPORTED: OnceLock<bool> = OnceLock::new();
    *SUPPORTED.get_or_init(|| probe().is_ok())
}

fn probe() -> io::Result<()> {
    let config = RingConfig { entries: 4, cq_entries: 8, buf_count: 2, buf_size: 64, buf_hot: 0, defer_taskrun: false };
    let mut ring: Ring<Vec<u8>> = Ring::new(config)?;
    let (a, b) = std::os::unix::net::UnixStream::pair()?;
    ring.recv_multishot(b.as_raw_fd(), 1)?;
    ring.submit()?;
    crate::socket::writev(a.as_raw_fd(), &[IoSlice::new(b"probe")])?;
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(1);
    while out.is_empty() && Instant::now() < deadline {
        ring.wait(1, Some(Duration::from_millis(100)))?;
        ring.reap(&mut out);
    }
    let ok = match out.first() {
        Some(&Completion::Recv { buf_id, len: 5, more: true, .. }) => ring.buffer(buf_id) == Some(&b"probe"[..]),
        _ => false,
    };
    ring.cancel_fd(b.as_raw_fd())?;
    if ok {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP))
    }
}

/// An anonymous private mapping: page-aligned, zeroed, unmapped on drop.
struct Mmap {
    ptr: *mut u8,
    len: usize,
}

impl Mmap {
    fn new(len: usize) -> io::Result<Mmap> {
        let len = len.max(1);
        // SAFETY: a fresh anonymous mapping at an address the kernel picks; no existing
        // memory is affected.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mmap { ptr: ptr.cast(), len })
    }
}

impl Drop for Mmap {
    fn drop(&mut self) {
        if self.ptr.is_null() {
            return; // a placeholder left where a mapping was leaked
        }
        // SAFETY: `ptr`/`len` are exactly one mapping we created and nobody else unmaps.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// `struct io_uring_buf` (16 bytes). Entry 0's `resv` field is the ring's tail, which
/// the kernel reads; entries are therefore written field by field through raw pointers,
/// never through a reference to a whole entry.
#[repr(C)]
struct RawBuf {
    addr: u64,
    len: u32,
    bid: u16,
    resv: u16,
}

/// Length stored for a buffer that is in the kernel's ring.
const IN_KERNEL: u32 = u32::MAX;
/// Length stored for a free buffer kept out of the kernel's ring (`BufRing::spare`).
const SPARE: u32 = u32::MAX - 1;

/// Whether a buffer's stored length says the caller holds it.
fn is_held(len: u32) -> bool {
    len < SPARE
}

/// Deliveries over which [`BufRing`] looks for a ring deeper than it needs.
const EPOCH: u16 = 1024;

/// The provided buffers and their ring.
struct BufRing {
    ring: Mmap,
    data: Mmap,
    count: u16,
    size: u32,
    /// Next ring slot to fill (the kernel sees it once published to the shared tail).
    tail: u16,
    /// Per buffer: bytes held by the caller, [`IN_KERNEL`] or [`SPARE`].
    held: Vec<u32>,
    /// Free buffers kept out of the kernel's ring, the most recently used last.
    spare: Vec<u16>,
    /// Buffers in the kernel's ring (given, not yet delivered).
    queued: u16,
    /// How many free buffers the kernel's ring is kept at (`count` when
    /// `hot` is 0).
    depth: u16,
    /// The least `depth` ([`RingConfig::buf_hot`]; 0: every free buffer queued).
    hot: u16,
    /// Deliveries left in this epoch, and the fewest buffers queued in it.
    epoch_left: u16,
    low: u16,
}

impl BufRing {
    fn new(count: u16, size: u32, hot: u16) -> io::Result<BufRing> {
        if count == 0 || !count.is_power_of_two() || count > 32768 || size == 0 || hot > count {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        let ring = Mmap::new(count as usize * std::mem::size_of::<RawBuf>())?;
        let data_len =
            (count as usize).checked_mul(size as usize).ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
        let data = Mmap::new(data_len)?;
        let depth = if hot == 0 { count } else { hot };
        let mut bufs = BufRing {
            ring,
            data,
            count,
            size,
            tail: 0,
            held: vec![SPARE; count as usize],
            spare: (0..count).rev().collect(),
            queued: 0,
            depth,
            hot,
            epoch_left: EPOCH,
            low: depth,
        };
        bufs.refill();
        Ok(bufs)
    }

    /// Tops the kernel's ring up to `depth` from the spare stack, the most
    /// recently used first.
    fn refill(&mut self) {
        let before = self.queued;
        while self.queued < self.depth {
            let Some(bid) = self.spare.pop() else { break };
            self.push(bid);
        }
        if self.queued != before {
            self.publish();
        }
    }

    /// The kernel delivered `len` bytes in buffer `bid` (taken from its ring);
    /// at the end of an epoch that never used half the ring's depth, the
    /// depth halves (down to `hot`).
    fn delivered(&mut self, bid: u16, len: u32) {
        self.held[bid as usize] = len.min(self.size);
        self.queued = self.queued.saturating_sub(1);
        self.low = self.low.min(self.queued);
        self.epoch_left -= 1;
        if self.epoch_left == 0 {
            if self.hot != 0 && self.low > self.depth / 2 {
                self.depth = (self.depth / 2).max(self.hot);
            }
            (self.epoch_left, self.low) = (EPOCH, self.queued);
        }
    }

    /// A receive found the kernel's ring empty: deepen it, if buffers were
    /// kept back.
    fn ran_dry(&mut self) {
        if self.hot != 0 && self.depth < self.count {
            self.depth = self.depth.saturating_mul(2).min(self.count);
            (self.epoch_left, self.low) = (EPOCH, self.depth);
            self.refill();
        }
    }

    fn entries(&self) -> *mut RawBuf {
        self.ring.ptr.cast()
    }

    /// Puts buffer `bid` in the next ring slot (not yet visible to the kernel).
    fn push(&mut self, bid: u16) {
        debug_assert_eq!(self.held[bid as usize], SPARE);
        let slot = (self.tail & (self.count - 1)) as usize;
        // SAFETY: `slot < count`, inside the ring mapping; `bid < count`, so the address
        // is inside the data mapping. The slot is free: at most `count - 1` other buffers
        // are in the ring (this one was not), so the kernel has consumed it.
        unsafe {
            let e = self.entries().add(slot);
            std::ptr::addr_of_mut!((*e).addr).write(self.data.ptr.add(bid as usize * self.size as usize) as u64);
            std::ptr::addr_of_mut!((*e).len).write(self.size);
            std::ptr::addr_of_mut!((*e).bid).write(bid);
        }
        self.held[bid as usize] = IN_KERNEL;
        self.queued += 1;
        self.tail = self.tail.wrapping_add(1);
    }

    /// Gives a held buffer back: onto the spare stack, then to the kernel's
    /// ring if it is below its depth; false (nothing done) if it is not held.
    fn give_back(&mut self, bid: u16) -> bool {
        match self.held.get(bid as usize) {
            Some(&len) if is_held(len) => {
                self.held[bid as usize] = SPARE;
                self.spare.push(bid);
                self.refill();
                true
            }
            _ => false,
        }
    }

    /// Makes pushed buffers visible to the kernel (release store of the shared tail).
    fn publish(&self) {
        // SAFETY: the tail is the aligned u16 `resv` of entry 0 inside the ring mapping,
        // which the kernel only reads; it is accessed atomically here as there.
        let tail = unsafe { AtomicU16::from_ptr(std::ptr::addr_of_mut!((*self.entries()).resv)) };
        tail.store(self.tail, Ordering::Release);
    }
}

/// What a slot of the ring's table holds: one operation in flight.
enum Op<B> {
    Free {
        next: usize,
    },
    Recv {
        token: u64,
    },
    Send {
        token: u64,
        state: Box<SendState<B>>,
    },
    Poll {
        token: u64,
    },
    /// A receive into `buf`'s spare capacity, at most `max` bytes.
    RecvInto {
        token: u64,
        buf: bytes::BytesMut,
        max: usize,
    },
    Cancel,
}

/// The memory a `sendmsg` reads until it completes; boxed so it never moves.
struct SendState<B> {
    msg: libc::msghdr,
    iovs: Vec<libc::iovec>,
    /// Owned so the payload lives until the kernel is done with it.
    bufs: Vec<B>,
}

/// Marks the end of the free list.
const NONE: usize = usize::MAX;

/// The table of operations in flight; a slot's index is its `user_data`. A slot is
/// reused only after its last completion, so a completion never finds a stranger.
struct Slots<B> {
    ops: Vec<Op<B>>,
    free: usize,
    in_flight: usize,
    /// Buffers of finished [`Op::RecvInto`]s, until the caller takes them.
    filled: Vec<(u64, bytes::BytesMut)>,
    /// Send states of finished sends, emptied, for the next sends: a send in
    /// steady state allocates nothing.
    // Boxed: the kernel holds pointers into a state while its send is out,
    // so a state must not move when the vector grows.
    #[allow(clippy::vec_box)]
    spare: Vec<Box<SendState<B>>>,
}

/// Send states kept for reuse (more than this many sends in flight at once
/// allocate the rest).
const SPARE_SENDS: usize = 64;

impl<B> Slots<B> {
    fn alloc(&mut self, op: Op<B>) -> usize {
        self.in_flight += 1;
        if self.free != NONE {
            let slot = self.free;
            if let Op::Free { next } = self.ops[slot] {
                self.free = next;
            }
            self.ops[slot] = op;
            slot
        } else {
            self.ops.push(op);
            self.ops.len() - 1
        }
    }

    /// Keeps a finished send's state for reuse; its payloads are dropped now.
    fn spare_send(&mut self, mut state: Box<SendState<B>>) {
        state.iovs.clear();
        state.bufs.clear();
        if self.spare.len() < SPARE_SENDS {
            self.spare.push(state);
        }
    }

    fn release(&mut self, slot: usize) -> Op<B> {
        self.in_flight -= 1;
        let op = std::mem::replace(&mut self.ops[slot], Op::Free { next: self.free });
        self.free = slot;
        op
    }

    /// Turns one completion into what the caller sees (None: nothing to report).
    fn complete(&mut self, bufs: &mut BufRing, slot: usize, res: i32, flags: u32) -> Option<Completion> {
        let more = cqueue::more(flags);
        let token = match self.ops.get(slot)? {
            Op::Recv { token } | Op::Send { token, .. } | Op::Poll { token } | Op::RecvInto { token, .. } => *token,
            Op::Cancel => 0,
            Op::Free { .. } => return None,
        };
        // Only a multishot receive posts completions flagged "more".
        let op = if more { Op::Recv { token } } else { self.release(slot) };
        match op {
            Op::Recv { .. } => match cqueue::buffer_select(flags).filter(|&b| b < bufs.count) {
                Some(buf_id) if res > 0 => {
                    bufs.delivered(buf_id, res as u32);
                    Some(Completion::Recv { token, buf_id, len: res as usize, more })
                }
                Some(buf_id) => {
                    // A buffer consumed without data: straight back to the kernel.
                    bufs.delivered(buf_id, 0);
                    bufs.give_back(buf_id);
                    (!more).then_some(Completion::RecvEnd { token, res })
                }
                None => {
                    if res == -libc::ENOBUFS {
                        bufs.ran_dry();
                    }
                    (!more).then_some(Completion::RecvEnd { token, res })
                }
            },
            Op::Send { state, .. } => {
                self.spare_send(state);
                Some(Completion::Send { token, res })
            }
            Op::Poll { .. } => Some(Completion::Poll { token, res }),
            Op::RecvInto { mut buf, max, .. } => {
                if res > 0 {
                    let n = (res as usize).min(max).min(buf.capacity() - buf.len());
                    // SAFETY: the kernel wrote `res` bytes (at most `max`, which fits the
                    // spare capacity, checked in `recv_into`) at the buffer's end.
                    unsafe { buf.set_len(buf.len() + n) };
                }
                self.filled.push((token, buf));
                Some(Completion::RecvInto { token, res })
            }
            Op::Cancel | Op::Free { .. } => None,
        }
    }
}

/// An io_uring with a provided-buffer ring. `B` is the type of send payloads (anything
/// that is bytes: `Vec<u8>`, `Box<[u8]>`, `bytes::Bytes`…), kept alive until the send
/// completes.
pub struct Ring<B: AsRef<[u8]> = Vec<u8>> {
    uring: IoUring,
    bufs: BufRing,
    slots: Slots<B>,
}

// SAFETY: the raw pointers inside (mappings, msghdr/iovec of pending sends) point only
// at memory this Ring owns; nothing is shared with another thread, so the Ring may move
// to another thread whenever its payloads may.
unsafe impl<B: AsRef<[u8]> + Send> Send for Ring<B> {}

impl<B: AsRef<[u8]>> Ring<B> {
    /// [`Ring::new`] with completion work deferred to the ring's waits
    /// ([`RingConfig::defer_taskrun`]) where the kernel takes it (6.1+; older
    /// kernels refuse the flags with `EINVAL`), else the plain kind.
    pub fn new_deferred(config: RingConfig) -> io::Result<Ring<B>> {
        match Ring::new(RingConfig { defer_taskrun: true, ..config }) {
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                Ring::new(RingConfig { defer_taskrun: false, ..config })
            }
            r => r,
        }
    }

    /// Creates the ring and registers `config.buf_count` buffers of `config.buf_size`
    /// bytes. `EINVAL` for a buffer count that is not a power of two (≤ 32768) or a
    /// zero size; the kernel's error when io_uring is unavailable.
    pub fn new(config: RingConfig) -> io::Result<Ring<B>> {
        let mut builder = IoUring::builder();
        builder.setup_cqsize(config.cq_entries.max(config.entries));
        if config.defer_taskrun {
            builder.setup_single_issuer().setup_defer_taskrun();
        }
        let uring = builder.build(config.entries)?;
        let bufs = BufRing::new(config.buf_count, config.buf_size, config.buf_hot)?;
        // SAFETY: the ring mapping holds `buf_count` entries and lives in `self.bufs` as
        // long as the IoUring (it is leaked, not unmapped, if operations outlive Drop).
        unsafe {
            uring.submitter().register_buf_ring_with_flags(bufs.ring.ptr as u64, config.buf_count, BGID, 0)?;
        }
        Ok(Ring {
            uring,
            bufs,
            slots: Slots { ops: Vec::new(), free: NONE, in_flight: 0, filled: Vec::new(), spare: Vec::new() },
        })
    }

    /// Bytes per provided buffer.
    pub fn buf_size(&self) -> usize {
        self.bufs.size as usize
    }

    /// Number of provided buffers.
    pub fn buf_count(&self) -> usize {
        self.bufs.count as usize
    }

    /// Buffers currently held by the caller (delivered, not yet recycled).
    pub fn buffers_held(&self) -> usize {
        self.bufs.held.iter().filter(|&&l| is_held(l)).count()
    }

    /// Operations submitted (or queued for submission) whose last completion has not
    /// been reaped yet.
    pub fn in_flight(&self) -> usize {
        self.slots.in_flight
    }

    /// Queues a multishot receive on `fd` into the provided buffers; its completions
    /// carry `token`. Submitted by the next [`submit`](Ring::submit) or
    /// [`wait`](Ring::wait).
    pub fn recv_multishot(&mut self, fd: RawFd, token: u64) -> io::Result<()> {
        let slot = self.slots.alloc(Op::Recv { token });
        let entry = opcode::RecvMulti::new(types::Fd(fd), BGID).build().user_data(slot as u64);
        self.push(slot, entry)
    }

    /// Queues one receive on `fd` into one provided buffer (at most a buffer's
    /// size): the single-shot kind of [`recv_multishot`](Ring::recv_multishot),
    /// for a caller that must bound what one wait delivers (a multishot
    /// receive goes on filling buffers for as long as bytes come). Its one
    /// completion is a [`Completion::Recv`] with `more` false, or a
    /// [`Completion::RecvEnd`].
    pub fn recv_once(&mut self, fd: RawFd, token: u64) -> io::Result<()> {
        let slot = self.slots.alloc(Op::Recv { token });
        // Length 0 with a selected buffer: the buffer's own length.
        let entry = opcode::Recv::new(types::Fd(fd), std::ptr::null_mut(), 0)
            .buf_group(BGID)
            .build()
            .flags(squeue::Flags::BUFFER_SELECT)
            .user_data(slot as u64);
        self.push(slot, entry)
    }

    /// Queues one receive of at most `max` bytes from `fd` onto the end of `buf`
    /// (into its spare capacity, grown to `max` first if smaller): for a caller that
    /// knows where the bytes should land, with no provided buffer and no copy. The
    /// ring owns `buf` until the completion ([`Completion::RecvInto`]), then hands it
    /// back through [`take_filled`](Ring::take_filled) with the bytes appended. On
    /// failure to queue, `buf` comes back with the error, unchanged.
    pub fn recv_into(
        &mut self,
        fd: RawFd,
        token: u64,
        mut buf: bytes::BytesMut,
        max: usize,
    ) -> Result<(), (io::Error, bytes::BytesMut)> {
        let max = max.min(u32::MAX as usize);
        if buf.capacity() - buf.len() < max {
            buf.reserve(max);
        }
        // The heap block does not move when `buf` moves into the slot.
        let ptr = buf.spare_capacity_mut().as_mut_ptr().cast::<u8>();
        let slot = self.slots.alloc(Op::RecvInto { token, buf, max });
        let entry = opcode::Recv::new(types::Fd(fd), ptr, max as u32).build().user_data(slot as u64);
        match self.try_push(&entry) {
            Ok(()) => Ok(()),
            Err(e) => match self.slots.release(slot) {
                Op::RecvInto { buf, .. } => Err((e, buf)),
                _ => unreachable!("the slot just filled"),
            },
        }
    }

    /// The buffer of a finished [`recv_into`](Ring::recv_into) with `token`, with the
    /// bytes received appended; `None` if there is none (taken already).
    pub fn take_filled(&mut self, token: u64) -> Option<bytes::BytesMut> {
        let i = self.slots.filled.iter().position(|(t, _)| *t == token)?;
        Some(self.slots.filled.swap_remove(i).1)
    }

    /// Queues one `sendmsg(MSG_NOSIGNAL | MSG_WAITALL)` of all of `bufs` in order on
    /// `fd`; the kernel retries short writes itself, so the completion reports all
    /// bytes or an error. The payloads are dropped when the completion is reaped.
    pub fn send(&mut self, fd: RawFd, token: u64, mut bufs: Vec<B>) -> io::Result<()> {
        self.send_drain(fd, token, &mut bufs)
    }

    /// [`send`](Ring::send) of the payloads moved out of `bufs`, which is left
    /// empty with its capacity: with the ring's own reuse of send states, a
    /// caller that sends from one vector again and again allocates nothing.
    /// On error `bufs` is left as it was.
    pub fn send_drain(&mut self, fd: RawFd, token: u64, bufs: &mut Vec<B>) -> io::Result<()> {
        if bufs.len() > libc::UIO_MAXIOV as usize {
            return Err(io::Error::from_raw_os_error(libc::EMSGSIZE));
        }
        let mut state = match self.slots.spare.pop() {
            Some(s) => s,
            // SAFETY: msghdr is plain data; all-zero is "no name, no iov, no control".
            None => Box::new(SendState { msg: unsafe { std::mem::zeroed() }, iovs: Vec::new(), bufs: Vec::new() }),
        };
        // The iovecs point into the payloads where the state holds them (a
        // payload with its bytes inline would move with it).
        state.bufs.append(bufs);
        let SendState { iovs, bufs: held, .. } = &mut *state;
        iovs.extend(held.iter().map(|b| {
            let s = b.as_ref();
            libc::iovec { iov_base: s.as_ptr() as *mut _, iov_len: s.len() }
        }));
        state.msg.msg_iov = state.iovs.as_mut_ptr();
        state.msg.msg_iovlen = state.iovs.len() as _;
        let msg_ptr: *const libc::msghdr = &state.msg;
        let slot = self.slots.alloc(Op::Send { token, state });
        let entry = opcode::SendMsg::new(types::Fd(fd), msg_ptr)
            .flags((libc::MSG_NOSIGNAL | libc::MSG_WAITALL) as u32)
            .build()
            .user_data(slot as u64);
        match self.try_push(&entry) {
            Ok(()) => Ok(()),
            Err(e) => {
                if let Op::Send { mut state, .. } = self.slots.release(slot) {
                    bufs.append(&mut state.bufs);
                    self.slots.spare_send(state);
                }
                Err(e)
            }
        }
    }

    /// Queues a one-shot wait for `fd` to become readable (such as an eventfd that
    /// other threads notify); its completion is [`Completion::Poll`].
    pub fn poll_readable(&mut self, fd: RawFd, token: u64) -> io::Result<()> {
        let slot = self.slots.alloc(Op::Poll { token });
        let entry = opcode::PollAdd::new(types::Fd(fd), libc::POLLIN as u32).build().user_data(slot as u64);
        self.push(slot, entry)
    }

    /// Queues a one-shot wait for `fd` to take more bytes (a connection whose
    /// send buffer was full); its completion is [`Completion::Poll`] with
    /// `POLLOUT` (or `POLLERR`/`POLLHUP`: a write then reports the error).
    pub fn poll_writable(&mut self, fd: RawFd, token: u64) -> io::Result<()> {
        let slot = self.slots.alloc(Op::Poll { token });
        let entry = opcode::PollAdd::new(types::Fd(fd), libc::POLLOUT as u32).build().user_data(slot as u64);
        self.push(slot, entry)
    }

    /// Queues cancellation of every operation on `fd`; each one then completes (with
    /// `-ECANCELED` unless it finished first). Call it before closing the fd.
    pub fn cancel_fd(&mut self, fd: RawFd) -> io::Result<()> {
        let slot = self.slots.alloc(Op::Cancel);
        let entry =
            opcode::AsyncCancel2::new(types::CancelBuilder::fd(types::Fd(fd)).all()).build().user_data(slot as u64);
        self.push(slot, entry)
    }

    /// Queues cancellation of the receive(s) (multishot or `recv_into`) submitted with `token`, leaving
    /// other operations on the same fd (a send) alone. Returns how many were found;
    /// each then ends with its last completion (`-ECANCELED` unless it ended first).
    pub fn cancel_recv(&mut self, token: u64) -> io::Result<usize> {
        let targets: Vec<usize> = self
            .slots
            .ops
            .iter()
            .enumerate()
            .filter(|(_, op)| matches!(op, Op::Recv { token: t } | Op::RecvInto { token: t, .. } if *t == token))
            .map(|(i, _)| i)
            .collect();
        for &target in &targets {
            let slot = self.slots.alloc(Op::Cancel);
            let entry = opcode::AsyncCancel::new(target as u64).build().user_data(slot as u64);
            self.push(slot, entry)?;
        }
        Ok(targets.len())
    }

    /// Submits queued operations without waiting; returns how many were submitted.
    pub fn submit(&mut self) -> io::Result<usize> {
        self.uring.submit()
    }

    /// Submits queued operations and waits until at least `want` completions are ready
    /// or `timeout` passes (`None`: no limit). A timeout or a signal is not an error:
    /// reap to see what arrived.
    #[inline]
    pub fn wait(&mut self, want: usize, timeout: Option<Duration>) -> io::Result<()> {
        let r = match timeout {
            None if want > 0 => self.enter_and_wait(want),
            None => self.uring.submit_and_wait(want),
            Some(t) => {
                let ts = types::Timespec::new().sec(t.as_secs()).nsec(t.subsec_nanos());
                let args = types::SubmitArgs::new().timespec(&ts);
                self.uring.submitter().submit_with_args(want, &args)
            }
        };
        match r {
            Ok(_) => Ok(()),
            Err(e) if matches!(e.raw_os_error(), Some(libc::ETIME | libc::EINTR | libc::EBUSY)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// `io_uring_enter(2)`: submit what is queued, wait for `want`
    /// completions. Made here rather than with the io_uring crate's
    /// `submit_and_wait` (the same call) so that it is inlined into the
    /// caller: a wait switches to other threads, and after a context switch
    /// every return through a frame made before it is mispredicted (~12 ns
    /// each on the 2-CPU VM of `docs/performance.md`); the crate's calls were
    /// two frames more under every wait.
    #[inline(always)]
    fn enter_and_wait(&mut self, want: usize) -> io::Result<usize> {
        // `IORING_ENTER_GETEVENTS` (include/uapi/linux/io_uring.h).
        const GETEVENTS: libc::c_uint = 1;
        // What is queued and not yet submitted (the tail was published when
        // each entry was pushed).
        let to_submit = self.uring.submission().len() as libc::c_uint;
        let fd = self.uring.as_raw_fd();
        // SAFETY: `fd` is this ring's, open while `self` is; the argument
        // pointer is null (no signal mask, no extended argument), so the
        // kernel reads and writes no memory of ours but the ring's.
        let r = unsafe {
            libc::syscall(
                libc::SYS_io_uring_enter,
                fd,
                to_submit,
                want as libc::c_uint,
                GETEVENTS,
                std::ptr::null::<libc::sigset_t>(),
                std::mem::size_of::<libc::sigset_t>(),
            )
        };
        match r {
            n if n >= 0 => Ok(n as usize),
            _ => Err(io::Error::last_os_error()),
        }
    }

    /// Moves every ready completion into `out` (appending); returns how many were
    /// added. Completions of cancel requests are consumed here and not reported.
    pub fn reap(&mut self, out: &mut Vec<Completion>) -> usize {
        let before = out.len();
        let (slots, bufs) = (&mut self.slots, &mut self.bufs);
        for cqe in self.uring.completion() {
            if let Some(c) = slots.complete(bufs, cqe.user_data() as usize, cqe.result(), cqe.flags()) {
                out.push(c);
            }
        }
        out.len() - before
    }

    /// The bytes of buffer `buf_id` while the caller holds it (after a
    /// [`Completion::Recv`], before [`recycle`](Ring::recycle)); `None` otherwise.
    pub fn buffer(&self, buf_id: u16) -> Option<&[u8]> {
        let len = *self.bufs.held.get(buf_id as usize)?;
        if !is_held(len) {
            return None;
        }
        // SAFETY: the buffer is held by the caller, so it is not in the kernel's ring and
        // nothing writes it until `recycle`, which needs `&mut self` and so cannot run
        // while this borrow lives; `len <= buf_size` came from the kernel's completion.
        Some(unsafe {
            std::slice::from_raw_parts(self.bufs.data.ptr.add(buf_id as usize * self.bufs.size as usize), len as usize)
        })
    }

    /// Gives buffer `buf_id` back to the kernel. Returns false (and does nothing) if the
    /// caller does not hold it, so a double recycle cannot put a buffer in the ring twice.
    pub fn recycle(&mut self, buf_id: u16) -> bool {
        self.bufs.give_back(buf_id)
    }

    /// Pushes an entry whose memory is owned by `slot`; frees the slot on failure.
    fn push(&mut self, slot: usize, entry: squeue::Entry) -> io::Result<()> {
        let r = self.try_push(&entry);
        if r.is_err() {
            self.slots.release(slot);
        }
        r
    }

    /// Pushes an entry whose memory is owned by a slot, which the caller frees on failure.
    fn try_push(&mut self, entry: &squeue::Entry) -> io::Result<()> {
        for attempt in 0..2 {
            // SAFETY: every pointer in `entry` refers to memory owned by the slot in its
            // `user_data` or by `self.bufs`, which stays alive and in place until the
            // slot's last completion is reaped (or is leaked by Drop).
            if unsafe { self.uring.submission().push(entry) }.is_ok() {
                return Ok(());
            }
            if attempt == 0 {
                // The submission queue is full: hand it to the kernel, then retry once.
                self.uring.submit()?;
            }
        }
        Err(io::Error::from_raw_os_error(libc::EBUSY))
    }
}

impl<B: AsRef<[u8]>> Drop for Ring<B> {
    fn drop(&mut self) {
        if self.slots.in_flight == 0 {
            return;
        }
        // Cancel everything and wait, so the kernel is done with our memory before it
        // is freed.
        let entry = opcode::AsyncCancel2::new(types::CancelBuilder::any()).build().user_data(u64::MAX);
        let _ = self.uring.submit();
        // SAFETY: a cancel request carries no pointers.
        let _ = unsafe { self.uring.submission().push(&entry) };
        let deadline = Instant::now() + DROP_WAIT;
        let mut sink = Vec::new();
        while self.slots.in_flight > 0 && Instant::now() < deadline {
            if self.wait(1, Some(Duration::from_millis(10))).is_err() {
                break;
            }
            sink.clear();
            self.reap(&mut sink);
        }
        if self.slots.in_flight > 0 {
            // The kernel may still write into the buffers or read pending sends: leak
            // them rather than free memory under it.
            std::mem::forget(std::mem::take(&mut self.slots.ops));
            let data = std::mem::replace(&mut self.bufs.data, Mmap { ptr: std::ptr::null_mut(), len: 0 });
            std::mem::forget(data);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        (c, s)
    }

    /// Reaps until `pred` holds for the collected completions or 5 s pass.
    fn reap_until<B: AsRef<[u8]>>(ring: &mut Ring<B>, out: &mut Vec<Completion>, pred: impl Fn(&[Completion]) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !pred(out) && Instant::now() < deadline {
            ring.wait(1, Some(Duration::from_millis(50))).unwrap();
            ring.reap(out);
        }
        assert!(pred(out), "completions so far: {out:?}");
    }

    #[test]
    fn io_uring_is_supported_on_this_kernel() {
        // Platform notes: multishot recv with a provided-buffer ring works here.
        assert!(supported());
    }

    #[test]
    fn multishot_receives_several_messages_into_provided_buffers() {
        let (mut a, b) = pair();
        let mut ring: Ring =
            Ring::new(RingConfig { entries: 8, cq_entries: 64, buf_count: 8, buf_size: 64, ..RingConfig::default() })
                .unwrap();
        ring.recv_multishot(b.as_raw_fd(), 11).unwrap();
        ring.submit().unwrap();
        let mut got = Vec::new();
        let mut out = Vec::new();
        for i in 0..5u8 {
            let msg = vec![b'a' + i; 10 + i as usize];
            a.write_all(&msg).unwrap();
            // One write at a time, so each arrives as its own completion.
            let before = out.len();
            reap_until(&mut ring, &mut out, |c| c.len() > before);
            for c in &out[before..] {
                match *c {
                    Completion::Recv { token: 11, buf_id, len, more: true } => {
                        got.extend_from_slice(ring.buffer(buf_id).unwrap());
                        assert_eq!(ring.buffer(buf_id).unwrap().len(), len);
                        assert!(ring.recycle(buf_id));
                        assert!(!ring.recycle(buf_id), "a second recycle must be refused");
                        assert_eq!(ring.buffer(buf_id), None);
                    }
                    other => panic!("unexpected {other:?}"),
                }
            }
        }
        let want: Vec<u8> = (0..5u8).flat_map(|i| vec![b'a' + i; 10 + i as usize]).collect();
        assert_eq!(got, want);
        assert_eq!(ring.in_flight(), 1);
        // End of stream ends the multishot receive.
        drop(a);
        out.clear();
        reap_until(&mut ring, &mut out, |c| c.iter().any(|c| matches!(c, Completion::RecvEnd { .. })));
        assert_eq!(out.last(), Some(&Completion::RecvEnd { token: 11, res: 0 }));
        assert_eq!(ring.in_flight(), 0);
    }

    #[test]
    fn large_data_splits_over_buffers_and_runs_out_with_enobufs() {
        let (mut a, b) = pair();
        let mut ring: Ring =
            Ring::new(RingConfig { entries: 8, cq_entries: 64, buf_count: 4, buf_size: 100, ..RingConfig::default() })
                .unwrap();
        ring.recv_multishot(b.as_raw_fd(), 3).unwrap();
        ring.submit().unwrap();
        // 1000 bytes, 4 buffers of 100, none recycled: 400 bytes arrive, then ENOBUFS.
        let data: Vec<u8> = (0..1000u32).map(|i| (i % 251) as u8).collect();
        a.write_all(&data).unwrap();
        let mut out = Vec::new();
        reap_until(&mut ring, &mut out, |c| {
            c.iter().any(|c| matches!(c, Completion::RecvEnd { .. } | Completion::Recv { more: false, .. }))
        });
        let mut got = Vec::new();
        for c in &out {
            if let Completion::Recv { buf_id, len, .. } = *c {
                assert!(len <= 100);
                got.extend_from_slice(ring.buffer(buf_id).unwrap());
            }
        }
        assert_eq!(got.len(), 400, "{out:?}");
        assert_eq!(got, data[..400]);
        assert_eq!(ring.buffers_held(), 4);
        assert_eq!(out.last(), Some(&Completion::RecvEnd { token: 3, res: -libc::ENOBUFS }));
        assert_eq!(ring.in_flight(), 0);
        // Recycle and resubmit: the rest arrives, in order.
        for id in 0..4 {
            assert!(ring.recycle(id));
        }
        ring.recv_multishot(b.as_raw_fd(), 4).unwrap();
        let mut rest = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(5);
        while rest.len() < 600 && Instant::now() < deadline {
            out.clear();
            ring.wait(1, Some(Duration::from_millis(50))).unwrap();
            ring.reap(&mut out);
            for c in &out {
                match *c {
                    Completion::Recv { buf_id, more, .. } => {
                        rest.extend_from_slice(ring.buffer(buf_id).unwrap());
                        ring.recycle(buf_id);
                        if !more {
                            ring.recv_multishot(b.as_raw_fd(), 4).unwrap();
                        }
                    }
                    // We recycle only after each reap, so the kernel can run out of
                    // buffers again: resubmit, as a driver does.
                    Completion::RecvEnd { res, .. } if res == -libc::ENOBUFS => {
                        ring.recv_multishot(b.as_raw_fd(), 4).unwrap();
                    }
                    Completion::RecvEnd { res, .. } => panic!("ended with {res}"),
                    _ => {}
                }
            }
        }
        assert_eq!(rest, data[400..]);
        ring.cancel_fd(b.as_raw_fd()).unwrap();
        out.clear();
        reap_until(&mut ring, &mut out, |c| c.iter().any(|c| matches!(c, Completion::RecvEnd { .. })));
        assert!(out.contains(&Completion::RecvEnd { token: 4, res: -libc::ECANCELED }), "{out:?}");
        assert_eq!(ring.in_flight(), 0);
    }

    /// Sends `msgs` messages of 10 bytes one at a time on `a`, each received on
    /// `ring` (multishot on `b`, token 5) and recycled before the next is sent;
    /// returns the buffer each landed in.
    fn one_at_a_time(ring: &mut Ring, a: &mut TcpStream, b: &TcpStream, msgs: usize) -> Vec<u16> {
        let mut ids = Vec::new();
        let mut armed = false;
        for i in 0..msgs {
            if !armed {
                ring.recv_multishot(b.as_raw_fd(), 5).unwrap();
                armed = true;
            }
            a.write_all(&[i as u8; 10]).unwrap();
            let mut out = Vec::new();
            reap_until(ring, &mut out, |c| c.iter().any(|c| matches!(c, Completion::Recv { .. })));
            for c in out {
                if let Completion::Recv { buf_id, len, more, .. } = c {
                    assert_eq!(ring.buffer(buf_id).unwrap(), &[i as u8; 10][..len]);
                    assert_eq!(len, 10, "message {i}: one message a receive");
                    ids.push(buf_id);
                    assert!(ring.recycle(buf_id));
                    armed &= more;
                }
            }
        }
        ids
    }

    #[test]
    fn hot_buffers_are_reused_most_recent_first() {
        // Every free buffer queued (`buf_hot` 0): the kernel takes them in the
        // order given, so one message at a time walks through all of them.
        let (mut a, b) = pair();
        let cold = RingConfig { entries: 8, cq_entries: 64, buf_count: 8, buf_size: 64, ..RingConfig::default() };
        let mut ring: Ring = Ring::new(cold).unwrap();
        let ids = one_at_a_time(&mut ring, &mut a, &b, 16);
        let used: std::collections::BTreeSet<u16> = ids.iter().copied().collect();
        assert_eq!(used.len(), 8, "{ids:?}");

        // Two kept queued: the same two buffers take every message.
        let (mut a, b) = pair();
        let mut ring: Ring = Ring::new(RingConfig { buf_hot: 2, ..cold }).unwrap();
        let ids = one_at_a_time(&mut ring, &mut a, &b, 16);
        let used: std::collections::BTreeSet<u16> = ids.iter().copied().collect();
        assert_eq!(used.len(), 2, "{ids:?}");
        assert_eq!(ring.buffers_held(), 0);
    }

    #[test]
    fn a_hot_ring_that_runs_dry_deepens_and_loses_nothing() {
        let (mut a, b) = pair();
        let config =
            RingConfig { entries: 8, cq_entries: 64, buf_count: 8, buf_size: 64, buf_hot: 2, ..RingConfig::default() };
        let mut ring: Ring = Ring::new(config).unwrap();
        ring.recv_multishot(b.as_raw_fd(), 6).unwrap();
        // Six messages, one receive each, none recycled: the third finds the
        // two queued buffers gone (ENOBUFS while six are free), and the ring
        // deepens to four; resubmitted, the rest arrive in order.
        let mut got = Vec::new();
        let mut held = Vec::new();
        let mut dry = 0;
        for i in 0..6u8 {
            a.write_all(&[i; 10]).unwrap();
            let mut out = Vec::new();
            reap_until(&mut ring, &mut out, |c| {
                c.iter().any(|c| matches!(c, Completion::Recv { .. } | Completion::RecvEnd { .. }))
            });
            for c in out {
                match c {
                    Completion::Recv { buf_id, more, .. } => {
                        got.extend_from_slice(ring.buffer(buf_id).unwrap());
                        held.push(buf_id);
                        if !more {
                            ring.recv_multishot(b.as_raw_fd(), 6).unwrap();
                        }
                    }
                    Completion::RecvEnd { res, .. } => {
                        assert_eq!(res, -libc::ENOBUFS);
                        assert!(ring.buffers_held() < 8, "ran dry with buffers kept back");
                        dry += 1;
                        ring.recv_multishot(b.as_raw_fd(), 6).unwrap();
                        // The message that found the ring empty is still in the socket.
                        let mut more = Vec::new();
                        reap_until(&mut ring, &mut more, |c| c.iter().any(|c| matches!(c, Completion::Recv { .. })));
                        for c in more {
                            if let Completion::Recv { buf_id, .. } = c {
                                got.extend_from_slice(ring.buffer(buf_id).unwrap());
                                held.push(buf_id);
                            }
                        }
                    }
                    _ => {}
                }
            }
        }
        let want: Vec<u8> = (0..6u8).flat_map(|i| [i; 10]).collect();
        assert_eq!(got, want);
        assert!(dry >= 1, "two queued buffers never ran out");
        assert_eq!(held.len(), 6);
        for id in held {
            assert!(ring.recycle(id));
        }
        // Deepened to 4, then (at least) 8: after two epochs of one message at a
        // time it is back to two buffers in use.
        let ids = one_at_a_time(&mut ring, &mut a, &b, 2 * EPOCH as usize + 16);
        let last: std::collections::BTreeSet<u16> = ids[ids.len() - 16..].iter().copied().collect();
        assert_eq!(last.len(), 2, "{:?}", &ids[ids.len() - 16..]);
    }

    #[test]
    fn buf_hot_above_the_count_is_refused() {
        let r = Ring::<Vec<u8>>::new(RingConfig { buf_count: 4, buf_hot: 5, ..RingConfig::default() });
        assert_eq!(r.err().and_then(|e| e.raw_os_error()), Some(libc::EINVAL));
    }

    #[test]
    fn batched_sends_complete_with_all_bytes() {
        let (a, mut b) = pair();
        let mut ring: Ring<Vec<u8>> = Ring::new(RingConfig::default()).unwrap();
        // One vectored send of three slices; then a batch of eight sends in flight at
        // once, each on its own connection (one send per socket at a time).
        ring.send(a.as_raw_fd(), 1, vec![b"head-".to_vec(), b"body-".to_vec(), b"tail".to_vec()]).unwrap();
        let mut out = Vec::new();
        reap_until(&mut ring, &mut out, |c| !c.is_empty());
        assert_eq!(out, vec![Completion::Send { token: 1, res: 14 }]);
        let mut buf = [0u8; 14];
        b.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"head-body-tail");

        let conns: Vec<(TcpStream, TcpStream)> = (0..8).map(|_| pair()).collect();
        for (i, (c, _)) in conns.iter().enumerate() {
            let payload = vec![vec![i as u8; 1000], vec![0xEE; 24]];
            ring.send(c.as_raw_fd(), 100 + i as u64, payload).unwrap();
        }
        out.clear();
        reap_until(&mut ring, &mut out, |c| c.len() == 8);
        let mut tokens: Vec<u64> = out
            .iter()
            .map(|c| match *c {
                Completion::Send { token, res: 1024 } => token,
                other => panic!("unexpected {other:?}"),
            })
            .collect();
        tokens.sort_unstable();
        assert_eq!(tokens, (100..108).collect::<Vec<_>>());
        for (i, (_, s)) in conns.iter().enumerate() {
            let mut got = vec![0u8; 1024];
            (&*s).read_exact(&mut got).unwrap();
            assert!(got[..1000].iter().all(|&x| x == i as u8) && got[1000..].iter().all(|&x| x == 0xEE));
        }
        assert_eq!(ring.in_flight(), 0);
    }

    #[test]
    fn sends_from_one_vector_reuse_state_and_point_at_the_moved_payloads() {
        let (a, mut b) = pair();
        // Payloads with their bytes inline: an iovec taken before the move into
        // the ring would point at the caller's vector, whose next contents differ.
        let mut ring: Ring<[u8; 4]> = Ring::new(RingConfig::default()).unwrap();
        let mut v: Vec<[u8; 4]> = Vec::with_capacity(8);
        let mut want = Vec::new();
        let mut out = Vec::new();
        for i in 0..60u32 {
            for k in 0..(i % 5 + 1) {
                let p = (i * 8 + k).to_be_bytes();
                want.extend_from_slice(&p);
                v.push(p);
            }
            let n = v.len() * 4;
            ring.send_drain(a.as_raw_fd(), i as u64, &mut v).unwrap();
            assert!(v.is_empty() && v.capacity() >= 8, "emptied, room kept");
            // Overwrite the caller's memory before the kernel runs the send.
            v.extend_from_slice(&[[0xAA; 4]; 8]);
            v.clear();
            out.clear();
            reap_until(&mut ring, &mut out, |c| !c.is_empty());
            assert_eq!(out, vec![Completion::Send { token: i as u64, res: n as i32 }]);
        }
        assert_eq!(ring.slots.spare.len(), 1, "one state serves every send in turn");
        let mut got = vec![0u8; want.len()];
        b.read_exact(&mut got).unwrap();
        assert!(got == want, "bytes in order, none stale");

        let too_many = vec![[0u8; 4]; libc::UIO_MAXIOV as usize + 1];
        let mut v = too_many.clone();
        let e = ring.send_drain(a.as_raw_fd(), 99, &mut v).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EMSGSIZE));
        assert_eq!(v.len(), too_many.len(), "left as it was");
    }

    #[test]
    fn large_send_is_completed_by_the_kernel_despite_short_writes() {
        let (a, b) = pair();
        // A send buffer far smaller than the payload forces many partial writes (a
        // tiny one makes loopback crawl: 8 KiB takes ~2 s for 4 MiB, blocking or not).
        crate::socket::set_sndbuf(a.as_raw_fd(), 64 * 1024).unwrap();
        let mut ring: Ring<Box<[u8]>> = Ring::new(RingConfig::default()).unwrap();
        let data: Vec<u8> = (0..1024 * 1024u32).map(|i| (i * 7 % 256) as u8).collect();
        ring.send(a.as_raw_fd(), 9, vec![data.clone().into_boxed_slice()]).unwrap();
        ring.submit().unwrap();
        let reader = std::thread::spawn(move || {
            let mut got = vec![0u8; 1024 * 1024];
            (&b).read_exact(&mut got).unwrap();
            got
        });
        let mut out = Vec::new();
        reap_until(&mut ring, &mut out, |c| !c.is_empty());
        assert_eq!(out, vec![Completion::Send { token: 9, res: 1024 * 1024 }]);
        assert!(reader.join().unwrap() == data);
    }

    #[test]
    fn send_to_reset_peer_fails_without_sigpipe() {
        let (a, b) = pair();
        crate::socket::abort(b.as_raw_fd()).unwrap();
        drop(b);
        let mut ring: Ring = Ring::new(RingConfig::default()).unwrap();
        let mut res = 0;
        // The first send may still be accepted before the reset is seen.
        for attempt in 0..50 {
            ring.send(a.as_raw_fd(), attempt, vec![vec![1u8; 100]]).unwrap();
            let mut out = Vec::new();
            reap_until(&mut ring, &mut out, |c| !c.is_empty());
            let Completion::Send { res: r, .. } = out[0] else { panic!("{out:?}") };
            res = r;
            if res < 0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(res == -libc::EPIPE || res == -libc::ECONNRESET, "res {res}");
    }

    #[test]
    fn poll_completes_when_an_eventfd_is_notified() {
        let efd = crate::eventfd::EventFd::new().unwrap();
        let mut ring: Ring = Ring::new(RingConfig::default()).unwrap();
        ring.poll_readable(efd.as_raw_fd(), 5).unwrap();
        ring.wait(1, Some(Duration::from_millis(30))).unwrap();
        let mut out = Vec::new();
        assert_eq!(ring.reap(&mut out), 0, "nothing to report before the notify");
        efd.notify().unwrap();
        reap_until(&mut ring, &mut out, |c| !c.is_empty());
        assert_eq!(out, vec![Completion::Poll { token: 5, res: libc::POLLIN as i32 }]);
        assert_eq!(efd.drain().unwrap(), 1);
    }

    #[test]
    fn poll_writable_completes_when_a_full_connection_takes_more() {
        let (a, mut b) = pair();
        a.set_nonblocking(true).unwrap();
        // Fill the connection: bounded by its buffers (a few MiB at most).
        let chunk = [7u8; 64 << 10];
        let mut written = 0usize;
        for _ in 0..4096 {
            match (&a).write(&chunk) {
                Ok(n) => written += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => panic!("{e}"),
            }
        }
        assert!(matches!((&a).write(&chunk), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock), "not full");
        let mut ring: Ring = Ring::new(RingConfig::default()).unwrap();
        ring.poll_writable(a.as_raw_fd(), 9).unwrap();
        ring.wait(1, Some(Duration::from_millis(30))).unwrap();
        let mut out = Vec::new();
        assert_eq!(ring.reap(&mut out), 0, "nothing to report while the connection is full");
        // The peer reads it all: room again.
        let mut buf = vec![0u8; 64 << 10];
        let mut read = 0usize;
        while read < written {
            read += b.read(&mut buf).unwrap();
        }
        reap_until(&mut ring, &mut out, |c| !c.is_empty());
        assert!(matches!(out[..], [Completion::Poll { token: 9, res }] if res & libc::POLLOUT as i32 != 0), "{out:?}");
    }

    #[test]
    fn config_is_checked_and_drop_with_operations_in_flight_is_clean() {
        for bad in [0u16, 3, 100] {
            let r = Ring::<Vec<u8>>::new(RingConfig { buf_count: bad, ..RingConfig::default() });
            assert_eq!(r.err().unwrap().raw_os_error(), Some(libc::EINVAL));
        }
        let r = Ring::<Vec<u8>>::new(RingConfig { buf_size: 0, ..RingConfig::default() });
        assert_eq!(r.err().unwrap().raw_os_error(), Some(libc::EINVAL));

        let (_a, b) = pair();
        let efd = crate::eventfd::EventFd::new().unwrap();
        let mut ring: Ring = Ring::new(RingConfig::default()).unwrap();
        ring.recv_multishot(b.as_raw_fd(), 1).unwrap();
        ring.poll_readable(efd.as_raw_fd(), 2).unwrap();
        ring.submit().unwrap();
        assert_eq!(ring.in_flight(), 2);
        let t = Instant::now();
        drop(ring);
        // Cancelled and waited for, well within the drop limit.
        assert!(t.elapsed() < DROP_WAIT, "{:?}", t.elapsed());
    }

    #[test]
    fn a_full_submission_queue_is_flushed_to_the_kernel() {
        let mut ring: Ring =
            Ring::new(RingConfig { entries: 2, cq_entries: 16, buf_count: 2, buf_size: 64, ..RingConfig::default() })
                .unwrap();
        let efds: Vec<_> = (0..6).map(|_| crate::eventfd::EventFd::new().unwrap()).collect();
        // Six polls queued without an explicit submit through a 2-entry queue.
        for (i, e) in efds.iter().enumerate() {
            ring.poll_readable(e.as_raw_fd(), i as u64).unwrap();
        }
        assert_eq!(ring.in_flight(), 6);
        for e in &efds {
            e.notify().unwrap();
        }
        let mut out = Vec::new();
        reap_until(&mut ring, &mut out, |c| c.len() == 6);
        let mut tokens: Vec<u64> =
            out.iter().map(|c| if let Completion::Poll { token, .. } = *c { token } else { u64::MAX }).collect();
        tokens.sort_unstable();
        assert_eq!(tokens, (0..6).collect::<Vec<_>>());
        assert_eq!(ring.in_flight(), 0);
    }

    #[test]
    fn cancel_recv_ends_the_receive_and_leaves_other_operations() {
        let (mut a, b) = pair();
        let efd = crate::eventfd::EventFd::new().unwrap();
        // Completion work deferred to waits, as the runtime's workers run it.
        let mut ring: Ring = Ring::new(RingConfig { defer_taskrun: true, ..RingConfig::default() }).unwrap();
        ring.recv_multishot(b.as_raw_fd(), 7).unwrap();
        ring.poll_readable(efd.as_raw_fd(), 8).unwrap();
        a.write_all(b"before").unwrap();
        let mut out = Vec::new();
        reap_until(&mut ring, &mut out, |c| !c.is_empty());
        assert!(matches!(out[0], Completion::Recv { token: 7, len: 6, more: true, .. }), "{out:?}");
        if let Completion::Recv { buf_id, .. } = out[0] {
            ring.recycle(buf_id);
        }
        assert_eq!(ring.cancel_recv(7).unwrap(), 1);
        assert_eq!(ring.cancel_recv(99).unwrap(), 0, "no receive with that token");
        out.clear();
        reap_until(&mut ring, &mut out, |c| c.iter().any(|c| matches!(c, Completion::RecvEnd { .. })));
        assert_eq!(out, vec![Completion::RecvEnd { token: 7, res: -libc::ECANCELED }]);
        // The poll on another fd is still in flight and still works; bytes sent now
        // stay in the socket.
        assert_eq!(ring.in_flight(), 1);
        a.write_all(b"after").unwrap();
        efd.notify().unwrap();
        out.clear();
        reap_until(&mut ring, &mut out, |c| !c.is_empty());
        assert_eq!(out, vec![Completion::Poll { token: 8, res: libc::POLLIN as i32 }]);
        let mut buf = [0u8; 16];
        let n = (&b).read(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"after");
    }

    #[test]
    fn recv_into_appends_to_the_callers_buffer_and_can_be_cancelled() {
        let (mut a, b) = pair();
        let mut ring: Ring = Ring::new(RingConfig { defer_taskrun: true, ..RingConfig::default() }).unwrap();
        let mut buf = bytes::BytesMut::with_capacity(8);
        buf.extend_from_slice(b"kept:");
        // Room for 100 000 bytes is made; at most 70 000 may come.
        ring.recv_into(b.as_raw_fd(), 5, buf, 70_000).unwrap();
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 253) as u8).collect();
        a.write_all(&data).unwrap();
        let mut out = Vec::new();
        reap_until(&mut ring, &mut out, |c| !c.is_empty());
        let Completion::RecvInto { token: 5, res } = out[0] else { panic!("{out:?}") };
        assert!(res > 0 && res <= 70_000, "{res}");
        let got = ring.take_filled(5).expect("the buffer comes back");
        assert_eq!(ring.take_filled(5), None, "once");
        assert_eq!(&got[..5], b"kept:", "bytes before the append point are untouched");
        assert_eq!(&got[5..], &data[..res as usize]);
        // A receive with nothing to read waits; cancelled, its buffer comes back
        // unchanged.
        let mut rest = vec![0u8; data.len() - res as usize];
        (&b).read_exact(&mut rest).unwrap();
        ring.recv_into(b.as_raw_fd(), 6, got, 1000).unwrap();
        assert_eq!(ring.cancel_recv(6).unwrap(), 1);
        out.clear();
        reap_until(&mut ring, &mut out, |c| !c.is_empty());
        assert_eq!(out, vec![Completion::RecvInto { token: 6, res: -libc::ECANCELED }]);
        let back = ring.take_filled(6).unwrap();
        assert_eq!(back.len(), 5 + res as usize);
        assert_eq!(ring.in_flight(), 0);
        // End of stream.
        drop(a);
        ring.recv_into(b.as_raw_fd(), 7, back, 1000).unwrap();
        out.clear();
        reap_until(&mut ring, &mut out, |c| !c.is_empty());
        assert_eq!(out, vec![Completion::RecvInto { token: 7, res: 0 }]);
        assert_eq!(ring.take_filled(7).unwrap().len(), 5 + res as usize);
    }

    #[test]
    fn ring_is_send() {
        fn assert_send<T: Send>() {}
        assert_send::<Ring<Vec<u8>>>();
    }
}
