//! NFS version 3 procedure arguments (RFC 1813 §3.3): [`NfsCall::decode`]
//! reads a call's argument bytes into a typed view that borrows them (file
//! handles, names and WRITE data are slices of the input), and
//! [`NfsCall::encode`] writes the same bytes (for clients and tests).
//!
//! Limits beyond RFC 1813's own: names and paths of at most
//! [`MAXPATHLEN`] bytes (a single name is checked by the server), file
//! handles of at most [`FHSIZE`] bytes. WRITE's data must be exactly `count`
//! bytes long ([`XdrError::WriteCount`]; Linux's nfsd refuses it too).
//! Bytes after the arguments are ignored, as the Sun/TI-RPC decoders do.

use crate::types::{Ftype3, Nfstime3, Sattr3, StableHow, FHSIZE, MAXPATHLEN, VERFSIZE};
use crate::xdr::{put_bool, put_fixed, put_opaque, put_u32, put_u64, Reader, XdrError};

/// NFS version 3 procedure numbers.
pub mod proc3 {
    #![allow(missing_docs)]
    pub const NULL: u32 = 0;
    pub const GETATTR: u32 = 1;
    pub const SETATTR: u32 = 2;
    pub const LOOKUP: u32 = 3;
    pub const ACCESS: u32 = 4;
    pub const READLINK: u32 = 5;
    pub const READ: u32 = 6;
    pub const WRITE: u32 = 7;
    pub const CREATE: u32 = 8;
    pub const MKDIR: u32 = 9;
    pub const SYMLINK: u32 = 10;
    pub const MKNOD: u32 = 11;
    pub const REMOVE: u32 = 12;
    pub const RMDIR: u32 = 13;
    pub const RENAME: u32 = 14;
    pub const LINK: u32 = 15;
    pub const READDIR: u32 = 16;
    pub const READDIRPLUS: u32 = 17;
    pub const FSSTAT: u32 = 18;
    pub const FSINFO: u32 = 19;
    pub const PATHCONF: u32 = 20;
    pub const COMMIT: u32 = 21;
}

/// The RFC's name of procedure `p`.
pub fn proc_name(p: u32) -> &'static str {
    const NAMES: [&str; 22] = [
        "NULL",
        "GETATTR",
        "SETATTR",
        "LOOKUP",
        "ACCESS",
        "READLINK",
        "READ",
        "WRITE",
        "CREATE",
        "MKDIR",
        "SYMLINK",
        "MKNOD",
        "REMOVE",
        "RMDIR",
        "RENAME",
        "LINK",
        "READDIR",
        "READDIRPLUS",
        "FSSTAT",
        "FSINFO",
        "PATHCONF",
        "COMMIT",
    ];
    NAMES.get(p as usize).copied().unwrap_or("?")
}

/// A directory and a name in it (`diropargs3`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DirOp<'a> {
    /// The directory's handle.
    pub dir: &'a [u8],
    /// The name (bytes, not checked here).
    pub name: &'a [u8],
}

impl<'a> DirOp<'a> {
    fn get(r: &mut Reader<'a>) -> Result<Self, XdrError> {
        Ok(DirOp { dir: fh(r)?, name: r.opaque("filename3", MAXPATHLEN)? })
    }
    fn put(&self, out: &mut Vec<u8>) {
        put_opaque(out, self.dir);
        put_opaque(out, self.name);
    }
}

/// How CREATE creates (`createhow3`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CreateHow {
    /// UNCHECKED: an existing file is used.
    Unchecked(Sattr3),
    /// GUARDED: an existing file is NFS3ERR_EXIST.
    Guarded(Sattr3),
    /// EXCLUSIVE with the client's verifier.
    Exclusive([u8; VERFSIZE]),
}

