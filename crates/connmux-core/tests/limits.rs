//! The mux-wide limits: the memory budget (largest holders paused first,
//! the stuck ones aborted after the grace, counted; the rest read again
//! below the low mark), the idle timeout and the handshake deadline.

mod common;

use std::time::Duration;

use common::*;
use connmux_core::mux::{Direct, Event, Mux, MuxConfig, PsockConfig, PsockError, PsockId, RxError, SockType, Steering};
use connmux_core::Timestamp;

fn ms(n: u64) -> Timestamp {
    Timestamp::from_nanos(n * 1_000_000)
}

const LIMIT: usize = 100_000;

fn budget_config() -> MuxConfig {
    MuxConfig {
        mem_limit: LIMIT,
        mem_grace: Duration::from_secs(1),
        max_msg_size: 64 << 10,
        psock_rx_buf: 4 << 10,
        ..rr_config()
    }
}

/// The first `n` bytes of one 60,000-byte l4 message (never complete).
fn partial(n: usize, tag: u8) -> Vec<u8> {
    l4_total(60_000, tag)[..n].to_vec()
}

fn failures(ev: &[Event]) -> Vec<(PsockId, PsockError)> {
    ev.iter()
        .filter_map(|e| match e {
            Event::PsockFailed(p, err) => Some((*p, err.clone())),
            _ => None,
        })
        .collect()
}

#[test]
fn over_budget_pauses_largest_first_then_aborts_the_stuck() {
    let (mut m, k) = dgram_mux(budget_config());
    let a = attach_l4(&mut m);
    let b = attach_l4(&mut m);
    let c = attach_l4(&mut m);
    let good = attach_l4(&mut m);
    // 90,000 bytes held in three partial messages: under the limit.
    m.feed(a, &partial(40_000, 0xa), ms(0)).unwrap();
    m.feed(b, &partial(30_000, 0xb), ms(0)).unwrap();
    m.feed(c, &partial(20_000, 0xc), ms(0)).unwrap();
    assert_eq!(m.memory_counted(), 90_000);
    assert_eq!(m.stats().mem_pauses, 0);
    assert!([a, b, c].iter().all(|&p| m.rx_capacity(p) > 0));
    // c grows to 35,000: 105,000 > 100,000. Every psock holding 16 KiB or
    // more is paused; the good one, holding nothing, is not.
    m.feed(c, &partial(35_000, 0xc)[20_000..], ms(100)).unwrap();
    assert_holds(m.memory_used(), 105_000, "memory");
    assert!(m.mem_paused(a) && m.mem_paused(b) && m.mem_paused(c) && !m.mem_paused(good));
    assert_eq!((m.rx_capacity(a), m.rx_capacity(b), m.rx_capacity(c)), (0, 0, 0));
    // Over the budget, a read is no larger than the floor (16 KiB).
    assert!(m.rx_capacity(good) > 0 && m.rx_capacity(good) <= 16 << 10);
    assert_eq!(m.stats().mem_pauses, 3);
    assert!(failures(&events(&mut m)).is_empty(), "a pause is not an abort");
    // A well-behaved psock is still read and its messages delivered.
    let msgs: Vec<u8> = (0..10).flat_map(|i| l4_total(100, i)).collect();
    m.feed(good, &msgs, ms(200)).unwrap();
    assert_eq!(recv_all(&mut m, k).len(), 10);
    // The grace ends one second after the pauses.
    assert_eq!(m.poll_timeout(), Some(ms(1100)));
    m.handle_timeout(ms(1099));
    assert!(failures(&events(&mut m)).is_empty(), "not before the grace ends");
    m.handle_timeout(ms(1100));
    let ev = events(&mut m);
    // Largest first until the total is at the low mark: a (→ 65,000), then
    // c (→ 30,000); b is spared and read again.
    let f = failures(&ev);
    assert_eq!(
        f,
        vec![
            (a, PsockError::Rx(RxError::MemLimit { held: 40_000, limit: LIMIT })),
            // (c's 35,000 bytes lie in a buffer grown to 40,000: the
            // budget counts the allocation.)
            (c, PsockError::Rx(RxError::MemLimit { held: 40_000, limit: LIMIT })),
        ]
    );
    assert_eq!(m.stats().mem_aborts, 2);
    assert!(!m.mem_paused(b) && m.rx_capacity(b) > 0);
    assert!(ev.contains(&Event::PsockRxResume(b)));
    assert_holds(m.memory_used(), 30_000, "the aborted psocks' buffers are freed");
    assert_eq!(m.memory_counted(), m.memory_used());
    // b was never paused: it completes its message.
    m.feed(b, &l4_total(60_000, 0xb)[30_000..], ms(1200)).unwrap();
    let got = recv_all(&mut m, k);
    assert_eq!(got, vec![l4_total(60_000, 0xb)]);
    assert_eq!(m.poll_timeout(), None, "nothing left to look at");
}

