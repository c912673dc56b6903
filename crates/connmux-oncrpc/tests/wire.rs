//! The RPC bytes of ksf.md §2.4 (captured from rpctest and rpcinfo), every
//! reply the NULL service can send, and hostile input: typed errors, no panics.

use connmux_oncrpc::call::{AuthField, Call, CallHeader, Credential, HeaderError, MAX_CALL_HEADER_LEN};
use connmux_oncrpc::record::{encode_record, fragments, strip_marks, MarkError, RecordError, RecordLimits};
use connmux_oncrpc::*;

/// Big-endian words to bytes.
fn words(w: &[u32]) -> Vec<u8> {
    w.iter().flat_map(|x| x.to_be_bytes()).collect()
}

/// The 44-byte AUTH_NONE NULL call of ksf.md §2.4 (xid = sequence number n).
fn capture_null_call(xid: u32) -> Vec<u8> {
    words(&[0x8000_0028, xid, 0, 2, 0x186a3, 3, 0, 0, 0, 0, 0])
}

/// The 28-byte reply of ksf.md §2.4.
fn capture_reply(xid: u32) -> Vec<u8> {
    words(&[0x8000_0018, xid, 1, 0, 0, 0, 0])
}

/// Small deterministic generator (xorshift64*), so the random tests need no
/// dependency and replay exactly.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

#[test]
fn null_call_is_byte_exact_with_the_capture() {
    for xid in [0, 1, 2, 0xdead_beef] {
        let mut out = Vec::new();
        encode_null_call(xid, 100003, 3, 1, &mut out);
        assert_eq!(out, capture_null_call(xid));
    }
}

#[test]
fn three_fragment_call_is_rpctest_dash_f() {
    let mut out = Vec::new();
    encode_null_call(5, 100003, 3, 3, &mut out);
    let body = &capture_null_call(5)[4..];
    let mut want = words(&[1]);
    want.push(body[0]);
    want.extend_from_slice(&words(&[38]));
    want.extend_from_slice(&body[1..39]);
    want.extend_from_slice(&words(&[0x8000_0001]));
    want.push(body[39]);
    assert_eq!(out.len(), 52);
    assert_eq!(out, want);
}

#[test]
fn auth_sys_call_matches_the_capture_layout() {
    let call = Call {
        xid: 3,
        prog: 100003,
        vers: 3,
        procedure: 0,
        cred: Credential::Sys { stamp: 0x1234, machine_name: b"vm", uid: 65534, gid: 65534, gids: &[] },
        args: &[],
    };
    let mut out = Vec::new();
    call.encode(1, &mut out).unwrap();
    let mut want = words(&[0x8000_0040, 3, 0, 2, 100003, 3, 0, 1, 24, 0x1234, 2]);
    want.extend_from_slice(b"vm\0\0");
    want.extend_from_slice(&words(&[65534, 65534, 0, 0, 0]));
    assert_eq!(out, want);
    let mut reply = Vec::new();
    assert_eq!(Registry::default().handle_marked(&out, &mut reply), Outcome::Replied { xid: 3, reply: Reply::Success });
    assert_eq!(reply, capture_reply(3));
}

#[test]
fn success_reply_is_byte_exact_and_checks() {
    let mut out = Vec::new();
    encode_reply(42, &Reply::Success, &mut out);
    assert_eq!(out, capture_reply(42));
    assert_eq!(check_reply(&out[4..], Some(42)), Ok(42));
    assert_eq!(check_reply(&out[4..], None), Ok(42));
    assert_eq!(check_reply(&out[4..], Some(41)), Err(ReplyError::XidMismatch { expected: 41, got: 42 }));
}

#[test]
fn call_header_view_fields() {
    let c = capture_null_call(0x0102_0304);
    let h = CallHeader::new_checked(&c[4..]).unwrap();
    assert_eq!(h.xid(), 0x0102_0304);
    assert_eq!(h.program(), Program::NFS);
    assert_eq!(h.version(), 3);
    assert_eq!(h.procedure(), 0);
    assert_eq!(h.cred(), OpaqueAuth { flavor: AuthFlavor::AUTH_NONE, body: &[] });
    assert_eq!(h.verf(), OpaqueAuth { flavor: AuthFlavor::AUTH_NONE, body: &[] });
    assert_eq!(h.header_len(), 40);
    assert!(h.args().is_empty());
}