/// A decoded NFS version 3 call: the procedure and its arguments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NfsCall<'a> {
    /// NULL.
    Null,
    /// GETATTR.
    Getattr {
        /// The object.
        fh: &'a [u8],
    },
    /// SETATTR.
    Setattr {
        /// The object.
        fh: &'a [u8],
        /// What to set.
        attr: Sattr3,
        /// Only if the object's ctime is this.
        guard: Option<Nfstime3>,
    },
    /// LOOKUP.
    Lookup(DirOp<'a>),
    /// ACCESS.
    Access {
        /// The object.
        fh: &'a [u8],
        /// ACCESS3_* bits asked about.
        access: u32,
    },
    /// READLINK.
    Readlink {
        /// The link.
        fh: &'a [u8],
    },
    /// READ.
    Read {
        /// The file.
        fh: &'a [u8],
        /// Where.
        offset: u64,
        /// Bytes asked for (the server answers at most its `rtmax`).
        count: u32,
    },
    /// WRITE.
    Write {
        /// The file.
        fh: &'a [u8],
        /// Where.
        offset: u64,
        /// How stable the data must be before the reply.
        stable: StableHow,
        /// The data (`count` bytes, checked).
        data: &'a [u8],
    },
    /// CREATE.
    Create {
        /// Where and what.
        at: DirOp<'a>,
        /// How.
        how: CreateHow,
    },
    /// MKDIR.
    Mkdir {
        /// Where and what.
        at: DirOp<'a>,
        /// Initial attributes.
        attr: Sattr3,
    },
    /// SYMLINK.
    Symlink {
        /// Where and what.
        at: DirOp<'a>,
        /// Initial attributes.
        attr: Sattr3,
        /// The link's contents.
        target: &'a [u8],
    },
    /// MKNOD (its attributes and device numbers are checked, not kept:
    /// the server does not make special files).
    Mknod {
        /// Where and what.
        at: DirOp<'a>,
        /// The type asked for.
        ftype: Ftype3,
    },
    /// REMOVE.
    Remove(DirOp<'a>),
    /// RMDIR.
    Rmdir(DirOp<'a>),
    /// RENAME.
    Rename {
        /// From.
        from: DirOp<'a>,
        /// To.
        to: DirOp<'a>,
    },
    /// LINK.
    Link {
        /// The existing file.
        fh: &'a [u8],
        /// The new name.
        at: DirOp<'a>,
    },
    /// READDIR.
    Readdir {
        /// The directory.
        dir: &'a [u8],
        /// Where to go on from (0: the start).
        cookie: u64,
        /// The verifier that came with the cookie.
        verf: [u8; VERFSIZE],
        /// Most bytes of the reply.
        count: u32,
    },
    /// READDIRPLUS.
    Readdirplus {
        /// The directory.
        dir: &'a [u8],
        /// Where to go on from (0: the start).
        cookie: u64,
        /// The verifier that came with the cookie.
        verf: [u8; VERFSIZE],
        /// Most bytes of directory information (ids, names, cookies).
        dircount: u32,
        /// Most bytes of the reply.
        maxcount: u32,
    },
    /// FSSTAT.
    Fsstat {
        /// Any object of the file system.
        fh: &'a [u8],
    },
    /// FSINFO.
    Fsinfo {
        /// The root.
        fh: &'a [u8],
    },
    /// PATHCONF.
    Pathconf {
        /// The object.
        fh: &'a [u8],
    },
    /// COMMIT.
    Commit {
        /// The file.
        fh: &'a [u8],
        /// Start of the range.
        offset: u64,
        /// Its length (0: to the end).
        count: u32,
    },
}

fn fh<'a>(r: &mut Reader<'a>) -> Result<&'a [u8], XdrError> {
    r.opaque("nfs_fh3", FHSIZE)
}

fn verf(r: &mut Reader<'_>, what: &'static str) -> Result<[u8; VERFSIZE], XdrError> {
    Ok(r.fixed(what, VERFSIZE)?.try_into().expect("8 bytes"))
}

