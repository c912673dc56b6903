//! `Mux::feed_in_place`: messages framed where they lie in the read bytes
//! must be exactly the messages, order, counters and errors that `feed` and
//! `recv_msg` give for the same bytes; and nothing is framed in place where
//! steering would not send the message to the caller's socket.

mod common;

use std::ops::Range;
use std::time::Duration;

use common::*;
use connmux_core::mux::{Direct, Event, Mux, MuxConfig, PsockConfig, PsockId, SockId, SockType, Steering};
use connmux_core::run::{Messages, Run};
use connmux_core::Bytes;
use connmux_core::Timestamp;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const T0: Timestamp = Timestamp::ZERO;

fn affinity_mux(cfg: MuxConfig, parser: L4) -> (Mux, SockId, PsockId) {
    let mut m = Mux::new(MuxConfig { steering: Steering::Affinity, ..cfg });
    let s = m.socket(SockType::Dgram);
    m.set_affinity(s, Some(0)).unwrap();
    let p = m.attach(Box::new(parser), PsockConfig::default());
    m.set_psock_affinity(p, Some(0)).unwrap();
    (m, s, p)
}

/// Feed `data` in place; return what the socket's reader sees, in order: the
/// messages framed in place, then whatever the queue holds.
/// Messages completed from buffered bytes are handed over in `direct` (as by
/// `feed_direct`), which comes after the in-place ones and before the queue.
fn feed_and_read(
    m: &mut Mux,
    s: SockId,
    p: PsockId,
    data: &[u8],
    now: Timestamp,
    limit: usize,
) -> (usize, Vec<Vec<u8>>) {
    let (mut out, mut direct): (Vec<Run>, Vec<(Bytes, PsockId)>) = (Vec::new(), Vec::new());
    let mut d = Direct { sock: s, out: &mut direct, limit: 2 };
    m.feed_in_place(p, data, now, &mut d, limit, &mut out).unwrap();
    let n = connmux_core::run::count(&out);
    let mut got: Vec<Vec<u8>> = Messages::new(data, &out).iter().map(<[u8]>::to_vec).collect();
    assert_eq!(got.len(), n, "every run within the read");
    got.extend(direct.into_iter().map(|(b, _)| b.to_vec()));
    got.extend(recv_all(m, s));
    (n, got)
}

/// `feed_in_place`, its messages as ranges of `data` appended to `out`.
fn in_place(m: &mut Mux, s: SockId, p: PsockId, data: &[u8], limit: usize, out: &mut Vec<Range<usize>>) {
    let mut direct = Vec::new();
    let mut d = Direct { sock: s, out: &mut direct, limit: 0 };
    let mut runs = Vec::new();
    m.feed_in_place(p, data, T0, &mut d, limit, &mut runs).unwrap();
    out.extend(connmux_core::run::ranges(&runs));
}