/// Runs `handle` on `body` and `handle_marked` on `body` cut in 1, 3 and 7
/// fragments; all must agree. Returns the outcome and the reply bytes.
fn serve(reg: &Registry, body: &[u8]) -> (Outcome, Vec<u8>) {
    let mut out = Vec::new();
    let outcome = reg.handle(body, &mut out);
    for k in [1, 3, 7] {
        let mut marked = Vec::new();
        encode_record(body, k, &mut marked);
        let mut out2 = Vec::new();
        assert_eq!(reg.handle_marked(&marked, &mut out2), outcome, "k={k}");
        assert_eq!(out2, out, "k={k}");
    }
    match &outcome {
        Outcome::Replied { xid, reply } => {
            let d = decode_reply(&out[4..]).unwrap();
            assert_eq!((d.xid, d.reply), (*xid, *reply));
            assert_eq!(out.len(), 4 + reply.body_len());
        }
        Outcome::CloseConnection(_) => assert!(out.is_empty()),
    }
    (outcome, out)
}

fn call_body(xid: u32, rpcvers: u32, prog: u32, vers: u32, procedure: u32, tail: &[u32]) -> Vec<u8> {
    let mut w = vec![xid, 0, rpcvers, prog, vers, procedure];
    w.extend_from_slice(tail);
    words(&w)
}

fn replied(o: Outcome) -> Reply {
    match o {
        Outcome::Replied { reply, .. } => reply,
        Outcome::CloseConnection(r) => panic!("closed: {r}"),
    }
}

#[test]
fn every_reply_kind_from_the_service() {
    let reg = Registry::default();
    let none = [0, 0, 0, 0];
    let ok = call_body(1, 2, 100003, 3, 0, &none);
    assert_eq!(replied(serve(&reg, &ok).0), Reply::Success);
    assert_eq!(replied(serve(&reg, &call_body(1, 2, 100003, 4, 0, &none)).0), Reply::Success);
    assert_eq!(replied(serve(&reg, &call_body(1, 2, 100005, 3, 0, &none)).0), Reply::ProgUnavail);
    assert_eq!(replied(serve(&reg, &call_body(1, 2, 100003, 2, 0, &none)).0), Reply::ProgMismatch { low: 3, high: 4 });
    assert_eq!(replied(serve(&reg, &call_body(1, 2, 100003, 5, 0, &none)).0), Reply::ProgMismatch { low: 3, high: 4 });
    assert_eq!(replied(serve(&reg, &call_body(1, 2, 100003, 3, 1, &none)).0), Reply::ProcUnavail);
    assert_eq!(replied(serve(&reg, &call_body(9, 3, 100003, 3, 0, &none)).0), Reply::RpcMismatch { low: 2, high: 2 });
    // RPC_MISMATCH needs only xid, type and version: the rest may be absent.
    assert_eq!(replied(serve(&reg, &words(&[9, 0, 1])).0), Reply::RpcMismatch { low: 2, high: 2 });

    // NULL with argument bytes: krpc2's SUCCESS by default, GARBAGE_ARGS when strict.
    let with_args = call_body(1, 2, 100003, 3, 0, &[0, 0, 0, 0, 7]);
    assert_eq!(replied(serve(&reg, &with_args).0), Reply::Success);
    let mut strict = Registry::default();
    strict.set_strict_null_args(true);
    assert_eq!(replied(serve(&strict, &with_args).0), Reply::GarbageArgs);
    assert_eq!(replied(serve(&strict, &ok).0), Reply::Success);
}

#[test]
fn auth_answers() {
    let reg = Registry::default();
    // RPCSEC_GSS credential: unsupported flavour.
    let gss = call_body(1, 2, 100003, 3, 0, &[6, 4, 0xabcd, 0, 0]);
    assert_eq!(replied(serve(&reg, &gss).0), Reply::AuthError(AuthStat::AUTH_REJECTEDCRED));
    // AUTH_SYS whose body does not decode (name length 300 > 255).
    let bad_sys = call_body(1, 2, 100003, 3, 0, &[1, 8, 0, 300, 0, 0]);
    assert_eq!(replied(serve(&reg, &bad_sys).0), Reply::AuthError(AuthStat::AUTH_BADCRED));
    // Verifier not AUTH_NONE.
    let verf = call_body(1, 2, 100003, 3, 0, &[0, 0, 1, 0]);
    assert_eq!(replied(serve(&reg, &verf).0), Reply::AuthError(AuthStat::AUTH_BADVERF));
    // Credential body over 400 bytes, present in full or not.
    let mut long = call_body(1, 2, 100003, 3, 0, &[0, 404]);
    long.resize(long.len() + 404 + 8, 0);
    assert_eq!(replied(serve(&reg, &long).0), Reply::AuthError(AuthStat::AUTH_BADCRED));
    assert_eq!(
        replied(serve(&reg, &call_body(1, 2, 100003, 3, 0, &[0, 401])).0),
        Reply::AuthError(AuthStat::AUTH_BADCRED)
    );
    let long_verf = call_body(1, 2, 100003, 3, 0, &[0, 0, 0, 0x7fff_ffff]);
    assert_eq!(replied(serve(&reg, &long_verf).0), Reply::AuthError(AuthStat::AUTH_BADVERF));
    // AUTH_NONE with a body: contents undefined by RFC 5531 §10.1, accepted.
    let none_body = call_body(1, 2, 100003, 3, 0, &[0, 4, 0x55, 0, 0]);
    assert_eq!(replied(serve(&reg, &none_body).0), Reply::Success);
    // Auth is checked before the program.
    let gss_unknown = call_body(1, 2, 7, 3, 0, &[6, 0, 0, 0]);
    assert_eq!(replied(serve(&reg, &gss_unknown).0), Reply::AuthError(AuthStat::AUTH_REJECTEDCRED));
}

