//! The stream parser with each built-in parser, the byte stream cut at
//! fuzzer-chosen points.
//!
//! Input: `[parser, max_lo, max_hi, n_cuts, cuts (n_cuts × u16 LE)…, stream…]`.
//! `parser` picks a spec from `SPECS`; the last choice reads a spec string
//! from the stream (up to its first NUL) and frames the rest with it.
//!
//! Checked:
//! - the messages (wire length and delivered bytes) and how the stream ends
//!   (refusal, or the bytes left and the need hint) are the same whether the
//!   stream came in one piece or cut at the chosen points, fed or (where the
//!   stream lends its buffer for a large message) read into a loan;
//! - every message is 1..=max_msg bytes, is the next slice of the stream, and
//!   is delivered as it is on the wire (or, for `oncrpc:strip`, with its marks
//!   stripped exactly as `connmux_oncrpc::record::strip_marks` does);
//! - framing whole messages where they lie in each piece
//!   (`StreamParser::frame_in_place`, the rest fed as usual) gives the same
//!   messages and the same end as feeding every piece;
//! - ONC RPC framing agrees with `connmux_oncrpc::RecordReader` on the same stream;
//! - a spec that parses names a parser whose name parses to the same name;
//! - nothing panics.
#![no_main]

use connmux_core::mux::RxError;
use connmux_core::parsers::from_spec;
use connmux_core::stream::{StreamLimits, StreamParser, Unlend};
use connmux_core::{Bytes, Parser, Timestamp};
use connmux_oncrpc::record::{strip_marks, RecordLimits, RecordReader};
use libfuzzer_sys::fuzz_target;

/// Known defect of the stream parser: after a need-more answer whose hint
/// reaches past `max_msg_size`, the parser is not asked again until the
/// hinted bytes are in, so a stream arriving in small pieces is gathered past
/// the limit (and, in the mux, stalls the psock) where the same bytes in one
/// piece are refused as too big. Reproduced by the ignored tests in
/// `crates/connmux-cli/tests/fuzz_regressions.rs`; set to false once
/// `StreamParser::next_msg` refuses `have + hint > max_msg_size`.
const TOLERATE_GATHERING_PAST_MAX: bool = false;

const SPECS: &[&str] = &[
    "l4",
    "len:offset=2,width=2,endian=le",
    "len:offset=1,width=3,endian=be,adjust=-3,includes_header=true",
    "len:width=8,endian=le,adjust=5",
    "len:width=1,includes_header=true",
    "oncrpc",
    "oncrpc:strip",
    "oncrpc:max_fragments=3",
    "oncrpc:strip,max_fragments=2",
    "9p",
    "thrift",
    "http2",
    "kafka",
    "memcached",
];

#[derive(Debug, PartialEq)]
enum End {
    /// Bytes left of an unfinished message, and the need hint.
    Open {
        buffered: usize,
        need: Option<usize>,
    },
    Refused(Refusal),
}

/// A refusal, without the figures that depend on how much was buffered when
/// it happened (a "too big" found from a need-more answer reports the bytes
/// gathered so far plus the hint; `gathered` is where the last answer was).
#[derive(Debug, PartialEq)]
enum Refusal {
    TooBig { max: usize },
    BadLength { len: usize },
    Other(RxError),
}

fn refusal(e: RxError) -> Refusal {
    match e {
        RxError::TooBig { max, .. } => Refusal::TooBig { max },
        RxError::BadLength { len, .. } => Refusal::BadLength { len },
        e => Refusal::Other(e),
    }
}

#[derive(Debug, PartialEq)]
struct Run {
    /// (wire length, delivered bytes) of each message.
    msgs: Vec<(usize, Bytes)>,
    end: End,
}

