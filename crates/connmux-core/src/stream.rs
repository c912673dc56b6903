//! The per-psock stream parser: Linux's strparser, with its framing flaw fixed.
//!
//! Bytes read from one connection go in with [`StreamParser::feed`]; whole
//! messages come out of [`StreamParser::next_msg`], one per call, so the owner
//! can stop pulling (KCM's "pause") when nobody can take a message.
//!
//! ```text
//!            feed(bytes)                 parse = NeedMore(n)
//!   Idle ───────────────▶ Header{asked,hint} ◀──────┐ (ask again only once
//!    ▲                        │   │                 │  `hint` more bytes came)
//!    │                        │   └─────────────────┘
//!    │  message complete      │ parse = Length(L)   (L checked: > max → TooBig,
//!    │  (split_to(L).freeze)  ▼                      0 or ≤ asked → BadLength)
//!    └──────────────────── Body{full_len=L}
//!
//!   any state ── Invalid / TooBig / BadLength / Timeout ──▶ Stopped (terminal)
//! ```
//!
//! Differences from strparser, each on purpose:
//! - the parser always sees bytes from the **message start**, never from the
//!   start of the chunk that carried it (strparser hands BPF the head skb, so
//!   a fixed-offset parser mis-frames coalesced messages: the 2018 report);
//! - received bytes are counted once, when their message completes
//!   (strparser double-counts a chunk that ends inside a message body);
//! - a header the parser cannot frame within `max_msg_size` bytes is refused
//!   as too big instead of being gathered without limit;
//! - a finished message is one contiguous [`Bytes`] cut out of the read buffer
//!   without copying (no skb chain).
//!
//! Large messages need not be copied at all: once the parser knows a
//! message of at least [`LEND_MIN`] bytes (or, between messages, while the
//! last one was that large), [`StreamParser::lend`] hands the driver the
//! assembly buffer itself, with room reserved for the rest of the message,
//! and [`StreamParser::unlend`] takes it back with the bytes the driver read
//! into it. Reads then end at message boundaries as far as lengths are known
//! or predicted (a lent read asks for what the message still needs, then for
//! whole messages as large as the last one) and every message is read once,
//! where it will be cut from.
//!
//! What it does not do: read sockets, keep time (the caller passes
//! [`Timestamp`]s), or decide who receives a message.

use std::time::Duration;

use bytes::{Bytes, BytesMut};

use crate::parser::{Parse, ParseError, Parser};
use crate::run::Run;
use crate::rx_error::RxError;
use crate::time::Timestamp;

/// ESTRPIPE: a parser's "hand the stream back" answer (strparser.rst).
pub const ESTRPIPE: i32 = 86;
/// ENODATA: what strparser posts when ESTRPIPE comes mid-message.
pub const ENODATA: i32 = 61;

/// Smallest buffer growth: reading into a nearly full buffer would otherwise
/// reallocate for every few bytes.
const MIN_GROW: usize = 16 << 10;

/// The most memory ([`StreamParser::memory`]) an assembly buffer holding at
/// most `held` bytes can have: growth at least doubles and takes at least
/// [`MIN_GROW`], and a lent buffer places its first byte within a page.
pub fn memory_bound(held: usize) -> usize {
    2 * held.max(MIN_GROW) + PAGE
}

/// Messages of at least this many bytes are read straight into the assembly
/// buffer ([`StreamParser::lend`]): below it, a read into the driver's buffer
/// and a copy cost less than the extra syscalls of reads that stop at each
/// message's end.
pub const LEND_MIN: usize = 16 << 10;

/// Where in its page a new lent buffer's first read byte lands. The kernel
/// copies socket bytes into the buffer with `rep movsb`, which on some CPUs
/// crawls when the destination
/// sits a few bytes after the source's offset within a page (4K aliasing).
/// A loopback sender's page fragments start near a page's start, and a
/// large allocation from the allocator starts 16 bytes into a page: the
/// worst place. Half a page from both.
pub const LEND_PAGE_OFFSET: usize = 2048;

const PAGE: usize = 4096;

/// A buffer with `room` bytes free after a copy of `keep`, placed so the
/// first free byte is at [`LEND_PAGE_OFFSET`] within its page.
fn lend_buffer(keep: &[u8], room: usize) -> BytesMut {
    let mut b = BytesMut::with_capacity(PAGE + keep.len() + room);
    let at = b.as_ptr() as usize + keep.len();
    let pad = (LEND_PAGE_OFFSET + PAGE - at % PAGE) % PAGE;
    // Skipped bytes are written once (at most a page) and never read.
    b.resize(pad, 0);
    bytes::Buf::advance(&mut b, pad);
    b.extend_from_slice(keep);
    b
}