/// A quiet psock whose driver armed a read ahead for its next message (the
/// last was large: `Mux::rx_lend_ahead`) holds that loan, counted whole,
/// while it sends nothing. Paused by the budget, it has the loan recalled
/// and holds nothing at its grace's end: the stuck psocks are aborted, not
/// the quiet one, though its loan was the largest holding.
/// What a psock's owner may read with no look at the hub
/// (`rx_room_alone`): the room the hub gave at the psock's last report,
/// while it is at a message boundary and the budget was less than half
/// used; nothing (ask the hub) while it holds part of a message, or once
/// its report saw the budget half used.
#[test]
fn a_psock_reads_alone_only_at_a_boundary_and_with_half_the_budget_free() {
    let (mut m, k) = dgram_mux(budget_config());
    let a = attach_l4(&mut m);
    let b = attach_l4(&mut m);
    assert!(m.owned().rx_room_alone(a) > 0 && m.owned().rx_room_alone(a) <= m.rx_capacity(a));
    m.feed(a, &partial(40_000, 0xa), ms(0)).unwrap();
    assert_eq!(m.owned().rx_room_alone(a), 0, "part of a message held: the hub decides");
    assert!(m.rx_capacity(a) > 0);
    // b's last report (its attach) saw nothing used: alone until it reports.
    assert!(m.owned().rx_room_alone(b) > 0);
    m.feed(a, &partial(55_000, 0xa)[40_000..], ms(1)).unwrap();
    assert!(m.owned().rx_room_alone(b) > 0, "a stale room until b's next report");
    // b's next read reports 55,000 of 100,000 used (and its message queued).
    m.feed(b, &l4_total(100, 1), ms(2)).unwrap();
    assert_eq!(m.owned().rx_room_alone(b), 0, "the hub decides");
    assert_eq!(recv_all(&mut m, k).len(), 1);
    // A part of a message and the rest again: nothing queued, but half the
    // budget used.
    m.feed(b, &l4_total(100, 2)[..50], ms(3)).unwrap();
    m.feed(b, &l4_total(100, 2)[50..], ms(3)).unwrap();
    assert_eq!(recv_all(&mut m, k).len(), 1);
    m.feed(b, &l4_total(100, 3)[..50], ms(4)).unwrap();
    m.feed(b, &l4_total(100, 3)[50..], ms(4)).unwrap();
    assert_eq!(m.owned().rx_room_alone(b), 0, "half the budget used: the hub decides");
    assert!(m.rx_capacity(b) > 0, "and still lets it read");
}