/// The same stream, cut at the same random points, through `feed` and through
/// `feed_in_place`: same messages in the same order, same counters, same
/// failure; and most messages framed in place.
#[test]
fn in_place_matches_feed_for_random_splits() {
    for seed in 0..300u64 {
        let mut rng = StdRng::seed_from_u64(seed);
        let strip = rng.gen_bool(0.3);
        let max = 300;
        let cfg = MuxConfig { max_msg_size: max, ..MuxConfig::default() };
        let mk = || L4 { strip, refuse: Some(77), ..L4::new() };
        let (mut a, sa, pa) = affinity_mux(cfg.clone(), mk());
        let (mut b, sb, pb) = affinity_mux(cfg, mk());
        // Messages of 4..=200 bytes; now and then one too big or refused, to
        // check that an error is found and counted the same way.
        let mut wire = Vec::new();
        for i in 0..rng.gen_range(1..60) {
            let total = rng.gen_range(4..=200);
            wire.extend(l4_total(total, i as u8));
            if rng.gen_bool(0.01) {
                wire.extend(l4_total(max + 1 + rng.gen_range(0..10), 0xee));
            } else if rng.gen_bool(0.01) {
                wire.extend(l4_total(77 + 4, 0xdd));
            }
        }
        let (mut want, mut got, mut in_place) = (Vec::new(), Vec::new(), 0);
        let mut at = 0;
        let mut t = 0u64;
        while at < wire.len() {
            let n = rng.gen_range(1..=wire.len() - at).min(rng.gen_range(1..600));
            let now = Timestamp::from_nanos(t);
            a.feed(pa, &wire[at..at + n], now).unwrap();
            want.extend(recv_all(&mut a, sa));
            let (k, g) = feed_and_read(&mut b, sb, pb, &wire[at..at + n], now, rng.gen_range(1..64));
            in_place += k;
            got.extend(g);
            at += n;
            t += 1_000;
        }
        assert_eq!(got, want, "seed {seed}: messages");
        assert_eq!(b.sock_stats(sb).unwrap(), a.sock_stats(sa).unwrap(), "seed {seed}: socket counters");
        assert_eq!(b.psock_stats(pb).unwrap(), a.psock_stats(pa).unwrap(), "seed {seed}: psock counters");
        let fails =
            |m: &mut Mux| events(m).into_iter().filter(|e| matches!(e, Event::PsockFailed(..))).collect::<Vec<_>>();
        let (fa, fb) = (fails(&mut a), fails(&mut b));
        assert_eq!(fb.len(), fa.len(), "seed {seed}: failures");
        if let (Some(Event::PsockFailed(_, ea)), Some(Event::PsockFailed(_, eb))) = (fa.first(), fb.first()) {
            assert_eq!(eb, ea, "seed {seed}: failure reason");
        }
        if seed == 0 {
            assert!(in_place > 0, "nothing was framed in place");
        }
    }
}

/// The same stream, cut at the same random points, through `feed` and
/// framed by the psock's owner alone wherever it may (`frame_alone`, then
/// `report_alone`), the rest of each read through `feed_in_place`: the
/// same messages in the same order, the same counters, the share exact
/// (errors included: the owner frames alone only up to one); and many
/// reads framed alone (a read after one that left part of a message, or
/// queued one, goes through the hub).
#[test]
fn framing_alone_matches_feed_for_random_splits() {
    let mut alone = 0;
    for seed in 0..300u64 {
        let mut rng = StdRng::seed_from_u64(seed);
        let max = 300;
        let cfg = MuxConfig { max_msg_size: max, ..MuxConfig::default() };
        let mk = || L4 { refuse: Some(77), ..L4::new() };
        let (mut a, sa, pa) = affinity_mux(cfg.clone(), mk());
        let (mut b, sb, pb) = affinity_mux(cfg, mk());
        let mut wire = Vec::new();
        for i in 0..rng.gen_range(1..60) {
            wire.extend(l4_total(rng.gen_range(4..=200), i as u8));
            if rng.gen_bool(0.01) {
                wire.extend(l4_total(max + 1 + rng.gen_range(0..10), 0xee));
            }
        }
        let (mut want, mut got) = (Vec::new(), Vec::new());
        let (mut at, mut t) = (0, 0u64);
        while at < wire.len() {
            let n = rng.gen_range(1..=wire.len() - at).min(rng.gen_range(1..600));
            let (now, read) = (Timestamp::from_nanos(t), &wire[at..at + n]);
            a.feed(pa, read, now).unwrap();
            want.extend(recv_all(&mut a, sa));
            let mut runs = Vec::new();
            let taken = match b.owned().frame_alone(pb, read, now, sb, 0, &mut runs) {
                Some(f) => {
                    let taken = f.taken();
                    b.report_alone(f);
                    alone += 1;
                    taken
                }
                None => 0,
            };
            got.extend(Messages::new(read, &runs).iter().map(<[u8]>::to_vec));
            if taken < n {
                got.extend(feed_and_read(&mut b, sb, pb, &read[taken..], now, 64).1);
            }
            assert_shares(&b);
            at += n;
            t += 1_000;
        }
        assert_eq!(got, want, "seed {seed}: messages");
        assert_eq!(b.sock_stats(sb).unwrap(), a.sock_stats(sa).unwrap(), "seed {seed}: socket counters");
        assert_eq!(b.psock_stats(pb).unwrap(), a.psock_stats(pa).unwrap(), "seed {seed}: psock counters");
        let fails = |m: &mut Mux| events(m).into_iter().filter(|e| matches!(e, Event::PsockFailed(..))).count();
        assert_eq!(fails(&mut b), fails(&mut a), "seed {seed}: failures");
    }
    assert!(alone > 100, "framed alone {alone} times");
}

