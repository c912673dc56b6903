//! Built-in parsers on real protocol bytes: every split point of every
//! stream frames the same messages, the NeedMore hints are exact, bad input
//! gives the typed error, and spec strings round-trip.

use bytes::Bytes;
use connmux_core::parser::{Parse, ParseError, Parser, Run, EPROTO};
use connmux_core::parsers::*;
use connmux_core::run::ranges;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn be32(w: &[u32]) -> Vec<u8> {
    w.iter().flat_map(|x| x.to_be_bytes()).collect()
}

// ---- Real messages -------------------------------------------------------

/// ksf.md §2.4: rpctest's 44-byte NFSv3 NULL call (AUTH_NONE), xid n.
fn rpc_null_call(xid: u32) -> Vec<u8> {
    be32(&[0x8000_0028, xid, 0, 2, 0x186a3, 3, 0, 0, 0, 0, 0])
}

/// ksf.md §2.4: the same call as rpctest `-f` sends it, 3 fragments (1, 38, 1).
fn rpc_null_call_3frags(xid: u32) -> Vec<u8> {
    let body = &rpc_null_call(xid)[4..];
    let mut v = be32(&[1]);
    v.push(body[0]);
    v.extend_from_slice(&be32(&[38]));
    v.extend_from_slice(&body[1..39]);
    v.extend_from_slice(&be32(&[0x8000_0001]));
    v.push(body[39]);
    v
}

/// ksf.md §2.4: `-A sys` call, 64-byte body (stamp, "vm", uid/gid 65534).
fn rpc_auth_sys_call(xid: u32) -> Vec<u8> {
    let mut v = be32(&[0x8000_0040, xid, 0, 2, 100003, 3, 0, 1, 24, 0x5f00_0001, 2]);
    v.extend_from_slice(b"vm\0\0");
    v.extend_from_slice(&be32(&[65534, 65534, 0, 0, 0]));
    v
}

/// A record of 1-byte fragments only.
fn rpc_one_byte_fragments(body: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    for (i, b) in body.iter().enumerate() {
        let last = if i + 1 == body.len() { 0x8000_0000 } else { 0 };
        v.extend_from_slice(&be32(&[last | 1]));
        v.push(*b);
    }
    v
}

/// An HTTP/2 client's opening (curl 8): preface, SETTINGS (max concurrent
/// streams 100, initial window 32 MiB, push disabled), WINDOW_UPDATE.
fn h2_client_opening() -> Vec<Vec<u8>> {
    vec![
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec(),
        vec![
            0, 0, 18, 4, 0, 0, 0, 0, 0, // SETTINGS, 18 bytes, stream 0
            0, 3, 0, 0, 0, 100, // MAX_CONCURRENT_STREAMS 100
            0, 4, 2, 0, 0, 0, // INITIAL_WINDOW_SIZE 32 MiB
            0, 2, 0, 0, 0, 0, // ENABLE_PUSH 0
        ],
        vec![0, 0, 4, 8, 0, 0, 0, 0, 0, 1, 0xff, 0, 1], // WINDOW_UPDATE +33488897
        vec![0, 0, 0, 4, 1, 0, 0, 0, 0],                // SETTINGS ACK (empty payload)
    ]
}

/// 9P2000 Tversion(msize 8192, "9P2000") and the server's Rversion.
fn ninep_version_exchange() -> Vec<Vec<u8>> {
    let t = [19, 0, 0, 0, 100, 0xff, 0xff, 0, 0x20, 0, 0, 6, 0, b'9', b'P', b'2', b'0', b'0', b'0'];
    let mut r = t;
    r[4] = 101;
    vec![t.to_vec(), r.to_vec()]
}

/// memcached binary protocol spec's GET "Hello" request and its response
/// (flags 0xdeadbeef, value "World").
fn memcached_get() -> Vec<Vec<u8>> {
    let mut req = vec![0x80, 0x00, 0x00, 0x05, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x05];
    req.extend_from_slice(&[0; 12]);
    req.extend_from_slice(b"Hello");
    let mut resp = vec![0x81, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x09];
    resp.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
    resp.extend_from_slice(&[0xde, 0xad, 0xbe, 0xef]);
    resp.extend_from_slice(b"World");
    vec![req, resp]
}

