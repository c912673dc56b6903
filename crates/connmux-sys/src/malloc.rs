//! The C allocator's knobs that decide whether freed memory goes back to the
//! system (glibc's `mallopt` and `malloc_trim`).
//!
//! Why: glibc raises its mmap threshold to the size of each large block freed
//! (up to 32 MiB), so after the first large buffer is freed, later ones come
//! from the heap arenas, and freeing them keeps the pages in the process. A
//! server whose peers come and go with large messages then keeps its peak
//! RSS for good. A fixed threshold keeps large buffers in their own mappings
//! (returned at free); a trim gives back free pages inside the arenas.
//! Elsewhere than glibc these do nothing.

/// Serve allocations of at least `bytes` by their own mapping, and stop
/// glibc from moving the threshold up (`M_MMAP_THRESHOLD`). Returns whether
/// the allocator took it.
pub fn set_mmap_threshold(bytes: usize) -> bool {
    #[cfg(target_env = "gnu")]
    {
        let v = i32::try_from(bytes).unwrap_or(i32::MAX);
        // SAFETY: mallopt takes two ints and changes allocator parameters
        // only; any value is checked by glibc (it returns 0 when refused).
        unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, v) == 1 }
    }
    #[cfg(not(target_env = "gnu"))]
    {
        let _ = bytes;
        false
    }
}

/// Give free pages of the allocator's arenas back to the system
/// (`malloc_trim(0)`). Costs a walk of the free lists: call it after a burst
/// of frees, not per operation. Returns whether anything was released.
pub fn trim() -> bool {
    #[cfg(target_env = "gnu")]
    {
        // SAFETY: malloc_trim takes a size and only releases free memory of
        // the allocator; it is thread-safe (it locks each arena).
        unsafe { libc::malloc_trim(0) == 1 }
    }
    #[cfg(not(target_env = "gnu"))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg_attr(connmux_asan, ignore = "ASan's allocator replaces glibc's and refuses its knobs")]
    fn knobs_are_taken() {
        assert!(set_mmap_threshold(256 << 10));
        // A large block freed is not in a heap arena; trim runs either way.
        drop(vec![1u8; 4 << 20]);
        let _ = trim();
    }
}
