//! The MOUNT protocol, version 3 (RFC 1813 appendix I): the calls a client
//! makes to get the export's root handle, and their results.

use crate::types::{FHSIZE, MAXPATHLEN};
use crate::xdr::{put_bool, put_opaque, put_u32, Reader, XdrError};

/// MOUNT version 3 procedure numbers.
pub mod mproc {
    #![allow(missing_docs)]
    pub const NULL: u32 = 0;
    pub const MNT: u32 = 1;
    pub const DUMP: u32 = 2;
    pub const UMNT: u32 = 3;
    pub const UMNTALL: u32 = 4;
    pub const EXPORT: u32 = 5;
}

/// `mountstat3` values.
pub mod mountstat {
    #![allow(missing_docs)]
    pub const OK: u32 = 0;
    pub const ERR_PERM: u32 = 1;
    pub const ERR_NOENT: u32 = 2;
    pub const ERR_IO: u32 = 5;
    pub const ERR_ACCES: u32 = 13;
    pub const ERR_NOTDIR: u32 = 20;
    pub const ERR_INVAL: u32 = 22;
    pub const ERR_NAMETOOLONG: u32 = 63;
    pub const ERR_NOTSUPP: u32 = 10004;
    pub const ERR_SERVERFAULT: u32 = 10006;
}

/// A decoded MOUNT call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MountCall<'a> {
    /// NULL.
    Null,
    /// MNT of a path.
    Mnt(&'a [u8]),
    /// DUMP.
    Dump,
    /// UMNT of a path.
    Umnt(&'a [u8]),
    /// UMNTALL.
    Umntall,
    /// EXPORT.
    Export,
}

impl<'a> MountCall<'a> {
    /// Decodes the arguments of procedure `proc`.
    pub fn decode(proc: u32, args: &'a [u8]) -> Result<Self, XdrError> {
        let mut r = Reader::new(args);
        Ok(match proc {
            mproc::NULL => MountCall::Null,
            mproc::MNT => MountCall::Mnt(r.opaque("dirpath", MAXPATHLEN)?),
            mproc::DUMP => MountCall::Dump,
            mproc::UMNT => MountCall::Umnt(r.opaque("dirpath", MAXPATHLEN)?),
            mproc::UMNTALL => MountCall::Umntall,
            mproc::EXPORT => MountCall::Export,
            p => return Err(XdrError::UnknownProc(p)),
        })
    }

    /// The procedure number.
    pub fn proc(&self) -> u32 {
        match self {
            MountCall::Null => mproc::NULL,
            MountCall::Mnt(_) => mproc::MNT,
            MountCall::Dump => mproc::DUMP,
            MountCall::Umnt(_) => mproc::UMNT,
            MountCall::Umntall => mproc::UMNTALL,
            MountCall::Export => mproc::EXPORT,
        }
    }

    /// Appends the arguments.
    pub fn encode(&self, out: &mut Vec<u8>) {
        if let MountCall::Mnt(p) | MountCall::Umnt(p) = self {
            put_opaque(out, p);
        }
    }
}

/// MNT's success: the root handle and the flavours accepted.
pub fn mnt_ok(out: &mut Vec<u8>, fh: &[u8], flavors: &[u32]) {
    put_u32(out, mountstat::OK);
    put_opaque(out, fh);
    put_u32(out, flavors.len() as u32);
    for &f in flavors {
        put_u32(out, f);
    }
}

/// MNT's failure.
pub fn mnt_err(out: &mut Vec<u8>, status: u32) {
    put_u32(out, status);
}

/// EXPORT's result: each path with no group restriction.
pub fn exports(out: &mut Vec<u8>, paths: &[&[u8]]) {
    for p in paths {
        put_bool(out, true);
        put_opaque(out, p);
        put_bool(out, false); // no groups
    }
    put_bool(out, false);
}

/// DUMP's result: no mount is listed.
pub fn dump_empty(out: &mut Vec<u8>) {
    put_bool(out, false);
}

/// MNT's result as a client reads it: the handle, or the status.
pub fn decode_mnt(results: &[u8]) -> Result<Result<&[u8], u32>, XdrError> {
    let mut r = Reader::new(results);
    let s = r.u32("mountstat3")?;
    if s != mountstat::OK {
        return Ok(Err(s));
    }
    let fh = r.opaque("fhandle3", FHSIZE)?;
    let n = r.u32("auth_flavors")?;
    // Bounded by the input: each flavour is 4 bytes.
    if n as usize > r.remaining() / 4 {
        return Err(XdrError::Truncated {
            what: "auth_flavors",
            at: r.position(),
            need: 4 * u64::from(n),
            have: results.len(),
        });
    }
    for _ in 0..n {
        r.u32("auth_flavor")?;
    }
    Ok(Ok(fh))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_calls_and_results_round_trip() {
        for c in [
            MountCall::Null,
            MountCall::Mnt(b"/srv/x"),
            MountCall::Dump,
            MountCall::Umnt(b"/"),
            MountCall::Umntall,
            MountCall::Export,
        ] {
            let mut out = Vec::new();
            c.encode(&mut out);
            assert_eq!(MountCall::decode(c.proc(), &out), Ok(c));
            for n in 0..out.len() {
                assert!(MountCall::decode(c.proc(), &out[..n]).is_err());
            }
        }
        assert_eq!(MountCall::decode(9, &[]), Err(XdrError::UnknownProc(9)));
        let mut out = Vec::new();
        mnt_ok(&mut out, b"root-handle", &[1, 0]);
        assert_eq!(decode_mnt(&out), Ok(Ok(&b"root-handle"[..])));
        for n in 0..out.len() {
            assert!(decode_mnt(&out[..n]).is_err());
        }
        let mut out = Vec::new();
        mnt_err(&mut out, mountstat::ERR_NOENT);
        assert_eq!(decode_mnt(&out), Ok(Err(2)));
        // A flavour count the input cannot hold.
        let mut out = Vec::new();
        mnt_ok(&mut out, b"h", &[]);
        let n = out.len();
        out[n - 4..].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(matches!(decode_mnt(&out), Err(XdrError::Truncated { .. })));
    }
}
