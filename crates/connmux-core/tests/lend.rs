//! Reading large messages straight into a psock's assembly buffer
//! (`Mux::rx_lend` / `Mux::rx_commit`, `StreamParser::lend` / `unlend`): the
//! messages, limits, deadlines and counters are those of `feed`, and the bytes
//! read into a loan become the message without a copy.
//!
//! The seeded simulation drives a mux as a driver would: each read is a loan
//! where the core offers one (a random part of its limit, sometimes nothing),
//! else a random split fed. Replay one run:
//! `CONNMUX_SEED=<seed> cargo test -p connmux-core --test lend`.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::*;
use connmux_core::mux::{
    Direct, Event, Mux, MuxConfig, MuxError, PsockConfig, PsockError, PsockId, RxError, RxLoan, SockId, SockType,
    Steering, AHEAD_QUIET,
};
use connmux_core::stream::{StreamLimits, StreamParser, Unlend, LEND_CHUNK, LEND_MIN, LEND_PAGE_OFFSET};
use connmux_core::Timestamp;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const BIG: usize = 100 << 10;

fn t(ms: u64) -> Timestamp {
    Timestamp::from_nanos(ms * 1_000_000)
}

fn big_cfg() -> MuxConfig {
    MuxConfig { max_msg_size: 1 << 20, psock_rx_buf: 256 << 10, ..MuxConfig::default() }
}

/// One psock on a mux with one DGRAM socket.
fn setup(cfg: MuxConfig) -> (Mux, SockId, PsockId) {
    let mut m = Mux::new(cfg);
    let s = m.socket(SockType::Dgram);
    let p = m.attach(L4::boxed(), PsockConfig::default());
    (m, s, p)
}

/// Append `bytes` to a loan as a read would.
fn read_into(loan: &mut RxLoan, bytes: &[u8]) {
    assert!(bytes.len() <= loan.limit(), "a driver reads at most the limit");
    loan.buf().extend_from_slice(bytes);
}

fn recv_all(m: &mut Mux, s: SockId) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for _ in 0..100_000 {
        match m.recv_msg(s) {
            Ok((b, _)) => out.push(b.to_vec()),
            Err(_) => return out,
        }
    }
    panic!("socket never ran dry");
}

#[test]
fn a_large_body_is_lent_once_the_length_is_known_and_the_loan_ends_at_the_message_end() {
    let (mut m, s, p) = setup(big_cfg());
    let msg = l4_total(BIG, 7);
    // Nothing known yet: read as usual.
    assert!(m.rx_lend(p).is_none(), "no loan before the first length is known");
    m.feed(p, &msg[..1000], t(0)).unwrap();
    let mut loan = m.rx_lend(p).expect("a large body is lent");
    assert_eq!(loan.limit(), BIG - 1000, "the loan asks for what the message still needs, no more");
    assert_eq!(loan.psock(), p);
    // While lent: nothing else is taken, the limit counts as held.
    assert_eq!(m.rx_capacity(p), 0);
    assert!(m.rx_lend(p).is_none(), "one loan at a time");
    assert_eq!(m.feed(p, b"x", t(0)), Err(MuxError::Invalid), "feed while lent is refused");
    assert_holds(m.memory_used(), BIG, "memory");
    assert!(m.memory_used() <= m.memory_bound());
    read_into(&mut loan, &msg[1000..50_000]);
    m.rx_commit(loan, t(1)).unwrap();
    assert!(m.recv_msg(s).is_err(), "not whole yet");
    let mut loan = m.rx_lend(p).unwrap();
    assert_eq!(loan.limit(), BIG - 50_000);
    read_into(&mut loan, &msg[50_000..]);
    m.rx_commit(loan, t(2)).unwrap();
    let (got, from) = m.recv_msg(s).unwrap();
    assert_eq!((&got[..], from), (&msg[..], p));
    let st = m.psock_stats(p).unwrap();
    assert_eq!((st.rx_msgs, st.rx_bytes), (1, BIG as u64), "counted once, at completion");
    assert_eq!(m.memory_used(), 0);
}

#[test]
fn bytes_read_into_a_loan_become_the_message_without_a_copy() {
    let (mut m, s, p) = setup(big_cfg());
    let msg = l4_total(BIG, 9);
    m.feed(p, &msg[..10], t(0)).unwrap();
    let mut loan = m.rx_lend(p).unwrap();
    // Where the loan's bytes land: right after the 10 bytes already there.
    let at = loan.buf().as_ptr() as usize + 10;
    read_into(&mut loan, &msg[10..60_000]);
    m.rx_commit(loan, t(0)).unwrap();
    let mut loan = m.rx_lend(p).unwrap();
    read_into(&mut loan, &msg[60_000..]);
    m.rx_commit(loan, t(0)).unwrap();
    let (got, _) = m.recv_msg(s).unwrap();
    assert_eq!(&got[..], &msg[..]);
    assert_eq!(got.as_ptr() as usize + 10, at, "the message is the lent buffer itself (read once, never copied)");
}

