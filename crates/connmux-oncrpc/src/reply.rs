//! Replies (RFC 5531 §9 `reply_body`): the encoder servers use and the
//! decoder/checker clients use.
//!
//! ```text
//! accepted:  xid | REPLY(1) | MSG_ACCEPTED(0) | verf.flavor | verf.length | verf.body
//!            | accept_stat | [PROG_MISMATCH: low | high] | [SUCCESS: results]
//! denied:    xid | REPLY(1) | MSG_DENIED(1) | reject_stat
//!            | [RPC_MISMATCH: low | high] | [AUTH_ERROR: auth_stat]
//! ```
//! The encoder always sends an AUTH_NONE verifier and void results, which is
//! what every reply of a NULL-only server looks like.

use core::fmt;

use crate::call::OpaqueAuth;
use crate::msg::{AcceptStat, AuthFlavor, AuthStat, MsgType, RejectStat, ReplyStat, MAX_AUTH_BYTES};
use crate::record::RecordMark;
use crate::xdr::{get_u32, padded, put_u32};

/// What a reply says, accepted or denied. Void results for `Success`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reply {
    /// MSG_ACCEPTED, SUCCESS, void results.
    Success,
    /// MSG_ACCEPTED, PROG_UNAVAIL: the program is not served here.
    ProgUnavail,
    /// MSG_ACCEPTED, PROG_MISMATCH: versions `low..=high` of the program are served.
    ProgMismatch {
        /// Lowest version served.
        low: u32,
        /// Highest version served.
        high: u32,
    },
    /// MSG_ACCEPTED, PROC_UNAVAIL: the program has no such procedure.
    ProcUnavail,
    /// MSG_ACCEPTED, GARBAGE_ARGS: the arguments could not be decoded.
    GarbageArgs,
    /// MSG_ACCEPTED, SYSTEM_ERR: e.g. out of memory.
    SystemErr,
    /// MSG_DENIED, RPC_MISMATCH: RPC versions `low..=high` are spoken.
    RpcMismatch {
        /// Lowest RPC version spoken.
        low: u32,
        /// Highest RPC version spoken.
        high: u32,
    },
    /// MSG_DENIED, AUTH_ERROR with this reason.
    AuthError(AuthStat),
}

impl Reply {
    /// Bytes of the encoded reply without its record mark.
    pub fn body_len(&self) -> usize {
        match self {
            Reply::ProgMismatch { .. } => 32,
            Reply::Success | Reply::ProgUnavail | Reply::ProcUnavail | Reply::GarbageArgs | Reply::SystemErr => 24,
            Reply::RpcMismatch { .. } => 24,
            Reply::AuthError(_) => 20,
        }
    }

    /// The accept_stat, for an accepted reply.
    pub fn accept_stat(&self) -> Option<AcceptStat> {
        Some(match self {
            Reply::Success => AcceptStat::SUCCESS,
            Reply::ProgUnavail => AcceptStat::PROG_UNAVAIL,
            Reply::ProgMismatch { .. } => AcceptStat::PROG_MISMATCH,
            Reply::ProcUnavail => AcceptStat::PROC_UNAVAIL,
            Reply::GarbageArgs => AcceptStat::GARBAGE_ARGS,
            Reply::SystemErr => AcceptStat::SYSTEM_ERR,
            Reply::RpcMismatch { .. } | Reply::AuthError(_) => return None,
        })
    }
}

impl fmt::Display for Reply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reply::ProgMismatch { low, high } => write!(f, "PROG_MISMATCH (versions {low}..={high})"),
            Reply::RpcMismatch { low, high } => write!(f, "RPC_MISMATCH (RPC versions {low}..={high})"),
            Reply::AuthError(s) => write!(f, "AUTH_ERROR ({s})"),
            other => match other.accept_stat() {
                Some(s) => write!(f, "{s}"),
                None => Ok(()),
            },
        }
    }
}