impl<'a> NfsCall<'a> {
    /// Decodes the arguments `args` of procedure `proc`.
    pub fn decode(proc: u32, args: &'a [u8]) -> Result<Self, XdrError> {
        use proc3::*;
        let r = &mut Reader::new(args);
        Ok(match proc {
            NULL => NfsCall::Null,
            GETATTR => NfsCall::Getattr { fh: fh(r)? },
            SETATTR => {
                let fh = fh(r)?;
                let attr = Sattr3::get(r)?;
                let guard = if r.bool("sattrguard3")? { Some(Nfstime3::get(r)?) } else { None };
                NfsCall::Setattr { fh, attr, guard }
            }
            LOOKUP => NfsCall::Lookup(DirOp::get(r)?),
            ACCESS => NfsCall::Access { fh: fh(r)?, access: r.u32("access")? },
            READLINK => NfsCall::Readlink { fh: fh(r)? },
            READ => NfsCall::Read { fh: fh(r)?, offset: r.u64("offset")?, count: r.u32("count")? },
            WRITE => {
                let fh = fh(r)?;
                let offset = r.u64("offset")?;
                let count = r.u32("count")?;
                let s = r.u32("stable_how")?;
                let stable = StableHow::from_u32(s).ok_or(XdrError::BadValue { what: "stable_how", value: s })?;
                let len = r.clone().u32("data")?;
                if len != count {
                    return Err(XdrError::WriteCount { count, len });
                }
                let data = r.opaque("data", u32::MAX)?;
                NfsCall::Write { fh, offset, stable, data }
            }
            CREATE => {
                let at = DirOp::get(r)?;
                let how = match r.u32("createmode3")? {
                    0 => CreateHow::Unchecked(Sattr3::get(r)?),
                    1 => CreateHow::Guarded(Sattr3::get(r)?),
                    2 => CreateHow::Exclusive(verf(r, "createverf3")?),
                    value => return Err(XdrError::BadValue { what: "createmode3", value }),
                };
                NfsCall::Create { at, how }
            }
            MKDIR => NfsCall::Mkdir { at: DirOp::get(r)?, attr: Sattr3::get(r)? },
            SYMLINK => NfsCall::Symlink {
                at: DirOp::get(r)?,
                attr: Sattr3::get(r)?,
                target: r.opaque("nfspath3", MAXPATHLEN)?,
            },
            MKNOD => {
                let at = DirOp::get(r)?;
                let t = r.u32("ftype3")?;
                let ftype = Ftype3::from_u32(t).ok_or(XdrError::BadValue { what: "ftype3", value: t })?;
                match ftype {
                    Ftype3::Chr | Ftype3::Blk => {
                        Sattr3::get(r)?;
                        r.u64("specdata3")?;
                    }
                    Ftype3::Sock | Ftype3::Fifo => {
                        Sattr3::get(r)?;
                    }
                    _ => {}
                }
                NfsCall::Mknod { at, ftype }
            }
            REMOVE => NfsCall::Remove(DirOp::get(r)?),
            RMDIR => NfsCall::Rmdir(DirOp::get(r)?),
            RENAME => NfsCall::Rename { from: DirOp::get(r)?, to: DirOp::get(r)? },
            LINK => NfsCall::Link { fh: fh(r)?, at: DirOp::get(r)? },
            READDIR => NfsCall::Readdir {
                dir: fh(r)?,
                cookie: r.u64("cookie")?,
                verf: verf(r, "cookieverf3")?,
                count: r.u32("count")?,
            },
            READDIRPLUS => NfsCall::Readdirplus {
                dir: fh(r)?,
                cookie: r.u64("cookie")?,
                verf: verf(r, "cookieverf3")?,
                dircount: r.u32("dircount")?,
                maxcount: r.u32("maxcount")?,
            },
            FSSTAT => NfsCall::Fsstat { fh: fh(r)? },
            FSINFO => NfsCall::Fsinfo { fh: fh(r)? },
            PATHCONF => NfsCall::Pathconf { fh: fh(r)? },
            COMMIT => NfsCall::Commit { fh: fh(r)?, offset: r.u64("offset")?, count: r.u32("count")? },
            p => return Err(XdrError::UnknownProc(p)),
        })
    }

    /// The procedure number.
    pub fn proc(&self) -> u32 {
        use proc3::*;
        match self {
            NfsCall::Null => NULL,
            NfsCall::Getattr { .. } => GETATTR,
            NfsCall::Setattr { .. } => SETATTR,
            NfsCall::Lookup(_) => LOOKUP,
            NfsCall::Access { .. } => ACCESS,
            NfsCall::Readlink { .. } => READLINK,
            NfsCall::Read { .. } => READ,
            NfsCall::Write { .. } => WRITE,
            NfsCall::Create { .. } => CREATE,
            NfsCall::Mkdir { .. } => MKDIR,
            NfsCall::Symlink { .. } => SYMLINK,
            NfsCall::Mknod { .. } => MKNOD,
            NfsCall::Remove(_) => REMOVE,
            NfsCall::Rmdir(_) => RMDIR,
            NfsCall::Rename { .. } => RENAME,
            NfsCall::Link { .. } => LINK,
            NfsCall::Readdir { .. } => READDIR,
            NfsCall::Readdirplus { .. } => READDIRPLUS,
            NfsCall::Fsstat { .. } => FSSTAT,
            NfsCall::Fsinfo { .. } => FSINFO,
            NfsCall::Pathconf { .. } => PATHCONF,
            NfsCall::Commit { .. } => COMMIT,
        }
    }