#[test]
fn after_a_large_message_the_next_read_is_lent_for_whole_messages_of_that_size() {
    let (mut m, s, p) = setup(big_cfg());
    let a = l4_total(BIG, 1);
    m.feed(p, &a[..100], t(0)).unwrap();
    let mut loan = m.rx_lend(p).unwrap();
    read_into(&mut loan, &a[100..]);
    m.rx_commit(loan, t(0)).unwrap();
    assert_eq!(recv_all(&mut m, s), vec![a.clone()]);
    // Between messages: the next one is predicted as large as the last.
    let loan = m.rx_lend(p).expect("between large messages the read is lent");
    assert_eq!(loan.limit(), BIG, "one predicted message (larger than LEND_CHUNK: no second one)");
    m.rx_commit(loan, t(0)).unwrap(); // nothing read: only the buffer back
                                      // Messages smaller than LEND_CHUNK: as many whole ones as fit in it.
    let (mut m, s, p) = setup(big_cfg());
    let len = 20_000;
    let b = l4_total(len, 2);
    m.feed(p, &b[..8], t(0)).unwrap();
    let mut loan = m.rx_lend(p).unwrap();
    assert_eq!(loan.limit(), len - 8 + (LEND_CHUNK - (len - 8)) / len * len, "the rest, then whole messages");
    let mut wire = b[8..].to_vec();
    for tag in 3..6 {
        wire.extend(l4_total(len, tag));
    }
    let n = loan.limit();
    read_into(&mut loan, &wire[..n]);
    m.rx_commit(loan, t(0)).unwrap();
    let got = recv_all(&mut m, s);
    assert_eq!(got.len(), 1 + (n - (len - 8)) / len, "reads end on message boundaries");
    assert_eq!(m.psock_stats(p).unwrap().rx_bytes, (got.len() * len) as u64);
}

/// A receive armed ahead (io_uring) for a message only predicted counts
/// whole while the peer sends nothing: such loans are made only while the
/// budget's low mark (half of `mem_limit`) has room; a message begun is
/// lent as always.
#[test]
fn a_loan_ahead_for_a_predicted_message_is_made_only_below_half_the_budget() {
    let cfg = MuxConfig { mem_limit: 3 * BIG, ..big_cfg() };
    let mut m = Mux::new(cfg);
    let s = m.socket(SockType::Dgram);
    let (p1, p2) = (m.attach(L4::boxed(), PsockConfig::default()), m.attach(L4::boxed(), PsockConfig::default()));
    for (p, tag) in [(p1, 1), (p2, 2)] {
        m.feed(p, &l4_total(BIG, tag), t(0)).unwrap();
    }
    assert_eq!(recv_all(&mut m, s).len(), 2);
    assert_eq!(m.memory_used(), 0, "both messages taken: the psocks are quiet");
    // Both predict a BIG message; the low mark (1.5 BIG) has room for one.
    assert!(m.rx_would_lend_ahead(p1));
    let ahead = m.rx_lend_ahead(p1).expect("room below the low mark: lent ahead");
    assert_eq!(ahead.limit(), BIG, "for the predicted message");
    assert_holds(m.memory_used(), BIG, "counted whole while out");
    assert!(!m.rx_would_lend_ahead(p2), "a second would pass the low mark");
    assert!(m.rx_lend_ahead(p2).is_none());
    assert!(m.rx_would_lend(p2), "a loan once the bytes are there is still offered");
    // p2's next message begins: its loan is for bytes the peer sends.
    let next = l4_total(BIG, 3);
    m.feed(p2, &next[..100], t(1)).unwrap();
    assert!(m.rx_would_lend_ahead(p2));
    let mut loan = m.rx_lend_ahead(p2).expect("a message begun is lent");
    read_into(&mut loan, &next[100..]);
    m.rx_commit(loan, t(1)).unwrap();
    assert_eq!(recv_all(&mut m, s), vec![next]);
    // The loan ahead comes back empty: room again.
    m.rx_commit(ahead, t(2)).unwrap();
    assert_eq!(m.memory_used(), 0);
    assert!(m.rx_would_lend_ahead(p2));
    assert!(m.rx_lend_ahead(p2).is_some(), "below the low mark again");
}