/// Appends the reply's body (no record mark) to `out`.
pub fn encode_reply_body(xid: u32, reply: &Reply, out: &mut Vec<u8>) {
    put_u32(out, xid);
    put_u32(out, MsgType::REPLY.0);
    if let Some(stat) = reply.accept_stat() {
        put_u32(out, ReplyStat::MSG_ACCEPTED.0);
        put_u32(out, AuthFlavor::AUTH_NONE.0);
        put_u32(out, 0);
        put_u32(out, stat.0);
        if let Reply::ProgMismatch { low, high } = *reply {
            put_u32(out, low);
            put_u32(out, high);
        }
        return;
    }
    put_u32(out, ReplyStat::MSG_DENIED.0);
    match *reply {
        Reply::RpcMismatch { low, high } => {
            put_u32(out, RejectStat::RPC_MISMATCH.0);
            put_u32(out, low);
            put_u32(out, high);
        }
        Reply::AuthError(stat) => {
            put_u32(out, RejectStat::AUTH_ERROR.0);
            put_u32(out, stat.0);
        }
        // Accepted kinds returned above.
        _ => {}
    }
}

/// Appends the reply as one record (a single last fragment) to `out`.
/// A SUCCESS reply is the 28 bytes of ksf.md §2.4.
pub fn encode_reply(xid: u32, reply: &Reply, out: &mut Vec<u8>) {
    let mark = RecordMark { last: true, len: reply.body_len() as u32 };
    out.extend_from_slice(&mark.to_bytes());
    encode_reply_body(xid, reply, out);
}

/// A decoded reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodedReply<'a> {
    /// The xid it answers.
    pub xid: u32,
    /// What it says.
    pub reply: Reply,
    /// The verifier of an accepted reply (`None` when denied).
    pub verf: Option<OpaqueAuth<'a>>,
    /// Bytes after the status: the results of a SUCCESS (empty for NULL).
    pub results: &'a [u8],
}

/// Why a reply record is not the answer a client expects.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReplyError {
    /// The reply's fields run past the end of the record.
    #[error("reply needs {need} bytes, record has {have}")]
    Truncated {
        /// Bytes needed so far.
        need: usize,
        /// Bytes the record has.
        have: usize,
    },
    /// The message is not a reply.
    #[error("message type {msg_type} is not REPLY")]
    NotAReply {
        /// The message's xid.
        xid: u32,
        /// Its type.
        msg_type: MsgType,
    },
    /// reply_stat is neither MSG_ACCEPTED nor MSG_DENIED.
    #[error("unknown reply_stat {stat}")]
    UnknownReplyStat {
        /// The reply's xid.
        xid: u32,
        /// The value.
        stat: ReplyStat,
    },
    /// accept_stat is not one RFC 5531 defines.
    #[error("unknown accept_stat {stat}")]
    UnknownAcceptStat {
        /// The reply's xid.
        xid: u32,
        /// The value.
        stat: AcceptStat,
    },
    /// reject_stat is not one RFC 5531 defines.
    #[error("unknown reject_stat {stat}")]
    UnknownRejectStat {
        /// The reply's xid.
        xid: u32,
        /// The value.
        stat: RejectStat,
    },
    /// The reply verifier's body exceeds 400 bytes.
    #[error("reply verifier of {len} bytes exceeds the 400-byte maximum")]
    VerifierTooLong {
        /// The reply's xid.
        xid: u32,
        /// The declared length.
        len: u32,
    },
    /// The reply answers another call.
    #[error("reply xid {got:#x}, expected {expected:#x}")]
    XidMismatch {
        /// The xid asked for.
        expected: u32,
        /// The reply's xid.
        got: u32,
    },
    /// The server did not answer SUCCESS.
    #[error("server answered {reply} to xid {xid:#x}")]
    NotSuccess {
        /// The reply's xid.
        xid: u32,
        /// What the server said instead.
        reply: Reply,
    },
    /// A SUCCESS reply to a NULL call carries results (they must be void).
    #[error("NULL reply to xid {xid:#x} carries {len} bytes of results")]
    TrailingBytes {
        /// The reply's xid.
        xid: u32,
        /// Bytes of results.
        len: usize,
    },
}

