//! 9P (9P2000, .u, .L): `size[4]` little-endian, counting the whole message
//! including itself, then `type[1] tag[2]`. A size below 7 cannot hold the
//! fixed header and is refused.

use crate::parser::{Parse, Parser};
use crate::parsers::length::checked_total;

/// `size[4] type[1] tag[2]`: the smallest 9P message.
pub const MIN_MESSAGE: usize = 7;

/// 9P framing parser.
///
/// ```
/// use connmux_core::parsers::NineP;
/// use connmux_core::{Parse, Parser};
/// assert_eq!(NineP::new().parse(&[19, 0, 0, 0, 100]), Parse::Length(19));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NineP;

impl NineP {
    /// The 9P parser (no configuration).
    pub fn new() -> Self {
        NineP
    }
}

impl Parser for NineP {
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
        let Some(b) = buf.get(..4) else {
            return Parse::NeedMore(4 - buf.len());
        };
        let size = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        checked_total(u64::from(size), 0, 0, MIN_MESSAGE)
    }

    fn name(&self) -> &str {
        "9p"
    }
}