/// A loan made ahead for a predicted message that stays out with nothing
/// read for `AHEAD_QUIET` is recalled and the prediction forgotten: the
/// quiet peer holds nothing; its next message is read as the first was
/// (header, then a loan). One whose message comes in time is not recalled.
#[test]
fn a_loan_ahead_that_stays_out_quiet_is_recalled_and_the_prediction_forgotten() {
    let (mut m, s, p) = setup(big_cfg());
    let quiet_for = AHEAD_QUIET.as_millis() as u64;
    m.feed(p, &l4_total(BIG, 1), t(0)).unwrap();
    assert_eq!(recv_all(&mut m, s).len(), 1);
    // A message that comes within the time: no recall.
    let ahead = m.rx_lend_ahead(p).expect("lent ahead");
    assert_eq!(m.poll_timeout(), Some(t(quiet_for)), "the scan looks at it then");
    let mut loan = ahead;
    let next = l4_total(BIG, 2);
    read_into(&mut loan, &next);
    m.rx_commit(loan, t(500)).unwrap();
    assert_eq!(recv_all(&mut m, s), vec![next]);
    let ahead = m.rx_lend_ahead(p).expect("lent ahead again");
    m.handle_timeout(t(quiet_for));
    assert!(!events(&mut m).contains(&Event::PsockRxRecall(p)), "a loan made at 500 ms is not due at {quiet_for} ms");
    // Quiet: recalled once it has been out that long.
    let due = m.poll_timeout().expect("the scan looks again");
    assert!(due <= t(500 + quiet_for), "{due:?}");
    m.handle_timeout(t(500 + quiet_for));
    assert_eq!(events(&mut m), vec![Event::PsockRxRecall(p)]);
    assert_holds(m.memory_used(), BIG, "counted until the driver gives it back");
    m.rx_commit(ahead, t(500 + quiet_for)).unwrap();
    assert_eq!(m.memory_used(), 0, "the quiet peer holds nothing");
    assert!(m.rx_lend_ahead(p).is_none(), "nothing predicted any more");
    assert!(!m.rx_would_lend(p));
    assert_eq!(m.poll_timeout(), None, "nothing left to look at");
    // Its next message: the header first, then the body lent.
    let later = l4_total(BIG, 3);
    m.feed(p, &later[..100], t(5000)).unwrap();
    let mut loan = m.rx_lend_ahead(p).expect("a message begun is lent");
    read_into(&mut loan, &later[100..]);
    m.rx_commit(loan, t(5000)).unwrap();
    assert_eq!(recv_all(&mut m, s), vec![later]);
}

#[test]
fn a_predicted_message_larger_than_the_read_ahead_is_read_in_one_loan() {
    // 300 KiB messages, 256 KiB of read-ahead: between messages the loan
    // still covers the whole predicted message (not the read-ahead and then
    // a few bytes more in a second read).
    let (mut m, s, p) = setup(big_cfg());
    let len = 300 << 10;
    let a = l4_total(len, 1);
    m.feed(p, &a[..100], t(0)).unwrap();
    let mut loan = m.rx_lend(p).unwrap();
    read_into(&mut loan, &a[100..]);
    m.rx_commit(loan, t(0)).unwrap();
    assert_eq!(recv_all(&mut m, s), vec![a]);
    for tag in 2..5 {
        let b = l4_total(len, tag);
        let mut loan = m.rx_lend(p).expect("lent between large messages");
        assert_eq!(loan.limit(), len, "one read for the whole predicted message");
        read_into(&mut loan, &b);
        m.rx_commit(loan, t(0)).unwrap();
        assert_eq!(recv_all(&mut m, s), vec![b]);
    }
    assert!(m.memory_used() <= m.memory_bound());
}

#[test]
fn between_messages_a_loan_plans_a_whole_chunk_even_when_the_last_buffer_has_a_little_room() {
    // 20,000-byte messages: a loan plans three (about LEND_CHUNK). When a
    // read brings two, the buffer keeps room for one more; the next loan
    // must still ask for three, or a read would leave whole messages in the
    // socket for another wake-up.
    let (mut m, s, p) = setup(big_cfg());
    let len = 20_000;
    let plan = LEND_CHUNK / len * len;
    let first = l4_total(len, 1);
    m.feed(p, &first[..100], t(0)).unwrap();
    let mut loan = m.rx_lend(p).unwrap();
    read_into(&mut loan, &first[100..]);
    m.rx_commit(loan, t(0)).unwrap();
    assert_eq!(recv_all(&mut m, s).len(), 1);
    let mut tag = 2;
    for round in 0..6 {
        let mut loan = m.rx_lend(p).unwrap();
        assert_eq!(loan.limit(), plan, "round {round}: a whole chunk of predicted messages");
        let mut wire = Vec::new();
        for _ in 0..2 {
            wire.extend(l4_total(len, tag));
            tag += 1;
        }
        read_into(&mut loan, &wire);
        m.rx_commit(loan, t(0)).unwrap();
        assert_eq!(recv_all(&mut m, s).len(), 2);
    }
    assert_eq!(m.psock_stats(p).unwrap().rx_msgs, 13);
}

