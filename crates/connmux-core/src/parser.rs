//! The message parser: given the bytes of one message gathered so far (starting at
//! the message's first byte), answer one of three things.
//!
//! This is strparser's `parse_msg` made an enum instead of an overloaded integer:
//! KCM's BPF program returns > 0 (length), 0 (need more), < 0 (error); the BPF
//! parser in `connmux-bpf` maps onto this trait.

use std::ops::Range;

use bytes::Bytes;

pub use crate::run::Run;

/// A parser's answer for the bytes of the current message gathered so far.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Parse {
    /// The length is not known yet: at least this many more bytes are needed
    /// before asking again (a hint; `1` when the parser cannot tell).
    NeedMore(usize),
    /// The message's total length in bytes, header included, counted from its
    /// first byte. Must be > 0.
    Length(usize),
    /// The stream cannot be framed: the psock is aborted with this reason.
    Invalid(ParseError),
}

/// Why a parser refused a stream. Each maps to the errno KCM would post on the
/// TCP socket (`errno()`), so the kernel backend and the userspace engine report
/// the same thing.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// The decoded length is smaller than the header that carried it.
    #[error("length {length} is shorter than the {header}-byte header")]
    LengthBelowHeader { length: u64, header: usize },
    /// The decoded length does not fit in the address space / 63 bits.
    #[error("length field overflows")]
    LengthOverflow,
    /// A protocol-specific magic or constant field is wrong.
    #[error("bad {what}: {value:#x}")]
    BadField { what: &'static str, value: u64 },
    /// A multi-fragment record has more fragments than allowed.
    #[error("too many record fragments ({0})")]
    TooManyFragments(usize),
    /// A BPF parser returned a negative value (−errno).
    #[error("parser program returned error {0}")]
    Program(i32),
    /// A BPF program could not run to completion (budget exhausted, fault).
    #[error("parser program fault: {0}")]
    ProgramFault(String),
}

impl ParseError {
    /// The errno KCM posts on the TCP socket for this refusal (EPROTO for framing
    /// errors, the program's own value for BPF errors).
    pub fn errno(&self) -> i32 {
        match self {
            ParseError::Program(e) => *e,
            _ => EPROTO,
        }
    }
}

/// Linux errno values used by the core (kept here so the core needs no libc).
pub const EPROTO: i32 = 71;
pub const EMSGSIZE: i32 = 90;
pub const ETIMEDOUT: i32 = 110;
pub const EPIPE: i32 = 32;
pub const EINVAL: i32 = 22;

/// A message parser for one psock. One instance per psock (it may keep state,
/// e.g. "HTTP/2 preface seen").
pub trait Parser: Send {
    /// Look at the bytes of the current message gathered so far. `buf` starts at
    /// the message's first byte and holds every byte available (it may extend
    /// past the end of this message). Called again with a longer `buf` after
    /// `NeedMore`; not called again for this message after `Length`.
    fn parse(&mut self, buf: &[u8]) -> Parse;

    /// Turn a complete message (exactly `Length` bytes) into what the application
    /// receives. The default keeps it as framed on the wire; the ONC RPC parser
    /// can strip fragment headers here.
    fn finish(&mut self, msg: Bytes) -> Bytes {
        msg
    }

    /// An optional steering key for a complete message: messages with the same
    /// key go to the same KCM socket while it is able to take them.
    fn steering_key(&self, _msg: &[u8]) -> Option<u64> {
        None
    }

    /// Whether messages may be framed where they lie in the driver's read
    /// buffer (the in-place path, [`crate::stream::StreamParser::frame_in_place`]):
    /// `parse` is then also asked about bytes outside the stream's own buffer,
    /// and may be asked again about the same bytes (it must answer alike, as
    /// a stateless parser does). Off unless a parser says so.
    fn frames_in_place(&self) -> bool {
        false
    }

    /// For a complete message (exactly `Length` bytes) framed in place: the
    /// part the application receives when that is a plain sub-slice of it (what
    /// `finish` would return, without a copy). `None` sends the message down
    /// the ordinary path instead.
    fn finish_in_place(&self, msg: &[u8]) -> Option<Range<usize>> {
        Some(0..msg.len())
    }