/// A lent read asks for whole messages up to about this many bytes when
/// messages are smaller (several per read, as a plain read of a chunk would).
pub const LEND_CHUNK: usize = 64 << 10;

/// The assembly buffer while it is lent ([`StreamParser::lend`]): the driver
/// appends at most [`Loan::limit`] bytes read from the connection to
/// [`Loan::buf`], then gives it back with [`StreamParser::unlend`].
#[derive(Debug)]
pub struct Loan {
    buf: BytesMut,
    /// Bytes the buffer held when lent (the driver appends after them).
    start: usize,
    limit: usize,
    id: u64,
}

impl Loan {
    /// The most bytes the driver may append (the buffer has room for them).
    pub fn limit(&self) -> usize {
        self.limit
    }
    /// The assembly buffer: append to it, change nothing before its end.
    pub fn buf(&mut self) -> &mut BytesMut {
        &mut self.buf
    }
    /// Bytes appended so far.
    pub fn appended(&self) -> usize {
        self.buf.len().saturating_sub(self.start)
    }
}

/// What [`StreamParser::unlend`] did with a loan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unlend {
    /// The bytes appended (maybe none) are the stream's now.
    Took(usize),
    /// The stream stopped or was reset while the buffer was out (an assembly
    /// timeout, an unattach): the loan is dropped with its bytes, as bytes fed
    /// to a stopped stream are.
    Stale,
    /// More than [`Loan::limit`] bytes were appended, or bytes before the
    /// append point were removed: nothing appended is taken (as `feed` takes
    /// nothing beyond the psock's cap).
    Refused,
}

/// The limits of one stream parser.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamLimits {
    /// Largest message accepted (AF_KCM: the TCP socket's SO_RCVBUF).
    pub max_msg_size: usize,
    /// Assembly deadline from a message's first byte (AF_KCM: SO_RCVTIMEO).
    pub assembly_timeout: Option<Duration>,
    /// Bytes buffered beyond the message being assembled.
    pub read_ahead: usize,
}

/// Receive counters of one stream (strparser's `strp_stats`, bytes counted once).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StreamStats {
    /// Complete messages (`msgs`).
    pub msgs: u64,
    /// Wire bytes of complete messages (`bytes`).
    pub bytes: u64,
    /// Parser answers of "need more" (`need_more_hdr`).
    pub need_more_hdr: u64,
    /// EPROTO aborts (`bad_hdr_len`).
    pub bad_hdr_len: u64,
    /// EMSGSIZE aborts (`msg_too_big`).
    pub msg_too_big: u64,
    /// ETIMEDOUT aborts (`msg_timeouts`).
    pub msg_timeouts: u64,
    /// Parser refusals (`interrupted`).
    pub interrupted: u64,
    /// ESTRPIPE after bytes of the message were gathered (`unrecov_intr`).
    pub unrecov_intr: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Frame {
    /// No byte of the current message has been looked at.
    Idle,
    /// The parser answered NeedMore when `asked` bytes were there; it is asked
    /// again once `asked + hint` bytes are.
    Header { asked: usize, hint: usize },
    /// The length is known.
    Body { full_len: usize },
}

/// One psock's stream parser.
pub struct StreamParser {
    parser: Box<dyn Parser>,
    limits: StreamLimits,
    /// Always begins at the current message's first byte.
    buf: BytesMut,
    frame: Frame,
    /// When the current message's first byte was seen (deadline origin),
    /// or when reading it last resumed after the server stopped.
    started: Option<Timestamp>,
    /// The assembly deadline is held: the server stopped reading this
    /// stream (backpressure) when it came due; it runs again, in full, from
    /// [`StreamParser::restart_deadline`].
    deadline_held: bool,
    stopped: bool,
    stats: StreamStats,
    /// Length of the last complete message (predicts the next one's).
    last_len: usize,
    /// The loan out, if any: its id, the bytes it started with, its limit.
    lent: Option<(u64, usize, usize)>,
    /// The lent buffer's allocation (what it holds in memory while out).
    lent_cap: usize,
    loans: u64,
}

impl std::fmt::Debug for StreamParser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamParser")
            .field("parser", &self.parser.name())
            .field("buffered", &self.buf.len())
            .field("frame", &self.frame)
            .field("stopped", &self.stopped)
            .finish()
    }
}