/// Kafka ApiVersions v0 request (correlation id 1, client id "cli").
fn kafka_api_versions() -> Vec<u8> {
    let mut v = be32(&[13]);
    v.extend_from_slice(&[0, 18, 0, 0, 0, 0, 0, 1, 0, 3, b'c', b'l', b'i']);
    v
}

/// Thrift framed TBinaryProtocol call `ping()` seqid 0.
fn thrift_ping() -> Vec<u8> {
    let mut body = be32(&[0x8001_0001, 4]);
    body.extend_from_slice(b"ping");
    body.extend_from_slice(&[0, 0, 0, 0, 0]); // seqid, STOP
    let mut v = be32(&[body.len() as u32]);
    v.extend_from_slice(&body);
    v
}

// ---- A driver that frames like the stream parser -------------------------

/// Frames `stream`, delivered up to each cut then to the end, the way the
/// stream parser does: parse from each message's first byte, wait for the
/// hinted bytes before asking again, cut the message, `finish` it. Also checks
/// that a hint is ≥ 1 and that a length is > 0 and beyond the bytes asked about.
fn frame(p: &mut dyn Parser, stream: &[u8], cuts: &[usize]) -> (Vec<Vec<u8>>, Option<ParseError>) {
    let mut msgs = Vec::new();
    let (mut start, mut known, mut ask_at, mut asked) = (0usize, None::<usize>, 0usize, 0usize);
    for &have in cuts.iter().chain(std::iter::once(&stream.len())) {
        let have = have.min(stream.len());
        // Each pass completes a message or stops; bounded by the stream length.
        for _ in 0..=stream.len() {
            if let Some(len) = known {
                if have - start < len {
                    break;
                }
                msgs.push(p.finish(Bytes::copy_from_slice(&stream[start..start + len])).to_vec());
                start += len;
                known = None;
                (ask_at, asked) = (start, 0);
                continue;
            }
            if have == start || have < ask_at {
                break;
            }
            match p.parse(&stream[start..have]) {
                Parse::NeedMore(n) => {
                    assert!(n >= 1, "hint 0");
                    (ask_at, asked) = (have + n, have - start);
                    break;
                }
                Parse::Length(len) => {
                    assert!(len > 0 && len > asked, "length {len} after asking with {asked}");
                    known = Some(len);
                }
                Parse::Invalid(e) => return (msgs, Some(e)),
            }
        }
    }
    (msgs, None)
}

/// All messages of `msgs` concatenated, framed whole, at every single split
/// point, byte by byte and in random chunks: always `want`.
fn check_splits(spec: &str, msgs: &[Vec<u8>], want: &[Vec<u8>]) {
    let stream = msgs.concat();
    let run = |cuts: &[usize]| frame(&mut *from_spec(spec).unwrap(), &stream, cuts);
    assert_eq!(run(&[]), (want.to_vec(), None), "{spec}: whole stream");
    for p in 0..=stream.len() {
        assert_eq!(run(&[p]), (want.to_vec(), None), "{spec}: split at {p}");
    }
    let bytewise: Vec<usize> = (1..stream.len()).collect();
    assert_eq!(run(&bytewise), (want.to_vec(), None), "{spec}: byte by byte");
    let mut rng = StdRng::seed_from_u64(stream.len() as u64);
    for _ in 0..50 {
        let mut cuts: Vec<usize> = (0..rng.gen_range(1..8)).map(|_| rng.gen_range(0..=stream.len())).collect();
        cuts.sort_unstable();
        assert_eq!(run(&cuts), (want.to_vec(), None), "{spec}: cuts {cuts:?}");
    }
}

/// For every prefix of `msg` on which a fresh parser answers NeedMore(n), a
/// fresh parser answers NeedMore with the same target on each longer prefix
/// short of it: the hint never overshoots what the parser then decides with.
fn check_hints_exact(spec: &str, msg: &[u8]) {
    for l in 0..msg.len() {
        if let Parse::NeedMore(n) = from_spec(spec).unwrap().parse(&msg[..l]) {
            let target = l + n;
            for l2 in l + 1..target.min(msg.len() + 1) {
                assert_eq!(
                    from_spec(spec).unwrap().parse(&msg[..l2]),
                    Parse::NeedMore(target - l2),
                    "{spec}: prefix {l2} after NeedMore({n}) at {l}"
                );
            }
        }
    }
}

// ---- Per-protocol behaviour ---------------------------------------------