#[test]
fn rx_room_is_the_capacity_and_the_loan_in_one_call() {
    let (mut m, s, p) = setup(big_cfg());
    // Nothing known yet: the capacity, no loan.
    let cap = m.rx_capacity(p);
    let (room, loan) = m.rx_room(p);
    assert_eq!((room, loan.is_none()), (cap, true));
    let msg = l4_total(BIG, 5);
    m.feed(p, &msg[..8], t(0)).unwrap();
    let cap = m.rx_capacity(p);
    let (room, loan) = m.rx_room(p);
    let mut loan = loan.expect("a large body is lent");
    assert_eq!(room, cap);
    assert_eq!(loan.limit(), BIG - 8);
    assert_eq!(m.rx_room(p).0, 0, "nothing more while lent");
    assert!(m.rx_room(p).1.is_none());
    read_into(&mut loan, &msg[8..]);
    m.rx_commit(loan, t(0)).unwrap();
    assert_eq!(recv_all(&mut m, s), vec![msg]);
}

#[test]
fn a_new_lent_buffer_takes_its_bytes_half_a_page_in() {
    // Where the kernel's copy lands decides its speed (4K aliasing with the
    // source): a buffer made for a loan puts its append point at
    // LEND_PAGE_OFFSET within a page, with the bytes already read kept.
    let (mut m, s, p) = setup(big_cfg());
    let msg = l4_total(BIG, 3);
    for kept in [10usize, 4] {
        m.feed(p, &msg[..kept], t(0)).unwrap();
        let mut loan = m.rx_lend(p).unwrap();
        let at = loan.buf().as_ptr() as usize + kept;
        assert_eq!(at % 4096, LEND_PAGE_OFFSET, "append point after {kept} kept bytes");
        assert_eq!(&loan.buf()[..], &msg[..kept], "kept bytes moved with the buffer");
        read_into(&mut loan, &msg[kept..]);
        m.rx_commit(loan, t(0)).unwrap();
        let (got, _) = m.recv_msg(s).unwrap();
        assert_eq!(&got[..], &msg[..]);
        assert_eq!(got.as_ptr() as usize + kept, at, "and the message is cut from it");
    }
    // Between messages (nothing kept): the message itself starts there.
    let mut loan = m.rx_lend(p).unwrap();
    assert_eq!((loan.buf().as_ptr() as usize + loan.buf().len()) % 4096, LEND_PAGE_OFFSET);
    read_into(&mut loan, &msg);
    m.rx_commit(loan, t(0)).unwrap();
    let (got, _) = m.recv_msg(s).unwrap();
    assert_eq!(got.as_ptr() as usize % 4096, LEND_PAGE_OFFSET);
}

#[test]
fn small_messages_are_never_lent_and_a_small_one_ends_the_prediction() {
    let (mut m, s, p) = setup(big_cfg());
    m.feed(p, &l4_total(LEND_MIN - 1, 1)[..100], t(0)).unwrap();
    assert!(m.rx_lend(p).is_none(), "below LEND_MIN: read and fed as usual");
    m.feed(p, &l4_total(LEND_MIN - 1, 1)[100..], t(0)).unwrap();
    // A large one, then a small one: the small one's completion ends lending.
    let big = l4_total(LEND_MIN, 2);
    m.feed(p, &big[..4], t(0)).unwrap();
    let mut loan = m.rx_lend(p).unwrap();
    read_into(&mut loan, &big[4..]);
    m.rx_commit(loan, t(0)).unwrap();
    assert!(m.rx_lend(p).is_some_and(|l| m.rx_commit(l, t(0)).is_ok()), "after a large one: lent");
    m.feed(p, &l4_total(10, 3), t(0)).unwrap();
    assert!(m.rx_lend(p).is_none(), "after a small one: fed again");
    let got = recv_all(&mut m, s);
    assert_eq!(got, vec![l4_total(LEND_MIN - 1, 1), big, l4_total(10, 3)]);
}

#[test]
fn small_messages_read_into_a_loan_are_cut_like_fed_ones() {
    // A loan between messages may carry small ones (the prediction was
    // wrong): they come out whole and in order, the large one after them too.
    let (mut m, s, p) = setup(big_cfg());
    let big = l4_total(BIG, 1);
    m.feed(p, &big[..4], t(0)).unwrap();
    let mut loan = m.rx_lend(p).unwrap();
    read_into(&mut loan, &big[4..]);
    m.rx_commit(loan, t(0)).unwrap();
    let mut wire = Vec::new();
    let mut want = vec![big.clone()];
    for i in 0..50u8 {
        let msg = l4_total(5 + i as usize, i);
        wire.extend(&msg);
        want.push(msg);
    }
    let big2 = l4_total(BIG + 3, 2);
    wire.extend(&big2);
    want.push(big2);
    let mut at = 0;
    for _ in 0..100 {
        if at == wire.len() {
            break;
        }
        match m.rx_lend(p) {
            Some(mut loan) => {
                let n = loan.limit().min(wire.len() - at).min(3000);
                read_into(&mut loan, &wire[at..at + n]);
                at += n;
                m.rx_commit(loan, t(0)).unwrap();
            }
            None => {
                let n = m.rx_capacity(p).min(wire.len() - at).min(3000);
                m.feed(p, &wire[at..at + n], t(0)).unwrap();
                at += n;
            }
        }
    }
    assert_eq!(at, wire.len());
    assert_eq!(recv_all(&mut m, s), want);
}

