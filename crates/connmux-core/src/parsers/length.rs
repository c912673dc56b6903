//! The generic length-field parser: a length at any offset, 1 to 8 bytes wide,
//! either byte order, with a signed adjustment, counting or not counting the
//! header. Most length-prefixed protocols are one configuration of it.

use std::fmt;

use crate::parser::{frame_batch_with, run_of, Parse, ParseError, Parser, Run};

/// Byte order of a length field.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Endian {
    /// Big-endian (network order), spelled `be`.
    Big,
    /// Little-endian, spelled `le`.
    Little,
}

impl fmt::Display for Endian {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Endian::Big => "be",
            Endian::Little => "le",
        })
    }
}

/// Largest offset accepted for a length field: a field further than 64 KiB
/// into a message is not a header, and the bound keeps `offset + width` far
/// from overflow.
pub const MAX_OFFSET: usize = 0xffff;

/// A length-field configuration the parser cannot use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LengthFieldError {
    /// The width is not 1..=8 bytes.
    #[error("length field width {0} is not 1..=8 bytes")]
    Width(usize),
    /// The offset is over [`MAX_OFFSET`].
    #[error("length field offset {0} exceeds {MAX_OFFSET}")]
    Offset(usize),
}

/// A length field at `offset`, `width` bytes, in `endian` order.
///
/// The message length is `value + adjust` when `includes_header` (the value
/// counts the whole message from its first byte), otherwise
/// `offset + width + value + adjust` (the value counts the bytes after the
/// field). A result below `offset + width` is refused
/// ([`ParseError::LengthBelowHeader`]); one over `i64::MAX` too
/// ([`ParseError::LengthOverflow`]).
///
/// ```
/// use connmux_core::parsers::{LengthField, Endian};
/// use connmux_core::{Parse, Parser};
/// // 2-byte little-endian length at offset 1, counting the whole message:
/// let mut p = LengthField::new(1, 2, Endian::Little, 0, true).unwrap();
/// assert_eq!(p.parse(&[0xaa, 5, 0, 1, 2]), Parse::Length(5));
/// assert_eq!(LengthField::l4().parse(&[0, 0]), Parse::NeedMore(2));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LengthField {
    offset: usize,
    width: usize,
    endian: Endian,
    adjust: i64,
    includes_header: bool,
    /// offset + width: bytes needed before the length is known.
    header_len: usize,
    /// The canonical spec string (also the parser's name).
    name: String,
}

impl LengthField {
    /// A length-field parser; see the type's docs for the arithmetic.
    pub fn new(
        offset: usize,
        width: usize,
        endian: Endian,
        adjust: i64,
        includes_header: bool,
    ) -> Result<Self, LengthFieldError> {
        if !(1..=8).contains(&width) {
            return Err(LengthFieldError::Width(width));
        }
        if offset > MAX_OFFSET {
            return Err(LengthFieldError::Offset(offset));
        }
        let name = format!(
            "len:offset={offset},width={width},endian={endian},adjust={adjust},includes_header={includes_header}"
        );
        Ok(LengthField { offset, width, endian, adjust, includes_header, header_len: offset + width, name })
    }

    /// `l4`: a 4-byte big-endian length at offset 0 that excludes itself.
    pub fn l4() -> Self {
        match LengthField::new(0, 4, Endian::Big, 0, false) {
            Ok(p) => p,
            // Width 4 and offset 0 are in range.
            Err(_) => unreachable!(),
        }
    }

    /// Bytes needed before the length is known (`offset + width`).
    pub fn header_len(&self) -> usize {
        self.header_len
    }
}

/// The message length for a decoded field `value`: `base + value + adjust`,
/// refused below `header` or beyond `i64::MAX`. Shared by the fixed-format parsers.
#[inline]
pub(crate) fn checked_total(value: u64, base: usize, adjust: i64, header: usize) -> Parse {
    // i128 holds every u64 + usize + i64 sum exactly: no wrap to check for.
    let total = i128::from(value) + base as i128 + i128::from(adjust);
    if total < header as i128 {
        return Parse::Invalid(ParseError::LengthBelowHeader { length: total.max(0) as u64, header });
    }
    if total > i128::from(i64::MAX) || total > usize::MAX as i128 {
        return Parse::Invalid(ParseError::LengthOverflow);
    }
    Parse::Length(total as usize)
}

