//! The NULL-procedure service as a pure function: one call record in, the
//! record-marked reply appended to the caller's buffer, or "close the
//! connection" when the bytes are not a call at all.
//!
//! Decisions, in the order a call meets them (the order of the Sun/TI-RPC
//! `svc_getreq` dispatcher: header, authentication, program, procedure):
//!
//! | input | answer |
//! |---|---|
//! | fewer bytes than the header declares, or `msg_type` ≠ CALL | close the connection ([`CloseReason`]) |
//! | `rpcvers` ≠ 2 | MSG_DENIED RPC_MISMATCH(2, 2) |
//! | credential or verifier body > 400 bytes | AUTH_ERROR AUTH_BADCRED / AUTH_BADVERF |
//! | credential AUTH_NONE | accepted, body ignored (RFC 5531 §10.1: its contents are undefined) |
//! | credential AUTH_SYS that does not decode exactly | AUTH_ERROR AUTH_BADCRED |
//! | any other credential flavour | AUTH_ERROR AUTH_REJECTEDCRED (Sun/TI-RPC/FreeBSD; Linux says AUTH_BADCRED) |
//! | verifier flavour ≠ AUTH_NONE | AUTH_ERROR AUTH_BADVERF (Linux's check) |
//! | program not registered | PROG_UNAVAIL |
//! | version outside the registered range | PROG_MISMATCH(low, high) |
//! | procedure ≠ 0 | PROC_UNAVAIL |
//! | procedure 0 | SUCCESS, void results |
//!
//! NULL with non-empty arguments: answered SUCCESS, the bytes ignored. That is
//! what krpc2 does (ksf.md §1.6: it never looks at the arguments), and what the
//! TI-RPC and Linux dispatchers do in practice (their void decoder does not
//! check for leftovers). [`Registry::set_strict_null_args`] answers
//! GARBAGE_ARGS instead, the letter of RFC 5531 ("parameters of type void").
//!
//! Unlike krpc2, which answers every program and version, programs and
//! versions are checked against a [`Registry`]; [`Registry::any_program`]
//! gives krpc2's behaviour.

use crate::call::{AuthField, AuthSysParams, CallHeader, HeaderError, MAX_CALL_HEADER_LEN};
use crate::msg::MsgType;
use crate::msg::{AuthFlavor, AuthStat, Program, NULLPROC, RPC_VERSION};
use crate::record::{fragments, MarkError, RecordMark, LAST_FRAGMENT, MARK_LEN};
use crate::reply::{encode_reply, Reply};

/// Bytes of the shortest NULL call with its record mark (AUTH_NONE
/// credential and verifier, no arguments): what [`Registry::null_fast`] reads.
pub const NULL_CALL_LEN: usize = MARK_LEN + crate::call::MIN_CALL_LEN;
/// Bytes of a record-marked SUCCESS reply with void results (ksf.md §2.4).
pub const NULL_REPLY_LEN: usize = 28;
/// The SUCCESS reply with xid 0: mark (last, 24 bytes), xid, REPLY,
/// MSG_ACCEPTED, verifier AUTH_NONE (flavor, length 0), SUCCESS.
const NULL_REPLY_TEMPLATE: [u8; NULL_REPLY_LEN] = {
    let mut r = [0u8; NULL_REPLY_LEN];
    let mark = (LAST_FRAGMENT | 24).to_be_bytes();
    r[0] = mark[0];
    r[1] = mark[1];
    r[2] = mark[2];
    r[3] = mark[3];
    r[11] = 1; // REPLY; MSG_ACCEPTED, AUTH_NONE, 0 and SUCCESS are all zero words
    r
};

