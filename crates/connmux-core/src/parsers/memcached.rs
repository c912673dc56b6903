//! memcached binary protocol: a 24-byte header, then `total body length`
//! bytes (extras, key, value).
//!
//! ```text
//! offset 0  magic (0x80 request, 0x81 response)   1  opcode
//!        2  key length (2, BE)                    4  extras length (1)
//!        5  data type                              6  vbucket id / status (2)
//!        8  total body length (4, BE)             12  opaque (4)
//!       16  CAS (8)
//! ```
//! The magic is checked as soon as the first byte is in, and the body must
//! hold the key and extras it announces.

use crate::parser::{Parse, ParseError, Parser};

/// Header length.
pub const HEADER_LEN: usize = 24;
/// Magic of a request.
pub const MAGIC_REQUEST: u8 = 0x80;
/// Magic of a response.
pub const MAGIC_RESPONSE: u8 = 0x81;

/// memcached binary-protocol parser.
///
/// ```
/// use connmux_core::parsers::Memcached;
/// use connmux_core::{Parse, Parser};
/// let mut p = Memcached::new();
/// assert_eq!(p.parse(&[0x80, 0]), Parse::NeedMore(22));
/// assert!(matches!(p.parse(b"get k\r\n"), Parse::Invalid(_)));   // text protocol
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Memcached;

impl Memcached {
    /// The memcached binary parser (no configuration).
    pub fn new() -> Self {
        Memcached
    }
}

impl Parser for Memcached {
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
        match buf.first() {
            None => return Parse::NeedMore(HEADER_LEN),
            Some(&m) if m != MAGIC_REQUEST && m != MAGIC_RESPONSE => {
                return Parse::Invalid(ParseError::BadField { what: "memcached magic", value: u64::from(m) });
            }
            Some(_) => {}
        }
        let Some(h) = buf.get(..HEADER_LEN) else {
            return Parse::NeedMore(HEADER_LEN - buf.len());
        };
        let key_len = u32::from(u16::from_be_bytes([h[2], h[3]]));
        let extras_len = u32::from(h[4]);
        let body_len = u32::from_be_bytes([h[8], h[9], h[10], h[11]]);
        if key_len + extras_len > body_len {
            return Parse::Invalid(ParseError::BadField {
                what: "memcached key+extras length over body length",
                value: u64::from(key_len + extras_len),
            });
        }
        // 24 + u32 fits in usize on every 64-bit target; checked for 32-bit ones.
        match HEADER_LEN.checked_add(body_len as usize) {
            Some(n) => Parse::Length(n),
            None => Parse::Invalid(ParseError::LengthOverflow),
        }
    }

    fn name(&self) -> &str {
        "memcached"
    }
}