/// Decodes a reply record (marks stripped).
pub fn decode_reply(record: &[u8]) -> Result<DecodedReply<'_>, ReplyError> {
    let truncated = |need: usize| ReplyError::Truncated { need, have: record.len() };
    let word = |off: usize| get_u32(record, off).ok_or_else(|| truncated(off + 4));
    let xid = word(0)?;
    let msg_type = MsgType(word(4)?);
    if msg_type != MsgType::REPLY {
        return Err(ReplyError::NotAReply { xid, msg_type });
    }
    let stat = ReplyStat(word(8)?);
    if stat == ReplyStat::MSG_DENIED {
        let rstat = RejectStat(word(12)?);
        let (reply, end) = match rstat {
            RejectStat::RPC_MISMATCH => (Reply::RpcMismatch { low: word(16)?, high: word(20)? }, 24),
            RejectStat::AUTH_ERROR => (Reply::AuthError(AuthStat(word(16)?)), 20),
            stat => return Err(ReplyError::UnknownRejectStat { xid, stat }),
        };
        return Ok(DecodedReply { xid, reply, verf: None, results: &record[end..] });
    }
    if stat != ReplyStat::MSG_ACCEPTED {
        return Err(ReplyError::UnknownReplyStat { xid, stat });
    }
    let flavor = AuthFlavor(word(12)?);
    let vlen = word(16)?;
    if vlen as usize > MAX_AUTH_BYTES {
        return Err(ReplyError::VerifierTooLong { xid, len: vlen });
    }
    let body = record.get(20..20 + vlen as usize).ok_or_else(|| truncated(20 + vlen as usize))?;
    let at = 20 + padded(vlen) as usize;
    let astat = AcceptStat(word(at)?);
    let (reply, end) = match astat {
        AcceptStat::SUCCESS => (Reply::Success, at + 4),
        AcceptStat::PROG_UNAVAIL => (Reply::ProgUnavail, at + 4),
        AcceptStat::PROG_MISMATCH => (Reply::ProgMismatch { low: word(at + 4)?, high: word(at + 8)? }, at + 12),
        AcceptStat::PROC_UNAVAIL => (Reply::ProcUnavail, at + 4),
        AcceptStat::GARBAGE_ARGS => (Reply::GarbageArgs, at + 4),
        AcceptStat::SYSTEM_ERR => (Reply::SystemErr, at + 4),
        stat => return Err(ReplyError::UnknownAcceptStat { xid, stat }),
    };
    Ok(DecodedReply { xid, reply, verf: Some(OpaqueAuth { flavor, body }), results: &record[end..] })
}

/// Checks that `record` (marks stripped) is an accepted SUCCESS reply with
/// void results — the answer to a NULL call — and, if given, that it answers
/// `expect_xid`. Returns its xid. The xid is checked before the status, so a
/// refusal meant for another call reads as `XidMismatch`.
pub fn check_reply(record: &[u8], expect_xid: Option<u32>) -> Result<u32, ReplyError> {
    let d = decode_reply(record)?;
    if let Some(expected) = expect_xid {
        if expected != d.xid {
            return Err(ReplyError::XidMismatch { expected, got: d.xid });
        }
    }
    if d.reply != Reply::Success {
        return Err(ReplyError::NotSuccess { xid: d.xid, reply: d.reply });
    }
    if !d.results.is_empty() {
        return Err(ReplyError::TrailingBytes { xid: d.xid, len: d.results.len() });
    }
    Ok(d.xid)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [Reply; 9] = [
        Reply::Success,
        Reply::ProgUnavail,
        Reply::ProgMismatch { low: 3, high: 4 },
        Reply::ProcUnavail,
        Reply::GarbageArgs,
        Reply::SystemErr,
        Reply::RpcMismatch { low: 2, high: 2 },
        Reply::AuthError(AuthStat::AUTH_BADCRED),
        Reply::AuthError(AuthStat(99)),
    ];

    #[test]
    fn every_kind_round_trips_with_its_length() {
        for r in ALL {
            let mut out = Vec::new();
            encode_reply(0xdead_beef, &r, &mut out);
            assert_eq!(out.len(), 4 + r.body_len(), "{r}");
            assert_eq!(RecordMark::parse(&out), Some(RecordMark { last: true, len: r.body_len() as u32 }));
            let d = decode_reply(&out[4..]).unwrap();
            assert_eq!((d.xid, d.reply), (0xdead_beef, r));
            assert!(d.results.is_empty());
            // Every strict prefix is a typed truncation, never a panic.
            for n in 0..out.len() - 4 {
                assert!(matches!(decode_reply(&out[4..4 + n]), Err(ReplyError::Truncated { .. })), "{r} {n}");
            }
        }
    }

    #[test]
    fn display() {
        assert_eq!(Reply::ProgMismatch { low: 3, high: 4 }.to_string(), "PROG_MISMATCH (versions 3..=4)");
        assert_eq!(Reply::AuthError(AuthStat::AUTH_REJECTEDCRED).to_string(), "AUTH_ERROR (AUTH_REJECTEDCRED)");
        assert_eq!(Reply::GarbageArgs.to_string(), "GARBAGE_ARGS");
    }
}