#[test]
fn a_loan_over_its_limit_is_refused_and_takes_nothing() {
    let (mut m, s, p) = setup(big_cfg());
    let msg = l4_total(BIG, 4);
    m.feed(p, &msg[..4], t(0)).unwrap();
    let mut loan = m.rx_lend(p).unwrap();
    let limit = loan.limit();
    loan.buf().extend_from_slice(&msg[4..]);
    loan.buf().extend_from_slice(b"one too many");
    assert!(loan.appended() > limit);
    assert_eq!(m.rx_commit(loan, t(0)), Err(MuxError::Invalid));
    // Nothing of it was taken: the stream is where it was.
    let mut loan = m.rx_lend(p).unwrap();
    assert_eq!(loan.limit(), limit);
    read_into(&mut loan, &msg[4..]);
    m.rx_commit(loan, t(0)).unwrap();
    assert_eq!(recv_all(&mut m, s), vec![msg]);
}

#[test]
fn the_loan_is_bounded_by_rx_capacity_and_backpressure_stops_lending() {
    // Read-ahead and the hard cap: the limit never exceeds rx_capacity.
    let cfg = MuxConfig { max_msg_size: 1 << 20, psock_rx_buf: 1000, sock_rcvbuf: 1, ..MuxConfig::default() };
    let (mut m, s, p) = setup(cfg);
    let a = l4_total(BIG, 1);
    let b = l4_total(BIG, 2);
    m.feed(p, &a[..4], t(0)).unwrap();
    let cap = m.rx_capacity(p);
    let mut loan = m.rx_lend(p).unwrap();
    assert!(loan.limit() <= cap);
    read_into(&mut loan, &a[4..]);
    m.rx_commit(loan, t(0)).unwrap();
    // The socket takes one message and is then full (SO_RCVBUF 1): the next
    // one completes, waits in the psock, and the psock is paused.
    m.feed(p, &b[..4], t(0)).unwrap();
    let mut loan = m.rx_lend(p).unwrap();
    read_into(&mut loan, &b[4..]);
    m.rx_commit(loan, t(0)).unwrap();
    assert_eq!(m.rx_capacity(p), 0, "paused: a message waits in the psock");
    assert!(m.rx_lend(p).is_none(), "no loan while paused");
    assert!(!m.rx_would_lend(p));
    assert!(m.memory_used() <= m.memory_bound());
    assert_eq!(recv_all(&mut m, s), vec![a, b]);
    assert!(m.rx_capacity(p) > 0, "resumed once the socket drained");
    assert!(m.rx_would_lend(p), "and lending again (the last message was large)");
}

#[test]
fn a_reply_backlog_mid_body_stops_lending_until_it_drains() {
    let cfg = MuxConfig { psock_sndbuf: 64 << 10, ..big_cfg() };
    let (mut m, s, p) = setup(cfg);
    let msg = l4_total(BIG, 5);
    m.feed(p, &msg[..4], t(0)).unwrap();
    let mut loan = m.rx_lend(p).unwrap();
    read_into(&mut loan, &msg[4..40_000]);
    m.rx_commit(loan, t(0)).unwrap();
    // The peer does not read its replies: half of psock_sndbuf pauses reading.
    m.send_to(s, p, &vec![0u8; 40 << 10], Default::default()).unwrap();
    assert_eq!(m.rx_capacity(p), 0);
    assert!(m.rx_lend(p).is_none(), "no loan while the reply backlog is over half");
    let chunk = m.tx_begin(p).unwrap();
    m.tx_complete(p, chunk.len());
    let mut loan = m.rx_lend(p).expect("lent again once the backlog drained");
    assert_eq!(loan.limit(), BIG - 40_000);
    read_into(&mut loan, &msg[40_000..]);
    m.rx_commit(loan, t(0)).unwrap();
    assert_eq!(recv_all(&mut m, s), vec![msg]);
}