/// Replies [`Registry::null_fast_run`] appends at once (then patches).
const NULL_REPLY_BLOCK: usize = 32;
/// [`NULL_REPLY_BLOCK`] copies of the template, back to back.
const NULL_REPLIES: [u8; NULL_REPLY_LEN * NULL_REPLY_BLOCK] = {
    let mut r = [0u8; NULL_REPLY_LEN * NULL_REPLY_BLOCK];
    let mut i = 0;
    while i < r.len() {
        r[i] = NULL_REPLY_TEMPLATE[i % NULL_REPLY_LEN];
        i += 1;
    }
    r
};

/// The big-endian word at byte `i` of `b`.
#[inline]
fn be32(b: &[u8], i: usize) -> u32 {
    u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

/// The program and version words of a call header (with its mark).
#[inline]
fn prog_vers(head: &[u8; NULL_CALL_LEN]) -> [u8; 8] {
    head[16..24].try_into().expect("8 bytes")
}

/// The first [`NULL_CALL_LEN`] bytes of `marked` when it is a one-fragment
/// record holding a version 2 call of procedure 0 with empty AUTH_NONE
/// credential and verifier (and no arguments, when `strict`), whatever its
/// program.
#[inline]
fn null_shape(marked: &[u8], strict: bool) -> Option<&[u8; NULL_CALL_LEN]> {
    let head: &[u8; NULL_CALL_LEN] = marked.get(..NULL_CALL_LEN)?.try_into().ok()?;
    // Words: mark, xid, msg_type, rpcvers, prog, vers, proc, cred (flavor,
    // len), verf (flavor, len). Compared a few words at a time, in wire
    // order (this runs once per request: a word-by-word decode costs as
    // much as the rest of the reply).
    let ne64 = |i: usize| u64::from_ne_bytes(head[i..i + 8].try_into().expect("8 bytes"));
    let ne32 = |i: usize| u32::from_ne_bytes(head[i..i + 4].try_into().expect("4 bytes"));
    // msg_type CALL and rpcvers 2, as on the wire.
    const CALL_V2: [u8; 8] = {
        let (t, v) = (MsgType::CALL.0.to_be_bytes(), RPC_VERSION.to_be_bytes());
        [t[0], t[1], t[2], t[3], v[0], v[1], v[2], v[3]]
    };
    let args = marked.len() - NULL_CALL_LEN;
    (be32(head, 0) == LAST_FRAGMENT | (marked.len() - MARK_LEN) as u32
        && ne64(8) == u64::from_ne_bytes(CALL_V2)
        && (ne64(24) | ne64(32) | u64::from(ne32(40))) == 0
        && !(strict && args != 0))
        .then_some(head)
}

/// [`null_shape`]'s test past the mark: `head` (a mark and the call's first
/// 40 bytes) holds a version 2 call of procedure 0 with empty AUTH_NONE
/// credential and verifier, and `args` bytes follow (none, when `strict`).
fn null_shape_args(head: &[u8; NULL_CALL_LEN], args: usize, strict: bool) -> bool {
    be32(head, 8) == MsgType::CALL.0
        && be32(head, 12) == RPC_VERSION
        && head[24..NULL_CALL_LEN].iter().all(|b| *b == 0)
        && !(strict && args != 0)
}

/// The SUCCESS reply to the NULL call `head`: the template with its xid.
#[inline]
fn null_reply(head: &[u8; NULL_CALL_LEN]) -> [u8; NULL_REPLY_LEN] {
    let mut reply = NULL_REPLY_TEMPLATE;
    reply[4..8].copy_from_slice(&head[4..8]);
    reply
}

/// One registered program and its supported versions `low..=high`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Versions {
    /// The program.
    pub prog: Program,
    /// Lowest version served.
    pub low: u32,
    /// Highest version served.
    pub high: u32,
}

/// A version range with `low > high`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("version range {low}..={high} of program {prog} is empty")]
pub struct EmptyRange {
    /// The program.
    pub prog: Program,
    /// Given low version.
    pub low: u32,
    /// Given high version.
    pub high: u32,
}