#[test]
fn a_loan_out_for_a_quiet_psock_is_recalled_when_paused_and_the_quiet_psock_kept() {
    let (mut m, k) = dgram_mux(budget_config());
    let quiet = attach_l4(&mut m);
    let a = attach_l4(&mut m);
    let b = attach_l4(&mut m);
    // One large message, taken: the next is predicted as large.
    m.feed(quiet, &l4_total(40_000, 0x1), ms(0)).unwrap();
    assert_eq!(recv_all(&mut m, k).len(), 1);
    let ahead = m.rx_lend_ahead(quiet).expect("room below the low mark: lent ahead");
    assert_holds(m.memory_used(), ahead.limit(), "the loan counts whole while out");
    assert!(ahead.limit() >= 40_000);
    // Two stuck senders take the total over the limit.
    m.feed(a, &partial(35_000, 0xa), ms(10)).unwrap();
    m.feed(b, &partial(30_000, 0xb), ms(10)).unwrap();
    assert!(m.memory_used() > LIMIT);
    assert!(m.mem_paused(quiet) && m.mem_paused(a) && m.mem_paused(b));
    let ev = events(&mut m);
    assert_eq!(
        ev.iter().filter(|e| matches!(e, Event::PsockRxRecall(_))).collect::<Vec<_>>(),
        vec![&Event::PsockRxRecall(quiet)],
        "only the psock whose buffer is lent is asked for it: {ev:?}"
    );
    // The driver ends the read: nothing came.
    m.rx_commit(ahead, ms(20)).unwrap();
    assert_holds(m.memory_used(), 65_000, "the quiet psock holds nothing now");
    assert!(m.rx_lend_ahead(quiet).is_none(), "paused: no loan");
    // The grace ends: the largest stuck holder goes until the low mark.
    m.handle_timeout(ms(1010));
    let ev = events(&mut m);
    assert_eq!(failures(&ev), vec![(a, PsockError::Rx(RxError::MemLimit { held: 35_000, limit: LIMIT }))]);
    assert!(ev.contains(&Event::PsockRxResume(quiet)), "read again: {ev:?}");
    // The quiet peer's next message is served.
    let next = l4_total(40_000, 0x2);
    m.feed(quiet, &next, ms(1020)).unwrap();
    assert_eq!(recv_all(&mut m, k), vec![next]);
    assert_eq!(m.stats().mem_aborts, 1);
}

#[test]
fn paused_psocks_read_again_below_the_low_mark() {
    let (mut m, k) = dgram_mux(MuxConfig { sock_rcvbuf: 1 << 20, ..budget_config() });
    let a = attach_l4(&mut m);
    let b = attach_l4(&mut m);
    m.feed(a, &partial(40_000, 0xa), ms(0)).unwrap();
    // b's complete messages queue on the socket (the application is slow):
    // 40,000 + 70,000 > 100,000; a holds the most and is paused. b, whose
    // own holding is nothing (its messages are the socket's), is not.
    for i in 0..7 {
        m.feed(b, &l4_total(10_000, i), ms(10)).unwrap();
    }
    assert!(m.mem_paused(a) && !m.mem_paused(b));
    assert_eq!(m.rx_capacity(a), 0);
    events(&mut m);
    // The application reads: 40,000 ≤ 50,000, a is read again at once.
    assert_eq!(recv_all(&mut m, k).len(), 7);
    assert!(!m.mem_paused(a));
    assert!(events(&mut m).contains(&Event::PsockRxResume(a)));
    assert!(m.rx_capacity(a) > 0);
    // Past the old grace nothing is aborted, and a completes its message.
    m.handle_timeout(ms(5000));
    assert!(failures(&events(&mut m)).is_empty());
    m.feed(a, &l4_total(60_000, 0xa)[40_000..], ms(5000)).unwrap();
    assert_eq!(recv_all(&mut m, k), vec![l4_total(60_000, 0xa)]);
    assert_eq!((m.stats().mem_pauses, m.stats().mem_aborts), (1, 0));
}

#[test]
fn a_paused_psock_that_shrinks_is_not_aborted() {
    // Replies queued for a psock count as its holding; one whose peer reads
    // them during the grace is not stuck.
    let (mut m, k) = dgram_mux(budget_config());
    let a = attach_l4(&mut m);
    let b = attach_l4(&mut m);
    for _ in 0..2 {
        m.send_msg(k, Some(a), vec![7u8; 30_000].into(), false).unwrap();
    }
    m.feed(b, &partial(45_000, 0xb), ms(0)).unwrap();
    // 105,000: both are paused (b is not read, a's peer is not read for).
    assert!(m.mem_paused(a) && m.mem_paused(b));
    // Its peer reads one of them before the grace ends.
    let chunk = m.tx_begin(a).expect("a reply to write");
    assert!(chunk.len() >= 30_000);
    m.tx_complete(a, 30_000);
    m.handle_timeout(ms(1000));
    // a shrank (60,000 → 30,000): not aborted; b is stuck: aborted, which
    // brings the total (75,000) to the low mark, and a is read again.
    let f = failures(&events(&mut m));
    assert_eq!(f, vec![(b, PsockError::Rx(RxError::MemLimit { held: 45_000, limit: LIMIT }))]);
    assert_eq!(m.stats().mem_aborts, 1);
    assert!(!m.mem_paused(a));
}

