//! The call header (RFC 5531 §9 `call_body`) as a checked view, AUTH_SYS
//! credentials (§A / RFC 5531 Appendix A), and the encoder clients use.
//!
//! ```text
//! offset  field
//!      0  xid
//!      4  msg_type      = CALL (0)
//!      8  rpcvers       = 2
//!     12  prog
//!     16  vers
//!     20  proc
//!     24  cred.flavor
//!     28  cred.length   (≤ 400)
//!     32  cred.body     (padded to 4)
//!      V  verf.flavor   V = 32 + pad4(cred.length)
//!    V+4  verf.length   (≤ 400)
//!    V+8  verf.body     (padded to 4)
//!      A  procedure arguments, A = V + 8 + pad4(verf.length)
//! ```
//! Record marks are not part of this view: it reads one record's body.

use crate::msg::{AuthFlavor, MsgType, Program, MAX_AUTH_BYTES, RPC_VERSION};
use crate::record::encode_record;
use crate::xdr::{get_u32, padded, StackWriter};

/// Named offsets of the fixed part of a call.
pub mod field {
    /// Transaction id.
    pub const XID: usize = 0;
    /// `msg_type` (CALL).
    pub const MSG_TYPE: usize = 4;
    /// `rpcvers` (2).
    pub const RPCVERS: usize = 8;
    /// Program number.
    pub const PROG: usize = 12;
    /// Program version.
    pub const VERS: usize = 16;
    /// Procedure number.
    pub const PROC: usize = 20;
    /// Start of the credential (flavor, length, body).
    pub const CRED: usize = 24;
}

/// Bytes before the credential.
pub const FIXED_LEN: usize = field::CRED;
/// Shortest call: both credential and verifier empty (the 40-byte NULL call).
pub const MIN_CALL_LEN: usize = FIXED_LEN + 2 * 8;
/// Longest call header: both auth bodies at their 400-byte maximum.
pub const MAX_CALL_HEADER_LEN: usize = FIXED_LEN + 2 * (8 + MAX_AUTH_BYTES);

/// Which opaque_auth of a call a [`HeaderError`] is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthField {
    /// The credential.
    Cred,
    /// The verifier.
    Verf,
}

impl core::fmt::Display for AuthField {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            AuthField::Cred => "credential",
            AuthField::Verf => "verifier",
        })
    }
}

/// Why bytes are not a usable call header. The variants that carry an `xid`
/// can still be answered (RPC_MISMATCH, AUTH_ERROR); the others cannot.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    /// The header's fields run past the end of the record.
    #[error("call header needs {need} bytes, record has {have}")]
    Truncated {
        /// Bytes the header needs so far.
        need: usize,
        /// Bytes the record has.
        have: usize,
    },
    /// The message is not a call (a reply, or an unknown type).
    #[error("message type {msg_type} is not CALL")]
    NotACall {
        /// The message's xid.
        xid: u32,
        /// Its type.
        msg_type: MsgType,
    },
    /// `rpcvers` is not 2; the rest of the header is not defined then.
    #[error("RPC version {rpcvers}, only 2 is spoken")]
    RpcVersion {
        /// The call's xid (to answer RPC_MISMATCH).
        xid: u32,
        /// The version it asked for.
        rpcvers: u32,
    },
    /// An auth body is longer than 400 bytes.
    #[error("{which} body of {len} bytes exceeds the 400-byte maximum")]
    AuthTooLong {
        /// The call's xid (to answer AUTH_ERROR).
        xid: u32,
        /// Credential or verifier.
        which: AuthField,
        /// The declared body length.
        len: u32,
    },
}

/// A credential or verifier: flavour and opaque body (at most 400 bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpaqueAuth<'a> {
    /// The flavour; any value, see [`AuthFlavor`]'s constants.
    pub flavor: AuthFlavor,
    /// The body without its padding.
    pub body: &'a [u8],
}

/// A checked view of a call header over one record's body (marks stripped).
/// Every accessor is valid once [`new_checked`](Self::new_checked) succeeded.
#[derive(Clone, Copy, Debug)]
pub struct CallHeader<'a> {
    buf: &'a [u8],
    /// Offset of the verifier (after the padded credential body).
    verf_at: usize,
    /// Offset of the arguments (after the padded verifier body).
    args_at: usize,
}