/// Why [`Registry::handle`] produced no reply: the stream is not ONC RPC calls.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CloseReason {
    /// The record is not a decodable call header.
    #[error("bad call header: {0}")]
    Header(HeaderError),
    /// The record marks do not describe the record (only from `handle_marked`).
    #[error("bad record marks: {0}")]
    Marks(MarkError),
    /// A datagram that holds a record-marked call: RPC over UDP has no
    /// record marks (RFC 5531 §11), so it is dropped (only from
    /// `handle_datagram`).
    #[error("a record mark in a datagram")]
    MarkedDatagram,
}

/// What [`Registry::handle`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// A reply was appended to `out`.
    Replied {
        /// The call's xid.
        xid: u32,
        /// The reply sent.
        reply: Reply,
    },
    /// Nothing was appended: close the connection (and count the reason).
    CloseConnection(CloseReason),
}

/// The programs a NULL-only server answers for, and its policy.
///
/// ```
/// use connmux_oncrpc::{encode_null_call, check_reply, Registry, Outcome, Reply};
/// let reg = Registry::default(); // NFS (100003) versions 3..=4
/// let (mut call, mut reply) = (Vec::new(), Vec::new());
/// encode_null_call(7, 100003, 3, 1, &mut call);
/// assert_eq!(reg.handle_marked(&call, &mut reply), Outcome::Replied { xid: 7, reply: Reply::Success });
/// assert_eq!(check_reply(&reply[4..], Some(7)), Ok(7));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Registry {
    /// Few entries (a server registers a handful): a linear scan beats hashing.
    programs: Vec<Versions>,
    any_program: bool,
    strict_null_args: bool,
}

impl Default for Registry {
    /// NFS (program 100003), versions 3 and 4.
    fn default() -> Self {
        let mut r = Registry::new();
        r.programs.push(Versions { prog: Program::NFS, low: 3, high: 4 });
        r
    }
}

impl Registry {
    /// No program registered: every call gets PROG_UNAVAIL.
    pub fn new() -> Self {
        Registry { programs: Vec::new(), any_program: false, strict_null_args: false }
    }

    /// krpc2's behaviour: every program and version is served (registrations
    /// are ignored).
    pub fn any_program() -> Self {
        Registry { any_program: true, ..Registry::new() }
    }

    /// Serves versions `low..=high` of `prog`, replacing an earlier range.
    pub fn register(&mut self, prog: u32, low: u32, high: u32) -> Result<(), EmptyRange> {
        let prog = Program(prog);
        if low > high {
            return Err(EmptyRange { prog, low, high });
        }
        let v = Versions { prog, low, high };
        match self.programs.iter_mut().find(|e| e.prog == prog) {
            Some(e) => *e = v,
            None => self.programs.push(v),
        }
        Ok(())
    }

    /// Stops serving `prog`; false if it was not registered.
    pub fn unregister(&mut self, prog: u32) -> bool {
        let before = self.programs.len();
        self.programs.retain(|e| e.prog != Program(prog));
        self.programs.len() != before
    }

    /// The registered version range of `prog`.
    pub fn versions(&self, prog: u32) -> Option<(u32, u32)> {
        self.programs.iter().find(|e| e.prog == Program(prog)).map(|e| (e.low, e.high))
    }

    /// Every registered program.
    pub fn programs(&self) -> &[Versions] {
        &self.programs
    }

    /// Answer GARBAGE_ARGS (true) or SUCCESS (false, the default, krpc2's
    /// behaviour) to a NULL call that carries argument bytes.
    pub fn set_strict_null_args(&mut self, strict: bool) {
        self.strict_null_args = strict;
    }

