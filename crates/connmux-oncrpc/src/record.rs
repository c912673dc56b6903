//! Record marking (RFC 5531 §11): how ONC RPC frames messages on a byte stream.
//!
//! A record is one or more fragments. Each fragment starts with a 4-byte
//! big-endian mark: the top bit says "last fragment of the record", the low
//! 31 bits give the fragment's length (the mark itself not included).
//!
//! ```text
//!  0                   1                   2                   3
//!  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//! +-+-------------------------------------------------------------+
//! |L|                 fragment length (31 bits)                   |
//! +-+-------------------------------------------------------------+
//! |                  fragment body (length bytes) ...
//! ```
//!
//! Here: the mark as a value ([`RecordMark`]), encoding a body as one or more
//! fragments ([`encode_record`]), walking and stripping the marks of one whole
//! record ([`fragments`], [`strip_marks`]), and an incremental reader for
//! clients ([`RecordReader`]) bounded by [`RecordLimits`].

/// Bytes in a record mark.
pub const MARK_LEN: usize = 4;
/// The "last fragment" bit of a mark.
pub const LAST_FRAGMENT: u32 = 0x8000_0000;
/// Largest fragment body a mark can describe (31 bits).
pub const MAX_FRAGMENT_LEN: usize = 0x7fff_ffff;

/// One decoded record mark.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordMark {
    /// This fragment ends the record.
    pub last: bool,
    /// Fragment body length in bytes (≤ [`MAX_FRAGMENT_LEN`]).
    pub len: u32,
}

impl RecordMark {
    /// A mark for a fragment of `len` bytes; `None` when `len` needs more than 31 bits.
    pub fn new(len: usize, last: bool) -> Option<Self> {
        if len > MAX_FRAGMENT_LEN {
            return None;
        }
        Some(RecordMark { last, len: len as u32 })
    }

    /// Decodes the 4 bytes of a mark.
    pub fn from_bytes(b: [u8; MARK_LEN]) -> Self {
        let w = u32::from_be_bytes(b);
        RecordMark { last: w & LAST_FRAGMENT != 0, len: w & !LAST_FRAGMENT }
    }

