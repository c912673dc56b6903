//! The C allocator's knobs that decide whether freed memory goes back to the
//! system (glibc's `mallopt` and `malloc_trim`).
//!
//! Why: a large block in a mapping of its own costs its pages afresh each
//! time (a fault and a zeroed page for every 4 KiB touched, and an unmap at
//! free), while a block from a heap arena reuses pages already in the
//! process; but pages freed in an arena stay in the process until a trim
//! gives them back. glibc moves its thresholds by itself (a freed mapping
//! raises the mmap threshold to its size, up to 32 MiB); a caller that sets
//! them fixes both where it wants them. Elsewhere than glibc these do
//! nothing.

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

/// Give back free memory at the top of an arena once more than `bytes` of
/// it lie there (`M_TRIM_THRESHOLD`; checked at each free that reaches the
/// top), and stop glibc from moving the threshold. Returns whether the
/// allocator took it.
pub fn set_trim_threshold(bytes: usize) -> bool {
    #[cfg(target_env = "gnu")]
    {
        let v = i32::try_from(bytes).unwrap_or(i32::MAX);
        // SAFETY: as for M_MMAP_THRESHOLD above: two ints, checked by glibc.
        unsafe { libc::mallopt(libc::M_TRIM_THRESHOLD, v) == 1 }
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
        assert!(set_trim_threshold(8 << 20));
        // A large block freed is not in a heap arena; trim runs either way.
        drop(vec![1u8; 4 << 20]);
        let _ = trim();
    }
}