#[test]
fn oncrpc_frames_the_captured_calls() {
    let msgs = vec![rpc_null_call(0), rpc_null_call_3frags(1), rpc_auth_sys_call(2), rpc_null_call(3)];
    // Keeping marks: each record exactly as on the wire; a multi-fragment
    // record is one message.
    check_splits("oncrpc", &msgs, &msgs);
    // Stripping: the record bodies.
    let bodies: Vec<Vec<u8>> = vec![
        rpc_null_call(0)[4..].to_vec(),
        rpc_null_call(1)[4..].to_vec(),
        rpc_auth_sys_call(2)[4..].to_vec(),
        rpc_null_call(3)[4..].to_vec(),
    ];
    check_splits("oncrpc:strip", &msgs, &bodies);
    // Forty one-byte fragments: one message, body intact when stripped.
    let many = rpc_one_byte_fragments(&rpc_null_call(9)[4..]);
    assert_eq!(many.len(), 200);
    let one = std::slice::from_ref(&many);
    check_splits("oncrpc", one, one);
    check_splits("oncrpc:strip", one, &[rpc_null_call(9)[4..].to_vec()]);
    for m in msgs.iter().chain([&many]) {
        check_hints_exact("oncrpc", m);
    }
}

#[test]
fn oncrpc_exact_hints_and_limits() {
    let mut p = OncRpc::new(false);
    let f = rpc_null_call_3frags(0);
    assert_eq!(p.parse(&f[..0]), Parse::NeedMore(4));
    assert_eq!(p.parse(&f[..3]), Parse::NeedMore(1));
    // First fragment's mark says 1 byte, not last: need it and the next mark.
    assert_eq!(p.parse(&f[..4]), Parse::NeedMore(5));
    assert_eq!(p.parse(&f[..9]), Parse::NeedMore(38 + 4));
    // Once the last mark is in, the length is known before its body.
    assert_eq!(p.parse(&f[..51]), Parse::Length(52));
    // The bound on fragments.
    let mut two = OncRpc::with_max_fragments(false, 2);
    assert_eq!(two.parse(&f), Parse::Invalid(ParseError::TooManyFragments(3)));
    assert_eq!(two.parse(&rpc_null_call(0)), Parse::Length(44));
    // A maximal 31-bit fragment does not overflow.
    assert_eq!(p.parse(&be32(&[0xffff_ffff])), Parse::Length(4 + 0x7fff_ffff));
    // An empty record is a 4-byte message.
    assert_eq!(p.parse(&be32(&[0x8000_0000])), Parse::Length(4));
}

#[test]
fn oncrpc_resume_state_follows_the_message() {
    // The trait promises a longer buffer of the same message after NeedMore.
    // A parser used past that promise (a stream aborted mid-record, the parser
    // reused) must still answer as a fresh one does in these cases: another
    // record with the same first mark, with another first mark, a shorter one.
    let fresh = |b: &[u8]| OncRpc::new(false).parse(b);
    let mut p = OncRpc::new(false);
    let a = rpc_one_byte_fragments(&[1, 2, 3, 4, 5, 6]);
    let b = rpc_null_call_3frags(0);
    assert_eq!(a[..4], b[..4]);
    let mut c = a.clone();
    c[3] = 2;
    for other in [&b[..], &c[..12], &b[..6], &a[..3]] {
        assert_eq!(p.parse(&a[..12]), Parse::NeedMore(2));
        assert_eq!(p.parse(other), fresh(other), "{other:?}");
    }
    assert_eq!(p.parse(&a), Parse::Length(30));
}

#[test]
fn oncrpc_strip_copies_only_multi_fragment_records() {
    let mut p = OncRpc::new(true);
    let one = Bytes::from(rpc_null_call(5));
    let stripped = p.finish(one.clone());
    assert_eq!(&stripped[..], &one[4..]);
    // Zero-copy: the stripped message points into the original buffer.
    assert_eq!(stripped.as_ptr(), one[4..].as_ptr());
    assert_eq!(&p.finish(Bytes::from(rpc_null_call_3frags(5)))[..], &one[4..]);
    // finish never panics on marks that lie.
    for bad in [vec![0x80, 0, 0, 99, 1], vec![0, 0], vec![0, 0, 0, 9, 1, 2]] {
        let _ = p.finish(Bytes::from(bad));
    }
}

