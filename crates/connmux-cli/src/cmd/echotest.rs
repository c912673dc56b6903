//! `connmux echotest`: load generator for an echo server (ksf's echotest).
//!
//! Each of `-j` connections keeps `-a` messages of `--size` bytes in flight and
//! checks that every byte comes back, in order. Two modes:
//!
//! - `--mode msg` (default): each message is framed "l4", a 4-byte big-endian
//!   length (not counting the header itself) and then the payload: what
//!   `connmux echo-server` splits messages on by default. The server echoes
//!   each message whole, header included.
//! - `--mode bytes`: messages are raw payload with no header, for a plain byte
//!   echo (ksf's kecho): the bytes may come back in any pieces.
//!
//! In both modes the echo must equal what was sent. Each payload is a window
//! of a fixed pseudo-random pattern that starts at an offset taken from the
//! message's sequence number, so a message echoed twice, dropped, reordered
//! or altered is caught. A message's RTT runs from the send of its batch to
//! the read that brought its last byte. Unlike ksf's echotest, the echoed
//! bytes are verified, and both directions' bytes count towards `Mbps`.
//!
//! With `-u` (ksf's UDP) each message is one datagram, echoed whole by
//! `connmux echo-server` (which answers on UDP on its TCP port): the l4
//! header in msg mode, then the message's 4-byte tag and a window of the
//! pattern chosen by the tag (so `--size` is at least 4 there), checked
//! byte for byte; replies may come in any order, and a message unanswered
//! for `--udp-retry` is counted lost.
//!
//! Output columns: see [`super::loadgen`]; the rate column is `msgs/s` and the
//! summary key `msg_per_s`.

use std::collections::VecDeque;
use std::sync::Arc;

use rand::rngs::SmallRng;
use rand::{RngCore, SeedableRng};
use serde::Serialize;

use super::loadgen::{self, target::parse_count, CommonArgs, Target, Units};

/// The default echo port (ksf's kecho).
pub const DEFAULT_PORT: u16 = 60007;
/// Largest `--size`.
pub const MAX_SIZE: u64 = 16 * 1024 * 1024;
/// Largest `-a` × message size per connection (the client's send buffer).
pub const MAX_INFLIGHT_BYTES: u64 = 256 * 1024 * 1024;

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// 4-byte big-endian length header + payload ("l4"); the echo comes back whole.
    Msg,
    /// Raw payload, byte echo.
    Bytes,
}

#[derive(clap::Args, Debug)]
#[command(after_help = loadgen::after_help(UNITS.rate_col))]
pub struct Args {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Payload bytes per message (msg mode adds a 4-byte header).
    #[arg(short = 'l', long = "size", default_value = "64", value_parser = parse_count)]
    pub size: u64,
    /// Framing: msg (l4 length header, message echo) or bytes (byte echo).
    #[arg(long, value_enum, default_value = "msg")]
    pub mode: Mode,
    /// Echo server, [user@]host[:port] (default port 60007); names are resolved.
    #[arg(default_value = "127.0.0.1")]
    pub target: String,
}

/// The settings of its own in the `--json` config.
#[derive(Serialize)]
struct Config {
    size: u64,
    mode: Mode,
}

const UNITS: Units = Units { tool: "echotest", rate_col: "msgs/s", rate_key: "msg_per_s" };

/// Number of distinct payload start offsets in the pattern.
const SHIFTS: usize = 251;

struct Echo {
    size: usize,
    header: bool,
    pattern: Arc<Vec<u8>>,
}

impl loadgen::Workload for Echo {
    type Client = EchoClient;
    fn client(&self, conn: usize) -> EchoClient {
        EchoClient {
            size: self.size,
            header: self.header,
            pattern: self.pattern.clone(),
            // Different connections start at different points of the pattern.
            seq: conn as u64 * 7,
            fifo: VecDeque::new(),
            pos: 0,
        }
    }
}

/// One connection's view: what was sent, in order, and how far its echo got.
pub struct EchoClient {
    size: usize,
    header: bool,
    pattern: Arc<Vec<u8>>,
    seq: u64,
    /// (tag, sequence number) of every message sent and not yet fully echoed.
    fifo: VecDeque<(u32, u64)>,
    /// Bytes of the oldest message already echoed.
    pos: usize,
}