#[test]
fn a_declared_length_over_the_maximum_is_refused_before_any_loan() {
    let cfg = MuxConfig { max_msg_size: 64 << 10, ..big_cfg() };
    let (mut m, _s, p) = setup(cfg);
    m.feed(p, &l4_total(BIG, 1)[..4], t(0)).unwrap();
    assert!(m.rx_lend(p).is_none());
    let ev: Vec<Event> = events(&mut m);
    assert!(ev.contains(&Event::PsockFailed(p, PsockError::Rx(RxError::TooBig { len: BIG, max: 64 << 10 }))), "{ev:?}");
    assert_eq!(m.psock_stats(p).unwrap().rx_msg_too_big, 1);
    assert_eq!(m.rx_capacity(p), 0);
}

#[test]
fn an_assembly_timeout_while_lent_drops_the_loan_and_its_bytes() {
    let cfg = MuxConfig { assembly_timeout: Some(Duration::from_millis(100)), ..big_cfg() };
    let (mut m, s, p) = setup(cfg);
    let msg = l4_total(BIG, 6);
    m.feed(p, &msg[..4], t(0)).unwrap();
    assert_eq!(m.poll_timeout(), Some(t(100)), "the deadline runs from the first byte");
    let mut loan = m.rx_lend(p).unwrap();
    read_into(&mut loan, &msg[4..1000]);
    m.rx_commit(loan, t(50)).unwrap();
    assert_eq!(m.poll_timeout(), Some(t(100)), "more bytes through a loan do not restart it");
    let mut loan = m.rx_lend(p).unwrap();
    m.handle_timeout(t(100));
    assert_eq!(events(&mut m), vec![Event::PsockFailed(p, PsockError::Rx(RxError::Timeout))]);
    // The read that was in progress completes: its bytes are dropped.
    read_into(&mut loan, &msg[1000..]);
    assert_eq!(m.rx_commit(loan, t(120)), Ok(()));
    assert!(m.recv_msg(s).is_err(), "nothing partial is delivered");
    let st = m.psock_stats(p).unwrap();
    assert_eq!((st.rx_msg_timeouts, st.rx_msgs, st.rx_bytes), (1, 0, 0));
    assert_eq!(m.memory_used(), 0);
    assert_eq!(m.poll_timeout(), None);
    assert!(m.rx_lend(p).is_none());
}

#[test]
fn a_close_or_unattach_while_lent_drops_the_loan() {
    let (mut m, s, p) = setup(big_cfg());
    let msg = l4_total(BIG, 7);
    m.feed(p, &msg[..4], t(0)).unwrap();
    let mut loan = m.rx_lend(p).unwrap();
    m.rx_closed(p, None).unwrap();
    read_into(&mut loan, &msg[4..]);
    assert_eq!(m.rx_commit(loan, t(0)), Ok(()));
    assert!(m.recv_msg(s).is_err());
    assert_eq!(m.memory_used(), 0);

    let p2 = m.attach(L4::boxed(), PsockConfig::default());
    m.feed(p2, &msg[..4], t(0)).unwrap();
    let mut loan = m.rx_lend(p2).unwrap();
    m.unattach(p2).unwrap();
    read_into(&mut loan, &msg[4..]);
    assert_eq!(m.rx_commit(loan, t(0)), Err(MuxError::NoPsock));
    assert_eq!(m.memory_used(), 0);
}

#[test]
fn a_committed_loan_hands_messages_over_directly() {
    let (mut m, s, p) = setup(big_cfg());
    let msg = l4_total(BIG, 8);
    m.feed(p, &msg[..4], t(0)).unwrap();
    let mut loan = m.rx_lend(p).unwrap();
    read_into(&mut loan, &msg[4..]);
    let mut out = Vec::new();
    let mut d = Direct { sock: s, out: &mut out, limit: 8 };
    m.rx_commit_direct(loan, t(0), &mut d).unwrap();
    assert_eq!(out.len(), 1);
    assert_eq!((&out[0].0[..], out[0].1), (&msg[..], p));
    assert_eq!(m.rx_queued(s).unwrap(), 0, "handed over, not queued");
    assert_eq!(m.sock_stats(s).unwrap().rx_msgs, 1);
}

#[test]
fn stream_parser_loans_keep_counts_and_refuse_stale_returns() {
    let limits = StreamLimits { max_msg_size: 1 << 20, assembly_timeout: None, read_ahead: 4096 };
    let mut st = StreamParser::new(L4::boxed(), limits);
    let msg = l4_total(BIG, 3);
    st.feed(&msg[..4]);
    assert!(st.next_msg(t(0)).unwrap().is_none());
    assert!(st.would_lend());
    let mut loan = st.lend(usize::MAX).unwrap();
    assert!(st.is_lent());
    assert_eq!(st.want(), 0);
    assert_eq!(st.buffered(), 4 + loan.limit());
    loan.buf().extend_from_slice(&msg[4..]);
    assert_eq!(st.unlend(loan), Unlend::Took(BIG - 4));
    let got = st.next_msg(t(0)).unwrap().unwrap();
    assert_eq!(&got[..], &msg[..]);
    assert_eq!((st.stats().msgs, st.stats().bytes), (1, BIG as u64));
    // A loan that comes back after the stream was reset is stale.
    let loan = st.lend(1000).unwrap();
    assert_eq!(loan.limit(), 1000, "bounded by the caller");
    st.discard();
    assert_eq!(st.unlend(loan), Unlend::Stale);
    assert!(!st.is_lent());
}