impl StreamParser {
    pub fn new(parser: Box<dyn Parser>, limits: StreamLimits) -> StreamParser {
        StreamParser {
            parser,
            limits,
            buf: BytesMut::new(),
            frame: Frame::Idle,
            started: None,
            deadline_held: false,
            lent_cap: 0,
            stopped: false,
            stats: StreamStats::default(),
            last_len: 0,
            lent: None,
            loans: 0,
        }
    }

    pub fn limits(&self) -> &StreamLimits {
        &self.limits
    }
    pub fn stats(&self) -> &StreamStats {
        &self.stats
    }
    pub fn parser(&self) -> &dyn Parser {
        &*self.parser
    }
    /// True once an error stopped the stream (KCM `RxStop`): terminal.
    pub fn is_stopped(&self) -> bool {
        self.stopped
    }
    /// Bytes held: the partial current message plus read-ahead (while the
    /// buffer is lent: what it held plus all the loan may add).
    pub fn buffered(&self) -> usize {
        match self.lent {
            Some((_, start, limit)) => start + limit,
            None => self.buf.len(),
        }
    }

    /// Memory held for the stream, as the memory budget counts it: the
    /// assembly buffer's allocation while it holds bytes or is lent (room
    /// reserved for the rest of a message is memory the process holds, and
    /// pages reused from earlier buffers are resident), never less than
    /// [`StreamParser::buffered`]. An empty buffer between messages counts
    /// nothing (a small read buffer kept for the next read).
    pub fn memory(&self) -> usize {
        match self.lent {
            Some((_, start, limit)) => (start + limit).max(self.lent_cap),
            None if self.buf.is_empty() => 0,
            None => self.buf.capacity().max(self.buf.len()),
        }
    }
    /// True while the assembly buffer is lent ([`StreamParser::lend`]).
    pub fn is_lent(&self) -> bool {
        self.lent.is_some()
    }

    /// Append bytes read from the connection. A stopped stream drops them.
    pub fn feed(&mut self, data: &[u8]) {
        if self.stopped || data.is_empty() {
            return;
        }
        if self.buf.capacity() - self.buf.len() < data.len() {
            self.grow(data.len());
        }
        self.buf.extend_from_slice(data);
    }

    /// Room for `add` more bytes in the assembly buffer. A message is cut
    /// out of this buffer and keeps its allocation alive for as long as it
    /// lives (a queued reply that is its request), so growth stops at the
    /// current message's end when its length is known: `BytesMut`'s own
    /// doubling left a 64 KiB message read in 16 KiB pieces holding a
    /// 128 KiB block, memory the budget never saw. Below that end it still
    /// doubles (a peer that announces a large message and trickles it gets
    /// no more than twice what it sent), and with the length unknown it
    /// grows as before.
    fn grow(&mut self, add: usize) {
        let len = self.buf.len();
        match self.frame {
            Frame::Body { full_len } if full_len > len => {
                let cap = (2 * len).max(MIN_GROW).min(full_len).max(len + add);
                let mut b = BytesMut::with_capacity(cap);
                b.extend_from_slice(&self.buf);
                self.buf = b;
            }
            _ => self.buf.reserve(add.max(MIN_GROW)),
        }
    }

    /// How many more bytes the stream wants buffered now: the rest of the
    /// current message (as far as known) plus the read-ahead allowance.
    /// Nothing while the buffer is lent.
    #[inline]
    pub fn want(&self) -> usize {
        if self.stopped || self.lent.is_some() {
            return 0;
        }
        // Between large messages the next one is predicted as large as the
        // last (what `lend` reads): a read-ahead smaller than that would split
        // every message over two reads.
        let predicted = self.predicted_len().unwrap_or(0);
        let target = match self.frame {
            Frame::Idle => predicted,
            Frame::Header { asked, hint } => (asked + hint).min(self.limits.max_msg_size).max(predicted),
            Frame::Body { full_len } => full_len,
        };
        (target + self.limits.read_ahead).saturating_sub(self.buf.len())
    }

