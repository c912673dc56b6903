//! ONC RPC wire formats: record marking, the call view, the service's
//! answer, reply decoding.
//!
//! Input: `[max_len, max_frags, piece, frags, reply_kind, stream…]`.
//!
//! Checked:
//! - `RecordReader` finds the same records and the same error whether the
//!   stream is pushed whole or in pieces, never returns a record over its
//!   limit, and holds at most `max_record_len + 4 × max_fragments` plus the
//!   last piece (its documented bound) plus 3 bytes of an incomplete mark;
//! - on every record (and on the raw stream): `CallHeader` accessors stay in
//!   bounds; `Registry::handle` either appends nothing (close) or one
//!   well-formed record-marked reply that `decode_reply` and `check_reply`
//!   read back with the same xid and answer; `handle_marked` on the record
//!   marked in any number of fragments answers byte for byte the same;
//! - `null_fast_run` over the records (each marked as one fragment, back to
//!   back), and over a run of three copies of the first, answers the
//!   leading ones `null_fast` answers, byte for byte, and stops at the
//!   first it declines;
//! - any reply `encode_reply` writes decodes to itself;
//! - nothing panics.
#![no_main]

use connmux_oncrpc::call::AuthSysParams;
use connmux_oncrpc::msg::AuthStat;
use connmux_oncrpc::record::{encode_record, RecordError, RecordLimits, RecordMark, RecordReader};
use connmux_oncrpc::{check_reply, decode_reply, encode_reply, CallHeader, Outcome, Registry, Reply};
use libfuzzer_sys::fuzz_target;

/// Records popped after each push, and the error that ended the stream.
fn read(limits: RecordLimits, stream: &[u8], piece: usize) -> (Vec<Vec<u8>>, Option<RecordError>) {
    let mut r = RecordReader::new(limits);
    let mut out = Vec::new();
    for chunk in stream.chunks(piece.max(1)) {
        r.push(chunk);
        // Each record consumes at least its 4-byte mark.
        for _ in 0..=stream.len() / 4 {
            match r.next_record() {
                Ok(Some(rec)) => {
                    assert!(rec.len() <= limits.max_record_len);
                    out.push(rec.to_vec());
                }
                Ok(None) => break,
                Err(e) => {
                    assert_eq!(r.next_record(), Err(e.clone()), "errors are sticky");
                    return (out, Some(e));
                }
            }
        }
        // The documented bound, plus up to 3 bytes of a mark not yet whole
        // (the one after the last fragment decoded).
        let bound = limits.max_record_len + 4 * limits.max_fragments + 3 + chunk.len();
        assert!(r.buffered() <= bound, "holds {} > {bound}", r.buffered());
        let _ = r.need();
    }
    (out, None)
}

fn check_reply_record(out: &[u8], xid: u32, reply: Reply) {
    assert_eq!(out.len(), 4 + reply.body_len(), "{reply:?}");
    let mark = RecordMark::parse(out).unwrap();
    assert!(mark.last);
    assert_eq!(mark.len as usize, out.len() - 4);
    let d = decode_reply(&out[4..]).unwrap_or_else(|e| panic!("own reply {reply:?} does not decode: {e}"));
    assert_eq!((d.xid, d.reply), (xid, reply));
    assert!(d.results.is_empty());
    match reply {
        Reply::Success => assert_eq!(check_reply(&out[4..], Some(xid)), Ok(xid)),
        _ => assert!(check_reply(&out[4..], Some(xid)).is_err()),
    }
}

