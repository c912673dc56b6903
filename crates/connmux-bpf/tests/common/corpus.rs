//! Inputs for comparing a parser program with the kernel: random bytes, short
//! headers, length fields at interesting values and at the exact boundaries of
//! the bytes available, and, per protocol, well-formed messages cut at every
//! length and damaged at every header byte.

use super::Rng;

/// The kernel takes a little under a page of data; stay well inside it.
pub const MAX_INPUT: usize = 2048;

/// 32-bit values where length arithmetic changes behaviour.
pub const INTERESTING: &[u32] = &[
    0,
    1,
    2,
    3,
    4,
    5,
    6,
    7,
    8,
    9,
    10,
    23,
    24,
    25,
    0x7f,
    0x80,
    0xff,
    0x100,
    0x7fff,
    0x8000,
    0xffff,
    0x1_0000,
    0x4000,
    0xff_ffff,
    0x100_0000,
    0x100_0001,
    0x3fff_fff8,
    0x3fff_fffb,
    0x3fff_fffc,
    0x3fff_fffd,
    0x4000_0000,
    0x4000_0001,
    0x7fff_0000,
    0x7fff_0001,
    0x7fff_ffef,
    0x7fff_fff0,
    0x7fff_fff1,
    0x7fff_fffb,
    0x7fff_fffc,
    0x7fff_ffff,
    0x8000_0000,
    0x8000_0001,
    0x8000_0004,
    0x8000_0008,
    0xbfff_ffff,
    0xc000_0000,
    0xfa00_0000,
    0xffff_fff0,
    0xffff_fffb,
    0xffff_fffc,
    0xffff_ffff,
    16_384_000,
    16_384_001,
    16_383_996,
    0x50_5249,
];

fn put(buf: &mut Vec<u8>, at: usize, bytes: &[u8]) {
    if buf.len() < at + bytes.len() {
        buf.resize(at + bytes.len(), 0);
    }
    buf[at..at + bytes.len()].copy_from_slice(bytes);
}

/// A length field's encodings that the programs in `bpf/` use.
fn encodings(v: u64) -> Vec<Vec<u8>> {
    vec![
        (v as u32).to_be_bytes().to_vec(),
        (v as u32).to_le_bytes().to_vec(),
        (v as u16).to_be_bytes().to_vec(),
        (v as u16).to_le_bytes().to_vec(),
        (v as u32).to_be_bytes()[1..].to_vec(),
        v.to_be_bytes().to_vec(),
    ]
}

/// Protocol-independent inputs, `n` of them.
pub fn generic(rng: &mut Rng, n: usize) -> Vec<Vec<u8>> {
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        match rng.below(4) {
            // Random bytes; mostly short headers.
            0 => {
                let len = match rng.below(10) {
                    0..=3 => rng.below(17),
                    4..=7 => rng.range(17, 257),
                    _ => rng.range(257, MAX_INPUT as u64 + 1),
                } as usize;
                out.push(rng.bytes(len));
            }
            // Interesting values in the first fields.
            1 => {
                let len = if rng.chance(70) { rng.below(40) } else { rng.below(MAX_INPUT as u64 + 1) } as usize;
                let mut b = rng.bytes(len.max(16));
                for i in 0..4 {
                    let v = rng.pick(INTERESTING);
                    let e = if rng.chance(50) { v.to_be_bytes() } else { v.to_le_bytes() };
                    put(&mut b, 4 * i, &e);
                }
                b.truncate(len);
                out.push(b);
            }
            // A length field that matches the bytes available, give or take.
            2 => {
                let len = rng.below(600) as usize;
                let mut b = rng.bytes(len);
                let delta = rng.range(0, 21) as i64 - 10;
                let hdr = rng.pick(&[0i64, 2, 4, 6, 8, 9]);
                let v = (len as i64 - hdr + delta).max(0) as u64;
                let encs = encodings(v);
                let e = &encs[rng.below(encs.len() as u64) as usize];
                let at = rng.pick(&[0usize, 0, 0, 2, 4]);
                if len >= at + e.len() {
                    put(&mut b, at, e);
                }
                out.push(b);
            }
            // Byte patterns: all zero, all ones, one byte set.
            _ => {
                let len = rng.below(64) as usize;
                let fill = rng.pick(&[0u8, 0xff, 0x80, 0x7f]);
                let mut b = vec![fill; len];
                if len > 0 {
                    let i = rng.below(len as u64) as usize;
                    b[i] = rng.u64() as u8;
                }
                out.push(b);
            }
        }
    }
    out
}

/// Every prefix of `msg` (with its trailing bytes), capped, plus the whole with
/// some bytes of a next message after it.
fn cuts(out: &mut Vec<Vec<u8>>, rng: &mut Rng, msg: &[u8], max_cuts: usize) {
    let n = msg.len().min(MAX_INPUT);
    if n <= max_cuts {
        for i in 0..=n {
            out.push(msg[..i].to_vec());
        }
    } else {
        for _ in 0..max_cuts {
            let i = rng.below(n as u64 + 1) as usize;
            out.push(msg[..i].to_vec());
        }
        out.push(msg[..n].to_vec());
    }
    if msg.len() + 16 <= MAX_INPUT {
        let mut m = msg.to_vec();
        let extra = rng.below(16) as usize + 1;
        m.extend(rng.bytes(extra));
        out.push(m);
    }
}