    /// Whether the next read should go straight into the assembly buffer
    /// ([`StreamParser::lend`]): a message whose length is known and at least
    /// [`LEND_MIN`] still needs bytes, or the length is not known yet and the
    /// last message was at least [`LEND_MIN`] (the next is likely as large).
    /// `None` where the stream reads through `feed` (small messages, a
    /// stopped stream, a loan already out).
    ///
    /// The answer is `(base, per)`: `base` bytes complete the current message
    /// (as far as predicted), `per` is the predicted size of the ones after.
    #[inline]
    fn lend_plan(&self) -> Option<(usize, usize)> {
        if self.stopped || self.lent.is_some() {
            return None;
        }
        let have = self.buf.len();
        match self.frame {
            Frame::Body { full_len } if full_len >= LEND_MIN && full_len > have => Some((full_len - have, full_len)),
            Frame::Idle | Frame::Header { .. } => {
                let per = self.predicted_len()?;
                let base = per.saturating_sub(have);
                Some((if base == 0 { per } else { base }, per))
            }
            _ => None,
        }
    }

    /// The length the next message is predicted to have when the last one
    /// was large (at least [`LEND_MIN`]): the same again.
    #[inline]
    fn predicted_len(&self) -> Option<usize> {
        (self.last_len >= LEND_MIN).then(|| self.last_len.min(self.limits.max_msg_size))
    }

    /// True when [`StreamParser::lend`] would lend (given room to read).
    #[inline]
    pub fn would_lend(&self) -> bool {
        self.lend_plan().is_some()
    }

    /// Predict nothing for the next message (the peer went quiet after a
    /// large one): the next lend waits for its header.
    pub fn forget_prediction(&mut self) {
        self.last_len = 0;
    }

    /// The bytes a lend now would be for a message only predicted (none of
    /// its bytes here yet, [`StreamParser::lend`]): its predicted length.
    /// `None` when a message has begun, or nothing is predicted.
    pub fn lend_predicted(&self) -> Option<usize> {
        match self.buf.is_empty() && self.lent.is_none() && !self.stopped {
            true => self.predicted_len(),
            false => None,
        }
    }

    /// Lend the assembly buffer for a read of at most `max` bytes straight
    /// into it (`max` is the caller's bound: what the psock may still hold).
    /// `None` when the stream reads through `feed` or `max` is 0.
    ///
    /// The loan's limit ends the read on a message boundary as far as lengths
    /// are known or predicted: the rest of the current message, then whole
    /// messages of the predicted size, up to [`LEND_CHUNK`] or the room the
    /// buffer already has. Room for the rest of the current message is
    /// reserved first, so a message is read into one allocation however many
    /// reads it takes (bytes already buffered move only when that room has to
    /// be made).
    ///
    /// Until [`StreamParser::unlend`], the stream holds nothing: `feed` must
    /// not be called, `want` is 0, `buffered` counts the loan's limit.
    pub fn lend(&mut self, max: usize) -> Option<Loan> {
        let (base, per) = self.lend_plan()?;
        if max == 0 {
            return None;
        }
        // Whole predicted messages after the current one, up to about LEND_CHUNK.
        let more = LEND_CHUNK.saturating_sub(base) / per;
        let spare = self.buf.capacity() - self.buf.len();
        let planned = base + per * more;
        let room = if spare >= planned || (spare >= base && !self.buf.is_empty()) {
            // The room left after the last messages, or after the bytes of
            // this one (which would have to move to go elsewhere).
            base + per * more.min((spare - base) / per)
        } else if max < base && spare >= max && !self.buf.is_empty() {
            // The memory budget allows less than the message needs: into
            // the room already there.
            max
        } else if max < base {
            // The same, with no room: a buffer for what the budget allows,
            // at least as large again as what is kept (so that a message
            // read this way moves O(log n) times, not once a read). The
            // budget counts the allocation ([`StreamParser::memory`]), so
            // reserving the whole message here would hold memory it does
            // not see (a thousand peers each sending most of a large
            // message).
            let alloc = max.max(self.buf.len()).min(base);
            self.buf = lend_buffer(&self.buf, alloc);
            alloc
        } else {
            // A new buffer for the whole plan. Between messages, rather than
            // a shorter read into the room left, which would leave whole
            // messages in the socket for another wake-up and read (16 KiB
            // echo: every other read took one message of two). A message cut
            // from the old allocation keeps it; the bytes already here (a
            // header, part of the body) move once.
            self.buf = lend_buffer(&self.buf, planned);
            planned
        };
        let limit = room.min(max);
        self.loans += 1;
        let start = self.buf.len();
        self.lent = Some((self.loans, start, limit));
        self.lent_cap = self.buf.capacity();
        Some(Loan { buf: std::mem::take(&mut self.buf), start, limit, id: self.loans })
    }