#[test]
fn http2_preface_then_frames() {
    let msgs = h2_client_opening();
    check_splits("http2", &msgs, &msgs);
    // A server's stream has no preface: frames from the first byte.
    check_splits("http2", &msgs[1..], &msgs[1..]);
    let opening = msgs.concat();
    check_hints_exact("http2", &opening[..24]);
    check_hints_exact("http2", &msgs[1]);
    let mut p = Http2::new();
    assert_eq!(p.parse(b""), Parse::NeedMore(9));
    assert_eq!(p.parse(b"PRI * HTTP/2.0\r\n"), Parse::NeedMore(1));
    assert_eq!(p.parse(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), Parse::Length(24));
    // Only the first message may be the preface; later the same bytes are a frame header.
    assert_eq!(p.parse(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), Parse::Length(9 + 0x50_5249));
    // A first message that starts like the preface and departs from it is a frame.
    let mut q = Http2::new();
    assert_eq!(q.parse(b"PRI * HTTP/1.1\r\n"), Parse::Length(9 + 0x50_5249));
    // Largest frame: 24-bit length, no overflow possible.
    assert_eq!(Http2::new().parse(&[0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 1]), Parse::Length(9 + 0xff_ffff));
}

#[test]
fn ninep_version_exchange_frames() {
    let msgs = ninep_version_exchange();
    check_splits("9p", &msgs, &msgs);
    check_hints_exact("9p", &msgs[0]);
    let mut p = NineP::new();
    assert_eq!(p.parse(&[19, 0]), Parse::NeedMore(2));
    // Smallest valid message (e.g. Rclunk: size, type, tag).
    assert_eq!(p.parse(&[7, 0, 0, 0, 121, 1, 0]), Parse::Length(7));
    assert_eq!(p.parse(&[6, 0, 0, 0]), Parse::Invalid(ParseError::LengthBelowHeader { length: 6, header: 7 }));
    assert_eq!(p.parse(&[0, 0, 0, 0]), Parse::Invalid(ParseError::LengthBelowHeader { length: 0, header: 7 }));
    assert_eq!(p.parse(&[0xff, 0xff, 0xff, 0xff]), Parse::Length(0xffff_ffff));
}

#[test]
fn memcached_get_frames() {
    let msgs = memcached_get();
    assert_eq!((msgs[0].len(), msgs[1].len()), (29, 33));
    check_splits("memcached", &msgs, &msgs);
    check_hints_exact("memcached", &msgs[0]);
    let mut p = Memcached::new();
    assert_eq!(p.parse(&[]), Parse::NeedMore(24));
    assert_eq!(p.parse(&msgs[0][..23]), Parse::NeedMore(1));
    // The text protocol is refused on its first byte.
    assert_eq!(p.parse(b"g"), Parse::Invalid(ParseError::BadField { what: "memcached magic", value: u64::from(b'g') }));
    // Key + extras longer than the body.
    let mut bad = msgs[1].clone();
    bad[11] = 3;
    assert!(matches!(p.parse(&bad), Parse::Invalid(ParseError::BadField { value: 4, .. })));
    // The largest body length does not overflow.
    let mut big = msgs[0].clone();
    big[8..12].copy_from_slice(&[0xff; 4]);
    assert_eq!(p.parse(&big), Parse::Length(24 + 0xffff_ffff));
}

#[test]
fn kafka_and_thrift_frame_and_refuse_negative_sizes() {
    let k = kafka_api_versions();
    check_splits("kafka", &[k.clone(), k.clone()], &[k.clone(), k.clone()]);
    check_hints_exact("kafka", &k);
    let t = thrift_ping();
    assert_eq!(t.len(), 21);
    check_splits("thrift", &[t.clone(), t.clone()], &[t.clone(), t.clone()]);
    check_hints_exact("thrift", &t);
    // Unframed TBinaryProtocol sent to a framed server: version word 0x80010001.
    assert_eq!(
        Thrift::new().parse(&t[4..]),
        Parse::Invalid(ParseError::BadField { what: "thrift frame size (negative)", value: 0x8001_0001 })
    );
    assert_eq!(
        Kafka::new().parse(&[0xff, 0xff, 0xff, 0xff]),
        Parse::Invalid(ParseError::BadField { what: "kafka size (negative)", value: 0xffff_ffff })
    );
    assert_eq!(Kafka::new().parse(&[0x7f, 0xff, 0xff, 0xff]), Parse::Length(4 + 0x7fff_ffff));
    assert_eq!(Kafka::new().parse(&[0, 0, 0, 0]), Parse::Length(4));
}