#[test]
fn idle_psocks_are_closed_after_the_idle_timeout() {
    let cfg = MuxConfig { idle_timeout: Some(Duration::from_secs(10)), ..rr_config() };
    let (mut m, k) = dgram_mux(cfg);
    m.handle_timeout(ms(0));
    let quiet = attach_l4(&mut m);
    let busy = attach_l4(&mut m);
    assert_eq!(m.poll_timeout(), Some(ms(10_000)));
    m.feed(busy, &l4(b"hi"), ms(6000)).unwrap();
    assert_eq!(recv_all(&mut m, k).len(), 1);
    m.handle_timeout(ms(9999));
    assert!(failures(&events(&mut m)).is_empty(), "not before the timeout");
    m.handle_timeout(ms(10_000));
    assert_eq!(failures(&events(&mut m)), vec![(quiet, PsockError::Rx(RxError::IdleTimeout))]);
    assert_eq!(m.rx_capacity(quiet), 0);
    assert_eq!(m.stats().idle_timeouts, 1);
    // busy's last traffic was at 6 s: it goes at 16 s, looked at by then.
    let next = m.poll_timeout().expect("busy still watched");
    assert!(next <= ms(16_000), "{next:?}");
    for _ in 0..64 {
        match m.poll_timeout() {
            Some(t) if t <= ms(16_000) => m.handle_timeout(t),
            _ => break,
        }
    }
    assert_eq!(failures(&events(&mut m)), vec![(busy, PsockError::Rx(RxError::IdleTimeout))]);
    assert_eq!(m.stats().idle_timeouts, 2);
}

/// Messages framed in place (never buffered, no reply) are traffic too.
#[test]
fn bytes_served_in_place_keep_a_psock_from_being_idle() {
    let cfg =
        MuxConfig { idle_timeout: Some(Duration::from_secs(10)), steering: Steering::Affinity, ..MuxConfig::default() };
    let mut m = Mux::new(cfg);
    let s = m.socket(SockType::Dgram);
    m.set_affinity(s, Some(0)).unwrap();
    m.handle_timeout(ms(0));
    let p = m.attach(L4::boxed(), PsockConfig::default());
    m.set_psock_affinity(p, Some(0)).unwrap();
    let data = l4(b"one way");
    let (mut out, mut direct) = (Vec::new(), Vec::new());
    let mut d = Direct { sock: s, out: &mut direct, limit: 0 };
    m.feed_in_place(p, &data, ms(8000), &mut d, 16, &mut out).unwrap();
    assert_eq!(connmux_core::run::count(&out), 1, "framed in place");
    for _ in 0..64 {
        match m.poll_timeout() {
            Some(t) if t <= ms(17_999) => m.handle_timeout(t),
            _ => break,
        }
    }
    m.handle_timeout(ms(17_999));
    assert!(failures(&events(&mut m)).is_empty(), "active at 8 s: not idle before 18 s");
    m.handle_timeout(ms(18_000));
    assert_eq!(failures(&events(&mut m)), vec![(p, PsockError::Rx(RxError::IdleTimeout))]);
}

#[test]
fn a_handshake_not_finished_by_its_deadline_fails_the_psock() {
    let (mut m, _k) = dgram_mux(rr_config());
    let slow = attach_l4(&mut m);
    let done = attach_l4(&mut m);
    m.set_handshake_deadline(slow, Some(ms(3000))).unwrap();
    m.set_handshake_deadline(done, Some(ms(3000))).unwrap();
    // done's handshake finishes in time.
    m.set_handshake_deadline(done, None).unwrap();
    assert_eq!(m.poll_timeout(), Some(ms(3000)));
    m.handle_timeout(ms(2999));
    assert!(failures(&events(&mut m)).is_empty());
    m.handle_timeout(ms(3000));
    assert_eq!(failures(&events(&mut m)), vec![(slow, PsockError::Rx(RxError::HandshakeTimeout))]);
    assert_eq!(m.stats().handshake_timeouts, 1);
    assert!(m.rx_capacity(done) > 0);
    assert_eq!(m.poll_timeout(), None);
}