#[test]
fn largest_header_survives_one_byte_fragments() {
    // AUTH_SYS with a 255-byte name and 16 groups, verifier AUTH_NONE with a
    // 400-byte body: a header near MAX_CALL_HEADER_LEN, cut into 1-byte fragments.
    let name = [b'n'; 255];
    let gids = [7u32; 16];
    let call = Call {
        xid: 77,
        prog: 100003,
        vers: 4,
        procedure: 0,
        cred: Credential::Sys { stamp: 1, machine_name: &name, uid: 1, gid: 2, gids: &gids },
        args: &[],
    };
    let mut marked = Vec::new();
    call.encode(1, &mut marked).unwrap();
    let mut body = Vec::new();
    strip_marks(&marked, &mut body).unwrap();
    // Swap the empty verifier for a 400-byte AUTH_NONE one, then add 1000 argument bytes.
    body.truncate(body.len() - 8);
    body.extend_from_slice(&words(&[0, 400]));
    body.extend_from_slice(&[0xee; 400]);
    let header_len = body.len();
    assert!(header_len <= MAX_CALL_HEADER_LEN && header_len > 700);
    body.extend_from_slice(&[1; 1000]);
    let mut one_byte = Vec::new();
    encode_record(&body, body.len(), &mut one_byte);
    assert_eq!(one_byte.len(), 5 * body.len());
    let mut out = Vec::new();
    let reg = Registry::default();
    assert_eq!(reg.handle_marked(&one_byte, &mut out), Outcome::Replied { xid: 77, reply: Reply::Success });
    let mut strict = reg.clone();
    strict.set_strict_null_args(true);
    let mut out = Vec::new();
    assert_eq!(strict.handle_marked(&one_byte, &mut out), Outcome::Replied { xid: 77, reply: Reply::GarbageArgs });
    assert_eq!(CallHeader::new_checked(&body).unwrap().args().len(), 1000);
}

#[test]
fn garbage_closes_the_connection() {
    let reg = Registry::default();
    // A reply is not a call.
    let (o, _) = serve(&reg, &capture_reply(1)[4..]);
    assert_eq!(
        o,
        Outcome::CloseConnection(CloseReason::Header(HeaderError::NotACall { xid: 1, msg_type: MsgType::REPLY }))
    );
    // Every strict prefix of the NULL call is a truncation (those of ≥ 12
    // bytes read rpcvers 2, so no RPC_MISMATCH either).
    let c = capture_null_call(1);
    for n in 0..40 {
        let (o, _) = serve(&reg, &c[4..4 + n]);
        assert!(
            matches!(o, Outcome::CloseConnection(CloseReason::Header(HeaderError::Truncated { .. }))),
            "{n}: {o:?}"
        );
    }
    // Credential length pointing past the end.
    let (o, _) = serve(&reg, &call_body(1, 2, 100003, 3, 0, &[0, 8, 0]));
    assert_eq!(o, Outcome::CloseConnection(CloseReason::Header(HeaderError::Truncated { need: 40, have: 36 })));
    // Bad marks around a good call.
    let mut o = Vec::new();
    let bad_marks: [(&[u8], MarkError); 4] = [
        (&c[..43], MarkError::TruncatedFragment { at: 0, len: 40, have: 43 }),
        (&[0x80, 0, 0], MarkError::TruncatedMark { at: 0 }),
        (&[], MarkError::MissingLastFragment),
        (&[&c[..], &[0]].concat(), MarkError::TrailingBytes { extra: 1 }),
    ];
    for (bytes, e) in bad_marks {
        assert_eq!(reg.handle_marked(bytes, &mut o), Outcome::CloseConnection(CloseReason::Marks(e)));
    }
    let mut not_last = c.clone();
    not_last[0] = 0;
    assert_eq!(
        reg.handle_marked(&not_last, &mut o),
        Outcome::CloseConnection(CloseReason::Marks(MarkError::MissingLastFragment))
    );
    assert!(o.is_empty());
}