    /// Take the assembly buffer back with what was read into it; the new
    /// bytes are then the stream's, as if fed (cut them with `next_msg`).
    pub fn unlend(&mut self, mut loan: Loan) -> Unlend {
        match self.lent {
            Some((id, start, limit)) if id == loan.id && start == loan.start && limit == loan.limit => {}
            _ => return Unlend::Stale,
        }
        self.lent = None;
        let len = loan.buf.len();
        if len < loan.start || len - loan.start > loan.limit {
            loan.buf.truncate(loan.start);
            self.buf = loan.buf;
            return Unlend::Refused;
        }
        self.buf = loan.buf;
        if len == 0 && self.buf.capacity() >= LEND_MIN {
            // A loan back with nothing (a read ahead recalled, a receive
            // that could not be armed): its allocation, as large as the
            // message it was for, is not kept for a quiet connection
            // outside what the core counts.
            self.buf = BytesMut::new();
        }
        Unlend::Took(len - loan.start)
    }

    /// The need-bytes hint: bytes still missing from the current message, if
    /// the stream has looked at it.
    pub fn need(&self) -> Option<usize> {
        if self.stopped {
            return None;
        }
        match self.frame {
            Frame::Idle => None,
            Frame::Header { asked, hint } => Some((asked + hint).saturating_sub(self.buf.len()).max(1)),
            Frame::Body { full_len } => Some(full_len.saturating_sub(self.buf.len())),
        }
    }

    /// The assembly deadline of the current message, if one is running.
    pub fn deadline(&self) -> Option<Timestamp> {
        match (self.started, self.limits.assembly_timeout) {
            (Some(t), Some(d)) if !self.stopped && !self.deadline_held => Some(t.add(d)),
            _ => None,
        }
    }

    /// The server is not reading this stream (its replies backed up, its
    /// readers full, the memory budget): the assembly deadline of the
    /// current message stops, since the time is the server's, not the
    /// peer's. Until [`StreamParser::restart_deadline`].
    pub fn hold_deadline(&mut self) {
        self.deadline_held = true;
    }

    /// Reading resumed at `now`: the current message's assembly deadline
    /// runs again from `now`, in full (a held one, or one that ran while the
    /// server was not reading).
    pub fn restart_deadline(&mut self, now: Timestamp) {
        self.deadline_held = false;
        if self.started.is_some() {
            self.started = Some(now);
        }
    }

    /// Abort with ETIMEDOUT if the current message's deadline has passed.
    pub fn check_timeout(&mut self, now: Timestamp) -> Result<(), RxError> {
        match self.deadline() {
            Some(d) if now >= d => Err(self.abort(RxError::Timeout)),
            _ => Ok(()),
        }
    }

    /// Stop the stream from outside (unattach, peer closed): the partial message
    /// is dropped, nothing more is accepted. No counter moves.
    pub fn stop(&mut self) {
        self.stopped = true;
        self.reset();
    }

    /// Drop whatever is buffered (a partial message at end of stream).
    pub fn discard(&mut self) {
        self.reset();
    }

    fn reset(&mut self) {
        self.buf = BytesMut::new();
        self.frame = Frame::Idle;
        self.started = None;
        self.deadline_held = false;
        // A loan out is dropped when it comes back (`Unlend::Stale`).
        self.lent = None;
    }

