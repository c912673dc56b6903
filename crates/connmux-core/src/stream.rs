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
//! What it does not do: read sockets, keep time (the caller passes
//! [`Timestamp`]s), or decide who receives a message.

use std::ops::Range;
use std::time::Duration;

use bytes::{Bytes, BytesMut};

use crate::mux::RxError;
use crate::parser::{Parse, ParseError, Parser};
use crate::time::Timestamp;

/// ESTRPIPE: a parser's "hand the stream back" answer (strparser.rst).
pub const ESTRPIPE: i32 = 86;
/// ENODATA: what strparser posts when ESTRPIPE comes mid-message.
pub const ENODATA: i32 = 61;

/// Smallest buffer growth: reading into a nearly full buffer would otherwise
/// reallocate for every few bytes.
const MIN_GROW: usize = 16 << 10;

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
    /// When the current message's first byte was seen (deadline origin).
    started: Option<Timestamp>,
    stopped: bool,
    stats: StreamStats,
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
            stopped: false,
            stats: StreamStats::default(),
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
    /// Bytes held: the partial current message plus read-ahead.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// Append bytes read from the connection. A stopped stream drops them.
    pub fn feed(&mut self, data: &[u8]) {
        if self.stopped || data.is_empty() {
            return;
        }
        if self.buf.capacity() - self.buf.len() < data.len() {
            self.buf.reserve(data.len().max(MIN_GROW));
        }
        self.buf.extend_from_slice(data);
    }

    /// How many more bytes the stream wants buffered now: the rest of the
    /// current message (as far as known) plus the read-ahead allowance.
    pub fn want(&self) -> usize {
        if self.stopped {
            return 0;
        }
        let target = match self.frame {
            Frame::Idle => 0,
            Frame::Header { asked, hint } => (asked + hint).min(self.limits.max_msg_size),
            Frame::Body { full_len } => full_len,
        };
        (target + self.limits.read_ahead).saturating_sub(self.buf.len())
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
            (Some(t), Some(d)) if !self.stopped => Some(t.add(d)),
            _ => None,
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
        self.frame = Frame::Idle;
        self.started = None;
        self.stats.msgs += 1;
        self.stats.bytes += full_len as u64;
        Ok(Some(self.parser.finish(raw)))
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
    /// Pushes what the application receives of each message (ranges of
    /// `data`) onto `out`, counts them as `next_msg` would, and returns how many
    /// bytes of `data` they took: the rest must be fed as usual.
    pub fn frame_in_place(&mut self, data: &[u8], limit: usize, out: &mut Vec<Range<usize>>) -> usize {
        if self.stopped || !self.buf.is_empty() || !self.parser.frames_in_place() {
            return 0;
        }
        let first = out.len();
        let taken = self.parser.frame_batch(data, self.limits.max_msg_size, limit, out);
        self.stats.msgs += (out.len() - first) as u64;
        self.stats.bytes += taken as u64;
        taken
    }

    fn abort(&mut self, e: RxError) -> RxError {
        match &e {
            RxError::TooBig { .. } => self.stats.msg_too_big += 1,
            RxError::BadLength { .. } => self.stats.bad_hdr_len += 1,
            RxError::Timeout => self.stats.msg_timeouts += 1,
            RxError::Parser(_) => self.stats.interrupted += 1,
            // Raised below the stream (the driver's TLS), never here.
            RxError::Tls(_) => {}
        }
        self.stopped = true;
        self.reset();
        e
    }
}