#[test]
fn length_field_configurations() {
    // l4 over the Kafka and Thrift bytes: the same framing (sizes are small).
    let k = kafka_api_versions();
    check_splits("l4", &[k.clone(), thrift_ping()], &[k.clone(), thrift_ping()]);
    // 2-byte little-endian length at offset 2 counting the whole message.
    let m1 = vec![0xaa, 0xbb, 6, 0, 1, 2];
    let m2 = vec![0xaa, 0xbb, 4, 0];
    let spec = "len:offset=2,width=2,endian=le,includes_header=true";
    check_splits(spec, &[m1.clone(), m2.clone()], &[m1.clone(), m2]);
    check_hints_exact(spec, &m1);
    // Adjustment: a 1-byte field counting the payload plus a 2-byte trailer.
    let m = vec![3, 7, 7, 7, 0xee, 0xee];
    check_splits("len:width=1,adjust=2", &[m.clone(), m.clone()], &[m.clone(), m]);
    // 3-byte big-endian field (HTTP/2's), read at offset 0.
    assert_eq!(LengthField::new(0, 3, Endian::Big, 6, false).unwrap().parse(&[0, 0, 18, 4]), Parse::Length(3 + 18 + 6));
    // Every width reads the right bytes in both orders.
    for w in 1..=8usize {
        let mut be = vec![0u8; w];
        be[w - 1] = 5;
        let mut le = vec![0u8; w];
        le[0] = 5;
        assert_eq!(LengthField::new(0, w, Endian::Big, 0, false).unwrap().parse(&be), Parse::Length(w + 5));
        assert_eq!(LengthField::new(0, w, Endian::Little, 0, false).unwrap().parse(&le), Parse::Length(w + 5));
        assert_eq!(LengthField::new(1, w, Endian::Big, 0, false).unwrap().parse(&be), Parse::NeedMore(1));
    }
}

#[test]
fn length_field_refusals() {
    let mut p = LengthField::new(0, 8, Endian::Big, 0, false).unwrap();
    assert_eq!(p.parse(&[0xff; 8]), Parse::Invalid(ParseError::LengthOverflow));
    assert_eq!(p.parse(&[0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xf7]), Parse::Length(i64::MAX as usize));
    assert_eq!(p.parse(&[0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xf8]), Parse::Invalid(ParseError::LengthOverflow));
    let mut incl = LengthField::new(0, 4, Endian::Big, 0, true).unwrap();
    assert_eq!(incl.parse(&be32(&[2])), Parse::Invalid(ParseError::LengthBelowHeader { length: 2, header: 4 }));
    assert_eq!(incl.parse(&be32(&[4])), Parse::Length(4));
    let mut neg = LengthField::new(0, 4, Endian::Big, -10, false).unwrap();
    assert_eq!(neg.parse(&be32(&[0])), Parse::Invalid(ParseError::LengthBelowHeader { length: 0, header: 4 }));
    assert_eq!(neg.parse(&be32(&[12])), Parse::Length(6));
    let mut max_adj = LengthField::new(0, 8, Endian::Big, i64::MAX, true).unwrap();
    assert_eq!(max_adj.parse(&[0, 0, 0, 0, 0, 0, 0, 1]), Parse::Invalid(ParseError::LengthOverflow));
    assert_eq!(LengthField::new(0, 0, Endian::Big, 0, false), Err(LengthFieldError::Width(0)));
    assert_eq!(LengthField::new(0, 9, Endian::Big, 0, false), Err(LengthFieldError::Width(9)));
    assert_eq!(LengthField::new(MAX_OFFSET + 1, 4, Endian::Big, 0, false), Err(LengthFieldError::Offset(65536)));
    // Framing errors post EPROTO, like KCM.
    assert_eq!(ParseError::LengthOverflow.errno(), EPROTO);
}

// ---- Spec strings --------------------------------------------------------

