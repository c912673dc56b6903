//! The stream parser on its own: framing from the message start, limits,
//! deadline, counters, zero-copy output.

mod common;

use std::time::Duration;

use common::*;
use connmux_core::mux::RxError;
use connmux_core::parser::ParseError;
use connmux_core::stream::{StreamLimits, StreamParser};
use connmux_core::{Bytes, Timestamp};

fn limits() -> StreamLimits {
    StreamLimits { max_msg_size: 1000, assembly_timeout: None, read_ahead: 4096 }
}

fn drain(s: &mut StreamParser, now: Timestamp) -> Vec<Bytes> {
    let mut out = Vec::new();
    for _ in 0..100_000 {
        match s.next_msg(now).expect("no error expected") {
            Some(m) => out.push(m),
            None => return out,
        }
    }
    panic!("stream never ran dry");
}

#[test]
fn two_messages_in_one_feed_are_framed_from_each_message_start() {
    let mut s = StreamParser::new(L4::boxed(), limits());
    let mut wire = l4_total(10, b'a');
    wire.extend(l4_total(10, b'b'));
    s.feed(&wire);
    let got = drain(&mut s, Timestamp::ZERO);
    assert_eq!(got.len(), 2);
    assert_eq!(&got[0][..], &l4_total(10, b'a')[..]);
    assert_eq!(&got[1][..], &l4_total(10, b'b')[..]);
    assert_eq!(s.stats().msgs, 2);
    assert_eq!(s.stats().bytes, 20);
    assert_eq!(s.buffered(), 0);
}

#[test]
fn one_byte_feeds_deliver_every_message_intact() {
    let mut s = StreamParser::new(L4::boxed(), limits());
    let mut wire = Vec::new();
    let mut want = Vec::new();
    for i in 0..50u8 {
        let m = l4_total(4 + (i as usize * 7) % 40, i);
        wire.extend(&m);
        want.push(m);
    }
    let mut got = Vec::new();
    for b in &wire {
        s.feed(std::slice::from_ref(b));
        got.extend(drain(&mut s, Timestamp::ZERO).into_iter().map(|m| m.to_vec()));
    }
    assert_eq!(got, want);
    // Bytes counted once, at completion.
    assert_eq!(s.stats().bytes, wire.len() as u64);
}

#[test]
fn header_split_two_plus_two_asks_need_more_once() {
    let mut s = StreamParser::new(L4::boxed(), limits());
    let m = l4_total(12, 7);
    s.feed(&m[..2]);
    assert!(s.next_msg(Timestamp::ZERO).unwrap().is_none());
    assert_eq!(s.stats().need_more_hdr, 1);
    assert_eq!(s.need(), Some(2), "the parser's hint is exposed");
    // One more byte is below the hint: the parser is not asked again.
    s.feed(&m[2..3]);
    assert!(s.next_msg(Timestamp::ZERO).unwrap().is_none());
    assert_eq!(s.stats().need_more_hdr, 1);
    s.feed(&m[3..]);
    let got = drain(&mut s, Timestamp::ZERO);
    assert_eq!(got.len(), 1);
    assert_eq!(&got[0][..], &m[..]);
    assert_eq!(s.stats().need_more_hdr, 1);
}

#[test]
fn need_hint_reports_the_rest_of_a_known_message() {
    let mut s = StreamParser::new(L4::boxed(), limits());
    let m = l4_total(100, 1);
    s.feed(&m[..30]);
    assert!(s.next_msg(Timestamp::ZERO).unwrap().is_none());
    assert_eq!(s.need(), Some(70));
    assert_eq!(s.want(), 70 + 4096);
}

#[test]
fn messages_are_cut_from_the_read_buffer_without_copying() {
    let mut s = StreamParser::new(L4::boxed(), limits());
    let mut wire = Vec::new();
    for i in 0..8 {
        wire.extend(l4_total(64, i));
    }
    s.feed(&wire);
    let got = drain(&mut s, Timestamp::ZERO);
    assert_eq!(got.len(), 8);
    for w in got.windows(2) {
        assert_eq!(w[0].as_ptr() as usize + 64, w[1].as_ptr() as usize, "adjacent slices of one buffer");
    }
}

