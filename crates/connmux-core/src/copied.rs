//! A sent message's copy in one allocation.
//!
//! A queued message is cloned once on its way out (the writer takes its
//! chunk's slices out of the lock, `Mux::tx_begin_into`). A `Bytes` made
//! from a `Vec` (`Bytes::copy_from_slice`, `BytesMut::freeze`) allocates
//! again at its first clone, to share the vector, and frees twice at its
//! last drop: two allocations and two frees a message, about a fifth of
//! the instructions a small message cost a `bench kcm` server. A
//! small message is copied into a fixed-size owner instead
//! (`Bytes::from_owner`): one allocation, holding the count that clones
//! share; a larger one as before, its copy outweighing the second
//! allocation.

use bytes::Bytes;

/// The largest message copied inline.
const INLINE_MAX: usize = 2048;

/// A message of at most `N` bytes, stored inline.
struct Inline<const N: usize> {
    len: usize,
    buf: [u8; N],
}

impl<const N: usize> AsRef<[u8]> for Inline<N> {
    fn as_ref(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

fn inline<const N: usize>(data: &[u8]) -> Bytes {
    let mut m = Inline { len: data.len(), buf: [0; N] };
    m.buf[..data.len()].copy_from_slice(data);
    Bytes::from_owner(m)
}

/// A copy of `data` whose clones allocate nothing (see the module).
pub fn copied(data: &[u8]) -> Bytes {
    // Powers of two: an owner past 64 bytes is less than twice the
    // message (the allocator rounds a small vector up too).
    match data.len() {
        0 => Bytes::new(),
        1..=64 => inline::<64>(data),
        65..=128 => inline::<128>(data),
        129..=256 => inline::<256>(data),
        257..=512 => inline::<512>(data),
        513..=1024 => inline::<1024>(data),
        1025..=INLINE_MAX => inline::<INLINE_MAX>(data),
        _ => Bytes::copy_from_slice(data),
    }
}

#[cfg(test)]
mod tests {
    use super::copied;

    #[test]
    fn a_copy_holds_the_bytes_at_every_size_class_edge() {
        for n in [0, 1, 64, 65, 128, 129, 256, 257, 512, 513, 1024, 1025, 2048, 2049, 10_000] {
            let data: Vec<u8> = (0..n).map(|i| (i * 7 + n) as u8).collect();
            let b = copied(&data);
            assert_eq!(&b[..], &data[..], "length {n}");
            let c = b.slice(n / 3..);
            drop(b);
            assert_eq!(&c[..], &data[n / 3..], "a slice outlives its source, length {n}");
        }
    }
}