#[test]
fn registry_configuration() {
    let mut reg = Registry::new();
    let call = |prog, vers| call_body(1, 2, prog, vers, 0, &[0, 0, 0, 0]);
    assert_eq!(replied(serve(&reg, &call(100003, 3)).0), Reply::ProgUnavail);
    reg.register(100005, 1, 3).unwrap();
    assert_eq!(replied(serve(&reg, &call(100005, 3)).0), Reply::Success);
    reg.register(100005, 2, 2).unwrap();
    assert_eq!(reg.versions(100005), Some((2, 2)));
    assert_eq!(replied(serve(&reg, &call(100005, 3)).0), Reply::ProgMismatch { low: 2, high: 2 });
    assert!(reg.register(1, 5, 4).is_err());
    assert!(reg.unregister(100005));
    assert!(!reg.unregister(100005));
    assert_eq!(replied(serve(&reg, &call(100005, 2)).0), Reply::ProgUnavail);
    let any = Registry::any_program();
    assert_eq!(replied(serve(&any, &call(4242, 99)).0), Reply::Success);
    assert_eq!(replied(serve(&any, &call_body(1, 2, 4242, 1, 3, &[0, 0, 0, 0])).0), Reply::ProcUnavail);
}

#[test]
fn check_reply_names_each_refusal() {
    let cases = [
        Reply::ProgUnavail,
        Reply::ProgMismatch { low: 3, high: 4 },
        Reply::ProcUnavail,
        Reply::GarbageArgs,
        Reply::SystemErr,
        Reply::RpcMismatch { low: 2, high: 2 },
        Reply::AuthError(AuthStat::AUTH_TOOWEAK),
    ];
    for r in cases {
        let mut out = Vec::new();
        encode_reply(8, &r, &mut out);
        assert_eq!(check_reply(&out[4..], Some(8)), Err(ReplyError::NotSuccess { xid: 8, reply: r }));
        // A refusal for another call reads as an xid mismatch.
        assert_eq!(check_reply(&out[4..], Some(9)), Err(ReplyError::XidMismatch { expected: 9, got: 8 }));
    }
    let err = |w: &[u32]| check_reply(&words(w), None).unwrap_err();
    assert_eq!(err(&[8, 0, 0]), ReplyError::NotAReply { xid: 8, msg_type: MsgType::CALL });
    assert_eq!(err(&[8, 1, 2]), ReplyError::UnknownReplyStat { xid: 8, stat: ReplyStat(2) });
    assert_eq!(err(&[8, 1, 0, 0, 0, 6]), ReplyError::UnknownAcceptStat { xid: 8, stat: AcceptStat(6) });
    assert_eq!(err(&[8, 1, 1, 2]), ReplyError::UnknownRejectStat { xid: 8, stat: RejectStat(2) });
    assert_eq!(err(&[8, 1, 0, 0, 401]), ReplyError::VerifierTooLong { xid: 8, len: 401 });
    assert_eq!(err(&[8, 1, 0, 0, 0, 0, 5]), ReplyError::TrailingBytes { xid: 8, len: 4 });
    assert_eq!(err(&[8, 1, 0, 0, 8, 1]), ReplyError::Truncated { need: 28, have: 24 });
    assert_eq!(err(&[8, 1, 0, 0, 0, 2, 3]), ReplyError::Truncated { need: 32, have: 28 });
    // A reply with a non-empty verifier (e.g. from an AUTH_SHORT server) is fine.
    assert_eq!(check_reply(&words(&[8, 1, 0, 2, 4, 0xaa, 0]), Some(8)), Ok(8));
}

#[test]
fn header_errors_are_typed() {
    let e = |w: &[u32]| CallHeader::new_checked(&words(w)).unwrap_err();
    assert_eq!(e(&[1]), HeaderError::Truncated { need: 8, have: 4 });
    assert_eq!(e(&[1, 0]), HeaderError::Truncated { need: 12, have: 8 });
    assert_eq!(e(&[1, 0, 2, 3, 4, 5, 0]), HeaderError::Truncated { need: 32, have: 28 });
    assert_eq!(e(&[1, 0, 2, 3, 4, 5, 0, 500]), HeaderError::AuthTooLong { xid: 1, which: AuthField::Cred, len: 500 });
    assert_eq!(
        e(&[1, 0, 2, 3, 4, 5, 0, 0, 0, 401]),
        HeaderError::AuthTooLong { xid: 1, which: AuthField::Verf, len: 401 }
    );
    assert_eq!(e(&[1, 7]), HeaderError::NotACall { xid: 1, msg_type: MsgType(7) });
}