// ---- seeded simulation ----

struct Run {
    lent_bytes: usize,
    fed_bytes: usize,
    timeouts: usize,
}

fn run(seed: u64) -> Run {
    let mut rng = StdRng::seed_from_u64(seed);
    let n_psocks = rng.gen_range(1..=3usize);
    let timeouts = rng.gen_bool(0.2);
    let max_msg = 300 << 10;
    let cfg = MuxConfig {
        max_msg_size: max_msg,
        assembly_timeout: timeouts.then(|| Duration::from_millis(rng.gen_range(5..50))),
        sock_rcvbuf: rng.gen_range(1..(600 << 10)),
        sock_sndbuf: 1 << 20,
        psock_rx_buf: rng.gen_range(1..(128 << 10)),
        steering: Steering::RoundRobin,
        imbalance: 4,
        psock_sndbuf: 4 << 20,
        ..MuxConfig::default()
    };
    let mut m = Mux::new(cfg);
    let s = m.socket(SockType::Dgram);
    let mut psocks = Vec::new();
    let mut streams: Vec<(Vec<u8>, usize)> = Vec::new();
    let mut sent: Vec<Vec<Vec<u8>>> = Vec::new();
    for i in 0..n_psocks {
        psocks.push(m.attach(L4::boxed(), PsockConfig::default()));
        let mut wire = Vec::new();
        let mut msgs = Vec::new();
        for seq in 0..rng.gen_range(1..25u32) {
            let len = match rng.gen_range(0..10) {
                0..=3 => rng.gen_range(5..200),
                4..=5 => rng.gen_range(LEND_MIN - 8..LEND_MIN + 8),
                6..=8 => rng.gen_range(LEND_MIN..max_msg / 2),
                _ => rng.gen_range(max_msg / 2..max_msg - 4),
            };
            let msg = message(i as u8, seq, len);
            wire.extend_from_slice(&msg);
            msgs.push(msg);
        }
        streams.push((wire, 0));
        sent.push(msgs);
    }
    let mut got: HashMap<u8, Vec<Vec<u8>>> = HashMap::new();
    let mut failed = vec![false; n_psocks];
    // A loan held across other calls (a read in flight, as on io_uring).
    let mut out: Option<(usize, RxLoan)> = None;
    let (mut lent_bytes, mut fed_bytes) = (0, 0);
    let mut now = 0u64;
    for step in 0..100_000 {
        now += rng.gen_range(0..if timeouts { 3 } else { 1000 });
        let done = streams.iter().enumerate().all(|(i, (w, c))| failed[i] || *c == w.len());
        if done && out.is_none() && m.rx_queued(s).unwrap() == 0 && m.memory_used() == 0 {
            break;
        }
        let action = rng.gen_range(0..100);
        let i = rng.gen_range(0..n_psocks);
        let p = psocks[i];
        if action < 50 && out.as_ref().is_none_or(|(j, _)| *j != i) {
            let (wire, cur) = &mut streams[i];
            let left = wire.len() - *cur;
            let cap = m.rx_capacity(p);
            match m.rx_lend(p) {
                Some(mut loan) => {
                    assert!(loan.limit() <= cap, "seed {seed}: a loan over rx_capacity");
                    let n = match rng.gen_range(0..5) {
                        0 => 0,
                        1 => rng.gen_range(0..=loan.limit().min(left).min(7)),
                        2 => rng.gen_range(0..=loan.limit().min(left)),
                        _ => loan.limit().min(left),
                    };
                    loan.buf().extend_from_slice(&wire[*cur..*cur + n]);
                    *cur += n;
                    lent_bytes += n;
                    if out.is_none() && rng.gen_bool(0.3) {
                        out = Some((i, loan)); // completes later
                    } else {
                        m.rx_commit(loan, Timestamp::from_nanos(now * 1_000_000)).unwrap();
                    }
                }
                None if cap > 0 && left > 0 => {
                    let n = rng.gen_range(1..=cap.min(left));
                    m.feed(p, &wire[*cur..*cur + n], Timestamp::from_nanos(now * 1_000_000)).unwrap();
                    *cur += n;
                    fed_bytes += n;
                }
                None => {}
            }
        } else if action < 60 {
            if let Some((_, loan)) = out.take() {
                match m.rx_commit(loan, Timestamp::from_nanos(now * 1_000_000)) {
                    Ok(()) => {}
                    Err(e) => panic!("seed {seed}: commit {e:?}"),
                }
            }
        } else if action < 90 {
            if let Ok((b, _)) = m.recv_msg(s) {
                got.entry(b[4]).or_default().push(b.to_vec());
            }
        } else {
            m.handle_timeout(Timestamp::from_nanos(now * 1_000_000));
        }
        for e in events(&mut m) {
            if let Event::PsockFailed(p, err) = e {
                assert!(timeouts, "seed {seed}: {p:?} failed on good input: {err:?}");
                assert_eq!(err, PsockError::Rx(RxError::Timeout), "seed {seed}");
                let k = psocks.iter().position(|x| *x == p).unwrap();
                failed[k] = true;
            }
        }
        assert!(
            m.memory_used() <= m.memory_bound(),
            "seed {seed} step {step}: memory_used {} > memory_bound {}",
            m.memory_used(),
            m.memory_bound()
        );
        if step > 90_000 {
            m.set_rcvbuf(s, 64 << 20).unwrap();
        }
    }
    if let Some((_, loan)) = out.take() {
        m.rx_commit(loan, Timestamp::from_nanos(now * 1_000_000)).unwrap();
    }
    while let Ok((b, _)) = m.recv_msg(s) {
        got.entry(b[4]).or_default().push(b.to_vec());
    }
    let mut fails = 0;
    for (i, msgs) in sent.iter().enumerate() {
        let mine = got.remove(&(i as u8)).unwrap_or_default();
        if failed[i] {
            // A timed-out psock delivered a prefix of its messages, intact.
            fails += 1;
            assert!(mine.len() <= msgs.len(), "seed {seed}");
            assert_eq!(&msgs[..mine.len()], &mine[..], "seed {seed}: psock {i} before its timeout");
        } else {
            assert_eq!(&mine, msgs, "seed {seed}: psock {i}: messages differ or out of order");
        }
        let st = m.psock_stats(psocks[i]).unwrap();
        assert_eq!(st.rx_msgs as usize, mine.len(), "seed {seed}");
        assert_eq!(st.rx_bytes as usize, mine.iter().map(Vec::len).sum::<usize>(), "seed {seed}: bytes counted once");
    }
    assert_eq!(m.memory_used(), 0, "seed {seed}: nothing left behind");
    Run { lent_bytes, fed_bytes, timeouts: fails }
}

