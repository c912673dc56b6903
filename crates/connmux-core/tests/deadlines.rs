//! Assembly deadlines kept in order (not found by walking every psock): the
//! next deadline and the expiries must be exactly what a walk would give,
//! through partial messages that complete or abort, deadlines re-armed by the
//! next message, psocks unattached (and their slots reused), and closes.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use connmux_core::mux::{Event, Mux, MuxConfig, PsockConfig, PsockError, PsockId, RxError, SockType, Steering};
use connmux_core::Timestamp;
use rand::{Rng, SeedableRng};

fn ms(v: u64) -> Timestamp {
    Timestamp::from_nanos(v * 1_000_000)
}

fn config(timeout: Option<Duration>) -> MuxConfig {
    MuxConfig { steering: Steering::RoundRobin, assembly_timeout: timeout, ..MuxConfig::default() }
}

fn timeouts_fired(m: &mut Mux) -> Vec<PsockId> {
    let mut out = Vec::new();
    while let Some(e) = m.poll_event() {
        if let Event::PsockFailed(p, PsockError::Rx(RxError::Timeout)) = e {
            out.push(p);
        }
    }
    out
}

#[test]
fn deadline_clears_on_completion_and_rearms_from_the_next_first_byte() {
    let mut m = Mux::new(config(Some(Duration::from_millis(100))));
    let k = m.socket(SockType::Dgram);
    let p = m.attach(L4::boxed(), PsockConfig::default());
    let (a, b) = (l4_total(30, 1), l4_total(30, 2));
    m.feed(p, &a[..10], ms(0)).unwrap();
    assert_eq!(m.poll_timeout(), Some(ms(100)));
    // The message completes with the first bytes of the next one: the next
    // deadline counts from this read.
    m.feed(p, &[&a[10..], &b[..3]].concat(), ms(40)).unwrap();
    assert_eq!(m.poll_timeout(), Some(ms(140)));
    m.handle_timeout(ms(100)); // the first deadline is gone: nothing fires
    assert!(timeouts_fired(&mut m).is_empty());
    m.feed(p, &b[3..], ms(60)).unwrap();
    assert_eq!(m.poll_timeout(), None, "no message in progress, no deadline");
    assert_eq!(m.recv_msg(k).unwrap().0, a);
    assert_eq!(m.recv_msg(k).unwrap().0, b);
    m.handle_timeout(ms(1_000));
    assert!(timeouts_fired(&mut m).is_empty());
    m.feed(p, &a[..1], ms(2_000)).unwrap();
    assert_eq!(m.poll_timeout(), Some(ms(2_100)), "re-armed by the next message");
    m.handle_timeout(ms(2_100));
    assert_eq!(timeouts_fired(&mut m), vec![p]);
    assert_eq!(m.poll_timeout(), None);
}

#[test]
fn unattached_closed_and_aborted_psocks_leave_no_deadline_behind() {
    let mut m = Mux::new(config(Some(Duration::from_millis(100))));
    let _k = m.socket(SockType::Dgram);
    let p1 = m.attach(L4::boxed(), PsockConfig::default());
    let p2 = m.attach(L4::boxed(), PsockConfig::default());
    let p3 = m.attach(L4::boxed(), PsockConfig::default());
    let refusing = L4 { refuse: Some(99), ..L4::new() };
    let p4 = m.attach(Box::new(refusing), PsockConfig::default());
    m.feed(p1, &l4_total(30, 1)[..5], ms(10)).unwrap();
    m.feed(p2, &l4_total(30, 2)[..5], ms(20)).unwrap();
    m.feed(p3, &l4_total(30, 3)[..5], ms(30)).unwrap();
    m.feed(p4, &[0, 0], ms(5)).unwrap();
    assert_eq!(m.poll_timeout(), Some(ms(105)));
    m.feed(p4, &[0, 99], ms(6)).unwrap(); // the parser refuses: aborted, deadline gone
    assert_eq!(m.poll_timeout(), Some(ms(110)));
    m.unattach(p1).unwrap();
    assert_eq!(m.poll_timeout(), Some(ms(120)));
    // A new psock in p1's slot, with its own (later) deadline.
    let p5 = m.attach(
        L4::boxed(),
        PsockConfig { assembly_timeout: Some(Some(Duration::from_millis(500))), ..Default::default() },
    );
    assert_eq!(p5.index, p1.index);
    m.feed(p5, &l4_total(30, 5)[..5], ms(40)).unwrap();
    m.rx_closed(p2, None).unwrap(); // the peer closed: the partial message is dropped
    assert_eq!(m.poll_timeout(), Some(ms(130)));
    m.handle_timeout(ms(200));
    assert_eq!(timeouts_fired(&mut m), vec![p3], "not p1 (gone), p2 (closed) or p4 (aborted)");
    assert_eq!(m.poll_timeout(), Some(ms(540)));
    m.handle_timeout(ms(540));
    assert_eq!(timeouts_fired(&mut m), vec![p5]);
    assert_eq!(m.poll_timeout(), None);
    assert_eq!(m.deadline_entries(), 0);
}

#[test]
fn arming_and_clearing_many_times_keeps_the_heap_bounded() {
    let mut m = Mux::new(config(Some(Duration::from_millis(100))));
    let k = m.socket(SockType::Dgram);
    let ps: Vec<PsockId> = (0..10).map(|_| m.attach(L4::boxed(), PsockConfig::default())).collect();
    let msg = l4_total(20, 7);
    // p0 keeps a partial message (its deadline stays the top) while the others
    // arm and clear 10,000 times each under it, all at the same instant.
    m.feed(ps[0], &msg[..3], ms(0)).unwrap();
    for _ in 0..10_000 {
        for &p in &ps[1..] {
            m.feed(p, &msg[..7], ms(1)).unwrap();
            m.feed(p, &msg[7..], ms(1)).unwrap();
        }
        while m.recv_msg(k).is_ok() {}
        assert!(m.deadline_entries() <= 2 + 64, "{} entries for 1 armed deadline", m.deadline_entries());
    }
    assert_eq!(m.poll_timeout(), Some(ms(100)));
    m.handle_timeout(ms(100));
    assert_eq!(timeouts_fired(&mut m), vec![ps[0]]);
}

