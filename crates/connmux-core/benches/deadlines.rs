//! Cost of the assembly-deadline bookkeeping with many psocks: what a worker
//! pays per pass for `poll_timeout` (asked twice per pass) and `handle_timeout`,
//! and what arming and clearing a deadline adds to a message that arrives in
//! two reads. Prints medians of several runs; not a test.
//!
//! Run: `cargo bench -p connmux-core --bench deadlines`

use std::hint::black_box;
use std::time::{Duration, Instant};

use connmux_core::mux::{Mux, MuxConfig, PsockConfig, PsockId, SockId, SockType};
use connmux_core::{Parse, Parser, Timestamp};

/// Parser L4: 4-byte big-endian length at the message start, plus 4.
struct L4;

impl Parser for L4 {
    fn parse(&mut self, buf: &[u8]) -> Parse {
        match buf.get(..4) {
            Some(h) => Parse::Length(u32::from_be_bytes([h[0], h[1], h[2], h[3]]) as usize + 4),
            None => Parse::NeedMore(4 - buf.len()),
        }
    }
    fn name(&self) -> &str {
        "l4"
    }
}

const RUNS: usize = 7;
const TIMEOUT: Duration = Duration::from_millis(300);

/// A mux with one KCM socket and `psocks` psocks, `partial` of them holding a
/// partial message (a deadline runs for each).
fn mux_with(psocks: usize, partial: usize) -> (Mux, SockId, Vec<PsockId>) {
    let mut m = Mux::new(MuxConfig { assembly_timeout: Some(TIMEOUT), ..MuxConfig::default() });
    let k = m.socket(SockType::Dgram);
    let ids: Vec<PsockId> = (0..psocks).map(|_| m.attach(Box::new(L4), PsockConfig::default())).collect();
    // `partial` psocks hold the first 6 bytes of a 20-byte message: a deadline runs.
    for (i, &p) in ids.iter().take(partial).enumerate() {
        let msg = msg20(i as u8);
        m.feed(p, &msg[..6], Timestamp::from_nanos(1_000 + i as u64)).unwrap();
    }
    while m.poll_event().is_some() {}
    (m, k, ids)
}

fn msg20(b: u8) -> Vec<u8> {
    let mut v = 16u32.to_be_bytes().to_vec();
    v.extend_from_slice(&[b; 16]);
    v
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// Nanoseconds per `poll_timeout` call.
fn poll_timeout_ns(psocks: usize, partial: usize) -> f64 {
    let (m, _, _) = mux_with(psocks, partial);
    let iters = (20_000_000 / psocks.max(1)).clamp(1_000, 2_000_000);
    let start = Instant::now();
    for _ in 0..iters {
        black_box(m.poll_timeout());
    }
    start.elapsed().as_nanos() as f64 / iters as f64
}

/// Nanoseconds per worker pass with nothing due: poll_timeout, one whole
/// message on one of 64 busy psocks, poll_timeout and handle_timeout(now),
/// as the workers do.
fn pass_ns(psocks: usize, partial: usize) -> f64 {
    let (mut m, k, ids) = mux_with(psocks, partial);
    let busy = (psocks - partial).min(64);
    let iters = (20_000_000 / psocks.max(1)).clamp(2_000, 1_000_000);
    let msg = msg20(9);
    let now = Timestamp::from_nanos(2_000);
    // Warm up the busy psocks (their first read allocates their buffer).
    for &p in &ids[partial..partial + busy] {
        m.feed(p, &msg, now).unwrap();
    }
    while m.poll_event().is_some() {}
    while m.recv_msg(k).is_ok() {}
    let start = Instant::now();
    for i in 0..iters {
        black_box(m.poll_timeout());
        let p = ids[partial + i % busy];
        m.feed(p, &msg, now).unwrap();
        if let Some(t) = m.poll_timeout() {
            if t <= now {
                m.handle_timeout(now);
            }
        }
        while m.poll_event().is_some() {}
        while m.recv_msg(k).is_ok() {}
    }
    start.elapsed().as_nanos() as f64 / iters as f64
}

/// Nanoseconds per message that arrives in two reads (arms a deadline, then
/// clears it), spread over all psocks.
fn split_msg_ns(psocks: usize) -> f64 {
    let (mut m, k, ids) = mux_with(psocks, 0);
    let iters = 1_000_000;
    let msg = msg20(3);
    let start = Instant::now();
    for i in 0..iters {
        let p = ids[i % psocks];
        let t = Timestamp::from_nanos(10_000 + i as u64);
        m.feed(p, &msg[..6], t).unwrap();
        m.feed(p, &msg[6..], t).unwrap();
        while m.poll_event().is_some() {}
        while m.recv_msg(k).is_ok() {}
    }
    start.elapsed().as_nanos() as f64 / iters as f64
}

/// Nanoseconds to expire `partial` deadlines among `psocks` in one handle_timeout.
fn expire_ns(psocks: usize, partial: usize) -> f64 {
    let (mut m, _, _) = mux_with(psocks, partial);
    let due = Timestamp::from_nanos(1_000_000_000);
    let start = Instant::now();
    m.handle_timeout(due);
    let ns = start.elapsed().as_nanos() as f64;
    let mut failed = 0;
    while let Some(e) = m.poll_event() {
        failed += usize::from(matches!(e, connmux_core::mux::Event::PsockFailed(..)));
    }
    assert_eq!(failed, partial);
    assert_eq!(m.poll_timeout(), None);
    ns
}

fn main() {
    println!("assembly deadlines, median of {RUNS} runs (ns)");
    println!("{:>8} {:>8} {:>14} {:>14} {:>16}", "psocks", "armed", "poll_timeout", "worker pass", "expire all armed");
    for (psocks, partial) in [(100, 0), (10_000, 0), (10_000, 100), (10_000, 10_000)] {
        let pt = median((0..RUNS).map(|_| poll_timeout_ns(psocks, partial)).collect());
        let pass =
            if partial < psocks { median((0..RUNS).map(|_| pass_ns(psocks, partial)).collect()) } else { f64::NAN };
        let exp = median((0..RUNS).map(|_| expire_ns(psocks, partial)).collect());
        println!("{psocks:>8} {partial:>8} {pt:>14.1} {pass:>14.1} {exp:>16.0}");
    }
    for psocks in [1, 10_000] {
        let ns = median((0..RUNS).map(|_| split_msg_ns(psocks)).collect());
        println!("message in two reads (arm + clear a deadline), {psocks} psocks: {ns:.1} ns/message");
    }
}
