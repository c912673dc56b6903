//! Helpers shared by the core's tests: the "L4" parser of the acceptance cases
//! (4-byte big-endian length at the message start, total = length + 4) and
//! message builders.
#![allow(dead_code)]

use connmux_core::parser::{Parse, ParseError, Parser};
use connmux_core::Bytes;

/// Parser L4: a 4-byte big-endian length at the message start; the message is
/// that length plus `adjust` bytes (4 for spec L4: the header is not counted).
pub struct L4 {
    pub adjust: usize,
    /// Refuse messages whose length field equals this value (to test Invalid).
    pub refuse: Option<u32>,
    /// Strip the 4-byte header in `finish` (to test that finish is applied).
    pub strip: bool,
    /// Use the first payload byte as steering key.
    pub keyed: bool,
    /// Allow framing in place (it is stateless).
    pub in_place: bool,
}

impl L4 {
    pub fn new() -> L4 {
        L4 { adjust: 4, refuse: None, strip: false, keyed: false, in_place: true }
    }
    pub fn boxed() -> Box<dyn Parser> {
        Box::new(L4::new())
    }
}

impl Parser for L4 {
    fn parse(&mut self, buf: &[u8]) -> Parse {
        if buf.len() < 4 {
            return Parse::NeedMore(4 - buf.len());
        }
        let v = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]);
        if Some(v) == self.refuse {
            return Parse::Invalid(ParseError::Program(22));
        }
        Parse::Length(v as usize + self.adjust)
    }
    fn finish(&mut self, msg: Bytes) -> Bytes {
        if self.strip {
            msg.slice(4..)
        } else {
            msg
        }
    }
    fn steering_key(&self, msg: &[u8]) -> Option<u64> {
        if self.keyed {
            msg.get(4).map(|&b| b as u64)
        } else {
            None
        }
    }
    fn frames_in_place(&self) -> bool {
        self.in_place
    }
    fn finish_in_place(&self, msg: &[u8]) -> Option<std::ops::Range<usize>> {
        Some(if self.strip { 4 } else { 0 }..msg.len())
    }
    fn name(&self) -> &str {
        "l4"
    }
}

/// One L4 message: header + payload.
pub fn l4(payload: &[u8]) -> Vec<u8> {
    let mut v = (payload.len() as u32).to_be_bytes().to_vec();
    v.extend_from_slice(payload);
    v
}

/// An L4 message that says who sent it and its sequence number: payload
/// `[from, seq (4 bytes BE), filler…]`, `len` bytes at least 5 (the
/// simulations' messages; [`id_of`] reads them back).
pub fn message(from: u8, seq: u32, len: usize) -> Vec<u8> {
    let mut payload = vec![from];
    payload.extend_from_slice(&seq.to_be_bytes());
    payload.resize(len.max(5), from ^ seq as u8);
    l4(&payload)
}

/// `(from, seq)` of a [`message`] (its L4 header included).
pub fn id_of(msg: &[u8]) -> (u8, u32) {
    (msg[4], u32::from_be_bytes([msg[5], msg[6], msg[7], msg[8]]))
}

/// An L4 message of `total` bytes (header included) whose payload is `tag`
/// repeated (tag identifies the message in tests).
pub fn l4_total(total: usize, tag: u8) -> Vec<u8> {
    assert!(total >= 4);
    l4(&vec![tag; total - 4])
}

/// Parse a byte stream of whole L4 messages into the messages (asserts it is
/// exactly whole messages: the receiving peer's check for atomicity).
pub fn split_l4(mut wire: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    while !wire.is_empty() {
        assert!(wire.len() >= 4, "truncated header on the wire");
        let n = u32::from_be_bytes([wire[0], wire[1], wire[2], wire[3]]) as usize + 4;
        assert!(wire.len() >= n, "truncated message on the wire");
        out.push(wire[..n].to_vec());
        wire = &wire[n..];
    }
    out
}

use connmux_core::mux::{Event, Mux, MuxConfig, PsockConfig, PsockId, SockId, SockType, Steering};

/// A mux with small, test-friendly limits and KCM's round-robin steering.
pub fn rr_config() -> MuxConfig {
    MuxConfig { steering: Steering::RoundRobin, ..MuxConfig::default() }
}

pub fn attach_l4(m: &mut Mux) -> PsockId {
    m.attach(L4::boxed(), PsockConfig::default())
}

/// Drain every pending event. Checks on the way that the sockets' side
/// holds what each psock reported ([`Mux::shares_exact`]).
#[track_caller]
pub fn events(m: &mut Mux) -> Vec<Event> {
    assert_shares(m);
    let mut v = Vec::new();
    for _ in 0..1_000_000 {
        match m.poll_event() {
            Some(e) => v.push(e),
            None => return v,
        }
    }
    panic!("event queue never drained");
}

/// Each psock's share holds what the psock has of its transmit side.
#[track_caller]
pub fn assert_shares(m: &Mux) {
    if let Err(e) = m.shares_exact() {
        panic!("share out of step with its psock: {e}");
    }
}

/// Write everything psock `p` has pending, as a driver with an always-ready
/// connection would; returns the bytes "on the wire".
pub fn flush(m: &mut Mux, p: PsockId) -> Vec<u8> {
    let mut wire = Vec::new();
    for _ in 0..1_000_000 {
        let Some(chunk) = m.tx_begin(p) else { return wire };
        for s in &chunk.slices {
            wire.extend_from_slice(s);
        }
        m.tx_complete(p, chunk.len());
        assert_shares(m);
    }
    panic!("psock never drained");
}

/// Every message queued on socket `s`, taken whole.
pub fn recv_all(m: &mut Mux, s: SockId) -> Vec<Vec<u8>> {
    let mut v = Vec::new();
    for _ in 0..1_000_000 {
        match m.recv_msg(s) {
            Ok((b, _)) => v.push(b.to_vec()),
            Err(_) => return v,
        }
    }
    panic!("socket never drained");
}

pub fn dgram_mux(cfg: MuxConfig) -> (Mux, SockId) {
    let mut m = Mux::new(cfg);
    let s = m.socket(SockType::Dgram);
    (m, s)
}

/// The memory budget counts allocations, not payload: `used` holds `bytes`
/// of payload in buffers no larger than twice it plus a page or two (a
/// buffer's growth, a lent buffer's alignment). Exact when `bytes` is 0.
#[track_caller]
pub fn assert_holds(used: usize, bytes: usize, what: &str) {
    assert!(
        used >= bytes && used <= 2 * bytes + (8 << 10) && (bytes > 0 || used == 0),
        "{what}: {used} counted for {bytes} bytes held"
    );
}