/// The handshake's time given at attach (`PsockConfig::handshake_timeout`)
/// runs from the attach, for a psock its owner creates itself and for one
/// attached for it by another thread, which the owner creates later (its
/// time still runs from when it takes it: the owner's clock).
#[test]
fn a_handshake_timeout_given_at_attach_runs_from_then() {
    use connmux_core::mux::{Hub, MuxRef, Owned};
    let cfg = PsockConfig { handshake_timeout: Some(Duration::from_millis(3000)), ..PsockConfig::default() };
    let (mut m, _k) = dgram_mux(rr_config());
    m.handle_timeout(ms(1000));
    let slow = m.attach(L4::boxed(), cfg.clone());
    assert_eq!(m.poll_timeout(), Some(ms(4000)));
    m.handle_timeout(ms(3999));
    assert!(failures(&events(&mut m)).is_empty());
    m.handle_timeout(ms(4000));
    assert_eq!(failures(&events(&mut m)), vec![(slow, PsockError::Rx(RxError::HandshakeTimeout))]);

    // Attached by the application for owner 0, taken by it at 500 ms.
    let mut hub = Hub::new(rr_config());
    let (mut owner, mut app) = (Owned::new(0), Owned::new(1));
    let p = MuxRef::new(&mut app, &mut hub).attach_to(0, L4::boxed(), cfg);
    assert_eq!(hub.poll_event(), Some(Event::Wake(0)), "the owner is woken to take it");
    let mut o = MuxRef::new(&mut owner, &mut hub);
    o.handle_timeout(ms(500));
    o.apply_pending();
    o.handle_timeout(ms(3499));
    assert!(o.poll_event().is_none());
    o.handle_timeout(ms(3500));
    assert_eq!(o.poll_event(), Some(Event::PsockFailed(p, PsockError::Rx(RxError::HandshakeTimeout))));
}

/// 300 psocks each read, as a driver would (lent buffers and fed reads),
/// A mux under a 64 MiB budget with 300 l4 psocks, and what each peer
/// sends: 1 MiB − 16 bytes of a 1 MiB message (never complete).
fn three_hundred_large_partials() -> (Mux, connmux_core::mux::SockId, Vec<PsockId>, Vec<u8>) {
    let cfg = MuxConfig { mem_limit: 64 << 20, max_msg_size: 1 << 20, ..MuxConfig::default() };
    let (mut m, k) = dgram_mux(cfg);
    let ps: Vec<PsockId> = (0..300).map(|_| attach_l4(&mut m)).collect();
    let mut wire = l4_total((1 << 20) - 4, 1);
    wire.truncate((1 << 20) - 16);
    (m, k, ps, wire)
}

/// 1 MiB − 16 bytes of a 1 MiB message under a 64 MiB budget: at every step
/// the total stays within the limit plus two floors per psock, the count
/// kept as reads go equals the real sum, and the budget pauses and aborts.
#[test]
fn many_psocks_reading_large_messages_stay_within_the_budget() {
    let (mut m, _k, ps, wire) = three_hundred_large_partials();
    let wire = &wire[..];
    let mut sent = vec![0usize; 300];
    for round in 0..200 {
        for (i, &p) in ps.iter().enumerate() {
            if sent[i] >= wire.len() {
                continue;
            }
            let (cap, loan) = m.rx_room(p);
            if let Some(mut loan) = loan {
                let n = loan.limit().min(wire.len() - sent[i]);
                loan.buf().extend_from_slice(&wire[sent[i]..sent[i] + n]);
                sent[i] += n;
                m.rx_commit(loan, ms(round)).unwrap();
            } else if cap > 0 {
                let n = cap.min(wire.len() - sent[i]).min(64 << 10);
                m.feed(p, &wire[sent[i]..sent[i] + n], ms(round)).unwrap();
                sent[i] += n;
            }
            assert_eq!(m.memory_counted(), m.memory_used(), "round {round} psock {i}");
            assert!(m.memory_used() <= (64 << 20) + 300 * (32 << 10), "round {round} psock {i}: {}", m.memory_used());
        }
    }
    let st = m.stats();
    assert!(st.mem_pauses >= 60 && st.mem_aborts == 0, "{st:?}");
    // Every one is stuck: a second later the largest are aborted down to
    // the low mark, and the rest read again.
    m.handle_timeout(ms(1200));
    assert!(m.stats().mem_aborts > 0);
    assert!(m.memory_used() <= 32 << 20);
    assert!(ps.iter().all(|&p| !m.mem_paused(p)));
}

