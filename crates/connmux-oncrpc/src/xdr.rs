//! The few XDR (RFC 4506) primitives the RPC headers need: big-endian 32-bit
//! words and 4-byte-padded opaque data, read with bounds checks and written by
//! appending to a caller's buffer.

/// XDR's unit: every item occupies a multiple of 4 bytes.
pub const UNIT: usize = 4;

/// Reads the big-endian word at `off`, or `None` when it does not fit.
#[inline]
pub fn get_u32(buf: &[u8], off: usize) -> Option<u32> {
    let b = buf.get(off..off.checked_add(UNIT)?)?;
    Some(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
}

/// Bytes an opaque/string body of `len` bytes occupies once padded to 4.
/// Computed in `u64` so that a hostile `len` near `u32::MAX` cannot overflow.
#[inline]
pub fn padded(len: u32) -> u64 {
    (u64::from(len) + 3) & !3
}

/// Appends a big-endian word.
#[inline]
pub fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_be_bytes());
}

/// A fixed-capacity writer used to build a call body on the stack before it is
/// split into record fragments (no heap allocation on the client's send path).
pub(crate) struct StackWriter<const N: usize> {
    buf: [u8; N],
    len: usize,
}

impl<const N: usize> StackWriter<N> {
    pub(crate) fn new() -> Self {
        StackWriter { buf: [0; N], len: 0 }
    }

    /// Callers size `N` for the largest header they can write (see
    /// `call::MAX_CALL_HEADER_LEN`), so running out of room is a bug here, not input.
    pub(crate) fn put_u32(&mut self, v: u32) {
        self.put_bytes(&v.to_be_bytes());
    }

    pub(crate) fn put_bytes(&mut self, b: &[u8]) {
        self.buf[self.len..self.len + b.len()].copy_from_slice(b);
        self.len += b.len();
    }

    /// Opaque/string: length word, bytes, zero padding to a multiple of 4.
    pub(crate) fn put_opaque(&mut self, b: &[u8]) {
        self.put_u32(b.len() as u32);
        self.put_bytes(b);
        let pad = (UNIT - b.len() % UNIT) % UNIT;
        self.put_bytes(&[0u8; 3][..pad]);
    }

    pub(crate) fn as_slice(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn get_u32_bounds() {
        let b = [0, 0, 1, 2, 3];
        assert_eq!(get_u32(&b, 0), Some(0x0102));
        assert_eq!(get_u32(&b, 1), Some(0x0001_0203));
        assert_eq!(get_u32(&b, 2), None);
        assert_eq!(get_u32(&b, usize::MAX - 1), None);
    }

    #[test]
    fn padding() {
        assert_eq!(padded(0), 0);
        assert_eq!(padded(1), 4);
        assert_eq!(padded(4), 4);
        assert_eq!(padded(5), 8);
        assert_eq!(padded(u32::MAX), 1 << 32);
    }
}