#[test]
fn spec_strings_round_trip() {
    let cases = [
        ("l4", "len:offset=0,width=4,endian=be,adjust=0,includes_header=false"),
        ("len", "len:offset=0,width=4,endian=be,adjust=0,includes_header=false"),
        (
            "len:offset=0,width=4,endian=be,adjust=0,includes_header=false",
            "len:offset=0,width=4,endian=be,adjust=0,includes_header=false",
        ),
        (" len: width=2 , endian=little ", "len:offset=0,width=2,endian=le,adjust=0,includes_header=false"),
        ("len:adjust=+5,includes_header=true", "len:offset=0,width=4,endian=be,adjust=5,includes_header=true"),
        (
            "len:adjust=-9223372036854775808",
            "len:offset=0,width=4,endian=be,adjust=-9223372036854775808,includes_header=false",
        ),
        ("oncrpc", "oncrpc"),
        ("oncrpc:strip", "oncrpc:strip"),
        ("oncrpc:max_fragments=8", "oncrpc:max_fragments=8"),
        ("oncrpc:max_fragments=8,strip", "oncrpc:strip,max_fragments=8"),
        ("oncrpc:max_fragments=1024", "oncrpc"),
        ("9p", "9p"),
        ("thrift", "thrift"),
        ("http2", "http2"),
        ("kafka", "kafka"),
        ("memcached", "memcached"),
    ];
    let sample = rpc_null_call_3frags(1);
    for (spec, name) in cases {
        let p = from_spec(spec).unwrap_or_else(|e| panic!("{spec}: {e}"));
        assert_eq!(p.name(), name, "{spec}");
        let q = from_spec(name).unwrap();
        assert_eq!(q.name(), name, "{name} is a fixed point");
        // Same configuration, same answers.
        for l in [0, 3, 9, 30, sample.len()] {
            assert_eq!(from_spec(spec).unwrap().parse(&sample[..l]), from_spec(name).unwrap().parse(&sample[..l]));
        }
    }
    // The typed constructors give the same names.
    assert_eq!(LengthField::l4().name(), cases[0].1);
    assert_eq!(OncRpc::new(true).name(), "oncrpc:strip");
    assert_eq!(OncRpc::with_max_fragments(false, 3).name(), "oncrpc:max_fragments=3");
}

#[test]
fn spec_errors_are_typed_and_list_the_forms() {
    let err = |s: &str| from_spec(s).err().unwrap_or_else(|| panic!("{s} accepted"));
    assert_eq!(err(""), SpecError::Empty);
    assert_eq!(err("   "), SpecError::Empty);
    assert_eq!(err("bogus"), SpecError::UnknownKind { kind: "bogus".into() });
    assert_eq!(err("L4"), SpecError::UnknownKind { kind: "L4".into() });
    assert_eq!(err("9p:x"), SpecError::NoOptions { kind: "9p", options: "x".into() });
    assert_eq!(err("l4:"), SpecError::NoOptions { kind: "l4", options: "".into() });
    assert_eq!(err("len:foo=1"), SpecError::UnknownOption { kind: "len", option: "foo".into() });
    assert_eq!(err("len:"), SpecError::UnknownOption { kind: "len", option: "".into() });
    assert_eq!(err("len:width=2,,endian=le"), SpecError::UnknownOption { kind: "len", option: "".into() });
    assert_eq!(err("len:width=2,width=3"), SpecError::DuplicateOption { kind: "len", option: "width" });
    assert_eq!(err("oncrpc:strip,strip"), SpecError::DuplicateOption { kind: "oncrpc", option: "strip" });
    assert_eq!(err("oncrpc:strip=1"), SpecError::UnknownOption { kind: "oncrpc", option: "strip=1".into() });
    for (spec, option, value) in [
        ("len:width=9", "width", "9"),
        ("len:width=0", "width", "0"),
        ("len:width", "width", ""),
        ("len:endian=middle", "endian", "middle"),
        ("len:offset=65536", "offset", "65536"),
        ("len:offset=-1", "offset", "-1"),
        ("len:adjust=1.5", "adjust", "1.5"),
        ("len:adjust=9223372036854775808", "adjust", "9223372036854775808"),
        ("len:includes_header=yes", "includes_header", "yes"),
        ("oncrpc:max_fragments=0", "max_fragments", "0"),
        ("oncrpc:max_fragments", "max_fragments", ""),
    ] {
        match err(spec) {
            SpecError::BadValue { option: o, value: v, .. } => assert_eq!((o, v.as_str()), (option, value), "{spec}"),
            e => panic!("{spec}: {e:?}"),
        }
    }
    let msg = err("bogus").to_string();
    assert!(msg.contains(SPEC_FORMS), "{msg}");
    assert!(err("len:width=9").to_string().contains("1..=8"));
}