    /// Cut the next complete message out of the buffer, if there is one.
    ///
    /// `now` is when the buffered bytes were seen: it starts the assembly
    /// deadline of a message whose first byte is looked at by this call. An
    /// error stops the stream (and is returned once).
    pub fn next_msg(&mut self, now: Timestamp) -> Result<Option<Bytes>, RxError> {
        if self.stopped || self.buf.is_empty() {
            return Ok(None);
        }
        if self.started.is_none() {
            self.started = Some(now);
        }
        let full_len = match self.frame {
            Frame::Body { full_len } => full_len,
            Frame::Header { asked, hint } if self.buf.len() < asked + hint => return Ok(None),
            Frame::Idle | Frame::Header { .. } => {
                let asked = match self.frame {
                    Frame::Header { asked, .. } => asked,
                    _ => 0,
                };
                match self.parser.parse(&self.buf) {
                    Parse::NeedMore(n) => {
                        self.stats.need_more_hdr += 1;
                        let have = self.buf.len();
                        let hint = n.max(1);
                        if have.saturating_add(hint) > self.limits.max_msg_size {
                            // The parser already says the message is longer than
                            // the largest size: refuse now, however the bytes
                            // arrive, instead of gathering (or stalling) first.
                            let len = have.saturating_add(hint);
                            return Err(self.abort(RxError::TooBig { len, max: self.limits.max_msg_size }));
                        }
                        self.frame = Frame::Header { asked: have, hint };
                        return Ok(None);
                    }
                    Parse::Length(len) => {
                        if len > self.limits.max_msg_size {
                            return Err(self.abort(RxError::TooBig { len, max: self.limits.max_msg_size }));
                        }
                        if len == 0 || len <= asked {
                            return Err(self.abort(RxError::BadLength { len, gathered: asked }));
                        }
                        self.frame = Frame::Body { full_len: len };
                        len
                    }
                    Parse::Invalid(e) => {
                        let e = match e {
                            ParseError::Program(v) if v.unsigned_abs() == ESTRPIPE.unsigned_abs() && asked > 0 => {
                                // strparser: ESTRPIPE mid-message is unrecoverable (ENODATA).
                                self.stats.unrecov_intr += 1;
                                ParseError::Program(ENODATA)
                            }
                            e => {
                                self.stats.interrupted += 1;
                                e
                            }
                        };
                        self.stopped = true;
                        self.reset();
                        return Err(RxError::Parser(e));
                    }
                }
            }
        };
        if self.buf.len() < full_len {
            return Ok(None);
        }
        // Zero-copy: the message shares the read buffer's allocation.
        let raw = self.buf.split_to(full_len).freeze();
        if self.buf.is_empty() && (full_len >= LEND_MIN || self.buf.capacity() < MIN_GROW) {
            // Nothing left of the read: let go of the allocation, which the
            // empty rest would keep alive (a large message's whole buffer)
            // for as long as the connection stays quiet, outside what the
            // core counts. The next bytes get a buffer of their own. (A
            // small message's read buffer with room left is kept: the next
            // read goes there without an allocation.)
            self.buf = BytesMut::new();
        }
        self.frame = Frame::Idle;
        self.started = None;
        self.deadline_held = false;
        self.stats.msgs += 1;
        self.stats.bytes += full_len as u64;
        self.last_len = full_len;
        Ok(Some(self.parser.finish(raw)))
    }

    /// Whether the messages framed in place are delivered whole
    /// ([`Parser::delivers_whole`]): their bytes are the bytes taken.
    pub fn delivers_whole(&self) -> bool {
        self.parser.delivers_whole()
    }

    /// Frame complete messages where they lie in `data` (bytes just read, not
    /// fed), for a driver that hands them to their handler at once instead of
    /// cutting a [`Bytes`] per message. Only when nothing is buffered and the
    /// parser allows it ([`Parser::frames_in_place`]); stops at the first
    /// message that is not whole in `data`, that the parser does not frame
    /// cleanly (any error is left for [`StreamParser::feed`] and
    /// [`StreamParser::next_msg`] to find and count on the same bytes), or that
    /// `finish_in_place` declines, and after `limit` messages.
    ///
    /// Pushes the messages onto `out` as runs of `data` (what the application
    /// receives of each), counts them as `next_msg` would, and returns how
    /// many bytes of `data` they took: the rest must be fed as usual.
    pub fn frame_in_place(&mut self, data: &[u8], limit: usize, out: &mut Vec<Run>) -> usize {
        if self.stopped || self.lent.is_some() || !self.buf.is_empty() || !self.parser.frames_in_place() {
            return 0;
        }
        let first = out.len();
        let taken = self.parser.frame_batch(data, self.limits.max_msg_size, limit, out);
        if let Some(last) = out.get(first..).and_then(|r| r.last()) {
            self.stats.msgs += crate::run::count(&out[first..]) as u64;
            // The last message's wire length: what `lend` predicts from.
            self.last_len = last.stride;
        }
        self.stats.bytes += taken as u64;
        taken
    }

    fn abort(&mut self, e: RxError) -> RxError {
        match &e {
            RxError::TooBig { .. } => self.stats.msg_too_big += 1,
            RxError::BadLength { .. } => self.stats.bad_hdr_len += 1,
            RxError::Timeout => self.stats.msg_timeouts += 1,
            RxError::Parser(_) => self.stats.interrupted += 1,
            // Raised below the stream (the driver's TLS) or by the mux's
            // limits, never here.
            RxError::Tls(_) | RxError::MemLimit { .. } | RxError::IdleTimeout | RxError::HandshakeTimeout => {}
        }
        self.stopped = true;
        self.reset();
        e
    }
}