/// The same, fed as the io_uring driver feeds: 16 KiB pieces copied in (no
/// loan), each within `rx_capacity`, the assembly buffers growing as they
/// fill. The core keeps to the budget this way too (peak 65.7 MiB of 64).
#[test]
fn many_psocks_fed_in_small_pieces_stay_within_the_budget() {
    let (mut m, _k, ps, wire) = three_hundred_large_partials();
    let wire = &wire[..];
    let mut sent = vec![0usize; 300];
    let mut peak = 0;
    for round in 0..100 {
        for (i, &p) in ps.iter().enumerate() {
            let n = m.rx_capacity(p).min(wire.len() - sent[i]).min(16 << 10);
            if n > 0 {
                m.feed(p, &wire[sent[i]..sent[i] + n], ms(round)).unwrap();
                sent[i] += n;
            }
            peak = peak.max(m.memory_used());
            assert!(m.memory_used() <= (64 << 20) + 300 * (32 << 10), "round {round} psock {i}: {}", m.memory_used());
        }
    }
    eprintln!("peak {} KiB of a 64 MiB budget", peak >> 10);
    assert!(m.stats().mem_pauses >= 60, "{:?}", m.stats());
}

#[test]
fn a_partial_record_below_the_parser_past_its_deadline_is_an_assembly_timeout() {
    let (mut m, k) = dgram_mux(rr_config());
    let stalled = attach_l4(&mut m);
    let done = attach_l4(&mut m);
    m.set_record_deadline(stalled, Some(ms(500))).unwrap();
    m.set_record_deadline(done, Some(ms(500))).unwrap();
    m.set_record_deadline(done, None).unwrap();
    m.handle_timeout(ms(499));
    assert!(failures(&events(&mut m)).is_empty());
    m.handle_timeout(ms(500));
    assert_eq!(failures(&events(&mut m)), vec![(stalled, PsockError::Rx(RxError::Timeout))]);
    let st = m.psock_stats(stalled).unwrap();
    assert_eq!((st.rx_msg_timeouts, st.rx_aborts), (1, 1));
    m.feed(done, &l4(b"fine"), ms(600)).unwrap();
    assert_eq!(recv_all(&mut m, k), vec![l4(b"fine")]);
}

/// Bytes the driver holds below the parser (`Mux::set_rx_below`, the
/// io_uring driver's copy of a paused psock's ring buffers) count in the
/// budget as the psock's: they can push it over, pause it, and a psock stuck
/// holding them is aborted after the grace, its bytes no longer counted.
#[test]
fn bytes_held_below_the_parser_count_in_the_budget() {
    let (mut m, _k) = dgram_mux(budget_config());
    let a = attach_l4(&mut m);
    let good = attach_l4(&mut m);
    m.feed(a, &partial(20_000, 0xa), ms(0)).unwrap();
    m.set_rx_below(a, 50_000);
    assert_holds(m.memory_used(), 70_000, "memory");
    assert_eq!(m.memory_counted(), 70_000);
    assert!(!m.mem_paused(a), "under the limit");
    m.set_rx_below(a, 90_000);
    assert_eq!(m.memory_counted(), 110_000);
    assert!(m.mem_paused(a) && !m.mem_paused(good));
    assert_eq!(m.rx_capacity(a), 0);
    m.handle_timeout(ms(1000));
    let f = failures(&events(&mut m));
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(f[0].0, a);
    assert!(matches!(f[0].1, PsockError::Rx(RxError::MemLimit { .. })), "{f:?}");
    assert_eq!(m.stats().mem_aborts, 1);
    assert!(m.memory_counted() <= 20_000, "the aborted psock's bytes below no longer count: {}", m.memory_counted());
    assert_eq!(m.memory_counted(), m.memory_used());
}
