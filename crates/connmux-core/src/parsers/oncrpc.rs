//! ONC RPC record marking (RFC 5531 §11): each fragment is a 4-byte
//! big-endian mark (top bit = last fragment, low 31 bits = length) and its
//! body. A record of several fragments is **one** message spanning all of
//! them, marks included; with `strip` the application receives the record
//! without its marks.

use bytes::{Bytes, BytesMut};

use crate::parser::{run_of, Parse, ParseError, Parser, Run};

const MARK_LEN: usize = 4;
const LAST_FRAGMENT: u32 = 0x8000_0000;

/// Default fragment bound: rpctest `-f` sends 3, most clients 1; 1024 leaves
/// room for odd clients while bounding the marks a record can make us walk.
pub const DEFAULT_MAX_FRAGMENTS: usize = 1024;

/// ONC RPC record-marking parser.
///
/// ```
/// use connmux_core::parsers::OncRpc;
/// use connmux_core::{Parse, Parser};
/// let mut p = OncRpc::new(false);           // keep marks; OncRpc::new(true) strips them
/// assert_eq!(p.parse(&[0x80, 0, 0, 40]), Parse::Length(44));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OncRpc {
    strip: bool,
    max_fragments: usize,
    /// Resume state for the message being framed: offset of the next mark
    /// not yet read and marks read so far (0/0 = start over). Without it a
    /// record of k tiny fragments arriving one by one costs O(k²) mark reads.
    /// It relies on the trait's contract (after NeedMore, `parse` sees the
    /// same message, longer); as a guard against misuse it restarts when the
    /// buffer is shorter or its first or last-read mark differs.
    next_mark: usize,
    frags: usize,
    /// The message's first mark.
    first: [u8; MARK_LEN],
    /// Offset and value of the last mark read (a non-last one).
    last_at: usize,
    last: [u8; MARK_LEN],
    name: String,
}

impl OncRpc {
    /// Record marking with [`DEFAULT_MAX_FRAGMENTS`]; `strip` removes the
    /// marks from delivered messages.
    pub fn new(strip: bool) -> Self {
        OncRpc::with_max_fragments(strip, DEFAULT_MAX_FRAGMENTS)
    }

    /// Record marking refusing records of more than `max_fragments`
    /// fragments (at least 1).
    pub fn with_max_fragments(strip: bool, max_fragments: usize) -> Self {
        let max_fragments = max_fragments.max(1);
        let mut name = String::from(if strip { "oncrpc:strip" } else { "oncrpc" });
        if max_fragments != DEFAULT_MAX_FRAGMENTS {
            name.push(if strip { ',' } else { ':' });
            name.push_str(&format!("max_fragments={max_fragments}"));
        }
        OncRpc {
            strip,
            max_fragments,
            next_mark: 0,
            frags: 0,
            first: [0; MARK_LEN],
            last_at: 0,
            last: [0; MARK_LEN],
            name,
        }
    }

    /// Whether delivered messages have their marks removed.
    pub fn strips(&self) -> bool {
        self.strip
    }

    /// The fragment bound.
    pub fn max_fragments(&self) -> usize {
        self.max_fragments
    }

    fn restart(&mut self) {
        self.next_mark = 0;
        self.frags = 0;
    }

    /// [`Parser::frame_batch`] from the first record that is not a whole
    /// one-fragment record on: out of line, so that the common loop keeps
    /// its registers.
    #[inline(never)]
    fn frame_batch_rest(&mut self, data: &[u8], at: usize, max_len: usize, limit: usize, out: &mut Vec<Run>) -> usize {
        crate::parser::frame_batch_with(self, data, at, max_len, limit, out)
    }

    /// Records of several fragments, or a mark not yet whole: framed one
    /// mark per pass, resuming where the last call stopped.
    #[inline(never)]
    fn parse_fragments(&mut self, buf: &[u8]) -> Parse {
        // Resume only if this is the message we were framing (it only grows).
        if self.next_mark != 0
            && (buf.len() < self.next_mark
                || mark_at(buf, 0) != Some(self.first)
                || mark_at(buf, self.last_at) != Some(self.last))
        {
            self.restart();
        }
        // Each pass reads one mark; at most max_fragments + 1 passes.
        loop {
            let Some(mark) = mark_at(buf, self.next_mark) else {
                // Exact: nothing can be decided before the next mark is in.
                return Parse::NeedMore(self.next_mark + MARK_LEN - buf.len());
            };
            if self.next_mark == 0 {
                self.first = mark;
            }
            self.frags += 1;
            if self.frags > self.max_fragments {
                let n = self.frags;
                self.restart();
                return Parse::Invalid(ParseError::TooManyFragments(n));
            }
            let word = u32::from_be_bytes(mark);
            let len = (word & !LAST_FRAGMENT) as usize;
            let Some(end) = self.next_mark.checked_add(MARK_LEN + len) else {
                self.restart();
                return Parse::Invalid(ParseError::LengthOverflow);
            };
            if word & LAST_FRAGMENT != 0 {
                self.restart();
                return Parse::Length(end);
            }
            self.last_at = self.next_mark;
            self.last = mark;
            self.next_mark = end;
        }
    }
}

