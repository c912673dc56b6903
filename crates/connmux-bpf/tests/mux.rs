//! The multiplexor with BPF parsers: the framing acceptance cases (§7, 8–14) and
//! the seeded-split simulation, with each program of `bpf/` against the
//! built-in parser that frames the same protocol.
//!
//! Replay one simulation run: `CONNMUX_SEED=<seed> cargo test -p connmux-bpf --test mux`.

mod common;

use std::sync::Arc;

use common::{program_cases, Rng};
use connmux_bpf::asm::*;
use connmux_bpf::insn::{alu, jmp};
use connmux_bpf::{BpfParser, Program};
use connmux_core::mux::{
    Event, Mux, MuxConfig, MuxError, PsockConfig, PsockError, PsockId, RxError, SockId, SockType, Steering,
};
use connmux_core::parser::{ParseError, Parser};
use connmux_core::parsers::from_spec;
use connmux_core::Timestamp;

const T0: Timestamp = Timestamp::ZERO;

fn ms(n: u64) -> Timestamp {
    Timestamp::from_nanos(n * 1_000_000)
}

/// `bpf/len_prefix.c` as built for BPF v3: the acceptance cases' "L4".
fn len_prefix() -> BpfParser {
    let case = program_cases()
        .into_iter()
        .find(|c| c.source == "len_prefix" && c.label.contains(".v3."))
        .expect("len_prefix.v3.o built");
    BpfParser::from_elf_file(&case.object, None).unwrap()
}

fn raw(insns: &[Insn]) -> BpfParser {
    BpfParser::new(Arc::new(Program::new(insns).unwrap()), "raw")
}
use connmux_bpf::Insn;

fn l4_total(total: usize, tag: u8) -> Vec<u8> {
    let mut v = ((total - 4) as u32).to_be_bytes().to_vec();
    v.resize(total, tag);
    v
}

fn mux(cfg: MuxConfig) -> (Mux, SockId) {
    let mut m = Mux::new(cfg);
    let s = m.socket(SockType::Dgram);
    (m, s)
}

fn rr() -> MuxConfig {
    MuxConfig { steering: Steering::RoundRobin, ..MuxConfig::default() }
}

fn attach(m: &mut Mux, p: impl Parser + 'static) -> PsockId {
    m.attach(Box::new(p), PsockConfig::default())
}

fn events(m: &mut Mux) -> Vec<Event> {
    let mut v = Vec::new();
    for _ in 0..100_000 {
        match m.poll_event() {
            Some(e) => v.push(e),
            None => return v,
        }
    }
    panic!("event queue never drained");
}

fn recv_all(m: &mut Mux, s: SockId) -> Vec<Vec<u8>> {
    let mut v = Vec::new();
    for _ in 0..100_000 {
        match m.recv_msg(s) {
            Ok((b, _)) => v.push(b.to_vec()),
            Err(_) => return v,
        }
    }
    panic!("socket never drained");
}

#[test]
fn case_08_two_messages_in_one_segment_keep_their_boundaries() {
    let (mut m, k) = mux(rr());
    let p = attach(&mut m, len_prefix());
    let (a, b) = (l4_total(10, b'a'), l4_total(10, b'b'));
    m.feed(p, &[a.clone(), b.clone()].concat(), T0).unwrap();
    // Linux runs the program on the segment, so the second message would be
    // framed by the first one's header; here each starts at its own first byte.
    assert_eq!(recv_all(&mut m, k), vec![a, b]);
}

#[test]
fn case_09_message_over_three_segments_is_delivered_once_after_the_last() {
    let (mut m, k) = mux(rr());
    let p = attach(&mut m, len_prefix());
    let msg = l4_total(100, 9);
    events(&mut m);
    m.feed(p, &msg[..30], ms(0)).unwrap();
    m.feed(p, &msg[30..70], ms(20)).unwrap();
    assert_eq!(m.recv_msg(k).unwrap_err(), MuxError::WouldBlock);
    assert!(events(&mut m).is_empty());
    m.feed(p, &msg[70..], ms(40)).unwrap();
    assert_eq!(events(&mut m), vec![Event::SockReadable(k)]);
    assert_eq!(recv_all(&mut m, k), vec![msg]);
}

#[test]
fn case_10_header_split_two_plus_two_needs_more_once() {
    let (mut m, k) = mux(rr());
    let p = attach(&mut m, len_prefix());
    let msg = l4_total(12, 1);
    m.feed(p, &msg[..2], T0).unwrap();
    m.feed(p, &msg[2..], T0).unwrap();
    assert_eq!(m.psock_stats(p).unwrap().rx_need_more_hdr, 1);
    assert_eq!(recv_all(&mut m, k), vec![msg]);
}

#[test]
fn case_11_bytes_held_before_attach_are_delivered_after() {
    let (mut m, k) = mux(rr());
    let held = [l4_total(8, 1), l4_total(9, 2), l4_total(10, 3)].concat();
    let p = attach(&mut m, len_prefix());
    m.feed(p, &held[..20], T0).unwrap();
    m.feed(p, &held[20..], T0).unwrap();
    assert_eq!(recv_all(&mut m, k), vec![l4_total(8, 1), l4_total(9, 2), l4_total(10, 3)]);
}