/// Nothing is framed alone for a psock whose messages wait in a queue
/// (later ones would overtake them), nor for one of another affinity.
#[test]
fn nothing_is_framed_alone_while_a_message_of_it_is_queued() {
    let (mut m, s, p) = affinity_mux(MuxConfig::default(), L4::new());
    let mut runs = Vec::new();
    assert!(m.owned().frame_alone(p, &l4_total(10, 1), T0, s, 1, &mut runs).is_none(), "another affinity");
    m.feed(p, &l4_total(10, 1), T0).unwrap();
    assert!(m.owned().frame_alone(p, &l4_total(10, 2), T0, s, 0, &mut runs).is_none(), "a message queued");
    assert_eq!(recv_all(&mut m, s).len(), 1);
    // Its next call on the hub sees the queue empty.
    let mut direct = Vec::new();
    let mut d = Direct { sock: s, out: &mut direct, limit: 0 };
    m.feed_in_place(p, &l4_total(10, 2), T0, &mut d, 64, &mut runs).unwrap();
    assert_eq!(connmux_core::run::count(&runs), 1);
    let f = m.owned().frame_alone(p, &l4_total(10, 3), T0, s, 0, &mut runs).expect("framed alone");
    m.report_alone(f);
    assert_eq!(connmux_core::run::count(&runs), 2);
    assert_eq!(m.sock_stats(s).unwrap().rx_msgs, 3);
}

/// The socket whose thread reads the psocks takes a read framed alone as
/// steering would give it through the hub: counted as received, held
/// until settled, and only for that socket.
#[test]
fn the_reading_threads_socket_frames_alone_what_steering_gives_it() {
    let mut m = Mux::new(MuxConfig { steering: Steering::Affinity, ..MuxConfig::default() });
    let k1 = m.socket(SockType::Dgram);
    let k2 = m.clone_sock(k1).unwrap();
    let p = m.attach(Box::new(L4::new()), PsockConfig::default());
    m.set_psock_affinity(p, Some(0)).unwrap();
    assert!(!m.v().tag_taken(0), "no socket takes the psock by its tag");
    let mut runs = Vec::new();
    assert!(m.owned().frame_alone_as_reader(p, &l4_total(10, 0), T0, k2, &mut runs).is_none(), "no reader yet");
    m.owned().set_reader(Some(k2));
    assert!(m.owned().frame_alone_as_reader(p, &l4_total(10, 0), T0, k1, &mut runs).is_none(), "not the reader");
    let f = m.owned().frame_alone_as_reader(p, &l4_total(10, 0), T0, k2, &mut runs).expect("the reader's");
    m.report_alone(f.held());
    assert_eq!(connmux_core::run::count(&runs), 1);
    assert_eq!(m.sock_stats(k2).unwrap().rx_msgs, 1, "received by the reader");
    // Through the hub, the same read goes the same way.
    m.feed(p, &l4_total(10, 1), T0).unwrap();
    assert_eq!((m.rx_queued(k1).unwrap(), m.rx_queued(k2).unwrap()), (0, 1));
    // The framed one is held: given back unreceived, it waits in the
    // reader's queue before the later one.
    m.unkeep(k2, vec![(Bytes::from(l4_total(10, 0)), p)]);
    assert_eq!(recv_all(&mut m, k2), vec![l4_total(10, 0), l4_total(10, 1)]);
    m.set_affinity(k1, Some(0)).unwrap();
    assert!(m.v().tag_taken(0), "K1 takes the psock by its tag now");
}