#[test]
fn reader_reassembles_replies_split_anywhere() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut wire = Vec::new();
    let mut want = Vec::new();
    for xid in 0..300u32 {
        let mut body = Vec::new();
        let r = if xid % 5 == 0 { Reply::ProgMismatch { low: 3, high: 4 } } else { Reply::Success };
        connmux_oncrpc::reply::encode_reply_body(xid, &r, &mut body);
        encode_record(&body, 1 + rng.below(6), &mut wire);
        want.push(body);
    }
    for round in 0..20 {
        let mut r = RecordReader::new(RecordLimits::default());
        let mut got = Vec::new();
        let mut pos = 0;
        while pos < wire.len() {
            let n = if round == 0 { 1 } else { 1 + rng.below(97) };
            let end = (pos + n).min(wire.len());
            r.push(&wire[pos..end]);
            pos = end;
            while let Some(rec) = r.next_record().unwrap() {
                got.push(rec.to_vec());
            }
            // Bounded: at most one partial record (≤ 32 + 4×6 bytes) plus a chunk.
            assert!(r.buffered() <= 56 + 97, "{}", r.buffered());
        }
        assert_eq!(got, want, "round {round}");
        for (xid, rec) in got.iter().enumerate() {
            let res = check_reply(rec, Some(xid as u32));
            if xid % 5 == 0 {
                assert!(matches!(res, Err(ReplyError::NotSuccess { .. })));
            } else {
                assert_eq!(res, Ok(xid as u32));
            }
        }
    }
}

#[test]
fn reader_refuses_oversized_and_fragment_floods() {
    let mut r = RecordReader::new(RecordLimits { max_record_len: 100, max_fragments: 4 });
    // Refused from the marks alone, before the body arrives.
    r.push(&words(&[50]));
    r.push(&[0; 50]);
    assert_eq!(r.next_record(), Ok(None));
    r.push(&words(&[0x8000_0051]));
    assert_eq!(r.next_record(), Err(RecordError::TooLarge { len: 131, max: 100 }));
    assert_eq!(r.buffered(), 58);
    let mut r = RecordReader::new(RecordLimits { max_record_len: 100, max_fragments: 4 });
    r.push(&words(&[0x7fff_ffff]));
    assert_eq!(r.next_record(), Err(RecordError::TooLarge { len: 0x7fff_ffff, max: 100 }));
    let mut r = RecordReader::new(RecordLimits { max_record_len: 100, max_fragments: 4 });
    r.push(&words(&[0, 0, 0, 0, 0x8000_0000]));
    assert_eq!(r.next_record(), Err(RecordError::TooManyFragments { max: 4 }));
}

#[test]
fn random_bytes_never_panic() {
    let mut rng = Rng(12345);
    let reg = Registry::default();
    let base = capture_null_call(1);
    let mut out = Vec::new();
    for i in 0..20_000 {
        // Half pure noise, half a valid call with a few bytes changed.
        let mut b: Vec<u8> = if i % 2 == 0 {
            let len = rng.below(120);
            (0..len).map(|_| rng.next() as u8).collect()
        } else {
            let mut b = base.clone();
            for _ in 0..1 + rng.below(3) {
                let at = rng.below(b.len());
                b[at] = if rng.below(2) == 0 { rng.next() as u8 } else { [0, 1, 0x80, 0xff][rng.below(4)] };
            }
            b.truncate(rng.below(b.len() + 1));
            b
        };
        out.clear();
        let _ = reg.handle_marked(&b, &mut out);
        let body = b.get(4..).unwrap_or(&[]);
        // handle and handle_marked agree on any body, whatever the fragmentation.
        let (o1, r1) = serve(&reg, body);
        if let Outcome::Replied { .. } = o1 {
            assert!(r1.len() <= 36);
        }
        let _ = CallHeader::new_checked(&b);
        let _ = decode_reply(&b);
        let _ = check_reply(&b, Some(1));
        let _ = AuthSysParams::parse(&b);
        let _ = fragments(&b).count();
        let mut r = RecordReader::new(RecordLimits { max_record_len: 64, max_fragments: 8 });
        b.push(0);
        r.push(&b);
        for _ in 0..b.len() {
            match r.next_record() {
                Ok(Some(_)) => {}
                _ => break,
            }
        }
    }
}