    /// Decodes the mark at the start of `buf`; `None` when fewer than 4 bytes.
    pub fn parse(buf: &[u8]) -> Option<Self> {
        let b = buf.get(..MARK_LEN)?;
        Some(Self::from_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// The 4 bytes on the wire.
    pub fn to_bytes(self) -> [u8; MARK_LEN] {
        let w = (self.len & !LAST_FRAGMENT) | if self.last { LAST_FRAGMENT } else { 0 };
        w.to_be_bytes()
    }
}

/// Appends `body` to `out` as one record of `fragments` fragments.
///
/// `fragments` is clamped to `1..=max(body.len(), 1)` (every fragment but an
/// empty record's only one carries at least a byte). The split follows
/// rpctest's `-f`: one-byte fragments around a single large middle one, so 3
/// fragments of a 40-byte body are 1, 38 and 1 bytes; `k` fragments are
/// `k/2` one-byte fragments, the middle, then `(k-1)/2` one-byte fragments.
///
/// # Panics
/// If the middle fragment would exceed [`MAX_FRAGMENT_LEN`] (a body over 2 GiB).
pub fn encode_record(body: &[u8], fragments: usize, out: &mut Vec<u8>) {
    encode_record_parts(body, &[], fragments, out);
}

/// [`encode_record`] for a body given in two parts (`head` then `tail`), so a
/// header built on the stack and caller-owned arguments need no joining copy.
///
/// # Panics
/// As [`encode_record`].
pub fn encode_record_parts(head: &[u8], tail: &[u8], fragments: usize, out: &mut Vec<u8>) {
    let total = head.len() + tail.len();
    let k = fragments.clamp(1, total.max(1));
    let before = k / 2;
    let after = (k - 1) / 2;
    let middle = total - before - after;
    assert!(middle <= MAX_FRAGMENT_LEN, "fragment over 2^31-1 bytes");
    out.reserve(total + k * MARK_LEN);
    let mut pos = 0;
    let mut put = |len: usize, last: bool, out: &mut Vec<u8>| {
        // `len` ≤ MAX_FRAGMENT_LEN was checked above (1 for the small ones).
        out.extend_from_slice(&RecordMark { last, len: len as u32 }.to_bytes());
        let end = pos + len;
        // The part of [pos, end) that lies in `head`, then the part in `tail`.
        out.extend_from_slice(&head[pos.min(head.len())..end.min(head.len())]);
        out.extend_from_slice(&tail[pos.max(head.len()) - head.len()..end.max(head.len()) - head.len()]);
        pos = end;
    };
    for _ in 0..before {
        put(1, false, out);
    }
    put(middle, after == 0, out);
    for i in 0..after {
        put(1, i + 1 == after, out);
    }
}

/// Why a whole record's marks do not describe it exactly.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MarkError {
    /// The record ends inside a fragment header.
    #[error("record ends inside the fragment mark at byte {at}")]
    TruncatedMark {
        /// Offset of the mark.
        at: usize,
    },
    /// A fragment's body runs past the end of the record.
    #[error("fragment of {len} bytes at byte {at} runs past the end of the {have}-byte record")]
    TruncatedFragment {
        /// Offset of the fragment's mark.
        at: usize,
        /// Its declared length.
        len: u32,
        /// The record's length.
        have: usize,
    },
    /// The bytes end after a fragment that is not marked last.
    #[error("record ends without a last fragment")]
    MissingLastFragment,
    /// Bytes follow the last fragment.
    #[error("{extra} bytes follow the last fragment")]
    TrailingBytes {
        /// How many.
        extra: usize,
    },
}

/// Iterator over the fragment bodies of one whole record, marks included in
/// the input; see [`fragments`].
#[derive(Clone, Debug)]
pub struct Fragments<'a> {
    buf: &'a [u8],
    pos: usize,
    done: bool,
}

/// Walks the fragments of one whole record (`marked` = marks and bodies,
/// exactly one record). Yields each body, then an error if the marks do not
/// describe `marked` exactly (and stops).
pub fn fragments(marked: &[u8]) -> Fragments<'_> {
    Fragments { buf: marked, pos: 0, done: false }
}

impl<'a> Iterator for Fragments<'a> {
    type Item = Result<&'a [u8], MarkError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let rest = &self.buf[self.pos..];
        if rest.is_empty() {
            self.done = true;
            return Some(Err(MarkError::MissingLastFragment));
        }
        let Some(mark) = RecordMark::parse(rest) else {
            self.done = true;
            return Some(Err(MarkError::TruncatedMark { at: self.pos }));
        };
        let len = mark.len as usize;
        let Some(body) = rest.get(MARK_LEN..MARK_LEN + len) else {
            self.done = true;
            return Some(Err(MarkError::TruncatedFragment { at: self.pos, len: mark.len, have: self.buf.len() }));
        };
        self.pos += MARK_LEN + len;
        if mark.last {
            self.done = true;
            let extra = self.buf.len() - self.pos;
            if extra != 0 {
                return Some(Err(MarkError::TrailingBytes { extra }));
            }
        }
        Some(Ok(body))
    }
}

/// Appends the bodies of one whole marked record to `out` (the record as the
/// RPC layer sees it). Returns the number of fragments. On error `out` may
/// hold part of the record.
pub fn strip_marks(marked: &[u8], out: &mut Vec<u8>) -> Result<usize, MarkError> {
    let mut n = 0;
    for frag in fragments(marked) {
        out.extend_from_slice(frag?);
        n += 1;
    }
    Ok(n)
}