/// Reads the opaque_auth at `at`: (flavor, length) or the error to report.
fn auth_at(buf: &[u8], at: usize, xid: u32, which: AuthField) -> Result<(u32, u32, usize), HeaderError> {
    let need = at + 8;
    let (Some(flavor), Some(len)) = (get_u32(buf, at), get_u32(buf, at + 4)) else {
        return Err(HeaderError::Truncated { need, have: buf.len() });
    };
    if len as usize > MAX_AUTH_BYTES {
        return Err(HeaderError::AuthTooLong { xid, which, len });
    }
    // len ≤ 400, so this is small.
    let end = need + padded(len) as usize;
    if end > buf.len() {
        return Err(HeaderError::Truncated { need: end, have: buf.len() });
    }
    Ok((flavor, len, end))
}

impl<'a> CallHeader<'a> {
    /// Checks that `buf` starts with a complete RPC v2 call header: type CALL,
    /// rpcvers 2, both auth bodies ≤ 400 bytes and inside `buf`. What follows
    /// the header is the procedure's arguments.
    pub fn new_checked(buf: &'a [u8]) -> Result<Self, HeaderError> {
        let truncated = |need| HeaderError::Truncated { need, have: buf.len() };
        let (Some(xid), Some(msg_type)) = (get_u32(buf, field::XID), get_u32(buf, field::MSG_TYPE)) else {
            return Err(truncated(field::MSG_TYPE + 4));
        };
        if MsgType(msg_type) != MsgType::CALL {
            return Err(HeaderError::NotACall { xid, msg_type: MsgType(msg_type) });
        }
        let Some(rpcvers) = get_u32(buf, field::RPCVERS) else {
            return Err(truncated(field::RPCVERS + 4));
        };
        if rpcvers != RPC_VERSION {
            return Err(HeaderError::RpcVersion { xid, rpcvers });
        }
        let (_, _, verf_at) = auth_at(buf, field::CRED, xid, AuthField::Cred)?;
        let (_, _, args_at) = auth_at(buf, verf_at, xid, AuthField::Verf)?;
        Ok(CallHeader { buf, verf_at, args_at })
    }

    fn word(&self, off: usize) -> u32 {
        // In bounds by construction; 0 keeps this panic-free regardless.
        get_u32(self.buf, off).unwrap_or(0)
    }

    /// Transaction id.
    pub fn xid(&self) -> u32 {
        self.word(field::XID)
    }
    /// Program number.
    pub fn program(&self) -> Program {
        Program(self.word(field::PROG))
    }
    /// Program version.
    pub fn version(&self) -> u32 {
        self.word(field::VERS)
    }
    /// Procedure number.
    pub fn procedure(&self) -> u32 {
        self.word(field::PROC)
    }

    fn auth(&self, at: usize) -> OpaqueAuth<'a> {
        let len = self.word(at + 4) as usize;
        OpaqueAuth { flavor: AuthFlavor(self.word(at)), body: self.buf.get(at + 8..at + 8 + len).unwrap_or(&[]) }
    }
    /// The credential.
    pub fn cred(&self) -> OpaqueAuth<'a> {
        self.auth(field::CRED)
    }
    /// The verifier.
    pub fn verf(&self) -> OpaqueAuth<'a> {
        self.auth(self.verf_at)
    }
    /// Header length: the offset of the arguments.
    pub fn header_len(&self) -> usize {
        self.args_at
    }
    /// The procedure's arguments (the rest of the buffer given to `new_checked`).
    pub fn args(&self) -> &'a [u8] {
        &self.buf[self.args_at..]
    }
}

/// Longest AUTH_SYS machine name (`string machinename<255>`).
pub const MAX_MACHINE_NAME: usize = 255;
/// Most AUTH_SYS supplementary groups (`unsigned int gids<16>`).
pub const MAX_GIDS: usize = 16;

/// Why an AUTH_SYS body is malformed (answered with AUTH_BADCRED).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AuthSysError {
    /// A field runs past the end of the body.
    #[error("AUTH_SYS body truncated")]
    Truncated,
    /// The machine name is longer than 255 bytes.
    #[error("AUTH_SYS machine name of {0} bytes exceeds 255")]
    MachineNameTooLong(u32),
    /// More than 16 supplementary groups.
    #[error("AUTH_SYS carries {0} groups, at most 16 allowed")]
    TooManyGids(u32),
    /// Bytes follow the group list inside the body.
    #[error("{0} bytes follow the AUTH_SYS fields")]
    TrailingBytes(usize),
}