/// The fast path answers the common NULL call with the bytes of ksf.md §2.4,
/// and anything it answers is answered alike by the decoding path (`handle`
/// on the record without its mark never takes the fast path).
#[test]
fn null_fast_matches_the_decoding_path() {
    let reg = Registry::default();
    assert_eq!(reg.null_fast(&capture_null_call(0x0102_0304)).map(|r| r.to_vec()), Some(capture_reply(0x0102_0304)));
    // Version 4 is served, 5 is not; program 100005 is not registered.
    assert!(reg.null_fast(&words(&[0x8000_0028, 9, 0, 2, 100003, 4, 0, 0, 0, 0, 0])).is_some());
    for declined in [
        words(&[0x8000_0028, 9, 0, 2, 100003, 5, 0, 0, 0, 0, 0]), // PROG_MISMATCH
        words(&[0x8000_0028, 9, 0, 2, 100005, 3, 0, 0, 0, 0, 0]), // PROG_UNAVAIL
        words(&[0x8000_0028, 9, 0, 2, 100003, 3, 1, 0, 0, 0, 0]), // PROC_UNAVAIL
        words(&[0x8000_0028, 9, 0, 3, 100003, 3, 0, 0, 0, 0, 0]), // RPC_MISMATCH
        words(&[0x8000_0028, 9, 1, 2, 100003, 3, 0, 0, 0, 0, 0]), // a reply
        words(&[0x0000_0028, 9, 0, 2, 100003, 3, 0, 0, 0, 0, 0]), // not the last fragment
        words(&[0x8000_002c, 9, 0, 2, 100003, 3, 0, 1, 0, 0, 0]), // AUTH_SYS: decoded the long way
        words(&[0x8000_0028, 9, 0, 2, 100003, 3, 0, 0, 4, 0, 0]), // a credential body
        words(&[0x8000_0028, 9, 0, 2, 100003, 3, 0, 0, 0, 6, 0]), // a verifier flavor
        words(&[0x8000_0028, 9, 0, 2, 100003, 3, 0, 0, 0, 0, 8]), // a verifier body
        words(&[0x8000_0024, 9, 0, 2, 100003, 3, 0, 0, 0, 0]),    // truncated
    ] {
        assert_eq!(reg.null_fast(&declined), None, "{declined:02x?}");
    }
    // Arguments: answered SUCCESS unless strict, as the decoding path does.
    let with_args = words(&[0x8000_002c, 9, 0, 2, 100003, 3, 0, 0, 0, 0, 0, 7]);
    assert!(reg.null_fast(&with_args).is_some());
    let mut strict = Registry::default();
    strict.set_strict_null_args(true);
    assert_eq!(strict.null_fast(&with_args), None);
    assert!(Registry::any_program().null_fast(&words(&[0x8000_0028, 9, 0, 2, 7, 99, 0, 0, 0, 0, 0])).is_some());

    // Random single-word changes to a call: whenever the fast path answers,
    // the decoding path answers SUCCESS with the same bytes.
    let mut rng = Rng(99);
    let mut answered = 0;
    for _ in 0..20_000 {
        let mut b = capture_null_call(rng.next() as u32);
        if rng.below(4) != 0 {
            let at = 4 * rng.below(b.len() / 4);
            let v: u32 = [0, 1, 2, 3, 4, 100003, 0x8000_0028, rng.next() as u32][rng.below(8)];
            b[at..at + 4].copy_from_slice(&v.to_be_bytes());
        }
        let mut slow = Vec::new();
        let slow_outcome = reg.handle(&b[4..], &mut slow);
        if let Some(fast) = reg.null_fast(&b) {
            answered += 1;
            assert!(matches!(slow_outcome, Outcome::Replied { reply: Reply::Success, .. }), "{b:02x?}");
            assert_eq!(&fast[..], &slow[..], "{b:02x?}");
        }
        // Where the mark is intact, handle_marked (which tries the fast path
        // first) says and writes what the decoding path does.
        if b[..4] == 0x8000_0028u32.to_be_bytes() {
            let mut marked = Vec::new();
            assert_eq!(reg.handle_marked(&b, &mut marked), slow_outcome.clone());
            assert_eq!(marked, slow);
            // And so does the variant without the fast path.
            let mut decoded = Vec::new();
            assert_eq!(reg.handle_marked_decoded(&b, &mut decoded), slow_outcome.clone());
            assert_eq!(decoded, slow);
        }
    }
    assert!(answered > 1000, "the fast path answered only {answered} calls");
}

