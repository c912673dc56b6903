//! HTTP/2 (RFC 9113): the client connection preface
//! `PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n` (24 bytes) is its own message when it is
//! the first thing on the stream; after it, every message is one frame: a
//! 9-byte header whose first 3 bytes are the big-endian payload length.
//!
//! ```text
//! +-----------------------------------------------+
//! |                 Length (24)                   |
//! +---------------+---------------+---------------+
//! |   Type (8)    |   Flags (8)   |
//! +-+-------------+---------------+-------------------------------+
//! |R|                 Stream Identifier (31)                      |
//! +=+=============================================================+
//! |                   Frame Payload (Length bytes)                |
//! ```
//! Frame types and flags are not checked (RFC 9113 §4.1: unknown types are
//! ignored by the peer, so they frame like any other).

use crate::parser::{Parse, Parser};

/// The client connection preface (RFC 9113 §3.4).
pub const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// Frame header length.
pub const FRAME_HEADER_LEN: usize = 9;

/// HTTP/2 framing parser. Keeps one bit of state: whether the first message
/// of the stream has been framed (only it may be the preface).
///
/// ```
/// use connmux_core::parsers::Http2;
/// use connmux_core::{Parse, Parser};
/// let mut p = Http2::new();
/// assert_eq!(p.parse(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), Parse::Length(24));
/// assert_eq!(p.parse(&[0, 0, 18, 4, 0, 0, 0, 0, 0]), Parse::Length(27));   // SETTINGS
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Http2 {
    at_start: bool,
}

impl Default for Http2 {
    fn default() -> Self {
        Http2::new()
    }
}

impl Http2 {
    /// A parser for a new stream (a preface may come first).
    pub fn new() -> Self {
        Http2 { at_start: true }
    }
}

impl Parser for Http2 {
    #[inline]
    fn parse(&mut self, buf: &[u8]) -> Parse {
        if self.at_start {
            let n = buf.len().min(PREFACE.len());
            if buf[..n] == PREFACE[..n] {
                if n == PREFACE.len() {
                    self.at_start = false;
                    return Parse::Length(PREFACE.len());
                }
                // Still possibly the preface: the least that can decide is one
                // more byte (a mismatch), and never less than a frame header.
                return Parse::NeedMore(FRAME_HEADER_LEN.max(n + 1) - n);
            }
            // Not the preface: from here on, frames only.
        }
        let Some(h) = buf.get(..FRAME_HEADER_LEN) else {
            return Parse::NeedMore(FRAME_HEADER_LEN - buf.len());
        };
        self.at_start = false;
        let len = (usize::from(h[0]) << 16) | (usize::from(h[1]) << 8) | usize::from(h[2]);
        Parse::Length(FRAME_HEADER_LEN + len)
    }

    fn name(&self) -> &str {
        "http2"
    }
}