// ---- Hostile input -------------------------------------------------------

#[test]
fn random_bytes_never_panic() {
    let specs = [
        "l4",
        "len:offset=3,width=8,endian=le,adjust=-7,includes_header=true",
        "len:offset=1,width=3,adjust=9223372036854775807",
        "oncrpc",
        "oncrpc:strip,max_fragments=4",
        "9p",
        "thrift",
        "http2",
        "kafka",
        "memcached",
    ];
    let mut rng = StdRng::seed_from_u64(0x5eed);
    for spec in specs {
        // One instance per spec, reused: state carried between unrelated
        // buffers must not break it either.
        let mut p = from_spec(spec).unwrap();
        for i in 0..5_000 {
            let len = rng.gen_range(0..64);
            let mut buf: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
            if i % 3 == 0 && len >= 4 {
                // Small lengths and mark bits so that Length answers come up too.
                buf[..4].copy_from_slice(&[rng.gen_range(0..2) * 0x80, 0, 0, rng.gen_range(0..24)]);
            }
            match p.parse(&buf) {
                Parse::NeedMore(n) => assert!(n >= 1),
                Parse::Length(l) => {
                    assert!(l > 0);
                    if l <= buf.len() {
                        let _ = p.finish(Bytes::copy_from_slice(&buf[..l]));
                    }
                }
                Parse::Invalid(e) => assert_eq!(e.errno(), EPROTO),
            }
            let _ = p.finish(Bytes::copy_from_slice(&buf));
        }
    }
}

/// The ONC RPC parser's own `frame_batch` (one-fragment records in a tight
/// loop) frames exactly what the general loop does, on random mixes of
/// one-fragment, multi-fragment, empty and oversize records with a cut tail.
#[test]
fn oncrpc_frame_batch_agrees_with_the_general_loop() {
    let mut rng = StdRng::seed_from_u64(0x0c7c);
    for round in 0..2_000 {
        let mut wire = Vec::new();
        for _ in 0..rng.gen_range(0..12) {
            // Runs of one kind, as a client's calls come (the fast loop
            // takes a run's length from its first mark).
            for _ in 0..rng.gen_range(1..5) {
                match rng.gen_range(0..7) {
                    0 => wire.extend(rpc_null_call_3frags(rng.gen())),
                    1 => wire.extend(be32(&[0x8000_0000])), // an empty record
                    // An empty fragment that is not the last (its mark is 0).
                    2 if rng.gen_bool(0.5) => wire.extend(be32(&[0])),
                    2 => wire.extend(rpc_one_byte_fragments(&[1, 2, 3])),
                    3 => wire.extend(rpc_auth_sys_call(rng.gen_range(0..9))),
                    _ => wire.extend(rpc_null_call(rng.gen())),
                }
            }
        }
        if rng.gen_bool(0.3) {
            wire.extend(rpc_auth_sys_call(7));
        }
        let cut = rng.gen_range(0..=wire.len());
        let data = &wire[..cut];
        let strip = rng.gen_bool(0.5);
        let max_frags = rng.gen_range(1..5);
        let max_len = if rng.gen_bool(0.2) { 40 } else { 1 << 20 };
        let limit = rng.gen_range(1..40);
        let mut fast = OncRpc::with_max_fragments(strip, max_frags);
        let mut general = OncRpc::with_max_fragments(strip, max_frags);
        // Runs are appended to what the vector already holds, which stays.
        let held = vec![Run::whole(0, 4, 1); rng.gen_range(0..3)];
        let h = held.len();
        let (mut a, mut b) = (held.clone(), held.clone());
        let ta = fast.frame_batch(data, max_len, limit, &mut a);
        let tb = connmux_core::parser::frame_batch_with(&mut general, data, 0, max_len, limit, &mut b);
        assert_eq!(
            (ta, ranges(&a[h..])),
            (tb, ranges(&b[h..])),
            "round {round}: strip {strip}, max_fragments {max_frags}, max_len {max_len}, limit {limit}"
        );
        assert_eq!((&a[..h], &b[..h]), (&held[..], &held[..]));
    }
}