/// The records `ranges` of `data` are, as `null_fast_run` takes them.
fn recs<'a>(data: &'a [u8], ranges: &'a [std::ops::Range<usize>]) -> impl ExactSizeIterator<Item = &'a [u8]> + 'a {
    ranges.iter().map(move |r| &data[r.clone()])
}

/// `null_fast_run` answers the leading NULL calls of a run exactly as
/// `null_fast` does one by one, and stops at the first record it declines.
#[test]
fn null_fast_run_answers_the_leading_null_calls() {
    let reg = Registry::default();
    let mut data = Vec::new();
    let mut ranges = Vec::new();
    let mut push = |rec: Vec<u8>, data: &mut Vec<u8>| {
        ranges.push(data.len()..data.len() + rec.len());
        data.extend(rec);
    };
    for xid in 1..=3 {
        push(capture_null_call(xid), &mut data);
    }
    push(words(&[0x8000_0028, 9, 0, 2, 100003, 3, 1, 0, 0, 0, 0]), &mut data); // PROC_UNAVAIL
    push(capture_null_call(5), &mut data);
    let mut out = bytes::BytesMut::new();
    assert_eq!(reg.null_fast_run(recs(&data, &ranges), &mut out), 3);
    let want: Vec<u8> = (1..=3).flat_map(capture_reply).collect();
    assert_eq!(&out[..], &want[..]);
    // From the declined record on: nothing; after it, the next call.
    assert_eq!(reg.null_fast_run(recs(&data, &ranges[3..]), &mut out), 0);
    assert_eq!(reg.null_fast_run(recs(&data, &ranges[4..]), &mut out), 1);
    assert_eq!(&out[want.len()..], &capture_reply(5)[..]);
    // The program and version are checked on every change within a run:
    // v3, v4 (served), then v5 (not).
    let mut d2 = Vec::new();
    let mut r2 = Vec::new();
    for vers in [3, 3, 4, 4, 5, 3] {
        let rec = words(&[0x8000_0028, vers, 0, 2, 100003, vers, 0, 0, 0, 0, 0]);
        r2.push(d2.len()..d2.len() + rec.len());
        d2.extend(rec);
    }
    let mut o2 = bytes::BytesMut::new();
    assert_eq!(reg.null_fast_run(recs(&d2, &r2), &mut o2), 4);
    let each: Vec<u8> = r2[..4].iter().flat_map(|r| reg.null_fast(&d2[r.clone()]).unwrap()).collect();
    assert_eq!(&o2[..], &each[..]);
    assert_eq!(reg.null_fast_run(recs(&d2, &r2[5..]), &mut o2), 1);
    // A record that is not a whole call ends the run too (one alone, or
    // the first of several), and no records answer nothing.
    assert_eq!(reg.null_fast_run([&data[..10]], &mut out), 0);
    assert_eq!(reg.null_fast_run([&data[..10], &data[ranges[0].clone()]], &mut out), 0);
    assert_eq!(reg.null_fast_run(std::iter::empty::<&[u8]>(), &mut out), 0);
    // Equal records end to end, as a run of a read gives them.
    let same: Vec<u8> = (1..=3).flat_map(capture_null_call).collect();
    let mut o3 = bytes::BytesMut::new();
    assert_eq!(reg.null_fast_run(same.chunks_exact(same.len() / 3), &mut o3), 3);
    assert_eq!(&o3[..], &want[..]);
}

/// Runs longer than the block of replies `null_fast_run` appends at once:
/// every reply exact, and a record declined in a later block leaves only the
/// replies before it.
#[test]
fn null_fast_run_spans_blocks_and_cuts_back_at_a_decline() {
    let reg = Registry::default();
    for (calls, bad_at) in
        [(100usize, None), (100, Some(0)), (100, Some(31)), (100, Some(32)), (100, Some(70)), (33, Some(32))]
    {
        let mut data = Vec::new();
        let mut ranges = Vec::new();
        for i in 0..calls {
            let rec = if Some(i) == bad_at {
                words(&[0x8000_0028, i as u32, 0, 2, 100003, 3, 1, 0, 0, 0, 0]) // PROC_UNAVAIL
            } else {
                capture_null_call(1000 + i as u32)
            };
            ranges.push(data.len()..data.len() + rec.len());
            data.extend(rec);
        }
        let mut out = bytes::BytesMut::from(&b"before"[..]);
        let answered = reg.null_fast_run(recs(&data, &ranges), &mut out);
        let want_n = bad_at.unwrap_or(calls);
        assert_eq!(answered, want_n, "{calls} calls, bad at {bad_at:?}");
        let mut want = b"before".to_vec();
        want.extend((0..want_n).flat_map(|i| capture_reply(1000 + i as u32)));
        assert_eq!(&out[..], &want[..], "{calls} calls, bad at {bad_at:?}");
    }
}