    /// Whether [`Parser::finish_in_place`] always hands over the whole
    /// message (the parser strips nothing): the bytes a batch framed in place
    /// delivers are then the bytes it took, with no sum over its ranges. Off
    /// unless a parser says so; a parser whose `finish_in_place` cuts must
    /// leave it off.
    fn delivers_whole(&self) -> bool {
        false
    }

    /// Frame up to `limit` complete messages of at most `max_len` bytes each
    /// at the front of `data` (in place: only called when
    /// [`Parser::frames_in_place`] says so), pushing them onto `out` as runs
    /// of `data` (each message received as [`Parser::finish_in_place`] cuts
    /// it); stop at the first message that is not whole, not cleanly framed
    /// or declined. Returns the bytes of `data` taken. What was in `out`
    /// before stays as it was (no run pushed is joined to it). Rarely
    /// overridden: the default is compiled for each parser, so its `parse`
    /// is called directly (no dynamic call per message).
    fn frame_batch(&mut self, data: &[u8], max_len: usize, limit: usize, out: &mut Vec<Run>) -> usize {
        frame_batch_with(self, data, 0, max_len, limit, out)
    }

    /// A short name for statistics and errors ("len4be", "oncrpc", "bpf:prog").
    fn name(&self) -> &str;
}

/// How many messages of `len` bytes lie end to end at the start of `rest`
/// (at most `room`), each after the first beginning with `head`, the
/// first's header: the run a parser's `frame_batch` takes once it has
/// decoded and checked the first. The rest are found by comparing header
/// bytes, stepping by `len`, with no decode and no bounds check beyond the
/// step's. `len` is at least `head`'s size and at most `rest.len()`.
#[inline]
pub(crate) fn run_of<const H: usize>(rest: &[u8], head: &[u8; H], len: usize, room: usize) -> usize {
    1 + rest[len..]
        .chunks_exact(len)
        .take(room.saturating_sub(1))
        .take_while(|m| m.first_chunk::<H>() == Some(head))
        .count()
}

/// [`Parser::frame_batch`]'s loop, from offset `at` of `data` (runs are
/// pushed at offsets into the whole of `data`): for a parser whose own
/// `frame_batch` takes a common case itself and leaves the rest to this.
/// A message like the one before it (as long, cut alike) joins its run.
pub fn frame_batch_with<P: Parser + ?Sized>(
    p: &mut P,
    data: &[u8],
    mut at: usize,
    max_len: usize,
    limit: usize,
    out: &mut Vec<Run>,
) -> usize {
    let mut n = 0;
    // The run being gathered, pushed when a message does not join it.
    let mut run: Option<Run> = None;
    while at < data.len() && n < limit {
        let rest = &data[at..];
        let len = match p.parse(rest) {
            Parse::Length(len) if len > 0 && len <= rest.len() && len <= max_len => len,
            _ => break,
        };
        let one = match p.finish_in_place(&rest[..len]) {
            Some(r) if r.start <= r.end && r.end <= len => Run::one(at, len, r),
            _ => break,
        };
        match &mut run {
            Some(r) if r.end() == at && r.stride == len && r.skip == one.skip && r.len == one.len => r.count += 1,
            _ => out.extend(run.replace(one)),
        }
        at += len;
        n += 1;
    }
    out.extend(run);
    at
}

impl<P: Parser + ?Sized> Parser for Box<P> {
    fn parse(&mut self, buf: &[u8]) -> Parse {
        (**self).parse(buf)
    }
    fn finish(&mut self, msg: Bytes) -> Bytes {
        (**self).finish(msg)
    }
    fn steering_key(&self, msg: &[u8]) -> Option<u64> {
        (**self).steering_key(msg)
    }
    fn frames_in_place(&self) -> bool {
        (**self).frames_in_place()
    }
    fn finish_in_place(&self, msg: &[u8]) -> Option<Range<usize>> {
        (**self).finish_in_place(msg)
    }
    fn delivers_whole(&self) -> bool {
        (**self).delivers_whole()
    }
    fn frame_batch(&mut self, data: &[u8], max_len: usize, limit: usize, out: &mut Vec<Run>) -> usize {
        (**self).frame_batch(data, max_len, limit, out)
    }
    fn name(&self) -> &str {
        (**self).name()
    }
}
