//! `malloc::Counting` as this test program's global allocator: the large
//! blocks it holds are counted through allocation, growth, shrinking and
//! free; small ones are not.

use connmux_sys::malloc::{large_in_use, take_large_high, Counting, COUNTED_FROM};

#[global_allocator]
static ALLOC: Counting = Counting;

// One test only: the count is the whole program's, and tests run in
// threads of one program.
#[test]
fn large_blocks_are_counted() {
    large_blocks_are_counted_until_freed();
    the_most_in_use_is_seen_after_the_frees();
}

fn large_blocks_are_counted_until_freed() {
    let base = large_in_use();
    let small = std::hint::black_box(vec![1u8; COUNTED_FROM - 1]);
    assert_eq!(large_in_use(), base, "a small block is not counted");
    let mut block: Vec<u8> = std::hint::black_box(Vec::with_capacity(64 << 10));
    assert_eq!(large_in_use(), base + (64 << 10));
    block.reserve_exact(1 << 20); // a realloc to 1 MiB
    assert_eq!(large_in_use(), base + block.capacity());
    let zeroed = std::hint::black_box(vec![0u8; 256 << 10]); // alloc_zeroed
    assert_eq!(large_in_use(), base + block.capacity() + (256 << 10));
    block.shrink_to(COUNTED_FROM / 2); // below the mark: no longer counted
    assert_eq!(large_in_use(), base + (256 << 10));
    drop(zeroed);
    drop(block);
    drop(small);
    assert_eq!(large_in_use(), base, "everything counted was freed");
}

/// The most in use since the last look is kept for that look, though the
/// blocks were freed before it: a burst between two looks is seen.
fn the_most_in_use_is_seen_after_the_frees() {
    let _ = take_large_high();
    let blocks: Vec<Vec<u8>> = (0..4).map(|_| std::hint::black_box(vec![7u8; 1 << 20])).collect();
    drop(blocks);
    assert!(take_large_high() >= 4 << 20, "four 1 MiB blocks were held at once");
    assert!(take_large_high() < 4 << 20, "the next look starts from what is in use");
}