/// Default [`RecordLimits::max_record_len`]: 1 MiB, the size of the largest
/// NFS READ/WRITE payload most servers negotiate, with room for its header.
pub const DEFAULT_MAX_RECORD_LEN: usize = (1 << 20) + 4096;
/// Default [`RecordLimits::max_fragments`]: generous for real clients (rpctest
/// `-f` sends 3, most send 1) while bounding the work a record of tiny
/// fragments can cause.
pub const DEFAULT_MAX_FRAGMENTS: usize = 1024;

/// Bounds on one record, so memory follows configuration, not the peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordLimits {
    /// Largest record body (marks excluded) accepted.
    pub max_record_len: usize,
    /// Most fragments one record may have.
    pub max_fragments: usize,
}

impl Default for RecordLimits {
    fn default() -> Self {
        RecordLimits { max_record_len: DEFAULT_MAX_RECORD_LEN, max_fragments: DEFAULT_MAX_FRAGMENTS }
    }
}

/// Why a [`RecordReader`] gave up on its stream. The stream cannot be
/// re-framed after this: close the connection.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// The record's fragments announce more body bytes than the limit.
    #[error("record of at least {len} bytes exceeds the limit of {max}")]
    TooLarge {
        /// Body bytes announced so far.
        len: u64,
        /// The limit.
        max: usize,
    },
    /// The record has more fragments than the limit.
    #[error("record has more than {max} fragments")]
    TooManyFragments {
        /// The limit.
        max: usize,
    },
}

/// Incremental record reader for a client's receive side: push the bytes as
/// they arrive, pop whole records with the fragment marks stripped.
///
/// Memory: the reader holds the unconsumed bytes. A partial record is refused
/// as soon as its marks announce more than `max_record_len` bytes or
/// `max_fragments` fragments, so what it holds is at most
/// `max_record_len + 4 × max_fragments` plus the last chunk pushed, provided
/// the caller pops every ready record after each push.
///
/// ```
/// use connmux_oncrpc::record::{RecordReader, RecordLimits};
/// let mut r = RecordReader::new(RecordLimits::default());
/// r.push(&[0x80, 0, 0, 2, b'h']);
/// assert_eq!(r.next_record(), Ok(None));
/// assert_eq!(r.need(), 1);
/// r.push(b"i");
/// assert_eq!(r.next_record(), Ok(Some(&b"hi"[..])));
/// ```
#[derive(Debug)]
pub struct RecordReader {
    limits: RecordLimits,
    /// Received bytes; `buf[..start]` is consumed and dropped on the next push.
    buf: Vec<u8>,
    /// Offset of the current record's first mark. Invariant: start ≤ scan.
    start: usize,
    /// Offset of the next mark of the current record not yet decoded.
    scan: usize,
    /// Body bytes announced by the marks decoded so far for this record.
    body_len: u64,
    /// Marks decoded so far for this record.
    frags: usize,
    /// Offset just past the record, once its last mark has been decoded.
    end: Option<usize>,
    /// Reassembly space for multi-fragment records (reused).
    assembled: Vec<u8>,
    /// Sticky: once the stream is refused it stays refused.
    error: Option<RecordError>,
}

impl RecordReader {
    /// A reader with these limits.
    pub fn new(limits: RecordLimits) -> Self {
        RecordReader {
            limits,
            buf: Vec::new(),
            start: 0,
            scan: 0,
            body_len: 0,
            frags: 0,
            end: None,
            assembled: Vec::new(),
            error: None,
        }
    }

    /// The limits this reader enforces.
    pub fn limits(&self) -> RecordLimits {
        self.limits
    }