fn serve(record: &[u8], frags: usize) {
    if let Ok(h) = CallHeader::new_checked(record) {
        assert!(h.header_len() <= record.len());
        assert_eq!(h.args(), &record[h.header_len()..]);
        let _ = (h.xid(), h.program(), h.version(), h.procedure(), h.verf());
        let cred = h.cred();
        if let Ok(sys) = AuthSysParams::parse(cred.body) {
            let _ = sys.gids().count();
        }
    }
    let mut strict = Registry::default();
    strict.set_strict_null_args(true);
    for reg in [Registry::default(), Registry::any_program(), Registry::new(), strict] {
        let mut out = vec![0xee; 3];
        let outcome = reg.handle(record, &mut out);
        assert_eq!(&out[..3], &[0xee; 3], "handle appends");
        let out = &out[3..];
        match &outcome {
            Outcome::Replied { xid, reply } => check_reply_record(out, *xid, *reply),
            Outcome::CloseConnection(_) => assert!(out.is_empty()),
        }
        let mut marked = Vec::new();
        encode_record(record, frags, &mut marked);
        let mut out2 = Vec::new();
        assert_eq!(reg.handle_marked(&marked, &mut out2), outcome, "{frags} fragments");
        assert_eq!(out2, out);
    }
}

/// `null_fast_run` against `null_fast` one record at a time.
fn null_runs(records: &[Vec<u8>]) {
    let mut data = Vec::new();
    let mut ranges = Vec::new();
    for rec in records {
        let at = data.len();
        encode_record(rec, 1, &mut data);
        ranges.push(at..data.len());
    }
    let mut strict = Registry::default();
    strict.set_strict_null_args(true);
    for reg in [Registry::default(), Registry::any_program(), Registry::new(), strict] {
        let mut want = b"x".to_vec();
        let mut n = 0;
        for r in &ranges {
            let Some(reply) = reg.null_fast(&data[r.clone()]) else { break };
            want.extend_from_slice(&reply);
            n += 1;
        }
        let mut out = bytes::BytesMut::from(&b"x"[..]);
        assert_eq!(reg.null_fast_run(ranges.iter().map(|r| &data[r.clone()]), &mut out), n);
        assert_eq!(&out[..], &want[..]);
        // A run of equal records end to end, as a read's runs give them.
        if let Some(r) = ranges.first().filter(|r| !r.is_empty()) {
            let one = &data[r.clone()];
            let run = one.repeat(3);
            let mut out = bytes::BytesMut::new();
            let n = reg.null_fast_run(run.chunks_exact(one.len()), &mut out);
            let want = reg.null_fast(one).map_or(Vec::new(), |reply| reply.repeat(3));
            assert_eq!(n, want.len() / connmux_oncrpc::service::NULL_REPLY_LEN);
            assert_eq!(&out[..], &want[..]);
        }
    }
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 5 {
        return;
    }
    let limits = RecordLimits { max_record_len: 1 + data[0] as usize * 8, max_fragments: 1 + (data[1] % 8) as usize };
    let piece = 1 + data[2] as usize % 13;
    let frags = 1 + data[3] as usize % 5;
    let stream = &data[5..];

    let whole = read(limits, stream, stream.len());
    let pieces = read(limits, stream, piece);
    assert_eq!(whole, pieces, "pushed in pieces of {piece}");
    for rec in &whole.0 {
        serve(rec, frags);
    }
    null_runs(&whole.0);
    serve(stream, frags);
    for reg in [Registry::default(), Registry::any_program()] {
        let mut out = Vec::new();
        if let Outcome::Replied { xid, reply } = reg.handle_marked(stream, &mut out) {
            check_reply_record(&out, xid, reply);
        }
    }
    let _ = decode_reply(stream);
    let _ = check_reply(stream, None);

    // Encode an arbitrary reply and read it back.
    let word = |i: usize| u32::from_le_bytes([data[4], data[i % data.len()], data[(i + 1) % data.len()], 0]);
    let reply = match data[4] % 8 {
        0 => Reply::Success,
        1 => Reply::ProgUnavail,
        2 => Reply::ProgMismatch { low: word(5), high: word(7) },
        3 => Reply::ProcUnavail,
        4 => Reply::GarbageArgs,
        5 => Reply::SystemErr,
        6 => Reply::RpcMismatch { low: word(6), high: word(8) },
        _ => Reply::AuthError(AuthStat(word(9) % 16)),
    };
    let mut out = Vec::new();
    encode_reply(word(3), &reply, &mut out);
    check_reply_record(&out, word(3), reply);
});