/// A body length: small (whole message fits), or any interesting value.
fn body_len(rng: &mut Rng) -> u32 {
    if rng.chance(60) {
        rng.below(64) as u32
    } else if rng.chance(50) {
        rng.pick(INTERESTING)
    } else {
        rng.u32()
    }
}

fn body(rng: &mut Rng, len: u32) -> Vec<u8> {
    rng.bytes((len as usize).min(MAX_INPUT))
}

/// Inputs shaped for the program from `bpf/<source>.c`.
pub fn specific(source: &str, rng: &mut Rng, n: usize) -> Vec<Vec<u8>> {
    let mut out = Vec::with_capacity(n + 64);
    while out.len() < n {
        match source {
            "len_prefix" => {
                let l = body_len(rng);
                let mut m = l.to_be_bytes().to_vec();
                m.extend(body(rng, l));
                cuts(&mut out, rng, &m, 12);
            }
            "thrift" => {
                let l = body_len(rng);
                let mut m = l.to_be_bytes().to_vec();
                let proto: &[u8] = rng.pick(&[
                    &[0x80u8, 0x01][..],
                    &[0x80, 0x02],
                    &[0x82, 0x21],
                    &[0x81, 0x01],
                    &[0x00, 0x00],
                    &[0x82],
                ]);
                m.extend_from_slice(proto);
                m.extend(body(rng, l.saturating_sub(2)));
                cuts(&mut out, rng, &m, 12);
            }
            "oncrpc" => {
                let frags = rng.range(1, 19) as usize;
                let mut m = Vec::new();
                for f in 0..frags {
                    let last = f + 1 == frags && rng.chance(90);
                    let len = if rng.chance(85) { rng.below(40) as u32 } else { rng.pick(INTERESTING) & 0x7fff_ffff };
                    let h = len | if last { 0x8000_0000 } else { 0 };
                    m.extend_from_slice(&h.to_be_bytes());
                    if m.len() < MAX_INPUT {
                        m.extend(body(rng, len.min(64)));
                    }
                }
                cuts(&mut out, rng, &m, 24);
            }
            "ninep" => {
                let size = if rng.chance(60) { rng.below(80) as u32 } else { rng.pick(INTERESTING) };
                let ty = if rng.chance(70) {
                    rng.pick(&[6u8, 7, 8, 76, 77, 78, 99, 100, 101, 126, 127, 128, 5, 0, 255])
                } else {
                    rng.u64() as u8
                };
                let mut m = size.to_le_bytes().to_vec();
                m.push(ty);
                m.extend(body(rng, size.saturating_sub(5)));
                cuts(&mut out, rng, &m, 12);
            }
            "http2" => {
                const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
                match rng.below(3) {
                    0 => {
                        let mut m = PREFACE.to_vec();
                        let extra = rng.below(20) as usize;
                        m.extend(rng.bytes(extra));
                        cuts(&mut out, rng, &m, 48);
                    }
                    1 => {
                        // The preface with one byte damaged (after "PRI ").
                        let mut m = PREFACE.to_vec();
                        let i = rng.range(4, 24) as usize;
                        m[i] ^= 1 << rng.below(8);
                        out.push(m.clone());
                        out.push(m[..rng.range(20, 25) as usize].to_vec());
                    }
                    _ => {
                        let l = if rng.chance(70) { rng.below(100) as u32 } else { rng.u32() & 0xff_ffff };
                        let mut m = l.to_be_bytes()[1..].to_vec();
                        m.push(rng.below(10) as u8);
                        m.extend(rng.bytes(5));
                        m.extend(body(rng, l));
                        cuts(&mut out, rng, &m, 12);
                    }
                }
            }
            "len_variants" => {
                let mut m = Vec::new();
                match rng.below(3) {
                    0 => m.extend_from_slice(&(body_len(rng) as u16).to_le_bytes()),
                    1 => {
                        let magic: u16 = if rng.chance(80) { 0xcafe } else { rng.u64() as u16 };
                        m.extend_from_slice(&magic.to_be_bytes());
                        m.extend_from_slice(&body_len(rng).to_le_bytes());
                    }
                    _ => {
                        let v: u64 = if rng.chance(50) {
                            body_len(rng) as u64
                        } else {
                            rng.pick(&[
                                0x7fff_0000u64,
                                0x7fff_0001,
                                1 << 32,
                                (1 << 32) + 5,
                                u64::MAX,
                                0x1_0000_0000_0000,
                            ])
                        };
                        m.extend_from_slice(&v.to_be_bytes());
                    }
                }
                let n = rng.below(70) as usize;
                m.extend(rng.bytes(n));
                cuts(&mut out, rng, &m, 12);
            }
            other => panic!("no inputs written for bpf/{other}.c: add them to tests/common/corpus.rs"),
        }
    }
    out
}