/// A decoded AUTH_SYS credential body (RFC 5531 Appendix A, `authsys_parms`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AuthSysParams<'a> {
    /// Arbitrary id the client chose.
    pub stamp: u32,
    /// The caller's machine name (not checked for UTF-8).
    pub machine_name: &'a [u8],
    /// Effective user id.
    pub uid: u32,
    /// Effective group id.
    pub gid: u32,
    /// The supplementary groups, 4 bytes each, big-endian.
    gids: &'a [u8],
}

impl<'a> AuthSysParams<'a> {
    /// Decodes an AUTH_SYS body; the fields must fill it exactly.
    pub fn parse(body: &'a [u8]) -> Result<Self, AuthSysError> {
        let stamp = get_u32(body, 0).ok_or(AuthSysError::Truncated)?;
        let name_len = get_u32(body, 4).ok_or(AuthSysError::Truncated)?;
        if name_len as usize > MAX_MACHINE_NAME {
            return Err(AuthSysError::MachineNameTooLong(name_len));
        }
        let name_end = 8 + name_len as usize;
        let machine_name = body.get(8..name_end).ok_or(AuthSysError::Truncated)?;
        let at = 8 + padded(name_len) as usize;
        let uid = get_u32(body, at).ok_or(AuthSysError::Truncated)?;
        let gid = get_u32(body, at + 4).ok_or(AuthSysError::Truncated)?;
        let ngids = get_u32(body, at + 8).ok_or(AuthSysError::Truncated)?;
        if ngids as usize > MAX_GIDS {
            return Err(AuthSysError::TooManyGids(ngids));
        }
        let gids_at = at + 12;
        let end = gids_at + 4 * ngids as usize;
        let gids = body.get(gids_at..end).ok_or(AuthSysError::Truncated)?;
        if end != body.len() {
            return Err(AuthSysError::TrailingBytes(body.len() - end));
        }
        Ok(AuthSysParams { stamp, machine_name, uid, gid, gids })
    }

    /// The supplementary groups.
    pub fn gids(&self) -> impl Iterator<Item = u32> + 'a {
        self.gids.chunks_exact(4).map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]))
    }
}

/// A credential for [`Call::encode`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Credential<'a> {
    /// AUTH_NONE with an empty body.
    None,
    /// AUTH_SYS (rpctest `-A sys`).
    Sys {
        /// Arbitrary id the client chooses.
        stamp: u32,
        /// The caller's machine name, ≤ 255 bytes.
        machine_name: &'a [u8],
        /// Effective user id.
        uid: u32,
        /// Effective group id.
        gid: u32,
        /// Supplementary groups, ≤ 16.
        gids: &'a [u32],
    },
}

/// A call to encode; the verifier is always AUTH_NONE (as for AUTH_SYS clients).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Call<'a> {
    /// Transaction id.
    pub xid: u32,
    /// Program number.
    pub prog: u32,
    /// Program version.
    pub vers: u32,
    /// Procedure number.
    pub procedure: u32,
    /// The credential.
    pub cred: Credential<'a>,
    /// Already XDR-encoded arguments (empty for NULL).
    pub args: &'a [u8],
}