/// Replies queued on a psock up to its backlog's pause mark: what its owner
/// decided alone no longer holds (`BacklogOver` told), and the next read
/// goes through the hub, which holds it back.
#[test]
fn nothing_is_framed_alone_once_the_reply_backlog_reaches_its_mark() {
    let cfg = MuxConfig { psock_sndbuf: 4096, ..MuxConfig::default() };
    let (mut m, s, p) = affinity_mux(cfg, L4::new());
    let mut runs = Vec::new();
    let f = m.owned().frame_alone(p, &l4_total(10, 1), T0, s, 0, &mut runs).expect("framed alone");
    m.report_alone(f);
    // Unwritten replies: 25 × 100 bytes, past half of the 4 KiB bound.
    for i in 0..25 {
        m.send_msg(s, Some(p), Bytes::from(l4_total(100, i)), false).unwrap();
    }
    assert!(m.owned().frame_alone(p, &l4_total(10, 2), T0, s, 0, &mut runs).is_none(), "backlog over its mark");
    assert_eq!(m.owned().rx_room_alone(p), 0);
    assert_eq!(m.rx_capacity(p), 0, "the hub holds it back");
    // Written: read (and framed alone) again.
    let _ = flush(&mut m, p);
    assert!(m.rx_capacity(p) > 0);
    assert!(m.owned().frame_alone(p, &l4_total(10, 3), T0, s, 0, &mut runs).is_some());
}

#[test]
fn whole_messages_are_framed_in_place_and_a_partial_tail_is_buffered() {
    let (mut m, s, p) = affinity_mux(MuxConfig::default(), L4::new());
    let mut wire = l4_total(10, 1);
    wire.extend(l4_total(12, 2));
    let third = l4_total(20, 3);
    wire.extend(&third[..7]);
    let mut out = Vec::new();
    in_place(&mut m, s, p, &wire, 64, &mut out);
    assert_eq!(out, vec![0..10, 10..22]);
    assert_eq!(m.rx_queued(s).unwrap(), 0);
    assert_eq!(m.psock_stats(p).unwrap().rx_msgs, 2);
    // With the partial third message buffered nothing more is framed in place: the rest
    // completes it in the stream and goes to the queue.
    out.clear();
    in_place(&mut m, s, p, &third[7..], 64, &mut out);
    assert!(out.is_empty());
    assert_eq!(recv_all(&mut m, s), vec![third]);
    let st = m.sock_stats(s).unwrap();
    assert_eq!((st.rx_msgs, st.rx_bytes), (3, 42));
}

#[test]
fn the_limit_bounds_what_is_framed_in_place() {
    let (mut m, s, p) = affinity_mux(MuxConfig::default(), L4::new());
    let wire: Vec<u8> = (0..5).flat_map(|i| l4_total(8, i)).collect();
    let (n, got) = feed_and_read(&mut m, s, p, &wire, T0, 2);
    assert_eq!(n, 2);
    assert_eq!(got, (0..5).map(|i| l4_total(8, i)).collect::<Vec<_>>());
}

/// Wherever steering would not hand the next message to the caller's socket
/// straight away, nothing is framed in place (the bytes are fed as usual).
#[test]
fn nothing_is_framed_in_place_unless_steered_to_the_callers_empty_socket() {
    let msg = l4_total(10, 1);
    let frames = |m: &mut Mux, s: SockId, p: PsockId| {
        let mut out = Vec::new();
        in_place(m, s, p, &msg, 64, &mut out);
        out.len()
    };
    // Round robin.
    {
        let mut m = Mux::new(rr_config());
        let s = m.socket(SockType::Dgram);
        let p = m.attach(L4::boxed(), PsockConfig::default());
        assert_eq!(frames(&mut m, s, p), 0);
        assert_eq!(m.rx_queued(s).unwrap(), 1);
    }
    // Another worker's psock.
    {
        let (mut m, s, p) = affinity_mux(MuxConfig::default(), L4::new());
        m.set_psock_affinity(p, Some(1)).unwrap();
        assert_eq!(frames(&mut m, s, p), 0);
    }
    // A message already waits in the socket's queue: order is kept.
    {
        let (mut m, s, p) = affinity_mux(MuxConfig::default(), L4::new());
        m.feed(p, &l4_total(9, 0), T0).unwrap();
        assert_eq!(frames(&mut m, s, p), 0);
        assert_eq!(recv_all(&mut m, s), vec![l4_total(9, 0), msg.clone()]);
    }
    // The socket does not take messages (receive disabled).
    {
        let (mut m, s, p) = affinity_mux(MuxConfig::default(), L4::new());
        m.set_recv_disable(s, true).unwrap();
        assert_eq!(frames(&mut m, s, p), 0);
    }
    // A parser that does not allow it.
    {
        let (mut m, s, p) = affinity_mux(MuxConfig::default(), L4 { in_place: false, ..L4::new() });
        assert_eq!(frames(&mut m, s, p), 0);
        assert_eq!(recv_all(&mut m, s), vec![msg.clone()]);
    }
}