#[test]
fn simulation_lent_and_fed_reads_with_random_splits_pressure_and_timeouts() {
    let seeds: Vec<u64> = match std::env::var("CONNMUX_SEED") {
        Ok(s) => vec![s.parse().expect("CONNMUX_SEED must be a number")],
        Err(_) => (0..300).map(|i| 0x1e4d_0000 + i).collect(),
    };
    let (mut lent, mut fed, mut timeouts) = (0, 0, 0);
    for seed in seeds.iter().copied() {
        let r = run(seed);
        lent += r.lent_bytes;
        fed += r.fed_bytes;
        timeouts += r.timeouts;
    }
    eprintln!("{} runs: {lent} bytes read into loans, {fed} fed, {timeouts} psocks timed out", seeds.len());
    if seeds.len() > 1 {
        assert!(lent > 4 * fed, "most bytes of large messages go through loans ({lent} lent, {fed} fed)");
        assert!(timeouts > 0, "the runs include assembly timeouts");
    }
}

#[test]
fn framing_in_place_sets_the_prediction_and_never_runs_while_lent() {
    let limits = StreamLimits { max_msg_size: 1 << 20, assembly_timeout: None, read_ahead: 4096 };
    let mut st = StreamParser::new(connmux_core::parsers::from_spec("l4").unwrap(), limits);
    let mut ranges = Vec::new();
    // A whole large message framed where it lies: the next read is lent.
    let big = l4_total(LEND_MIN + 10, 1);
    assert_eq!(st.frame_in_place(&big, 8, &mut ranges), big.len());
    assert!(st.would_lend());
    let loan = st.lend(usize::MAX).unwrap();
    assert_eq!(loan.limit(), big.len() * (LEND_CHUNK / big.len()), "whole messages of the last one's size");
    ranges.clear();
    assert_eq!(st.frame_in_place(&l4_total(10, 2), 8, &mut ranges), 0, "not while the buffer is lent");
    assert!(ranges.is_empty());
    assert_eq!(st.unlend(loan), Unlend::Took(0));
    // Small messages after it: the prediction ends with the last one framed.
    let mut two = l4_total(LEND_MIN + 10, 3);
    two.extend(l4_total(12, 4));
    assert_eq!(st.frame_in_place(&two, 8, &mut ranges), two.len());
    assert!(!st.would_lend());
    assert_eq!((st.stats().msgs, st.stats().bytes), (3, (big.len() + two.len()) as u64));
}