    /// Appends received bytes.
    pub fn push(&mut self, bytes: &[u8]) {
        if self.start > 0 {
            // Drop consumed bytes; what moves is at most one partial record.
            self.buf.drain(..self.start);
            self.scan -= self.start;
            self.end = self.end.map(|e| e - self.start);
            self.start = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// Bytes held that no popped record has consumed yet.
    pub fn buffered(&self) -> usize {
        self.buf.len() - self.start
    }

    /// How many more bytes must arrive before [`next_record`](Self::next_record)
    /// can return a record: 0 means one may be ready now. A lower bound when
    /// later fragments' marks are not in yet.
    pub fn need(&self) -> usize {
        let target = match self.end {
            Some(end) => end,
            None => self.scan + MARK_LEN,
        };
        target.saturating_sub(self.buf.len())
    }

    /// Pops the next whole record, marks stripped: `Ok(None)` until one is
    /// complete. The slice is valid until the next call on the reader. After an
    /// error every call returns the same error.
    pub fn next_record(&mut self) -> Result<Option<&[u8]>, RecordError> {
        if let Some(e) = &self.error {
            return Err(e.clone());
        }
        // Each pass decodes one mark; a record has at most max_fragments marks.
        loop {
            if let Some(end) = self.end {
                if self.buf.len() < end {
                    return Ok(None);
                }
                let begin = self.start;
                let frags = self.frags;
                self.start = end;
                self.scan = end;
                self.body_len = 0;
                self.frags = 0;
                self.end = None;
                if frags == 1 {
                    return Ok(Some(&self.buf[begin + MARK_LEN..end]));
                }
                self.assembled.clear();
                // The marks in buf[begin..end] were validated while scanning.
                let mut pos = begin;
                while pos < end {
                    let m = RecordMark::parse(&self.buf[pos..]).map_or(0, |m| m.len as usize);
                    self.assembled.extend_from_slice(&self.buf[pos + MARK_LEN..pos + MARK_LEN + m]);
                    pos += MARK_LEN + m;
                }
                return Ok(Some(&self.assembled));
            }
            let Some(mark) = self.buf.get(self.scan..).and_then(RecordMark::parse) else {
                return Ok(None);
            };
            self.frags += 1;
            if self.frags > self.limits.max_fragments {
                return Err(self.fail(RecordError::TooManyFragments { max: self.limits.max_fragments }));
            }
            self.body_len += u64::from(mark.len);
            if self.body_len > self.limits.max_record_len as u64 {
                let e = RecordError::TooLarge { len: self.body_len, max: self.limits.max_record_len };
                return Err(self.fail(e));
            }
            // Cannot overflow: body_len ≤ max_record_len bounds it to memory-sized values.
            let frag_end = self.scan + MARK_LEN + mark.len as usize;
            if mark.last {
                self.end = Some(frag_end);
            } else {
                self.scan = frag_end;
            }
        }
    }

    fn fail(&mut self, e: RecordError) -> RecordError {
        self.error = Some(e.clone());
        e
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mark_round_trip() {
        let m = RecordMark::from_bytes([0x80, 0, 0, 0x28]);
        assert_eq!(m, RecordMark { last: true, len: 40 });
        assert_eq!(m.to_bytes(), [0x80, 0, 0, 0x28]);
        assert_eq!(RecordMark::new(MAX_FRAGMENT_LEN + 1, true), None);
        assert_eq!(RecordMark::new(MAX_FRAGMENT_LEN, false).unwrap().to_bytes(), [0x7f, 0xff, 0xff, 0xff]);
    }

    #[test]
    fn encode_splits_like_rpctest() {
        let body: Vec<u8> = (0..40).collect();
        let mut out = Vec::new();
        encode_record(&body, 3, &mut out);
        assert_eq!(out.len(), 52);
        assert_eq!(&out[0..5], &[0, 0, 0, 1, 0]);
        assert_eq!(&out[5..9], &[0, 0, 0, 38]);
        assert_eq!(&out[47..52], &[0x80, 0, 0, 1, 39]);
        let mut back = Vec::new();
        assert_eq!(strip_marks(&out, &mut back), Ok(3));
        assert_eq!(back, body);
    }

    #[test]
    fn encode_all_counts() {
        let body: Vec<u8> = (0..7).collect();
        for k in 0..12 {
            let mut out = Vec::new();
            encode_record(&body, k, &mut out);
            let want = k.clamp(1, 7);
            assert_eq!(out.len(), 7 + 4 * want, "k={k}");
            let mut back = Vec::new();
            assert_eq!(strip_marks(&out, &mut back), Ok(want));
            assert_eq!(back, body);
        }
        let mut out = Vec::new();
        encode_record(&[], 5, &mut out);
        assert_eq!(out, [0x80, 0, 0, 0]);
    }

    #[test]
    fn encode_parts_matches_joined() {
        let head: Vec<u8> = (0..5).collect();
        let tail: Vec<u8> = (5..12).collect();
        for k in 1..14 {
            let (mut a, mut b) = (Vec::new(), Vec::new());
            encode_record_parts(&head, &tail, k, &mut a);
            encode_record(&[head.clone(), tail.clone()].concat(), k, &mut b);
            assert_eq!(a, b, "k={k}");
        }
    }

    #[test]
    fn mark_errors() {
        let mut v = Vec::new();
        assert_eq!(strip_marks(&[], &mut v), Err(MarkError::MissingLastFragment));
        assert_eq!(strip_marks(&[0x80, 0], &mut v), Err(MarkError::TruncatedMark { at: 0 }));
        assert_eq!(
            strip_marks(&[0x80, 0, 0, 3, 1], &mut v),
            Err(MarkError::TruncatedFragment { at: 0, len: 3, have: 5 })
        );
        assert_eq!(strip_marks(&[0, 0, 0, 1, 1], &mut v), Err(MarkError::MissingLastFragment));
        assert_eq!(strip_marks(&[0x80, 0, 0, 1, 1, 9], &mut v), Err(MarkError::TrailingBytes { extra: 1 }));
    }

    #[test]
    fn reader_byte_at_a_time() {
        let mut wire = Vec::new();
        let bodies: Vec<Vec<u8>> = (0..20u8).map(|i| (0..i).collect()).collect();
        for (i, b) in bodies.iter().enumerate() {
            encode_record(b, 1 + i % 4, &mut wire);
        }
        let mut r = RecordReader::new(RecordLimits::default());
        let mut got = Vec::new();
        for &byte in &wire {
            r.push(&[byte]);
            while let Some(rec) = r.next_record().unwrap() {
                got.push(rec.to_vec());
            }
        }
        assert_eq!(got, bodies);
        assert_eq!(r.buffered(), 0);
        assert_eq!(r.need(), MARK_LEN);
    }

    #[test]
    fn reader_limits_are_sticky() {
        let lim = RecordLimits { max_record_len: 8, max_fragments: 2 };
        let mut r = RecordReader::new(lim);
        r.push(&[0x80, 0, 0, 9]);
        let e = RecordError::TooLarge { len: 9, max: 8 };
        assert_eq!(r.next_record(), Err(e.clone()));
        r.push(&[0; 9]);
        assert_eq!(r.next_record(), Err(e));

        let mut r = RecordReader::new(lim);
        r.push(&[0, 0, 0, 0, 0, 0, 0, 0, 0x80, 0, 0, 0]);
        assert_eq!(r.next_record(), Err(RecordError::TooManyFragments { max: 2 }));
    }

    #[test]
    fn reader_need() {
        let mut r = RecordReader::new(RecordLimits::default());
        assert_eq!(r.need(), 4);
        r.push(&[0, 0]);
        assert_eq!(r.need(), 2);
        r.push(&[0, 3, 1]);
        assert_eq!(r.next_record(), Ok(None));
        // Rest of the 3-byte fragment, then the next mark.
        assert_eq!(r.need(), 2 + 4);
        r.push(&[2, 3, 0x80, 0, 0, 1]);
        assert_eq!(r.next_record(), Ok(None));
        assert_eq!(r.need(), 1);
        r.push(&[4, 0x80]);
        assert_eq!(r.next_record(), Ok(Some(&[1, 2, 3, 4][..])));
        assert_eq!(r.buffered(), 1);
        assert_eq!(r.next_record(), Ok(None));
    }
}