/// A bad message in the middle: the good ones before it are framed in place,
/// the bad one fails the psock exactly as `feed` would, nothing after it is
/// delivered.
#[test]
fn an_error_after_good_messages_fails_the_psock_once() {
    let cfg = MuxConfig { max_msg_size: 64, assembly_timeout: Some(Duration::from_millis(5)), ..MuxConfig::default() };
    let (mut m, s, p) = affinity_mux(cfg, L4::new());
    events(&mut m);
    let mut wire = l4_total(10, 1);
    wire.extend(l4_total(100, 2));
    wire.extend(l4_total(10, 3));
    let (n, got) = feed_and_read(&mut m, s, p, &wire, T0, 64);
    assert_eq!((n, got), (1, vec![l4_total(10, 1)]));
    let fails: Vec<Event> = events(&mut m).into_iter().filter(|e| matches!(e, Event::PsockFailed(..))).collect();
    assert_eq!(fails.len(), 1);
    assert_eq!(m.psock_stats(p).unwrap().rx_msgs, 1);
}

/// ONC RPC records framed in place, marks kept or stripped: the socket's byte
/// count is what its reader receives, the same as through `feed` (kept: the
/// bytes taken, counted without a walk of the ranges; stripped: the bodies).
#[test]
fn oncrpc_in_place_counts_the_bytes_delivered() {
    use connmux_core::parsers::OncRpc;
    let record = |body: &[u8], last: bool| {
        let mark = (body.len() as u32 | if last { 0x8000_0000 } else { 0 }).to_be_bytes();
        let mut r = mark.to_vec();
        r.extend_from_slice(body);
        r
    };
    let mut wire = Vec::new();
    for i in 0..40u8 {
        wire.extend(record(&vec![i; 40 + i as usize], true));
    }
    // A record of two fragments (the general loop), then a partial record.
    wire.extend(record(&[7; 12], false));
    wire.extend(record(&[8; 20], true));
    wire.extend(&record(&[9; 30], true)[..10]);
    for strip in [false, true] {
        let mk = || {
            let mut m = Mux::new(MuxConfig { steering: Steering::Affinity, ..MuxConfig::default() });
            let s = m.socket(SockType::Dgram);
            m.set_affinity(s, Some(0)).unwrap();
            let p = m.attach(Box::new(OncRpc::new(strip)), PsockConfig::default());
            m.set_psock_affinity(p, Some(0)).unwrap();
            (m, s, p)
        };
        let (mut a, sa, pa) = mk();
        a.feed(pa, &wire, T0).unwrap();
        let via_feed = recv_all(&mut a, sa);
        let (mut b, sb, pb) = mk();
        let (n, via_in_place) = feed_and_read(&mut b, sb, pb, &wire, T0, 64);
        assert!(n >= 40, "strip {strip}: only {n} framed in place");
        assert_eq!(via_in_place, via_feed, "strip {strip}");
        let (st_a, st_b) = (a.sock_stats(sa).unwrap(), b.sock_stats(sb).unwrap());
        let delivered: usize = via_feed.iter().map(Vec::len).sum();
        assert_eq!((st_b.rx_msgs, st_b.rx_bytes), (st_a.rx_msgs, st_a.rx_bytes), "strip {strip}");
        assert_eq!((st_b.rx_msgs, st_b.rx_bytes), (41, delivered as u64), "strip {strip}");
    }
}