/// `LengthField`'s own loop for a 4-byte field at the front frames exactly
/// what the general loop does (`frame_batch_with`, the reference), on
/// random streams of valid, short, oversize and below-header lengths, for
/// every endianness, header inclusion and a spread of adjustments
/// (including ones that overflow), with random size and count limits.
#[test]
fn the_four_byte_loop_frames_as_the_general_one() {
    use connmux_core::parser::frame_batch_with;
    let mut rng = StdRng::seed_from_u64(0x4c46);
    let adjusts = [0i64, 3, -4, -8, 100, i64::MAX, i64::MIN, i64::MAX - 2];
    for round in 0..4000 {
        let endian = if rng.gen_bool(0.5) { Endian::Big } else { Endian::Little };
        let includes = rng.gen_bool(0.5);
        let adjust = adjusts[rng.gen_range(0..adjusts.len())];
        let mut p = LengthField::new(0, 4, endian, adjust, includes).unwrap();
        let mut data = Vec::new();
        for _ in 0..rng.gen_range(0..12) {
            let body = rng.gen_range(0..40u32);
            let field = match rng.gen_range(0..10) {
                0 => rng.gen::<u32>(),
                1 => rng.gen_range(0..8),
                _ => body.wrapping_add(if includes { 4 } else { 0 }).wrapping_sub(adjust as u32),
            };
            // Runs of one message, as a client's requests come (the loop
            // takes a run's length from its first field).
            for _ in 0..rng.gen_range(1..6) {
                data.extend(match endian {
                    Endian::Big => field.to_be_bytes(),
                    Endian::Little => field.to_le_bytes(),
                });
                data.extend((0..body).map(|i| i as u8));
            }
        }
        data.truncate(data.len() - rng.gen_range(0..=data.len().min(6)));
        let max_len = rng.gen_range(4..64);
        let limit = rng.gen_range(1..40);
        // Runs are appended to what the vector already holds, which stays.
        let held = vec![Run::whole(0, 4, 1); rng.gen_range(0..3)];
        let h = held.len();
        let (mut fast, mut general) = (held.clone(), held.clone());
        let took_fast = p.frame_batch(&data, max_len, limit, &mut fast);
        let took_general = frame_batch_with(&mut p, &data, 0, max_len, limit, &mut general);
        assert_eq!(
            (took_fast, ranges(&fast[h..])),
            (took_general, ranges(&general[h..])),
            "round {round}: {endian:?} {includes} {adjust}"
        );
        assert_eq!((&fast[..h], &general[..h]), (&held[..], &held[..]));
        // A run of equal messages is one run, not one per message.
        assert!(fast[h..].windows(2).all(|w| w[0].stride != w[1].stride || w[0].end() != w[1].at), "round {round}");
    }
}

/// A parser that says it delivers messages whole (`delivers_whole`: the
/// bytes a batch frames in place are counted as delivered without a sum
/// over its ranges) hands every message over uncut; one that cuts says not.
/// Every built-in parser that frames in place, on its captured messages.
#[test]
fn delivers_whole_is_true_exactly_where_nothing_is_cut() {
    let mut l4 = be32(&[5]);
    l4.extend_from_slice(b"hello");
    let cases: Vec<(&str, Vec<Vec<u8>>)> = vec![
        ("l4", vec![l4]),
        ("len:offset=2,width=2,endian=le", vec![vec![0xaa, 0xbb, 3, 0, 1, 2, 3]]),
        ("9p", ninep_version_exchange()),
        ("memcached", memcached_get()),
        ("kafka", vec![kafka_api_versions()]),
        ("thrift", vec![thrift_ping()]),
        ("oncrpc", vec![rpc_null_call(7), rpc_null_call_3frags(8)]),
        ("oncrpc:strip", vec![rpc_null_call(7), rpc_null_call_3frags(8)]),
    ];
    for (spec, msgs) in cases {
        let mut p = from_spec(spec).unwrap();
        assert!(p.frames_in_place(), "{spec}");
        let whole = msgs.iter().all(|m| {
            let mut out = Vec::new();
            assert_eq!(p.frame_batch(m, 1 << 20, 1, &mut out), m.len(), "{spec}: one whole message");
            p.finish_in_place(m) == Some(0..m.len())
        });
        assert_eq!(p.delivers_whole(), whole, "{spec}");
    }
}
