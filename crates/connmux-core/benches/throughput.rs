//! Messages per second through the core on one thread: a large chunk of
//! 64-byte L4 messages is fed to one psock, steered to a KCM socket and taken
//! with `recv_msg`. Prints the median of several runs; not a test.
//!
//! Run: `cargo bench -p connmux-core --bench throughput`

use std::time::Instant;

use connmux_core::mux::{Mux, MuxConfig, PsockConfig, SockType, Steering};
use connmux_core::{Parse, Parser, Timestamp};

/// Parser L4: 4-byte big-endian length at the message start, plus 4.
struct L4;

impl Parser for L4 {
    #[inline]
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

const MSG: usize = 64;
const CHUNK_MSGS: usize = 4096; // 256 KiB per feed
const TOTAL_MSGS: usize = 20_000_000;
const RUNS: usize = 7;

fn one_run(steering: Steering) -> f64 {
    let mut m = Mux::new(MuxConfig { steering, psock_rx_buf: MSG * CHUNK_MSGS, ..MuxConfig::default() });
    let k = m.socket(SockType::Dgram);
    let p = m.attach(Box::new(L4), PsockConfig::default());
    let mut chunk = Vec::with_capacity(MSG * CHUNK_MSGS);
    for i in 0..CHUNK_MSGS {
        chunk.extend_from_slice(&((MSG - 4) as u32).to_be_bytes());
        chunk.extend(std::iter::repeat_n(i as u8, MSG - 4));
    }
    let rounds = TOTAL_MSGS / CHUNK_MSGS;
    let mut got = 0usize;
    let mut bytes = 0usize;
    let start = Instant::now();
    for r in 0..rounds {
        m.feed(p, &chunk, Timestamp::from_nanos(r as u64)).expect("feed");
        while let Ok((msg, _)) = m.recv_msg(k) {
            bytes += msg.len();
            got += 1;
        }
        while m.poll_event().is_some() {}
    }
    let secs = start.elapsed().as_secs_f64();
    assert_eq!(got, rounds * CHUNK_MSGS);
    assert_eq!(bytes, got * MSG);
    got as f64 / secs
}

fn main() {
    // `cargo bench` passes --bench; a filter argument is accepted and ignored.
    for (name, steering) in [("round-robin", Steering::RoundRobin), ("affinity (default)", Steering::Affinity)] {
        let mut rates: Vec<f64> = (0..RUNS).map(|_| one_run(steering)).collect();
        rates.sort_by(|a, b| a.partial_cmp(b).expect("finite"));
        let median = rates[RUNS / 2];
        println!(
            "connmux-core feed→steer→recv_msg, {MSG}-byte messages, {name}: median {:.1} M msg/s ({:.2} GB/s) over {RUNS} runs of {TOTAL_MSGS} (min {:.1}, max {:.1})",
            median / 1e6,
            median * MSG as f64 / 1e9,
            rates[0] / 1e6,
            rates[RUNS - 1] / 1e6
        );
    }
}