/// What a psock's deadline should be, tracked from the bytes fed.
struct Model {
    id: PsockId,
    /// The whole byte stream this psock will be fed (L4 messages back to back).
    stream: Vec<u8>,
    /// Message end offsets in `stream`.
    ends: Vec<usize>,
    fed: usize,
    /// Index of the message in progress.
    cur: usize,
    started: Option<Timestamp>,
    timeout: Option<Duration>,
    /// Receive still running (not timed out, closed or aborted).
    live: bool,
}

impl Model {
    fn deadline(&self) -> Option<Timestamp> {
        match (self.live, self.started, self.timeout) {
            (true, Some(t), Some(d)) => Some(t.add(d)),
            _ => None,
        }
    }
    fn feed(&mut self, n: usize, now: Timestamp) {
        if !self.live {
            return;
        }
        self.fed += n;
        if self.started.is_none() && n > 0 {
            self.started = Some(now);
        }
        while self.cur < self.ends.len() && self.fed >= self.ends[self.cur] {
            self.cur += 1;
            let cur_start = self.ends[self.cur - 1];
            self.started = (self.fed > cur_start).then_some(now);
        }
    }
}

/// Random traffic on up to 64 psocks with different timeouts; after every step
/// `poll_timeout` is the model's earliest deadline and `handle_timeout` fires
/// exactly the psocks whose deadline has passed.
#[test]
fn next_deadline_and_expiries_match_a_walk_of_every_psock() {
    for seed in 0..20u64 {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut m = Mux::new(config(Some(Duration::from_millis(100))));
        let k = m.socket(SockType::Dgram);
        let mut models: BTreeMap<PsockId, Model> = BTreeMap::new();
        let mut now = 0u64; // microseconds
        let mut fired_total = 0;
        for step in 0..3_000 {
            let t = Timestamp::from_nanos(now * 1_000);
            match rng.gen_range(0..100) {
                0..=7 if models.len() < 64 => {
                    let timeout = match rng.gen_range(0..5) {
                        0 => Some(None),
                        1 => None, // the mux default, 100 ms
                        2 => Some(Some(Duration::from_micros(rng.gen_range(1..5_000)))),
                        _ => Some(Some(Duration::from_millis(rng.gen_range(1..300)))),
                    };
                    let p = m.attach(L4::boxed(), PsockConfig { assembly_timeout: timeout, ..Default::default() });
                    let mut stream = Vec::new();
                    let mut ends = Vec::new();
                    for i in 0..rng.gen_range(1..20) {
                        stream.extend_from_slice(&l4_total(rng.gen_range(4..60), i as u8));
                        ends.push(stream.len());
                    }
                    let timeout = timeout.unwrap_or(Some(Duration::from_millis(100)));
                    let model = Model { id: p, stream, ends, fed: 0, cur: 0, started: None, timeout, live: true };
                    assert!(models.insert(p, model).is_none(), "a live id handed out twice");
                }
                8..=11 if !models.is_empty() => {
                    let p = *models.keys().nth(rng.gen_range(0..models.len())).unwrap();
                    m.unattach(p).unwrap();
                    models.remove(&p);
                }
                12..=13 if !models.is_empty() => {
                    let p = *models.keys().nth(rng.gen_range(0..models.len())).unwrap();
                    m.rx_closed(p, None).unwrap();
                    let md = models.get_mut(&p).unwrap();
                    md.live = false;
                    md.started = None;
                }
                14..=30 => {
                    now += rng.gen_range(0..20_000);
                    let t = Timestamp::from_nanos(now * 1_000);
                    m.handle_timeout(t);
                    let mut fired = timeouts_fired(&mut m);
                    fired.sort();
                    let mut want: Vec<PsockId> =
                        models.values().filter(|md| md.deadline().is_some_and(|d| d <= t)).map(|md| md.id).collect();
                    want.sort();
                    assert_eq!(fired, want, "seed {seed} step {step}: expiries at {t:?}");
                    fired_total += fired.len();
                    for p in fired {
                        let md = models.get_mut(&p).unwrap();
                        md.live = false;
                        md.started = None;
                    }
                }
                _ if !models.is_empty() => {
                    let p = *models.keys().nth(rng.gen_range(0..models.len())).unwrap();
                    let md = models.get_mut(&p).unwrap();
                    let left = md.stream.len() - md.fed;
                    if left > 0 {
                        let n = rng.gen_range(1..=left.min(80));
                        m.feed(p, &md.stream[md.fed..md.fed + n], t).unwrap();
                        md.feed(n, t);
                    }
                    now += rng.gen_range(0..3_000);
                }
                _ => {}
            }
            while m.recv_msg(k).is_ok() {}
            while m.poll_event().is_some() {}
            let want = models.values().filter_map(Model::deadline).min();
            assert_eq!(m.poll_timeout(), want, "seed {seed} step {step}: next deadline");
            let armed = models.values().filter(|md| md.deadline().is_some()).count();
            assert!(
                m.deadline_entries() <= 2 * armed + 64,
                "seed {seed} step {step}: {} entries, {armed} armed",
                m.deadline_entries()
            );
        }
        assert!(fired_total > 0, "seed {seed}: no deadline ever expired");
    }
}