#[test]
fn finish_is_applied_to_each_message() {
    let mut p = L4::new();
    p.strip = true;
    let mut s = StreamParser::new(Box::new(p), limits());
    s.feed(&l4(b"hello"));
    let got = drain(&mut s, Timestamp::ZERO);
    assert_eq!(&got[0][..], b"hello");
    assert_eq!(s.stats().bytes, 9, "wire bytes are counted, not the finished length");
}

#[test]
fn length_over_the_limit_is_too_big_and_stops() {
    let mut s = StreamParser::new(L4::boxed(), limits());
    s.feed(&l4_total(1001, 0)[..10]);
    let e = s.next_msg(Timestamp::ZERO).unwrap_err();
    assert_eq!(e, RxError::TooBig { len: 1001, max: 1000 });
    assert_eq!(e.errno(), 90);
    assert_eq!(s.stats().msg_too_big, 1);
    assert!(s.is_stopped());
    assert_eq!(s.buffered(), 0, "the partial message is dropped");
    // A stopped stream accepts nothing more.
    s.feed(&l4_total(10, 1));
    assert_eq!(s.buffered(), 0);
    assert_eq!(s.next_msg(Timestamp::ZERO), Ok(None));
    assert_eq!(s.want(), 0);
}

#[test]
fn length_equal_to_the_limit_is_accepted() {
    let mut s = StreamParser::new(L4::boxed(), limits());
    s.feed(&l4_total(1000, 3));
    assert_eq!(drain(&mut s, Timestamp::ZERO).len(), 1);
}

#[test]
fn length_not_past_bytes_already_asked_is_bad_length() {
    // Length field counts the header (adjust 0): a field of 2 after the parser
    // asked for more with 3 bytes present cannot be right.
    let mut p = L4::new();
    p.adjust = 0;
    let mut s = StreamParser::new(Box::new(p), limits());
    s.feed(&[0, 0, 0]);
    assert!(s.next_msg(Timestamp::ZERO).unwrap().is_none());
    s.feed(&[3, 9, 9]);
    let e = s.next_msg(Timestamp::ZERO).unwrap_err();
    assert_eq!(e, RxError::BadLength { len: 3, gathered: 3 });
    assert_eq!(e.errno(), 71);
    assert_eq!(s.stats().bad_hdr_len, 1);
    assert!(s.is_stopped());
}

#[test]
fn zero_length_is_bad_length() {
    let mut p = L4::new();
    p.adjust = 0;
    let mut s = StreamParser::new(Box::new(p), limits());
    s.feed(&[0, 0, 0, 0, 1]);
    assert_eq!(s.next_msg(Timestamp::ZERO).unwrap_err(), RxError::BadLength { len: 0, gathered: 0 });
    assert_eq!(s.stats().bad_hdr_len, 1);
}

#[test]
fn length_shorter_than_a_first_chunk_is_fine() {
    // A length inside the first chunk is a small message followed by the next one.
    let mut p = L4::new();
    p.adjust = 0;
    let mut s = StreamParser::new(Box::new(p), limits());
    s.feed(&[0, 0, 0, 5, 1, 0, 0, 0, 4]);
    let got = drain(&mut s, Timestamp::ZERO);
    assert_eq!(got.len(), 2);
}

#[test]
fn parser_refusal_stops_with_its_error() {
    let mut p = L4::new();
    p.refuse = Some(0xdead);
    let mut s = StreamParser::new(Box::new(p), limits());
    let mut wire = l4_total(8, 1);
    wire.extend(0xdeadu32.to_be_bytes());
    s.feed(&wire);
    assert_eq!(s.next_msg(Timestamp::ZERO).unwrap().unwrap().len(), 8);
    let e = s.next_msg(Timestamp::ZERO).unwrap_err();
    assert_eq!(e, RxError::Parser(ParseError::Program(22)));
    assert_eq!(e.errno(), 22);
    assert_eq!(s.stats().interrupted, 1);
    assert!(s.is_stopped());
}