    /// The reply to a call with a valid header and `args_len` argument bytes.
    pub fn decide(&self, call: &CallHeader<'_>, args_len: usize) -> Reply {
        let cred = call.cred();
        match cred.flavor {
            AuthFlavor::AUTH_NONE => {}
            AuthFlavor::AUTH_SYS => {
                if AuthSysParams::parse(cred.body).is_err() {
                    return Reply::AuthError(AuthStat::AUTH_BADCRED);
                }
            }
            _ => return Reply::AuthError(AuthStat::AUTH_REJECTEDCRED),
        }
        if call.verf().flavor != AuthFlavor::AUTH_NONE {
            return Reply::AuthError(AuthStat::AUTH_BADVERF);
        }
        if !self.any_program {
            let prog = call.program();
            let Some(v) = self.programs.iter().find(|e| e.prog == prog) else {
                return Reply::ProgUnavail;
            };
            if !(v.low..=v.high).contains(&call.version()) {
                return Reply::ProgMismatch { low: v.low, high: v.high };
            }
        }
        if call.procedure() != NULLPROC {
            return Reply::ProcUnavail;
        }
        if self.strict_null_args && args_len != 0 {
            return Reply::GarbageArgs;
        }
        Reply::Success
    }

    /// The common call, answered without decoding: a one-fragment record
    /// holding a NULL call with AUTH_NONE credential and verifier (both
    /// empty) to a served program and version. Returns the 28-byte
    /// record-marked SUCCESS reply, exactly what [`handle_marked`](Self::handle_marked)
    /// appends for the same record; `None` for every other record (the
    /// caller then takes `handle_marked`, which decides and explains).
    ///
    /// Why it exists: a NULL call is 44 bytes and its answer is a template
    /// with the xid patched in; the general path (checked view, auth
    /// dispatch, reply encoder) costs several times the framing itself.
    #[inline]
    pub fn null_fast(&self, marked: &[u8]) -> Option<[u8; NULL_REPLY_LEN]> {
        let head = self.null_shape(marked)?;
        self.serves(prog_vers(head)).then(|| null_reply(head))
    }

    /// [`null_fast`](Self::null_fast) over a run of records, each given
    /// whole with its mark (as the runs of a read yield them: a run of equal
    /// records is `wire.chunks_exact(len)`): appends the replies of the
    /// leading NULL calls to `out` and returns how many it answered. The
    /// first record `null_fast` declines ends the run; the caller answers it
    /// the general way and goes on after it.
    pub fn null_fast_run<'a, I>(&self, records: I, out: &mut bytes::BytesMut) -> usize
    where
        I: IntoIterator<Item = &'a [u8]>,
        I::IntoIter: ExactSizeIterator,
    {
        let mut records = records.into_iter();
        if records.len() == 1 {
            // One call (one in flight): its reply straight in, no block to cut.
            let Some(reply) = records.next().and_then(|m| self.null_fast(m)) else { return 0 };
            out.extend_from_slice(&reply);
            return 1;
        }
        // The argument rule a constant in the loop (one flag less to keep).
        if self.strict_null_args {
            self.null_run::<true>(records, out)
        } else {
            self.null_run::<false>(records, out)
        }
    }

