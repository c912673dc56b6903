//! What the core keeps allocated for a quiet psock, seen through the
//! counting allocator (`connmux_sys::malloc::Counting`, this program's
//! global allocator): a large buffer lent ahead for a predicted message and
//! given back empty (recalled) is let go, not kept by the psock outside
//! what `Mux::memory_used` counts.

mod common;

use common::*;
use connmux_core::mux::{Mux, MuxConfig, PsockConfig, SockType};
use connmux_core::Timestamp;
use connmux_sys::malloc::{large_in_use, Counting};

#[global_allocator]
static ALLOC: Counting = Counting;

const BIG: usize = 1 << 20;

// One test only: the count is the whole program's.
#[test]
fn a_large_loan_given_back_empty_is_let_go() {
    let mut m = Mux::new(MuxConfig { max_msg_size: 2 << 20, psock_rx_buf: 256 << 10, ..MuxConfig::default() });
    let s = m.socket(SockType::Dgram);
    let p = m.attach(L4::boxed(), PsockConfig::default());
    m.feed(p, &l4_total(BIG, 1), Timestamp::from_nanos(0)).unwrap();
    assert_eq!(recv_all(&mut m, s).len(), 1);
    let base = large_in_use();
    let loan = m.rx_lend_ahead(p).expect("lent ahead for the predicted message");
    assert!(loan.limit() >= BIG);
    assert!(large_in_use() >= base + BIG, "the loan's buffer is allocated for the whole message");
    // The driver's read is recalled: the loan comes back with nothing.
    m.rx_commit(loan, Timestamp::from_nanos(1)).unwrap();
    assert_eq!(m.memory_used(), 0);
    assert!(
        large_in_use() < base + BIG / 2,
        "{} of {} still allocated",
        large_in_use() - base.min(large_in_use()),
        BIG
    );
}
