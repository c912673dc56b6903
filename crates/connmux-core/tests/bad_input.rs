//! Bad input from a peer: a typed error in PsockFailed, the right counter,
//! that psock aborted (rx_capacity 0), and the other psocks' traffic unaffected.

mod common;

use std::time::Duration;

use common::*;
use connmux_core::mux::{Event, Mux, MuxConfig, PsockConfig, PsockError, PsockId, RxError, SockType};
use connmux_core::parser::ParseError;
use connmux_core::stats::PsockStats;
use connmux_core::{Parser, Timestamp};

fn ms(n: u64) -> Timestamp {
    Timestamp::from_nanos(n * 1_000_000)
}

/// Run `bad` on psock B while psocks A and C carry traffic before, during and
/// after; returns (events about B, B's stats).
fn with_neighbours(
    parser_b: Box<dyn Parser>,
    cfg: MuxConfig,
    bad: impl FnOnce(&mut Mux, PsockId),
) -> (Vec<Event>, PsockStats, usize) {
    let mut m = Mux::new(cfg);
    let k1 = m.socket(SockType::Dgram);
    let k2 = m.clone_sock(k1).unwrap();
    let a = attach_l4(&mut m);
    let b = m.attach(parser_b, PsockConfig::default());
    let c = attach_l4(&mut m);
    let stream = |tag: u8| -> Vec<Vec<u8>> { (0..20).map(|i| l4_total(8 + i, tag)).collect() };
    let (sa, sc) = (stream(0xa), stream(0xc));
    let (wa, wc) = (sa.concat(), sc.concat());
    // First half of A and C (cut mid-message), then the bad input, then the rest.
    m.feed(a, &wa[..wa.len() / 2], ms(50)).unwrap();
    m.feed(c, &wc[..wc.len() / 3], ms(50)).unwrap();
    events(&mut m);
    bad(&mut m, b);
    let mut ev_b = Vec::new();
    for e in events(&mut m) {
        match &e {
            Event::PsockFailed(p, _) => {
                assert_eq!(*p, b, "only the bad psock fails");
                ev_b.push(e);
            }
            Event::PsockRxResume(_) | Event::SockReadable(_) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(m.rx_capacity(b), 0, "the bad psock is aborted");
    assert_eq!(m.rx_need(b), None);
    let held = m.memory_used();
    // More bytes for B are ignored; A and C finish normally.
    m.feed(b, &l4_total(10, 0xbb), ms(1000)).unwrap();
    m.feed(a, &wa[wa.len() / 2..], ms(1000)).unwrap();
    m.feed(c, &wc[wc.len() / 3..], ms(1000)).unwrap();
    m.handle_timeout(ms(10_000));
    assert!(events(&mut m).iter().all(|e| !matches!(e, Event::PsockFailed(..))));
    let mut got = recv_all(&mut m, k1);
    got.extend(recv_all(&mut m, k2));
    let from = |tag: u8| got.iter().filter(|g| g[4] == tag).cloned().collect::<Vec<_>>();
    let mut fa = from(0xa);
    let mut fc = from(0xc);
    fa.sort();
    fc.sort();
    let (mut sa, mut sc) = (sa, sc);
    sa.sort();
    sc.sort();
    assert_eq!(fa, sa, "A unaffected");
    assert_eq!(fc, sc, "C unaffected");
    assert!(from(0xbb).is_empty(), "nothing from B after its abort");
    for p in [a, c] {
        let st = m.psock_stats(p).unwrap();
        assert_eq!(st.rx_aborts + st.rx_msg_too_big + st.rx_bad_hdr_len + st.rx_interrupted + st.rx_msg_timeouts, 0);
        assert!(m.rx_capacity(p) > 0);
    }
    (ev_b, m.psock_stats(b).unwrap(), held)
}

#[test]
fn oversize_length_aborts_only_that_psock() {
    let cfg = MuxConfig { max_msg_size: 4096, ..rr_config() };
    let (ev, st, _) = with_neighbours(L4::boxed(), cfg, |m, b| {
        m.feed(b, &l4_total(10, 0xb), ms(1)).unwrap();
        m.feed(b, &(1u32 << 20).to_be_bytes(), ms(1)).unwrap();
    });
    assert_eq!(
        ev,
        vec![Event::PsockFailed(ev_psock(&ev), PsockError::Rx(RxError::TooBig { len: (1 << 20) + 4, max: 4096 }))]
    );
    assert_eq!((st.rx_msg_too_big, st.rx_aborts, st.rx_msgs), (1, 1, 1));
}

#[test]
fn invalid_length_from_the_parser_aborts_only_that_psock() {
    let mut parser = L4::new();
    parser.refuse = Some(0xffff_fffe);
    let (ev, st, _) = with_neighbours(Box::new(parser), rr_config(), |m, b| {
        m.feed(b, &[0xff, 0xff, 0xff, 0xfe, 0, 0], ms(1)).unwrap();
    });
    assert_eq!(ev, vec![Event::PsockFailed(ev_psock(&ev), PsockError::Rx(RxError::Parser(ParseError::Program(22))))]);
    assert_eq!((st.rx_interrupted, st.rx_aborts), (1, 1));
}

#[test]
fn length_shorter_than_the_header_already_read_aborts_only_that_psock() {
    let mut parser = L4::new();
    parser.adjust = 0;
    let (ev, st, _) = with_neighbours(Box::new(parser), rr_config(), |m, b| {
        m.feed(b, &[0, 0], ms(1)).unwrap();
        // Below the parser's hint: it is not asked again, so the length
        // must reach past the 2 bytes it answered NeedMore for.
        m.feed(b, &[0], ms(2)).unwrap();
        m.feed(b, &[1, 7, 7, 7], ms(3)).unwrap();
    });
    assert_eq!(ev, vec![Event::PsockFailed(ev_psock(&ev), PsockError::Rx(RxError::BadLength { len: 1, gathered: 2 }))]);
    assert_eq!((st.rx_bad_hdr_len, st.rx_aborts), (1, 1));
    assert!(st.rx_need_more_hdr >= 1);
}

#[test]
fn stalled_message_past_its_deadline_aborts_only_that_psock() {
    let cfg = MuxConfig { assembly_timeout: Some(Duration::from_millis(100)), ..rr_config() };
    let (ev, st, _) = with_neighbours(L4::boxed(), cfg, |m, b| {
        let before = m.memory_used();
        m.feed(b, &l4_total(500, 0xb)[..100], ms(1)).unwrap();
        // The budget counts the assembly buffer's allocation: at least the
        // bytes held.
        assert!(m.memory_used() >= before + 100, "{} held", m.memory_used() - before);
        assert_eq!(m.poll_timeout(), Some(ms(101)));
        m.handle_timeout(ms(100));
        assert!(m.rx_capacity(b) > 0, "not yet");
        m.handle_timeout(ms(101));
        assert_eq!(m.memory_used(), before, "the stalled bytes are freed");
    });
    assert_eq!(ev, vec![Event::PsockFailed(ev_psock(&ev), PsockError::Rx(RxError::Timeout))]);
    assert_eq!((st.rx_msg_timeouts, st.rx_aborts), (1, 1));
}

fn ev_psock(ev: &[Event]) -> PsockId {
    match ev.first() {
        Some(Event::PsockFailed(p, _)) => *p,
        other => panic!("expected a failure, got {other:?}"),
    }
}