#[inline]
fn mark_at(buf: &[u8], at: usize) -> Option<[u8; MARK_LEN]> {
    let b = buf.get(at..at.checked_add(MARK_LEN)?)?;
    Some([b[0], b[1], b[2], b[3]])
}

impl Parser for OncRpc {
    #[inline]
    fn parse(&mut self, buf: &[u8]) -> Parse {
        // The common record, one fragment whose mark is in: no state to keep.
        if self.next_mark == 0 && self.max_fragments >= 1 {
            if let Some(mark) = mark_at(buf, 0) {
                let word = u32::from_be_bytes(mark);
                if word & LAST_FRAGMENT != 0 {
                    // Fits: a 31-bit length plus the mark.
                    return Parse::Length(MARK_LEN + (word & !LAST_FRAGMENT) as usize);
                }
            }
        }
        self.parse_fragments(buf)
    }

    // Its framing state is only a resumption aid: `parse` restarts when the
    // bytes it is shown are not the message it was framing.
    fn frames_in_place(&self) -> bool {
        true
    }

    /// One-fragment records (nearly all of them) straight off their marks,
    /// in a tight loop; at the first other one (several fragments, a mark
    /// not in yet) the general loop takes over from there.
    fn frame_batch(&mut self, data: &[u8], max_len: usize, limit: usize, out: &mut Vec<Run>) -> usize {
        let mut at = 0;
        let mut n = 0;
        if self.next_mark == 0 && self.max_fragments >= 1 {
            let body = if self.strip { MARK_LEN } else { 0 };
            // `data[at..]`, narrowed run by run.
            let mut rest = data;
            // Records come in runs of one length (a client's calls are
            // alike): a run's first mark is decoded and checked, the rest
            // of the run found by comparing marks with it (`run_of`), and
            // the run pushed as one [`Run`]. Where each record's start
            // came from the mark just read, each waited for that load (a
            // chain through memory), and a range pushed per record stored
            // the vector's length and read it back.
            // Bounded: each turn takes at least one record or stops.
            while n < limit {
                let Some((&mark, _)) = rest.split_first_chunk::<MARK_LEN>() else { break };
                let word = u32::from_be_bytes(mark);
                let len = MARK_LEN + (word & !LAST_FRAGMENT) as usize;
                if word & LAST_FRAGMENT == 0 || len > max_len || len > rest.len() {
                    break;
                }
                let run = run_of(rest, &mark, len, (limit - n).min(rest.len() / len));
                out.push(Run { at, stride: len, count: run, skip: body, len: len - body });
                at += run * len;
                n += run;
                rest = &rest[run * len..];
            }
        }
        if at == data.len() || n == limit {
            return at;
        }
        self.frame_batch_rest(data, at, max_len, limit - n, out)
    }

    fn delivers_whole(&self) -> bool {
        !self.strip
    }

    #[inline]
    fn finish_in_place(&self, msg: &[u8]) -> Option<std::ops::Range<usize>> {
        if !self.strip {
            return Some(0..msg.len());
        }
        // One fragment: the body after its mark; several need a copy.
        let w = u32::from_be_bytes(mark_at(msg, 0)?);
        (w & LAST_FRAGMENT != 0 && (w & !LAST_FRAGMENT) as usize == msg.len() - MARK_LEN).then_some(MARK_LEN..msg.len())
    }

    fn finish(&mut self, msg: Bytes) -> Bytes {
        if !self.strip {
            return msg;
        }
        // One fragment (the common case): a slice, no copy.
        if let Some(m) = mark_at(&msg, 0) {
            let w = u32::from_be_bytes(m);
            if w & LAST_FRAGMENT != 0 && (w & !LAST_FRAGMENT) as usize == msg.len() - MARK_LEN {
                return msg.slice(MARK_LEN..);
            }
        }
        // Several fragments: copy the bodies together. The marks were checked
        // by parse; clamping keeps this panic-free for any input anyway.
        let mut out = BytesMut::with_capacity(msg.len());
        let mut at = 0;
        while let Some(m) = mark_at(&msg, at) {
            let w = u32::from_be_bytes(m);
            let start = at + MARK_LEN;
            let end = start.saturating_add((w & !LAST_FRAGMENT) as usize).min(msg.len());
            out.extend_from_slice(&msg[start..end]);
            at = end;
            if w & LAST_FRAGMENT != 0 {
                break;
            }
        }
        out.freeze()
    }

    fn name(&self) -> &str {
        &self.name
    }
}