#[test]
fn deadline_runs_from_the_first_byte_and_is_not_restarted() {
    let mut l = limits();
    l.assembly_timeout = Some(Duration::from_millis(100));
    let mut s = StreamParser::new(L4::boxed(), l);
    let m = l4_total(100, 1);
    let t0 = Timestamp::from_nanos(1_000_000_000);
    assert_eq!(s.deadline(), None, "no message, no deadline");
    s.feed(&m[..10]);
    assert!(s.next_msg(t0).unwrap().is_none());
    let dl = t0.add(Duration::from_millis(100));
    assert_eq!(s.deadline(), Some(dl));
    // More bytes at +50 ms do not move it.
    s.feed(&m[10..20]);
    assert!(s.next_msg(t0.add(Duration::from_millis(50))).unwrap().is_none());
    assert_eq!(s.deadline(), Some(dl));
    assert!(s.check_timeout(t0.add(Duration::from_millis(99))).is_ok());
    assert_eq!(s.check_timeout(dl), Err(RxError::Timeout));
    assert_eq!(s.stats().msg_timeouts, 1);
    assert!(s.is_stopped());
    assert_eq!(s.deadline(), None);
}

#[test]
fn deadline_ends_when_the_message_completes() {
    let mut l = limits();
    l.assembly_timeout = Some(Duration::from_millis(100));
    let mut s = StreamParser::new(L4::boxed(), l);
    let m = l4_total(20, 1);
    s.feed(&m[..10]);
    assert!(s.next_msg(Timestamp::ZERO).unwrap().is_none());
    s.feed(&m[10..]);
    assert!(s.next_msg(Timestamp::from_nanos(5)).unwrap().is_some());
    assert_eq!(s.deadline(), None);
    assert!(s.check_timeout(Timestamp::from_nanos(u64::MAX)).is_ok());
}

#[test]
fn no_timeout_waits_forever() {
    let mut s = StreamParser::new(L4::boxed(), limits());
    s.feed(&l4_total(20, 1)[..5]);
    assert!(s.next_msg(Timestamp::ZERO).unwrap().is_none());
    assert_eq!(s.deadline(), None);
    assert!(s.check_timeout(Timestamp::from_nanos(u64::MAX)).is_ok());
    assert!(!s.is_stopped());
}

#[test]
fn endless_header_is_refused_at_the_size_limit() {
    // A parser that never finds a length: gathering stops at max_msg_size.
    struct Never;
    impl connmux_core::Parser for Never {
        fn parse(&mut self, _buf: &[u8]) -> connmux_core::Parse {
            connmux_core::Parse::NeedMore(1)
        }
        fn name(&self) -> &str {
            "never"
        }
    }
    let mut s = StreamParser::new(Box::new(Never), limits());
    let mut err = None;
    for _ in 0..2000 {
        s.feed(&[0u8; 10]);
        if let Err(e) = s.next_msg(Timestamp::ZERO) {
            err = Some(e);
            break;
        }
    }
    assert!(matches!(err, Some(RxError::TooBig { max: 1000, .. })), "{err:?}");
    assert_eq!(s.stats().msg_too_big, 1);
}

/// A message cut from the assembly buffer keeps its allocation while it
/// lives (a reply that is its request): a 64 KiB message fed in 16 KiB
/// pieces is assembled in an allocation of its own size, not in the
/// 128 KiB that doubling would reach for its last four bytes.
#[test]
fn a_known_length_bounds_the_assembly_buffer_growth() {
    let total = (64 << 10) + 4;
    let mut s = StreamParser::new(L4::boxed(), StreamLimits { max_msg_size: 1 << 20, ..limits() });
    let wire = l4_total(total, b'x');
    let mut got = Vec::new();
    let mut peak = 0;
    for piece in wire.chunks(16 << 10) {
        s.feed(piece);
        peak = peak.max(s.memory());
        got.extend(drain(&mut s, Timestamp::ZERO));
    }
    assert_eq!(got.len(), 1);
    assert_eq!(&got[0][..], &wire[..]);
    assert!(peak <= total + 4096, "assembly buffer grew to {peak} bytes for a {total}-byte message");
}
