//! The C allocator's knobs that decide whether freed memory goes back to the
//! system (glibc's `mallopt` and `malloc_trim`), and a global allocator that
//! counts the large blocks in use, so that a program knows when frees left
//! enough for a trim ([`Counting`]).
//!
//! Why: a large block in a mapping of its own costs its pages afresh each
//! time (a fault and a zeroed page for every 4 KiB touched, and an unmap at
//! free), while a block from a heap arena reuses pages already in the
//! process; but pages freed in an arena stay in the process until a trim
//! gives them back. glibc moves its thresholds by itself (a freed mapping
//! raises the mmap threshold to its size, up to 32 MiB); a caller that sets
//! them fixes both where it wants them. Elsewhere than glibc these do
//! nothing.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

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

/// Allocations of at least this size are counted by [`Counting`]: message
/// buffers and other blocks whose frees leave pages worth a trim; smaller
/// ones (most allocations, the hot path's) pay one comparison.
pub const COUNTED_FROM: usize = 16 << 10;

static LARGE_IN_USE: AtomicUsize = AtomicUsize::new(0);

/// The most [`LARGE_IN_USE`] reached since the last [`take_large_high`].
static LARGE_HIGH: AtomicUsize = AtomicUsize::new(0);

/// The system allocator, counting the bytes of the blocks of at least
/// [`COUNTED_FROM`] it holds for the program ([`large_in_use`]). What that
/// count falls by is what frees left in the arenas for a [`trim`] to give
/// back, known without walking the allocator's free lists (glibc's
/// `mallinfo2` walks every free block under each arena's lock: 20 ms for
/// 100,000 of them). A program installs it with `#[global_allocator]`.
pub struct Counting;

#[inline]
fn counted(size: usize, grow: bool) {
    if size >= COUNTED_FROM {
        if grow {
            let now = LARGE_IN_USE.fetch_add(size, Ordering::Relaxed) + size;
            // The read first: a new most is rare, a locked update dear.
            if now > LARGE_HIGH.load(Ordering::Relaxed) {
                LARGE_HIGH.fetch_max(now, Ordering::Relaxed);
            }
        } else {
            LARGE_IN_USE.fetch_sub(size, Ordering::Relaxed);
        }
    }
}

// SAFETY: every call goes to `System` with the caller's own arguments, so
// `System`'s guarantees are this allocator's; the count is a side effect.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract (a non-zero size) is System's.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            counted(layout.size(), true);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for `alloc`.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            counted(layout.size(), true);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        counted(layout.size(), false);
        // SAFETY: `ptr` came from this allocator (from System) with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` came from this allocator (from System) with `layout`.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            counted(layout.size(), false);
            counted(new_size, true);
        }
        p
    }
}

/// Bytes in blocks of at least [`COUNTED_FROM`] the program holds, as
/// [`Counting`] counts them (0 where it is not the global allocator).
pub fn large_in_use() -> usize {
    LARGE_IN_USE.load(Ordering::Relaxed)
}

/// The most bytes [`large_in_use`] reached since the last call (or since
/// the program started), and from now on the most since this call. A
/// program that looks at [`large_in_use`] now and then misses a burst of
/// large blocks taken and freed between two looks; this one does not.
pub fn take_large_high() -> usize {
    LARGE_HIGH.swap(large_in_use(), Ordering::Relaxed)
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