    /// Appends the arguments (MKNOD's with no attributes set, device 0,0).
    pub fn encode(&self, out: &mut Vec<u8>) {
        match *self {
            NfsCall::Null => {}
            NfsCall::Getattr { fh }
            | NfsCall::Readlink { fh }
            | NfsCall::Fsstat { fh }
            | NfsCall::Fsinfo { fh }
            | NfsCall::Pathconf { fh } => put_opaque(out, fh),
            NfsCall::Setattr { fh, attr, guard } => {
                put_opaque(out, fh);
                attr.put(out);
                put_bool(out, guard.is_some());
                if let Some(g) = guard {
                    g.put(out);
                }
            }
            NfsCall::Lookup(d) | NfsCall::Remove(d) | NfsCall::Rmdir(d) => d.put(out),
            NfsCall::Access { fh, access } => {
                put_opaque(out, fh);
                put_u32(out, access);
            }
            NfsCall::Read { fh, offset, count } | NfsCall::Commit { fh, offset, count } => {
                put_opaque(out, fh);
                put_u64(out, offset);
                put_u32(out, count);
            }
            NfsCall::Write { fh, offset, stable, data } => {
                put_opaque(out, fh);
                put_u64(out, offset);
                put_u32(out, data.len() as u32);
                put_u32(out, stable as u32);
                put_opaque(out, data);
            }
            NfsCall::Create { at, how } => {
                at.put(out);
                match how {
                    CreateHow::Unchecked(a) => {
                        put_u32(out, 0);
                        a.put(out);
                    }
                    CreateHow::Guarded(a) => {
                        put_u32(out, 1);
                        a.put(out);
                    }
                    CreateHow::Exclusive(v) => {
                        put_u32(out, 2);
                        put_fixed(out, &v);
                    }
                }
            }
            NfsCall::Mkdir { at, attr } => {
                at.put(out);
                attr.put(out);
            }
            NfsCall::Symlink { at, attr, target } => {
                at.put(out);
                attr.put(out);
                put_opaque(out, target);
            }
            NfsCall::Mknod { at, ftype } => {
                at.put(out);
                put_u32(out, ftype as u32);
                match ftype {
                    Ftype3::Chr | Ftype3::Blk => {
                        Sattr3::default().put(out);
                        put_u64(out, 0);
                    }
                    Ftype3::Sock | Ftype3::Fifo => Sattr3::default().put(out),
                    _ => {}
                }
            }
            NfsCall::Rename { from, to } => {
                from.put(out);
                to.put(out);
            }
            NfsCall::Link { fh, at } => {
                put_opaque(out, fh);
                at.put(out);
            }
            NfsCall::Readdir { dir, cookie, verf, count } => {
                put_opaque(out, dir);
                put_u64(out, cookie);
                put_fixed(out, &verf);
                put_u32(out, count);
            }
            NfsCall::Readdirplus { dir, cookie, verf, dircount, maxcount } => {
                put_opaque(out, dir);
                put_u64(out, cookie);
                put_fixed(out, &verf);
                put_u32(out, dircount);
                put_u32(out, maxcount);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::SetTime;

    /// One call of every procedure.
    pub(crate) fn every_call() -> Vec<NfsCall<'static>> {
        let fh: &[u8] = b"0123456789abcdef0123";
        let d = DirOp { dir: fh, name: b"name" };
        let attr = Sattr3 { mode: Some(0o755), size: Some(3), atime: SetTime::ServerTime, ..Sattr3::default() };
        vec![
            NfsCall::Null,
            NfsCall::Getattr { fh },
            NfsCall::Setattr { fh, attr, guard: Some(Nfstime3 { seconds: 1, nseconds: 2 }) },
            NfsCall::Setattr { fh, attr: Sattr3::default(), guard: None },
            NfsCall::Lookup(d),
            NfsCall::Access { fh, access: 0x3f },
            NfsCall::Readlink { fh },
            NfsCall::Read { fh, offset: 1 << 40, count: 4096 },
            NfsCall::Write { fh, offset: 5, stable: StableHow::DataSync, data: b"hello" },
            NfsCall::Write { fh, offset: 0, stable: StableHow::Unstable, data: b"" },
            NfsCall::Create { at: d, how: CreateHow::Unchecked(attr) },
            NfsCall::Create { at: d, how: CreateHow::Guarded(Sattr3::default()) },
            NfsCall::Create { at: d, how: CreateHow::Exclusive(*b"verifier") },
            NfsCall::Mkdir { at: d, attr },
            NfsCall::Symlink { at: d, attr, target: b"../x" },
            NfsCall::Mknod { at: d, ftype: Ftype3::Fifo },
            NfsCall::Mknod { at: d, ftype: Ftype3::Chr },
            NfsCall::Mknod { at: d, ftype: Ftype3::Reg },
            NfsCall::Remove(d),
            NfsCall::Rmdir(d),
            NfsCall::Rename { from: d, to: DirOp { dir: b"", name: b"other" } },
            NfsCall::Link { fh, at: d },
            NfsCall::Readdir { dir: fh, cookie: 9, verf: [1; 8], count: 4096 },
            NfsCall::Readdirplus { dir: fh, cookie: 0, verf: [0; 8], dircount: 512, maxcount: 8192 },
            NfsCall::Fsstat { fh },
            NfsCall::Fsinfo { fh },
            NfsCall::Pathconf { fh },
            NfsCall::Commit { fh, offset: 0, count: 0 },
        ]
    }

    #[test]
    fn every_call_round_trips_and_every_truncation_is_an_error() {
        for c in every_call() {
            let mut out = Vec::new();
            c.encode(&mut out);
            assert_eq!(out.len() % 4, 0, "{c:?}");
            assert_eq!(NfsCall::decode(c.proc(), &out), Ok(c), "{}", proc_name(c.proc()));
            for n in 0..out.len() {
                assert!(NfsCall::decode(c.proc(), &out[..n]).is_err(), "{} cut at {n}", proc_name(c.proc()));
            }
        }
    }

    #[test]
    fn hostile_arguments() {
        assert_eq!(NfsCall::decode(22, &[]), Err(XdrError::UnknownProc(22)));
        // A handle over 64 bytes.
        let mut out = Vec::new();
        put_opaque(&mut out, &[0; 65]);
        assert_eq!(NfsCall::decode(proc3::GETATTR, &out), Err(XdrError::TooLong { what: "nfs_fh3", len: 65, max: 64 }));
        // A 4 GiB READ decodes (the server clamps it to its rtmax).
        let mut out = Vec::new();
        NfsCall::Read { fh: b"h", offset: 0, count: u32::MAX }.encode(&mut out);
        assert!(matches!(NfsCall::decode(proc3::READ, &out), Ok(NfsCall::Read { count: u32::MAX, .. })));
        // A WRITE whose data is shorter than its count.
        let mut out = Vec::new();
        NfsCall::Write { fh: b"h", offset: 0, stable: StableHow::FileSync, data: b"abcd" }.encode(&mut out);
        let at = 4 + 4 + 8;
        out[at..at + 4].copy_from_slice(&u32::MAX.to_be_bytes());
        assert_eq!(NfsCall::decode(proc3::WRITE, &out), Err(XdrError::WriteCount { count: u32::MAX, len: 4 }));
        // A 4 GiB data length with matching count: truncated, nothing allocated.
        out[at..at + 4].copy_from_slice(&u32::MAX.to_be_bytes());
        out[at + 8..at + 12].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(matches!(NfsCall::decode(proc3::WRITE, &out), Err(XdrError::Truncated { .. })));
        // An unknown stable_how.
        let mut out = Vec::new();
        NfsCall::Write { fh: b"h", offset: 0, stable: StableHow::FileSync, data: b"" }.encode(&mut out);
        out[at + 7] = 3;
        assert_eq!(NfsCall::decode(proc3::WRITE, &out), Err(XdrError::BadValue { what: "stable_how", value: 3 }));
    }
}
