//! Inputs found by the fuzz targets in `fuzz/`, replayed through the public
//! APIs of the library crates as ordinary tests.
//!
//! A test marked `#[ignore]` asserts the behaviour the documentation promises
//! where the library does not give it yet; its reason names the defect. Run
//! them with `cargo test -p connmux-cli --test fuzz_regressions -- --include-ignored`.

use connmux_core::mux::{Event, Mux, MuxConfig, PsockConfig, PsockError, RxError, SockType};
use connmux_core::parsers::from_spec;
use connmux_core::stream::{StreamLimits, StreamParser};
use connmux_core::Timestamp;

fn be(words: &[u32]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_be_bytes()).collect()
}

/// An ONC RPC record whose first fragment (not the last) is 100 bytes long:
/// the record is at least 108 bytes, more than a 64-byte limit.
fn long_first_fragment() -> Vec<u8> {
    let mut wire = be(&[100]);
    wire.resize(4 + 100, 0);
    wire.extend(be(&[0x8000_0000]));
    wire
}

fn stream(max: usize) -> StreamParser {
    let limits = StreamLimits { max_msg_size: max, assembly_timeout: None, read_ahead: 0 };
    StreamParser::new(from_spec("oncrpc").unwrap(), limits)
}

/// Feed `wire` in pieces of `piece` bytes, pulling messages after each; the
/// first error, or the bytes still held at the end.
fn outcome(wire: &[u8], piece: usize, max: usize) -> Result<usize, RxError> {
    let mut sp = stream(max);
    for chunk in wire.chunks(piece) {
        sp.feed(chunk);
        if let Some(m) = sp.next_msg(Timestamp::ZERO)? {
            panic!("no message fits in {max} bytes, got {} bytes", m.len());
        }
    }
    Ok(sp.buffered())
}

/// The same bytes refused as too big when they come in one piece are, when
/// they come a byte at a time, gathered past `max_msg_size` without an answer:
/// after a need-more answer whose hint reaches past the limit the parser is
/// not asked again until the hinted bytes are in, and nothing checks the
/// limit meanwhile (fuzz target `stream_split`).
#[test]
fn header_past_the_limit_is_refused_however_the_bytes_arrive() {
    let wire = long_first_fragment();
    let whole = outcome(&wire[..104], 104, 64);
    assert!(matches!(whole, Err(RxError::TooBig { max: 64, .. })), "{whole:?}");
    let bytewise = outcome(&wire[..104], 1, 64);
    assert!(matches!(bytewise, Err(RxError::TooBig { max: 64, .. })), "byte by byte: {bytewise:?}");
}

/// In the mux the same stream, read as `rx_capacity` allows, stalls the
/// psock: once it holds `max_msg_size + psock_rx_buf` bytes its capacity is 0
/// and, with no assembly timeout, it never fails and never reads again.
#[test]
fn psock_with_header_past_the_limit_fails_instead_of_stalling() {
    let cfg = MuxConfig { max_msg_size: 64, psock_rx_buf: 16, ..MuxConfig::default() };
    let mut m = Mux::new(cfg);
    let _s = m.socket(SockType::SeqPacket);
    let p = m.attach(from_spec("oncrpc").unwrap(), PsockConfig::default());
    // A first fragment of 1000 bytes: the record cannot fit in 64.
    let mut wire = be(&[1000]);
    wire.resize(4 + 1000, 7);
    let mut fed = 0;
    let mut failed = None;
    // A driver reading one byte at a time, as far as the mux lets it.
    for _ in 0..wire.len() {
        if m.rx_capacity(p) == 0 || fed == wire.len() {
            break;
        }
        m.feed(p, &wire[fed..fed + 1], Timestamp::ZERO).unwrap();
        fed += 1;
        while let Some(e) = m.poll_event() {
            if let Event::PsockFailed(q, err) = e {
                assert_eq!(q, p);
                failed = Some(err);
            }
        }
    }
    assert!(
        matches!(failed, Some(PsockError::Rx(RxError::TooBig { max: 64, .. }))),
        "after {fed} bytes (capacity now {}): psock failure {failed:?}",
        m.rx_capacity(p)
    );
}

fn regression(target: &str, name: &str) -> Vec<u8> {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/regressions").join(target).join(name);
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// A program returning 0x80000000 gives `ParseError::Program(i32::MIN)`
/// (`parse_result` has no positive errno for it); the stream parser's
/// ESTRPIPE check takes `v.abs()` of it, which overflows: a panic where
/// overflow checks are on (debug builds), found by fuzz target `bpf_program`.
#[test]
fn program_returning_i32_min_is_refused_without_overflow() {
    // r0 = 0x80000000 (mov32: the immediate as it is); exit
    let code = [0xb4, 0x00, 0, 0, 0x00, 0x00, 0x00, 0x80, 0x95, 0, 0, 0, 0, 0, 0, 0];
    let parser = connmux_bpf::BpfParser::from_raw(&code).unwrap();
    let limits = StreamLimits { max_msg_size: 64, assembly_timeout: None, read_ahead: 0 };
    let mut sp = StreamParser::new(Box::new(parser), limits);
    sp.feed(b"x");
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| sp.next_msg(Timestamp::ZERO)));
    match r {
        Ok(Err(RxError::Parser(e))) => assert_eq!(e, connmux_core::ParseError::Program(i32::MIN)),
        Ok(other) => panic!("expected a refusal, got {other:?}"),
        Err(_) => panic!("next_msg panicked on ParseError::Program(i32::MIN)"),
    }
    // The fuzzer's input (raw program, then data) fails the same way.
    let input = regression("bpf_program", "program-returns-i32-min");
    let n = usize::from(u16::from_le_bytes([input[2], input[3]]));
    assert!(connmux_bpf::BpfParser::from_raw(&input[4..4 + 8 * n]).is_ok());
}

/// An object whose function symbol has an address and size summing past
/// u64::MAX: choosing that function panics in the ELF loader
/// (`sym.address() + sym.size()`) where overflow checks are on, instead of
/// refusing the object; found by fuzz target `bpf_program`.
#[test]
fn object_with_overflowing_function_symbol_is_refused() {
    let input = regression("bpf_program", "elf-function-end-overflow");
    let object = &input[2..];
    let list = connmux_bpf::elf::list_programs(object).expect("the object lists its programs");
    let mut tried = 0;
    for info in &list {
        for name in std::iter::once(&info.section).chain(&info.functions) {
            tried += 1;
            let r = std::panic::catch_unwind(|| connmux_bpf::elf::load_program(object, Some(name)).map(|_| ()));
            assert!(r.is_ok(), "load_program(Some({name:?})) panicked");
        }
    }
    assert!(tried > 1);
}