#[test]
fn case_12_length_over_the_limit_stops_that_psock_only() {
    let (mut m, k) = mux(MuxConfig { max_msg_size: 1000, ..rr() });
    let p = attach(&mut m, len_prefix());
    let q = attach(&mut m, len_prefix());
    events(&mut m);
    m.feed(p, &l4_total(2000, 0)[..100], T0).unwrap();
    assert_eq!(events(&mut m), vec![Event::PsockFailed(p, PsockError::Rx(RxError::TooBig { len: 2000, max: 1000 }))]);
    assert_eq!(m.psock_stats(p).unwrap().rx_msg_too_big, 1);
    assert_eq!(m.recv_msg(k).unwrap_err(), MuxError::WouldBlock);
    m.feed(q, &l4_total(10, 5), T0).unwrap();
    assert_eq!(recv_all(&mut m, k), vec![l4_total(10, 5)]);
}

#[test]
fn case_13_parser_error_is_posted_with_its_errno() {
    // return len == 7 ? -22 : len + 4
    let prog = [
        mov64_reg(6, 1),
        ld_abs(W, 0),
        jmp_imm(jmp::JNE, 0, 7, 2),
        mov64_imm(0, -22),
        exit(),
        alu64_imm(alu::ADD, 0, 4),
        exit(),
    ];
    let (mut m, _k) = mux(rr());
    let p = attach(&mut m, raw(&prog));
    events(&mut m);
    m.feed(p, &l4_total(11, 0), T0).unwrap();
    let e = RxError::Parser(ParseError::Program(22));
    assert_eq!(events(&mut m), vec![Event::PsockFailed(p, PsockError::Rx(e.clone()))]);
    assert_eq!(e.errno(), 22);
    assert_eq!(m.psock_stats(p).unwrap().rx_interrupted, 1);
    assert_eq!(m.rx_capacity(p), 0);
}

#[test]
fn case_14_length_within_bytes_already_gathered_is_eproto() {
    // The length field counts the whole message: return ld_abs_w[0].
    let prog = [mov64_reg(6, 1), ld_abs(W, 0), exit()];
    let (mut m, k) = mux(rr());
    let p = attach(&mut m, raw(&prog));
    events(&mut m);
    m.feed(p, &[0, 0, 0], T0).unwrap();
    assert!(events(&mut m).is_empty());
    m.feed(p, &[2, 0xff, 0xff], T0).unwrap();
    let e = RxError::BadLength { len: 2, gathered: 3 };
    assert_eq!(events(&mut m), vec![Event::PsockFailed(p, PsockError::Rx(e))]);
    assert_eq!(m.psock_stats(p).unwrap().rx_bad_hdr_len, 1);
    assert_eq!(m.recv_msg(k).unwrap_err(), MuxError::WouldBlock);
}

#[test]
fn program_fault_aborts_only_its_psock() {
    // An infinite loop: the budget stops it, the psock is aborted with a typed
    // error, the neighbour goes on.
    let spin = [mov64_imm(0, 0), jmp_imm(jmp::JEQ, 0, 0, -1), exit()];
    let prog = Program::with_limits(&spin, &connmux_bpf::Limits { budget: 10_000, ..Default::default() }).unwrap();
    let (mut m, k) = mux(rr());
    let p = attach(&mut m, BpfParser::new(Arc::new(prog), "spin"));
    let q = attach(&mut m, len_prefix());
    events(&mut m);
    m.feed(p, b"anything", T0).unwrap();
    let ev = events(&mut m);
    assert!(
        matches!(&ev[..], [Event::PsockFailed(x, PsockError::Rx(RxError::Parser(ParseError::ProgramFault(why))))] if *x == p && why.contains("budget")),
        "{ev:?}"
    );
    assert_eq!(m.psock_stats(p).unwrap().rx_interrupted, 1);
    m.feed(q, &l4_total(10, 5), T0).unwrap();
    assert_eq!(recv_all(&mut m, k), vec![l4_total(10, 5)]);
}

/// The built-in parser that frames the same messages as a program of `bpf/`.
fn builtin_for(source: &str, section: Option<&str>) -> &'static str {
    match (source, section) {
        ("len_prefix", _) => "l4",
        ("oncrpc", _) => "oncrpc",
        ("thrift", _) => "thrift",
        ("ninep", _) => "9p",
        ("http2", _) => "http2",
        ("len_variants", Some("socket/len16le")) => "len:offset=0,width=2,endian=le,includes_header=true",
        ("len_variants", Some("socket/magic_len32le")) => "len:offset=2,width=4,endian=le",
        ("len_variants", Some("socket/len64be")) => "len:offset=0,width=8,endian=be",
        other => panic!("no built-in parser named for {other:?}: add one to tests/mux.rs"),
    }
}