/// A run under the strict argument rule stops at the first NULL call that
/// carries arguments (answered GARBAGE_ARGS the general way); without the
/// rule the same run is answered whole.
#[test]
fn null_fast_run_keeps_the_argument_rule() {
    let mut data = Vec::new();
    let mut ranges = Vec::new();
    for i in 0..40u32 {
        let rec = if i == 35 {
            words(&[0x8000_002c, i, 0, 2, 100003, 3, 0, 0, 0, 0, 0, 7]) // one argument word
        } else {
            capture_null_call(i)
        };
        ranges.push(data.len()..data.len() + rec.len());
        data.extend(rec);
    }
    let lenient = Registry::default();
    let mut out = bytes::BytesMut::new();
    assert_eq!(lenient.null_fast_run(recs(&data, &ranges), &mut out), 40);
    let each: Vec<u8> = ranges.iter().flat_map(|r| lenient.null_fast(&data[r.clone()]).unwrap()).collect();
    assert_eq!(&out[..], &each[..]);
    let mut strict = Registry::default();
    strict.set_strict_null_args(true);
    let mut out = bytes::BytesMut::new();
    assert_eq!(strict.null_fast_run(recs(&data, &ranges), &mut out), 35);
    assert_eq!(&out[..], &each[..35 * 28]);
    assert_eq!(strict.null_fast_run(recs(&data, &ranges[35..]), &mut out), 0);
    assert_eq!(strict.null_fast_run(recs(&data, &ranges[36..]), &mut out), 4);
}

#[test]
fn a_datagram_is_answered_unmarked_and_a_marked_or_broken_one_dropped() {
    let reg = Registry::default();
    let marked = capture_null_call(9);
    let call = &marked[4..];
    // The NULL call, fast: the record's reply without its mark.
    let mut out = Vec::new();
    assert_eq!(reg.handle_datagram(call, &mut out), Outcome::Replied { xid: 9, reply: Reply::Success });
    let mut want = Vec::new();
    reg.handle_marked(&marked, &mut want);
    assert_eq!(out, want[4..]);
    assert_eq!(reg.null_fast_datagram(call).unwrap()[..], want[4..]);
    // Decoded: an AUTH_SYS call, and a refusal, each unmarked.
    // AUTH_SYS: stamp, empty machine name, uid, gid, no groups; AUTH_NONE verifier.
    let sys = call_body(10, 2, 100003, 3, 0, &[1, 20, 0, 0, 0, 0, 0, 0, 0]);
    for (body, reply) in [(&sys, Reply::Success), (&call_body(11, 2, 100099, 1, 0, &[0, 0, 0, 0]), Reply::ProgUnavail)]
    {
        let mut out = Vec::new();
        let o = reg.handle_datagram(body, &mut out);
        let Outcome::Replied { xid, reply: r } = o else { panic!("{o:?}") };
        assert_eq!(r, reply);
        let mut want = Vec::new();
        reg.handle(body, &mut want);
        assert_eq!(out, want[4..], "xid {xid}");
    }
    // A record mark in a datagram: dropped, for any xid (0 included).
    for xid in [0, 1, 0x8000_0028] {
        let mut out = Vec::new();
        assert_eq!(
            reg.handle_datagram(&capture_null_call(xid), &mut out),
            Outcome::CloseConnection(CloseReason::MarkedDatagram),
            "xid {xid:#x}"
        );
        assert!(out.is_empty());
    }
    // An unmarked call whose xid looks like a mark is still a call.
    let mut tricky = marked[4..].to_vec();
    let fake_mark = 0x8000_0000u32 | (tricky.len() as u32 - 4);
    tricky[..4].copy_from_slice(&fake_mark.to_be_bytes());
    assert!(matches!(reg.handle_datagram(&tricky, &mut Vec::new()), Outcome::Replied { reply: Reply::Success, .. }));
    // Every truncation of the call, and a reply: dropped, nothing written.
    for n in 0..call.len() {
        let mut out = Vec::new();
        assert!(matches!(reg.handle_datagram(&call[..n], &mut out), Outcome::CloseConnection(_)), "{n}");
        assert!(out.is_empty());
    }
    assert!(matches!(reg.handle_datagram(&capture_reply(1)[4..], &mut Vec::new()), Outcome::CloseConnection(_)));
}