    /// [`null_fast_run`](Self::null_fast_run) past one record, for calls
    /// with arguments refused (`STRICT`) or not.
    fn null_run<'a, const STRICT: bool>(
        &self,
        records: impl ExactSizeIterator<Item = &'a [u8]>,
        out: &mut bytes::BytesMut,
    ) -> usize {
        let mut records = records.peekable();
        let Some(first) = records.peek().and_then(|m| null_shape(m, STRICT)) else { return 0 };
        // The program and version of the last call answered: a run's calls
        // are nearly always to one of them, looked up once.
        let mut served = prog_vers(first);
        if !self.serves(served) {
            return 0;
        }
        out.reserve(records.len() * NULL_REPLY_LEN);
        let mut n = 0;
        // Bounded: each turn takes a block of records or ends.
        loop {
            let block = records.len().min(NULL_REPLY_BLOCK);
            if block == 0 {
                break;
            }
            // A block of templates appended at once, each reply then only
            // patched with its xid; cut back at the first record declined.
            let at = out.len();
            out.extend_from_slice(&NULL_REPLIES[..block * NULL_REPLY_LEN]);
            let (replies, _) = out[at..].as_chunks_mut::<NULL_REPLY_LEN>();
            let mut k = 0;
            for (m, reply) in records.by_ref().take(block).zip(replies) {
                let Some(head) = null_shape(m, STRICT) else { break };
                let pv = prog_vers(head);
                if pv != served {
                    if !self.serves_other(pv) {
                        break;
                    }
                    served = pv;
                }
                reply[4..8].copy_from_slice(&head[4..8]);
                k += 1;
            }
            n += k;
            if k < block {
                out.truncate(at + k * NULL_REPLY_LEN);
                break;
            }
        }
        n
    }

    /// [`serves`](Self::serves) for a call to another program or version
    /// than the run's last: out of the run's loop.
    #[inline(never)]
    fn serves_other(&self, prog_vers: [u8; 8]) -> bool {
        self.serves(prog_vers)
    }

    /// [`null_shape`] with this registry's argument rule.
    #[inline]
    fn null_shape<'a>(&self, marked: &'a [u8]) -> Option<&'a [u8; NULL_CALL_LEN]> {
        null_shape(marked, self.strict_null_args)
    }

    /// Whether calls to this program and version (two wire words) are served.
    #[inline]
    fn serves(&self, prog_vers: [u8; 8]) -> bool {
        if self.any_program {
            return true;
        }
        let (prog, vers) = (Program(be32(&prog_vers, 0)), be32(&prog_vers, 4));
        self.programs.iter().any(|e| e.prog == prog && (e.low..=e.high).contains(&vers))
    }

    /// [`null_fast`](Self::null_fast) for a call datagram (RPC over UDP:
    /// no record mark): the 24-byte SUCCESS reply, unmarked, for a NULL call
    /// with empty AUTH_NONE credential and verifier to a served program and
    /// version; `None` for every other datagram.
    #[inline]
    pub fn null_fast_datagram(&self, call: &[u8]) -> Option<[u8; NULL_REPLY_LEN - MARK_LEN]> {
        // The same test as a record's, on the call behind a mark.
        let mut head = [0u8; NULL_CALL_LEN];
        head[MARK_LEN..].copy_from_slice(call.get(..NULL_CALL_LEN - MARK_LEN)?);
        let args = call.len() - (NULL_CALL_LEN - MARK_LEN);
        let ok = null_shape_args(&head, args, self.strict_null_args) && self.serves(prog_vers(&head));
        ok.then(|| {
            let r = null_reply(&head);
            r[MARK_LEN..].try_into().expect("24 bytes")
        })
    }

    /// Answers one call datagram (RPC over UDP, RFC 5531 §11: one datagram
    /// holds one whole call, with no record mark): appends the reply,
    /// unmarked, to `out`, or appends nothing and says the datagram is to be
    /// dropped ([`Outcome::CloseConnection`]: nothing is closed over UDP).
    /// A datagram that holds a record-marked call (its first word the mark
    /// of the rest, then a call) is dropped with
    /// [`CloseReason::MarkedDatagram`]: its words read as an unmarked call
    /// never start one (an unmarked call has CALL then version 2 in words 1
    /// and 2; a marked one has CALL in word 2), so no call is taken for one.
    pub fn handle_datagram(&self, dgram: &[u8], out: &mut Vec<u8>) -> Outcome {
        if let Some(r) = self.null_fast_datagram(dgram) {
            out.extend_from_slice(&r);
            return Outcome::Replied { xid: be32(&r, 0), reply: Reply::Success };
        }
        let word = |i: usize| dgram.get(i * 4..i * 4 + 4).map(|w| be32(w, 0));
        let unmarked_call = word(1) == Some(MsgType::CALL.0) && word(2) == Some(RPC_VERSION);
        if !unmarked_call
            && word(0) == Some(LAST_FRAGMENT | (dgram.len() - MARK_LEN) as u32)
            && word(2) == Some(MsgType::CALL.0)
        {
            return Outcome::CloseConnection(CloseReason::MarkedDatagram);
        }
        let at = out.len();
        let o = self.handle(dgram, out);
        if matches!(o, Outcome::Replied { .. }) {
            // `handle` writes a record: the mark goes.
            out.drain(at..at + MARK_LEN);
        }
        o
    }

    /// Answers one call record given *without* record marks (as
    /// [`RecordReader`](crate::record::RecordReader) or a stripping parser
    /// delivers it): appends the record-marked reply to `out`, or appends
    /// nothing and says to close the connection. No allocation beyond `out`'s growth.
    pub fn handle(&self, record: &[u8], out: &mut Vec<u8>) -> Outcome {
        self.handle_prefix(record, record.len(), out)
    }

    /// Answers one call record given *with* its record marks (exactly one
    /// record, as the core's ONC RPC parser frames it when it keeps the marks).
    /// A multi-fragment record is reassembled on the stack (only its header
    /// matters to NULL), so this allocates nothing either.
    pub fn handle_marked(&self, marked: &[u8], out: &mut Vec<u8>) -> Outcome {
        if let Some(reply) = self.null_fast(marked) {
            out.extend_from_slice(&reply);
            let xid = u32::from_be_bytes([reply[4], reply[5], reply[6], reply[7]]);
            return Outcome::Replied { xid, reply: Reply::Success };
        }
        self.handle_marked_decoded(marked, out)
    }

    /// [`handle_marked`](Self::handle_marked) without its fast path, for a
    /// caller whose [`null_fast`](Self::null_fast) (or `null_fast_run`) has
    /// already declined this record: the same outcome and bytes, decoded.
    pub fn handle_marked_decoded(&self, marked: &[u8], out: &mut Vec<u8>) -> Outcome {
        // One fragment covering the whole record: no reassembly.
        if let Some(m) = RecordMark::parse(marked) {
            if m.last && marked.len() - MARK_LEN == m.len as usize {
                return self.handle(&marked[MARK_LEN..], out);
            }
        }
        let mut head = [0u8; MAX_CALL_HEADER_LEN];
        let mut filled = 0;
        let mut total = 0usize;
        for frag in fragments(marked) {
            let frag = match frag {
                Ok(f) => f,
                Err(e) => return Outcome::CloseConnection(CloseReason::Marks(e)),
            };
            let take = frag.len().min(head.len() - filled);
            head[filled..filled + take].copy_from_slice(&frag[..take]);
            filled += take;
            total += frag.len();
        }
        self.handle_prefix(&head[..filled], total, out)
    }

    /// `prefix`: the record's first bytes, at least the whole header when the
    /// record has one (≤ 840 bytes); `total`: the record's length.
    fn handle_prefix(&self, prefix: &[u8], total: usize, out: &mut Vec<u8>) -> Outcome {
        let (xid, reply) = match CallHeader::new_checked(prefix) {
            Ok(call) => (call.xid(), self.decide(&call, total - call.header_len())),
            Err(HeaderError::RpcVersion { xid, .. }) => {
                (xid, Reply::RpcMismatch { low: RPC_VERSION, high: RPC_VERSION })
            }
            Err(HeaderError::AuthTooLong { xid, which: AuthField::Cred, .. }) => {
                (xid, Reply::AuthError(AuthStat::AUTH_BADCRED))
            }
            Err(HeaderError::AuthTooLong { xid, which: AuthField::Verf, .. }) => {
                (xid, Reply::AuthError(AuthStat::AUTH_BADVERF))
            }
            Err(e @ (HeaderError::Truncated { .. } | HeaderError::NotACall { .. })) => {
                return Outcome::CloseConnection(CloseReason::Header(e));
            }
        };
        encode_reply(xid, &reply, out);
        Outcome::Replied { xid, reply }
    }
}
