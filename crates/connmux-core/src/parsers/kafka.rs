//! Kafka wire protocol: every request and response starts with a 4-byte
//! big-endian signed `Size` that excludes itself. A negative size is refused.

use crate::parser::{Parse, Parser};
use crate::parsers::thrift::parse_be_i32_size;

/// Kafka framing parser.
///
/// ```
/// use connmux_core::parsers::Kafka;
/// use connmux_core::{Parse, Parser};
/// assert_eq!(Kafka::new().parse(&[0, 0, 0, 13]), Parse::Length(17));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Kafka;

impl Kafka {
    /// The Kafka parser (no configuration).
    pub fn new() -> Self {
        Kafka
    }
}

impl Parser for Kafka {
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
        parse_be_i32_size(buf, "kafka size (negative)")
    }

    fn name(&self) -> &str {
        "kafka"
    }
}