/// `n` well-formed messages of the protocol (valid for both parsers).
fn messages(source: &str, section: Option<&str>, rng: &mut Rng, n: usize) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    if source == "http2" {
        out.push(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec());
    }
    while out.len() < n {
        let body = rng.range(0, 300) as usize;
        let mut m = Vec::new();
        match (source, section) {
            ("len_prefix", _) => {
                m.extend_from_slice(&(body as u32).to_be_bytes());
                m.extend(rng.bytes(body));
            }
            ("oncrpc", _) => {
                let frags = rng.range(1, 17);
                for f in 0..frags {
                    let len = rng.below(50) as u32;
                    let last = if f + 1 == frags { 0x8000_0000 } else { 0 };
                    m.extend_from_slice(&(len | last).to_be_bytes());
                    m.extend(rng.bytes(len as usize));
                }
            }
            ("thrift", _) => {
                m.extend_from_slice(&(body as u32 + 2).to_be_bytes());
                m.extend_from_slice(&[0x80, 0x01]);
                m.extend(rng.bytes(body));
            }
            ("ninep", _) => {
                m.extend_from_slice(&(body as u32 + 7).to_le_bytes());
                m.push(rng.pick(&[100u8, 101, 116, 117, 6, 7, 12, 77]));
                m.extend(rng.bytes(2 + body));
            }
            ("http2", _) => {
                m.extend_from_slice(&(body as u32).to_be_bytes()[1..]);
                m.extend(rng.bytes(6 + body));
                m[3] = rng.below(10) as u8; // type
            }
            (_, Some("socket/len16le")) => {
                let total = body + 2;
                m.extend_from_slice(&(total as u16).to_le_bytes());
                m.extend(rng.bytes(body));
            }
            (_, Some("socket/magic_len32le")) => {
                m.extend_from_slice(&[0xca, 0xfe]);
                m.extend_from_slice(&(body as u32).to_le_bytes());
                m.extend(rng.bytes(body));
            }
            (_, Some("socket/len64be")) => {
                m.extend_from_slice(&(body as u64).to_be_bytes());
                m.extend(rng.bytes(body));
            }
            other => panic!("no messages for {other:?}"),
        }
        out.push(m);
    }
    out
}

/// Cut `wire` into chunks: single bytes, pieces of a header, many messages at once.
fn splits(rng: &mut Rng, wire: &[u8]) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let mut at = 0;
    let style = rng.below(3);
    while at < wire.len() {
        let n = match style {
            0 => 1,
            1 => rng.range(1, 12) as usize,
            _ => rng.range(1, 2000) as usize,
        }
        .min(wire.len() - at);
        out.push(at..at + n);
        at += n;
    }
    out
}

#[test]
fn seeded_split_simulation_bpf_equals_builtin() {
    let fixed: Option<u64> = std::env::var("CONNMUX_SEED").ok().and_then(|s| s.parse().ok());
    let cases = program_cases();
    let runs_per_case = if fixed.is_some() { 1 } else { 60 };
    let (mut total_runs, mut total_msgs) = (0, 0);
    for (ci, case) in cases.iter().enumerate() {
        let spec = builtin_for(&case.source, case.section.as_deref());
        for r in 0..runs_per_case {
            let seed = fixed.unwrap_or((ci as u64) << 32 | r as u64);
            let mut rng = Rng::new(seed);
            let n = rng.range(1, 80) as usize;
            let sent = messages(&case.source, case.section.as_deref(), &mut rng, n);
            let wire = sent.concat();
            let chunks = splits(&mut rng, &wire);

            let (mut mb, kb) = mux(rr());
            let pb = mb.attach(
                Box::new(BpfParser::from_elf_file(&case.object, case.section.as_deref()).unwrap()),
                PsockConfig::default(),
            );
            let (mut mc, kc) = mux(rr());
            let pc = mc.attach(from_spec(spec).unwrap(), PsockConfig::default());
            let (mut got_b, mut got_c) = (Vec::new(), Vec::new());
            for c in &chunks {
                mb.feed(pb, &wire[c.clone()], T0).unwrap();
                mc.feed(pc, &wire[c.clone()], T0).unwrap();
                got_b.extend(recv_all(&mut mb, kb));
                got_c.extend(recv_all(&mut mc, kc));
                // Message by message, the two agree as they go.
                assert_eq!(got_b.len(), got_c.len(), "{} seed {seed}: bpf and {spec} differ", case.label);
            }
            let failed: Vec<Event> =
                events(&mut mb).into_iter().filter(|e| matches!(e, Event::PsockFailed(..))).collect();
            assert!(failed.is_empty(), "{} seed {seed}: {failed:?}", case.label);
            assert_eq!(got_b, sent, "{} seed {seed}: bpf parser", case.label);
            assert_eq!(got_c, sent, "{} seed {seed}: {spec}", case.label);
            total_runs += 1;
            total_msgs += sent.len();
        }
    }
    println!(
        "{} programs × {runs_per_case} seeded runs ({total_runs} runs, {total_msgs} messages): bpf = built-in = sent",
        cases.len()
    );
}