/// `in_place`: each piece's whole messages are framed where they lie first.
/// `lend`: each piece goes into a loan of the assembly buffer where the
/// stream offers one (as much of the piece as the loan's limit takes).
fn run(parser: Box<dyn Parser>, max_msg: usize, stream: &[u8], cuts: &[usize], in_place: bool, lend: bool) -> Run {
    let limits = StreamLimits { max_msg_size: max_msg, assembly_timeout: None, read_ahead: 0 };
    let mut sp = StreamParser::new(parser, limits);
    let mut msgs = Vec::new();
    let mut at = 0;
    let mut i = 0;
    let mut ranges = Vec::new();
    while at < stream.len() {
        let n = if cuts.is_empty() { stream.len() } else { cuts[i % cuts.len()] };
        i += 1;
        let end = (at + n).min(stream.len());
        if let Some(mut loan) = lend.then(|| sp.lend(end - at)).flatten() {
            let k = loan.limit();
            assert!(k >= 1 && k <= end - at);
            loan.buf().extend_from_slice(&stream[at..at + k]);
            assert_eq!(sp.unlend(loan), Unlend::Took(k));
            at += k;
        } else {
            let mut piece = &stream[at..end];
            if in_place {
                ranges.clear();
                let before = sp.stats().bytes;
                let taken = sp.frame_in_place(piece, 1 + i % 7, &mut ranges);
                // Every built-in parser delivers a suffix of its message's bytes:
                // each message's wire bytes end where its delivered part does.
                let mut wire_at = 0;
                for r in connmux_core::run::ranges(&ranges) {
                    assert!(r.start >= wire_at && r.end > wire_at && r.end <= taken, "range {r:?} of {taken}");
                    msgs.push((r.end - wire_at, Bytes::copy_from_slice(&piece[r.clone()])));
                    wire_at = r.end;
                }
                assert_eq!(wire_at, taken, "the messages framed in place are what was taken");
                assert_eq!((sp.stats().bytes - before) as usize, taken);
                piece = &piece[taken..];
            }
            sp.feed(piece);
            at = end;
        }
        loop {
            let before = sp.stats().bytes;
            match sp.next_msg(Timestamp::ZERO) {
                Ok(Some(m)) => msgs.push(((sp.stats().bytes - before) as usize, m)),
                Ok(None) => break,
                Err(e) => {
                    assert!(sp.is_stopped());
                    assert_eq!(sp.buffered(), 0);
                    return Run { msgs, end: End::Refused(refusal(e)) };
                }
            }
        }
    }
    Run { msgs, end: End::Open { buffered: sp.buffered(), need: sp.need() } }
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 4 {
        return;
    }
    let choice = data[0] as usize % (SPECS.len() + 1);
    let max_msg = 1 + u16::from_le_bytes([data[1], data[2]]) as usize;
    let n_cuts = (data[3] % 16) as usize;
    let mut rest = &data[4..];
    let mut cuts = Vec::with_capacity(n_cuts);
    for _ in 0..n_cuts {
        let Some(c) = rest.get(..2) else { return };
        // Mostly small pieces (headers cut anywhere), sometimes large ones.
        let v = u16::from_le_bytes([c[0], c[1]]) as usize;
        cuts.push(if v & 0x8000 != 0 { 1 + (v & 0x7fff) } else { 1 + v % 9 });
        rest = &rest[2..];
    }
    if cuts.is_empty() {
        // No cuts given: one byte at a time.
        cuts.push(1);
    }
    let (spec, stream): (String, &[u8]) = if choice == SPECS.len() {
        let nul = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
        let Ok(s) = std::str::from_utf8(&rest[..nul]) else { return };
        (s.to_owned(), rest.get(nul + 1..).unwrap_or(&[]))
    } else {
        (SPECS[choice].to_owned(), rest)
    };
    let Ok(p) = from_spec(&spec) else { return };
    let name = p.name().to_owned();
    let again = from_spec(&name).unwrap_or_else(|e| panic!("{spec:?} names {name:?}, which does not parse: {e}"));
    assert_eq!(again.name(), name, "canonical name of {spec:?}");

    let whole = run(from_spec(&spec).unwrap(), max_msg, stream, &[], false, false);
    let split = run(from_spec(&spec).unwrap(), max_msg, stream, &cuts, false, false);
    let in_place = run(from_spec(&spec).unwrap(), max_msg, stream, &cuts, true, false);
    assert_eq!(in_place, split, "in place: spec {spec:?}, max_msg {max_msg}, cuts {cuts:?}");
    let lent = run(from_spec(&spec).unwrap(), max_msg, stream, &cuts, false, true);
    for (split, lend) in [(split, false), (lent, true)] {
        if TOLERATE_GATHERING_PAST_MAX
            && whole.msgs == split.msgs
            && matches!(whole.end, End::Refused(Refusal::TooBig { .. }))
            && matches!(split.end, End::Open { buffered, .. } if buffered >= max_msg)
        {
            // Known defect, see TOLERATE_GATHERING_PAST_MAX.
        } else if whole.msgs == split.msgs
            && matches!((&whole.end, &split.end), (End::Refused(a), End::Refused(b))
                if matches!(a, Refusal::TooBig { .. }) || matches!(b, Refusal::TooBig { .. }))
        {
            // A message both longer than the limit and malformed: which of the two
            // is reported depends on how much of it the parser saw when the limit
            // was reached. Refused either way, after the same messages.
        } else {
            assert_eq!(whole, split, "spec {spec:?}, max_msg {max_msg}, cuts {cuts:?}, lend {lend}");
        }
    }

    let strip = name.starts_with("oncrpc:strip");
    let mut off = 0;
    for (len, msg) in &whole.msgs {
        assert!(*len >= 1 && *len <= max_msg, "message of {len} bytes, max {max_msg}");
        let wire = &stream[off..off + len];
        if strip {
            let mut body = Vec::new();
            strip_marks(wire, &mut body).expect("a framed record's marks describe it");
            assert_eq!(&msg[..], &body[..]);
        } else {
            assert_eq!(&msg[..], wire);
        }
        off += len;
    }
    match &whole.end {
        End::Open { buffered, need } => {
            assert_eq!(off + buffered, stream.len());
            assert_eq!(need.is_some(), *buffered > 0);
        }
        End::Refused(_) => assert!(off < stream.len()),
    }

    // Record marking: the client-side reader finds the same records.
    if name == "oncrpc" || name == "oncrpc:strip" {
        let mut rr = RecordReader::new(RecordLimits { max_record_len: usize::MAX >> 1, ..RecordLimits::default() });
        rr.push(stream);
        let mut off = 0;
        for (len, _) in &whole.msgs {
            let mut body = Vec::new();
            strip_marks(&stream[off..off + len], &mut body).unwrap();
            match rr.next_record() {
                Ok(Some(r)) => assert_eq!(r, &body[..], "record at {off}"),
                other => panic!("record at {off}: the reader says {other:?}"),
            }
            off += len;
        }
        if let End::Open { .. } = whole.end {
            assert_eq!(rr.next_record(), Ok(None), "no record beyond the parser's");
        }
    }
});