impl EchoClient {
    fn hdr_len(&self) -> usize {
        if self.header {
            4
        } else {
            0
        }
    }

    fn payload(&self, seq: u64) -> &[u8] {
        let start = (seq % SHIFTS as u64) as usize;
        &self.pattern[start..start + self.size]
    }
}

fn pattern(size: usize) -> Vec<u8> {
    // Seeded random bytes: the same every run, and no window of them repeats
    // at a small shift, so a shifted echo is caught.
    let mut p = vec![0u8; size + SHIFTS];
    SmallRng::seed_from_u64(0x9e37_79b9).fill_bytes(&mut p);
    p
}

impl loadgen::Client for EchoClient {
    fn encode(&mut self, tag: u32, out: &mut Vec<u8>) {
        if self.header {
            out.extend_from_slice(&(self.size as u32).to_be_bytes());
        }
        out.extend_from_slice(self.payload(self.seq));
        self.fifo.push_back((tag, self.seq));
        self.seq += 1;
    }

    fn decode(&mut self, mut input: &[u8], done: &mut Vec<u32>) -> Result<(), String> {
        let hdr = (self.size as u32).to_be_bytes();
        let total = self.hdr_len() + self.size;
        while !input.is_empty() {
            let Some(&(tag, seq)) = self.fifo.front() else {
                return Err(format!("{} bytes arrived while no message was in flight", input.len()));
            };
            let take = (total - self.pos).min(input.len());
            let (chunk, rest) = input.split_at(take);
            // The expected bytes for this chunk: the part of the header it
            // covers, then the part of the payload.
            let hl = self.hdr_len();
            let in_hdr = hl.saturating_sub(self.pos).min(take);
            let p_from = (self.pos + in_hdr).max(hl) - hl;
            let want_hdr = &hdr[self.pos.min(hl)..self.pos.min(hl) + in_hdr];
            let want_payload = &self.payload(seq)[p_from..p_from + take - in_hdr];
            if chunk[..in_hdr] != *want_hdr || chunk[in_hdr..] != *want_payload {
                let k = chunk
                    .iter()
                    .zip(want_hdr.iter().chain(want_payload))
                    .position(|(a, b)| a != b)
                    .expect("a differing byte");
                let want = want_hdr.iter().chain(want_payload).nth(k).expect("in range");
                return Err(format!(
                    "echo of message {seq} differs at byte {} of {total}: got {:#04x}, expected {want:#04x}",
                    self.pos + k,
                    chunk[k]
                ));
            }
            self.pos += take;
            input = rest;
            if self.pos == total {
                self.fifo.pop_front();
                self.pos = 0;
                done.push(tag);
            }
        }
        Ok(())
    }
}

/// One echo datagram: [l4 header][tag][pattern window chosen by the tag].
struct EchoDgram {
    size: usize,
    header: bool,
    pattern: Arc<Vec<u8>>,
}

impl EchoDgram {
    fn window(&self, tag: u32) -> &[u8] {
        let start = (tag as usize) % SHIFTS;
        &self.pattern[start..start + self.size - 4]
    }
}

impl loadgen::udp::DgramWorkload for Echo {
    type Client = EchoDgram;
    fn client(&self, _conn: usize) -> EchoDgram {
        EchoDgram { size: self.size, header: self.header, pattern: self.pattern.clone() }
    }
}

impl loadgen::udp::Dgram for EchoDgram {
    fn encode(&mut self, tag: u32, out: &mut Vec<u8>) {
        if self.header {
            out.extend_from_slice(&(self.size as u32).to_be_bytes());
        }
        out.extend_from_slice(&tag.to_be_bytes());
        out.extend_from_slice(self.window(tag));
    }

    fn decode(&mut self, d: &[u8]) -> Result<u32, String> {
        let hl = if self.header { 4 } else { 0 };
        if d.len() != hl + self.size {
            return Err(format!("an echo of {} bytes, not {}", d.len(), hl + self.size));
        }
        if self.header && d[..4] != (self.size as u32).to_be_bytes() {
            return Err(format!("echo header {:02x?} altered", &d[..4]));
        }
        let tag = u32::from_be_bytes(d[hl..hl + 4].try_into().expect("4 bytes"));
        if d[hl + 4..] != *self.window(tag) {
            return Err(format!("echo of tag {tag:#010x} differs from what was sent"));
        }
        Ok(tag)
    }
}

