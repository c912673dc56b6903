//! XDR (RFC 4506) for the NFS bodies: a checked reader over a byte slice
//! whose every failure is a typed [`XdrError`], and appending writers.
//!
//! Counts are bounded by the input: a length or a list count is checked
//! against the bytes left before anything is allocated or sliced, so a
//! hostile `0xffff_ffff` costs nothing.

/// Why bytes are not the XDR the procedure takes.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum XdrError {
    /// The input ends before the item does.
    #[error("{what}: needs {need} bytes at offset {at}, {have} in all")]
    Truncated {
        /// The item being read.
        what: &'static str,
        /// Its offset.
        at: usize,
        /// Bytes it needs from there.
        need: u64,
        /// Bytes the input has in all.
        have: usize,
    },
    /// A variable-length item longer than its type allows.
    #[error("{what}: {len} bytes, at most {max}")]
    TooLong {
        /// The item.
        what: &'static str,
        /// Its declared length.
        len: u32,
        /// The most its type allows.
        max: u32,
    },
    /// A discriminant or boolean with no arm for its value.
    #[error("{what}: no arm for {value}")]
    BadValue {
        /// The item.
        what: &'static str,
        /// The value read.
        value: u32,
    },
    /// WRITE's data is not as long as its count says.
    #[error("WRITE count {count} but {len} bytes of data")]
    WriteCount {
        /// The count argument.
        count: u32,
        /// The data's length.
        len: u32,
    },
    /// The procedure number is not one of the program's.
    #[error("no procedure {0}")]
    UnknownProc(u32),
}

/// A cursor over XDR input.
#[derive(Clone, Debug)]
pub struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    /// Reads `buf` from its start.
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf, at: 0 }
    }

    /// Bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.at
    }

    /// Offset of the next item.
    pub fn position(&self) -> usize {
        self.at
    }

    fn take(&mut self, what: &'static str, n: u64) -> Result<&'a [u8], XdrError> {
        if n > self.remaining() as u64 {
            return Err(XdrError::Truncated { what, at: self.at, need: n, have: self.buf.len() });
        }
        let s = &self.buf[self.at..self.at + n as usize];
        self.at += n as usize;
        Ok(s)
    }

    /// An unsigned 32-bit integer.
    pub fn u32(&mut self, what: &'static str) -> Result<u32, XdrError> {
        let b = self.take(what, 4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// An unsigned hyper.
    pub fn u64(&mut self, what: &'static str) -> Result<u64, XdrError> {
        let b = self.take(what, 8)?;
        Ok(u64::from_be_bytes(b.try_into().expect("8 bytes")))
    }

    /// A boolean: 0 or 1, anything else [`XdrError::BadValue`].
    pub fn bool(&mut self, what: &'static str) -> Result<bool, XdrError> {
        match self.u32(what)? {
            0 => Ok(false),
            1 => Ok(true),
            value => Err(XdrError::BadValue { what, value }),
        }
    }

    /// Fixed-length opaque data of `n` bytes (padded to 4).
    pub fn fixed(&mut self, what: &'static str, n: usize) -> Result<&'a [u8], XdrError> {
        let padded = (n as u64 + 3) & !3;
        let b = self.take(what, padded)?;
        Ok(&b[..n])
    }

    /// Variable-length opaque data or a string of at most `max` bytes.
    pub fn opaque(&mut self, what: &'static str, max: u32) -> Result<&'a [u8], XdrError> {
        let at = self.at;
        let len = self.u32(what)?;
        if len > max {
            self.at = at;
            return Err(XdrError::TooLong { what, len, max });
        }
        self.fixed(what, len as usize)
    }
}

/// Appends a big-endian word.
#[inline]
pub fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_be_bytes());
}

/// Appends a big-endian hyper.
#[inline]
pub fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_be_bytes());
}

/// Appends a boolean.
#[inline]
pub fn put_bool(out: &mut Vec<u8>, v: bool) {
    put_u32(out, u32::from(v));
}

/// Appends fixed-length opaque data, padded to 4.
pub fn put_fixed(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(b);
    out.extend_from_slice(&[0u8; 3][..(4 - b.len() % 4) % 4]);
}

/// Appends variable-length opaque data or a string: length, bytes, padding.
///
/// # Panics
/// If `b` is 4 GiB or longer (no XDR item can be).
pub fn put_opaque(out: &mut Vec<u8>, b: &[u8]) {
    put_u32(out, u32::try_from(b.len()).expect("opaque under 4 GiB"));
    put_fixed(out, b);
}

/// Bytes an opaque of `len` bytes takes with its length word and padding.
pub fn opaque_len(len: usize) -> usize {
    4 + ((len + 3) & !3)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reader_bounds_and_lengths() {
        let mut out = Vec::new();
        put_u32(&mut out, 7);
        put_u64(&mut out, 1 << 40);
        put_opaque(&mut out, b"abcde");
        put_bool(&mut out, true);
        assert_eq!(out.len(), 4 + 8 + opaque_len(5) + 4);
        let mut r = Reader::new(&out);
        assert_eq!(r.u32("a"), Ok(7));
        assert_eq!(r.u64("b"), Ok(1 << 40));
        assert_eq!(r.opaque("c", 5), Ok(&b"abcde"[..]));
        assert_eq!(r.bool("d"), Ok(true));
        assert_eq!(r.remaining(), 0);
        assert!(Reader::new(&out[..14]).clone().u64("x").is_ok());
        let mut r = Reader::new(&out[12..]);
        assert_eq!(r.opaque("c", 4), Err(XdrError::TooLong { what: "c", len: 5, max: 4 }));
        // A hostile length is refused before anything is taken.
        let huge = [0xff; 8];
        assert!(matches!(Reader::new(&huge).opaque("h", u32::MAX), Err(XdrError::Truncated { .. })));
        assert_eq!(Reader::new(&[0, 0, 0, 2]).bool("b"), Err(XdrError::BadValue { what: "b", value: 2 }));
    }
}
