//! Little-endian fields with bounds checks.

/// Why bytes are not a well-formed 9P message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// A field runs past the end of the message.
    #[error("field at offset {at} needs {need} bytes, message has {have}")]
    Truncated {
        /// Where the field starts.
        at: usize,
        /// Bytes it needs.
        need: usize,
        /// Bytes the message has.
        have: usize,
    },
    /// Bytes follow the last field.
    #[error("{extra} bytes after the last field")]
    Trailing {
        /// How many.
        extra: usize,
    },
    /// The size field disagrees with the bytes given.
    #[error("size field says {size}, message has {have} bytes")]
    Size {
        /// The size field.
        size: u32,
        /// Bytes given.
        have: usize,
    },
    /// A string is not UTF-8.
    #[error("string at offset {at} is not UTF-8")]
    NotUtf8 {
        /// Where its length starts.
        at: usize,
    },
    /// A Twalk with more than 16 names.
    #[error("walk of {n} names, at most 16")]
    TooManyNames {
        /// The count given.
        n: u16,
    },
    /// A count field larger than the data it describes can be (Twrite's count
    /// past the message, a Tread's count past the negotiated limit is the
    /// server's business, not this).
    #[error("count {count} exceeds the {room} bytes left")]
    Count {
        /// The count.
        count: u32,
        /// What is left.
        room: usize,
    },
    /// A type this crate does not decode (a T-message of 9P2000/.u, or an R-message).
    #[error("message type {0} is not a 9P2000.L request")]
    UnknownType(u8),
}

/// A cursor over one message's bytes.
#[derive(Clone, Debug)]
pub struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    /// Read `buf` from `at`.
    pub fn new(buf: &'a [u8], at: usize) -> Self {
        Reader { buf, at }
    }
    /// The offset of the next field.
    pub fn offset(&self) -> usize {
        self.at
    }
    /// Bytes left.
    pub fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.at)
    }
    /// The next `n` bytes.
    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.buf.len());
        let Some(end) = end else {
            return Err(WireError::Truncated { at: self.at, need: n, have: self.buf.len() });
        };
        let b = &self.buf[self.at..end];
        self.at = end;
        Ok(b)
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        let b = self.bytes(N)?;
        let mut a = [0u8; N];
        a.copy_from_slice(b);
        Ok(a)
    }
    /// u8.
    pub fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.array::<1>()?[0])
    }
    /// u16, little-endian.
    pub fn u16(&mut self) -> Result<u16, WireError> {
        Ok(u16::from_le_bytes(self.array()?))
    }
    /// u32, little-endian.
    pub fn u32(&mut self) -> Result<u32, WireError> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    /// u64, little-endian.
    pub fn u64(&mut self) -> Result<u64, WireError> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    /// `s[2]` + UTF-8 bytes.
    pub fn str(&mut self) -> Result<&'a str, WireError> {
        let at = self.at;
        let n = self.u16()? as usize;
        let b = self.bytes(n)?;
        std::str::from_utf8(b).map_err(|_| WireError::NotUtf8 { at })
    }
    /// `count[4]` + that many bytes.
    pub fn data(&mut self) -> Result<&'a [u8], WireError> {
        let count = self.u32()?;
        if count as usize > self.remaining() {
            return Err(WireError::Count { count, room: self.remaining() });
        }
        self.bytes(count as usize)
    }
    /// Fails unless every byte was read.
    pub fn finish(&self) -> Result<(), WireError> {
        match self.remaining() {
            0 => Ok(()),
            extra => Err(WireError::Trailing { extra }),
        }
    }
}

/// Append helpers for encoders.
pub(crate) fn put_str(out: &mut Vec<u8>, s: &str) {
    // Longer strings cannot be said in 9P: cut at 65,535 bytes (names are
    // at most 255 on Linux, so only a hostile symlink target gets here).
    let b = &s.as_bytes()[..s.len().min(u16::MAX as usize)];
    out.extend_from_slice(&(b.len() as u16).to_le_bytes());
    out.extend_from_slice(b);
}