pub fn run(a: Args) -> anyhow::Result<i32> {
    if !(1..=MAX_SIZE).contains(&a.size) {
        anyhow::bail!("--size must be 1..{MAX_SIZE}, got {}", a.size);
    }
    // The send buffer holds up to -a messages: bound it.
    let per_conn = a.common.inflight.max(1).saturating_mul(a.size + 4);
    if per_conn > MAX_INFLIGHT_BYTES {
        anyhow::bail!(
            "-a {} x --size {} is {per_conn} bytes in flight per connection; at most {MAX_INFLIGHT_BYTES}",
            a.common.inflight,
            a.size
        );
    }
    if a.common.udp && !(4..=(loadgen::udp::MAX_REPLY as u64 - 8)).contains(&a.size) {
        anyhow::bail!(
            "-u: --size must be 4..{} (a message is one datagram, its tag first)",
            loadgen::udp::MAX_REPLY - 8
        );
    }
    let target = Target::resolve(&a.target, DEFAULT_PORT)?;
    let size = a.size as usize;
    let w = Echo { size, header: a.mode == Mode::Msg, pattern: Arc::new(pattern(size)) };
    let config = Config { size: a.size, mode: a.mode };
    if a.common.udp {
        return loadgen::run_load_udp(&a.common, UNITS, &target, &w, config);
    }
    loadgen::run_load(&a.common, UNITS, &target, &w, config)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd::loadgen::Client;

    fn client(size: usize, header: bool) -> EchoClient {
        Echo { size, header, pattern: Arc::new(pattern(size)) }.client_for_test()
    }

    impl Echo {
        fn client_for_test(&self) -> EchoClient {
            loadgen::Workload::client(self, 0)
        }
    }

    #[test]
    fn echo_in_pieces_completes_in_order() {
        let mut c = client(10, true);
        let mut wire = Vec::new();
        c.encode(5, &mut wire);
        c.encode(6, &mut wire);
        assert_eq!(wire.len(), 28);
        assert_eq!(&wire[..4], &[0, 0, 0, 10]);
        assert_ne!(&wire[4..14], &wire[18..28], "consecutive payloads differ");
        let mut done = Vec::new();
        for b in wire.chunks(3) {
            c.decode(b, &mut done).unwrap();
        }
        assert_eq!(done, vec![5, 6]);
    }

    #[test]
    fn detects_altered_swapped_and_extra_bytes() {
        let mut c = client(8, false);
        let mut wire = Vec::new();
        c.encode(1, &mut wire);
        c.encode(2, &mut wire);
        let mut bad = wire.clone();
        bad[11] ^= 1;
        let mut done = Vec::new();
        let e = c.decode(&bad, &mut done).unwrap_err();
        assert!(e.contains("message 1 differs at byte 3"), "{e}");

        let mut c = client(8, false);
        let mut wire = Vec::new();
        c.encode(1, &mut wire);
        c.encode(2, &mut wire);
        let swapped = [&wire[8..], &wire[..8]].concat();
        assert!(c.decode(&swapped, &mut Vec::new()).is_err());

        let mut c = client(8, false);
        let mut wire = Vec::new();
        c.encode(1, &mut wire);
        wire.push(0);
        let mut done = Vec::new();
        let e = c.decode(&wire, &mut done).unwrap_err();
        assert!(e.contains("no message was in flight"), "{e}");
        assert_eq!(done, vec![1]);
    }

    #[test]
    fn an_echo_datagram_carries_its_tag_and_is_checked_whole() {
        use crate::cmd::loadgen::udp::{Dgram, DgramWorkload};
        let w = Echo { size: 16, header: true, pattern: Arc::new(pattern(16)) };
        let mut c = DgramWorkload::client(&w, 0);
        let mut d = Vec::new();
        c.encode(0x0102_0304, &mut d);
        assert_eq!(d.len(), 20);
        assert_eq!(&d[..8], &[0, 0, 0, 16, 1, 2, 3, 4]);
        assert_eq!(c.decode(&d), Ok(0x0102_0304));
        let mut bad = d.clone();
        bad[19] ^= 1;
        assert!(c.decode(&bad).unwrap_err().contains("differs"));
        assert!(c.decode(&d[..19]).is_err());
    }
}