impl Call<'_> {
    /// Appends this call to `out` as one record split into `fragments`
    /// fragments (see [`encode_record`] for the split). Refuses an AUTH_SYS
    /// credential the wire format cannot carry.
    pub fn encode(&self, fragments: usize, out: &mut Vec<u8>) -> Result<(), AuthSysError> {
        if let Credential::Sys { machine_name, gids, .. } = self.cred {
            if machine_name.len() > MAX_MACHINE_NAME {
                return Err(AuthSysError::MachineNameTooLong(machine_name.len() as u32));
            }
            if gids.len() > MAX_GIDS {
                return Err(AuthSysError::TooManyGids(gids.len() as u32));
            }
        }
        self.encode_valid(fragments, out);
        Ok(())
    }

    fn encode_valid(&self, fragments: usize, out: &mut Vec<u8>) {
        // The header is at most MAX_CALL_HEADER_LEN bytes: build it on the stack.
        let mut w = StackWriter::<MAX_CALL_HEADER_LEN>::new();
        w.put_u32(self.xid);
        w.put_u32(MsgType::CALL.0);
        w.put_u32(RPC_VERSION);
        w.put_u32(self.prog);
        w.put_u32(self.vers);
        w.put_u32(self.procedure);
        match self.cred {
            Credential::None => {
                w.put_u32(AuthFlavor::AUTH_NONE.0);
                w.put_u32(0);
            }
            Credential::Sys { stamp, machine_name, uid, gid, gids } => {
                // Body: stamp, name (padded), uid, gid, count, gids. ≤ 4+260+12+64 < 400.
                let name_pad = padded(machine_name.len() as u32) as usize;
                let body_len = 4 + 4 + name_pad + 12 + 4 * gids.len();
                w.put_u32(AuthFlavor::AUTH_SYS.0);
                w.put_u32(body_len as u32);
                w.put_u32(stamp);
                w.put_opaque(machine_name);
                w.put_u32(uid);
                w.put_u32(gid);
                w.put_u32(gids.len() as u32);
                for &g in gids {
                    w.put_u32(g);
                }
            }
        }
        w.put_u32(AuthFlavor::AUTH_NONE.0);
        w.put_u32(0);
        if self.args.is_empty() {
            encode_record(w.as_slice(), fragments, out);
        } else {
            crate::record::encode_record_parts(w.as_slice(), self.args, fragments, out);
        }
    }
}

/// Appends a NULL call (procedure 0, AUTH_NONE, no arguments) for `prog`/`vers`
/// with this `xid`, as one record of `fragments` fragments (≥ 1; 3 gives
/// rpctest `-f`'s 1/38/1 split). With one fragment that is the 44-byte call of
/// ksf.md §2.4.
pub fn encode_null_call(xid: u32, prog: u32, vers: u32, fragments: usize, out: &mut Vec<u8>) {
    Call { xid, prog, vers, procedure: crate::msg::NULLPROC, cred: Credential::None, args: &[] }
        .encode_valid(fragments, out);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(MIN_CALL_LEN, 40);
        assert_eq!(MAX_CALL_HEADER_LEN, 840);
    }

    #[test]
    fn auth_sys_round_trip() {
        let call = Call {
            xid: 9,
            prog: 100003,
            vers: 3,
            procedure: 0,
            cred: Credential::Sys { stamp: 7, machine_name: b"vm", uid: 65534, gid: 65534, gids: &[1, 2] },
            args: &[],
        };
        let mut out = Vec::new();
        call.encode(1, &mut out).unwrap();
        let h = CallHeader::new_checked(&out[4..]).unwrap();
        assert_eq!(h.cred().flavor, AuthFlavor::AUTH_SYS);
        let p = AuthSysParams::parse(h.cred().body).unwrap();
        assert_eq!((p.stamp, p.machine_name, p.uid, p.gid), (7, &b"vm"[..], 65534, 65534));
        assert_eq!(p.gids().collect::<Vec<_>>(), [1, 2]);
        assert!(h.args().is_empty());
    }

    #[test]
    fn auth_sys_errors() {
        assert_eq!(AuthSysParams::parse(&[]), Err(AuthSysError::Truncated));
        let mut b = vec![0, 0, 0, 1, 0, 0, 1, 0];
        assert_eq!(AuthSysParams::parse(&b), Err(AuthSysError::MachineNameTooLong(256)));
        b[6] = 0;
        b.extend_from_slice(&[0; 8]);
        b.extend_from_slice(&17u32.to_be_bytes());
        assert_eq!(AuthSysParams::parse(&b), Err(AuthSysError::TooManyGids(17)));
        let l = b.len();
        b[l - 1] = 0;
        b.push(5);
        assert_eq!(AuthSysParams::parse(&b), Err(AuthSysError::TrailingBytes(1)));
        let too_many = [0u32; 17];
        let c = Call {
            xid: 0,
            prog: 1,
            vers: 1,
            procedure: 0,
            cred: Credential::Sys { stamp: 0, machine_name: b"", uid: 0, gid: 0, gids: &too_many },
            args: &[],
        };
        assert_eq!(c.encode(1, &mut Vec::new()), Err(AuthSysError::TooManyGids(17)));
    }
}