impl Parser for LengthField {
    // Stateless: the same bytes always get the same answer.
    fn frames_in_place(&self) -> bool {
        true
    }

    /// Messages are handed over as framed, header and all.
    fn delivers_whole(&self) -> bool {
        true
    }

    #[inline]
    fn parse(&mut self, buf: &[u8]) -> Parse {
        let Some(field) = buf.get(self.offset..self.header_len) else {
            return Parse::NeedMore(self.header_len - buf.len());
        };
        let value = match (self.endian, field) {
            // The common widths convert in one load; the rest fold byte by byte.
            (Endian::Big, &[a, b, c, d]) => u64::from(u32::from_be_bytes([a, b, c, d])),
            (Endian::Little, &[a, b, c, d]) => u64::from(u32::from_le_bytes([a, b, c, d])),
            (Endian::Big, _) => field.iter().fold(0u64, |v, &b| (v << 8) | u64::from(b)),
            (Endian::Little, _) => field.iter().rev().fold(0u64, |v, &b| (v << 8) | u64::from(b)),
        };
        let base = if self.includes_header { 0 } else { self.header_len };
        checked_total(value, base, self.adjust, self.header_len)
    }

    /// A 4-byte field at the front (`l4` and its kin, the common shape):
    /// one load and two compares a message; any other shape goes the
    /// general way ([`frame_batch_with`]). The same messages either way
    /// (`tests/parsers.rs::the_four_byte_loop_frames_as_the_general_one`).
    fn frame_batch(&mut self, data: &[u8], max_len: usize, limit: usize, out: &mut Vec<Run>) -> usize {
        if self.offset != 0 || self.width != 4 {
            return frame_batch_with(self, data, 0, max_len, limit, out);
        }
        // total = field + (4 unless it includes itself) + adjust; below the
        // header it is invalid, which stops the batch. With an adjustment
        // this small a u32 field cannot take the sum past i64 (or usize).
        let extra = if self.includes_header { 0 } else { 4 };
        let extra = match self.adjust.checked_add(extra) {
            Some(e) if (-(1i64 << 40)..=(1i64 << 40)).contains(&e) => e,
            _ => return frame_batch_with(self, data, 0, max_len, limit, out),
        };
        match self.endian {
            Endian::Big => frame_l4::<true>(data, extra, max_len, limit, out),
            Endian::Little => frame_l4::<false>(data, extra, max_len, limit, out),
        }
    }

    fn name(&self) -> &str {
        &self.name
    }
}

/// [`LengthField::frame_batch`]'s loop for a 4-byte field at the front
/// (`BIG`: big-endian), a message's length the field plus `extra`.
///
/// Messages come in runs of one length (a client's requests are alike):
/// a run's first field is decoded and checked, the rest of the run is
/// found by comparing each next header's bytes with the first's, stepping
/// by the run's length through what is whole in `rest` (no decode, no
/// bounds check past the one of the step), and the run is pushed when it
/// ends, one [`Run`] for all its messages.
#[inline]
fn frame_l4<const BIG: bool>(data: &[u8], extra: i64, max_len: usize, limit: usize, out: &mut Vec<Run>) -> usize {
    let (mut at, mut n) = (0, 0);
    // `data[at..]`, narrowed run by run.
    let mut rest = data;
    // Bounded: each turn takes at least one message or stops.
    while n < limit {
        let Some((&head, _)) = rest.split_first_chunk::<4>() else { break };
        let field = if BIG { u32::from_be_bytes(head) } else { u32::from_le_bytes(head) };
        let total = i64::from(field) + extra;
        if total < 4 {
            break; // a message holds at least its header
        }
        let len = total as usize;
        if len > max_len || len > rest.len() {
            break;
        }
        // The run: messages whole in `rest` (within the limit) whose header
        // is this one's bytes.
        let run = run_of(rest, &head, len, (limit - n).min(rest.len() / len));
        out.push(Run::whole(at, len, run));
        at += run * len;
        n += run;
        rest = &rest[run * len..];
    }
    at
}
