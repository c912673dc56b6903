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
        mallopt(libc::M_MMAP_THRESHOLD, bytes)
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
        mallopt(libc::M_TRIM_THRESHOLD, bytes)
    }
    #[cfg(not(target_env = "gnu"))]
    {
        let _ = bytes;
        false
    }
}

#[cfg(target_env = "gnu")]
fn mallopt(param: libc::c_int, bytes: usize) -> bool {
    let v = i32::try_from(bytes).unwrap_or(i32::MAX);
    // SAFETY: mallopt takes two ints and changes allocator parameters only;
    // glibc checks the value (it returns 0 when refused).
    unsafe { libc::mallopt(param, v) == 1 }
}

/// Bytes the program holds in the allocator's heap arenas (`mallinfo2`'s
/// `uordblks`; blocks in mappings of their own are not counted: they go
/// back at free). What it falls by is what frees left in the arenas for a
/// [`trim`] to give back. Walks the free lists of every arena under its
/// lock: call it now and then, not per operation. `None` where the
/// allocator does not tell.
pub fn in_use() -> Option<usize> {
    #[cfg(target_env = "gnu")]
    {
        // SAFETY: mallinfo2 takes nothing and returns a struct by value; it
        // locks each arena while it counts (thread-safe).
        let info = unsafe { libc::mallinfo2() };
        Some(info.uordblks)
    }
    #[cfg(not(target_env = "gnu"))]
    {
        None
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

    #[test]
    #[cfg_attr(connmux_asan, ignore = "ASan's allocator replaces glibc's and does not count its arenas")]
    fn in_use_follows_an_arena_block() {
        // Below any mmap threshold glibc may have moved to: from an arena.
        // Other test threads allocate too: the first of a few tries that
        // no other allocation disturbed shows it.
        let mut seen = Vec::new();
        for _ in 0..5 {
            let before = in_use().expect("glibc tells");
            let block = std::hint::black_box(vec![1u8; 64 << 10]);
            let held = in_use().unwrap();
            drop(block);
            let after = in_use().unwrap();
            if held >= before + (64 << 10) && after + (64 << 10) <= held {
                return;
            }
            seen.push((before, held, after));
        }
        panic!("in use before, with and after a 64 KiB block: {seen:?}");
    }
}
