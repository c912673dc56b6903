//! Thrift framed transport (TFramedTransport): a 4-byte big-endian signed
//! frame size that excludes itself. A negative size is refused: in practice it
//! is an unframed TBinaryProtocol message (version word 0x8001…) sent to a
//! framed server.

use crate::parser::{Parse, ParseError, Parser};
use crate::parsers::length::checked_total;

/// Thrift framed-transport parser.
///
/// ```
/// use connmux_core::parsers::Thrift;
/// use connmux_core::{Parse, Parser};
/// assert_eq!(Thrift::new().parse(&[0, 0, 0, 17]), Parse::Length(21));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Thrift;

impl Thrift {
    /// The Thrift framed parser (no configuration).
    pub fn new() -> Self {
        Thrift
    }
}

/// A 4-byte big-endian signed size excluding itself, negative refused as
/// `what`. Shared by Thrift and Kafka, which frame alike.
#[inline]
pub(crate) fn parse_be_i32_size(buf: &[u8], what: &'static str) -> Parse {
    let Some(b) = buf.get(..4) else {
        return Parse::NeedMore(4 - buf.len());
    };
    let size = i32::from_be_bytes([b[0], b[1], b[2], b[3]]);
    if size < 0 {
        return Parse::Invalid(ParseError::BadField { what, value: u64::from(size as u32) });
    }
    checked_total(size as u64, 4, 0, 4)
}

impl Parser for Thrift {
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
        parse_be_i32_size(buf, "thrift frame size (negative)")
    }

    fn name(&self) -> &str {
        "thrift"
    }
}
