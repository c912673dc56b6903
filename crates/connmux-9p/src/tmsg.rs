//! Requests: [`Tmsg::decode`] checks one whole message and borrows its
//! strings and data; [`Tmsg::encode`] writes one (for clients and tests).
//!
//! Each body's fields, after the header (offset 7):
//! ```text
//! Tversion     msize[4] version[s]
//! Tauth        afid[4] uname[s] aname[s] n_uname[4]
//! Tattach      fid[4] afid[4] uname[s] aname[s] n_uname[4]
//! Tflush       oldtag[2]
//! Twalk        fid[4] newfid[4] nwname[2] nwname*(wname[s])     nwname <= 16
//! Tread        fid[4] offset[8] count[4]
//! Twrite       fid[4] offset[8] count[4] data[count]
//! Tclunk       fid[4]
//! Tremove      fid[4]
//! Tstatfs      fid[4]
//! Tlopen       fid[4] flags[4]
//! Tlcreate     fid[4] name[s] flags[4] mode[4] gid[4]
//! Tsymlink     fid[4] name[s] symtgt[s] gid[4]
//! Tmknod       dfid[4] name[s] mode[4] major[4] minor[4] gid[4]
//! Trename      fid[4] dfid[4] name[s]
//! Treadlink    fid[4]
//! Tgetattr     fid[4] request_mask[8]
//! Tsetattr     fid[4] valid[4] mode[4] uid[4] gid[4] size[8] atime[8+8] mtime[8+8]
//! Txattrwalk   fid[4] newfid[4] name[s]
//! Txattrcreate fid[4] name[s] attr_size[8] flags[4]
//! Treaddir     fid[4] offset[8] count[4]
//! Tfsync       fid[4] [datasync[4]]       (older clients omit datasync)
//! Tlock        fid[4] type[1] flags[4] start[8] length[8] proc_id[4] client_id[s]
//! Tgetlock     fid[4] type[1] start[8] length[8] proc_id[4] client_id[s]
//! Tlink        dfid[4] fid[4] name[s]
//! Tmkdir       dfid[4] name[s] mode[4] gid[4]
//! Trenameat    olddirfid[4] oldname[s] newdirfid[4] newname[s]
//! Tunlinkat    dirfid[4] name[s] flags[4]
//! ```

use crate::header::{Header, MsgType};
use crate::rmsg::Encoder;
use crate::types::SetAttr;
use crate::wire::{Reader, WireError};
use crate::MAX_WALK;

/// A byte-range lock request (Tlock / Tgetlock).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lock<'a> {
    /// The fid.
    pub fid: u32,
    /// F_RDLCK 0, F_WRLCK 1, F_UNLCK 2.
    pub lock_type: u8,
    /// Tlock's flags (block, reclaim); 0 for Tgetlock.
    pub flags: u32,
    /// Start of the range.
    pub start: u64,
    /// Length of the range (0: to the end).
    pub length: u64,
    /// The client's process.
    pub proc_id: u32,
    /// The client's name.
    pub client_id: &'a str,
}

/// One request, decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum Tmsg<'a> {
    Version { msize: u32, version: &'a str },
    Auth { afid: u32, uname: &'a str, aname: &'a str, n_uname: u32 },
    Attach { fid: u32, afid: u32, uname: &'a str, aname: &'a str, n_uname: u32 },
    Flush { oldtag: u16 },
    Walk { fid: u32, newfid: u32, names: Vec<&'a str> },
    Read { fid: u32, offset: u64, count: u32 },
    Write { fid: u32, offset: u64, data: &'a [u8] },
    Clunk { fid: u32 },
    Remove { fid: u32 },
    Statfs { fid: u32 },
    Lopen { fid: u32, flags: u32 },
    Lcreate { fid: u32, name: &'a str, flags: u32, mode: u32, gid: u32 },
    Symlink { fid: u32, name: &'a str, target: &'a str, gid: u32 },
    Mknod { dfid: u32, name: &'a str, mode: u32, major: u32, minor: u32, gid: u32 },
    Rename { fid: u32, dfid: u32, name: &'a str },
    Readlink { fid: u32 },
    Getattr { fid: u32, mask: u64 },
    Setattr { fid: u32, attr: SetAttr },
    Xattrwalk { fid: u32, newfid: u32, name: &'a str },
    Xattrcreate { fid: u32, name: &'a str, size: u64, flags: u32 },
    Readdir { fid: u32, offset: u64, count: u32 },
    Fsync { fid: u32, datasync: u32 },
    Lock(Lock<'a>),
    Getlock(Lock<'a>),
    Link { dfid: u32, fid: u32, name: &'a str },
    Mkdir { dfid: u32, name: &'a str, mode: u32, gid: u32 },
    Renameat { olddirfid: u32, oldname: &'a str, newdirfid: u32, newname: &'a str },
    Unlinkat { dirfid: u32, name: &'a str, flags: u32 },
}

impl<'a> Tmsg<'a> {
    /// Decodes one whole message: its tag and request. Every field must lie
    /// inside the message and no byte may follow the last one.
    pub fn decode(buf: &'a [u8]) -> Result<(u16, Tmsg<'a>), WireError> {
        let h = Header::new_checked(buf)?;
        let mut r = Reader::new(buf, crate::header::field::BODY);
        let m = Self::body(h.msg_type(), &mut r)?;
        r.finish()?;
        Ok((h.tag(), m))
    }

    fn body(ty: MsgType, r: &mut Reader<'a>) -> Result<Tmsg<'a>, WireError> {
        Ok(match ty {
            MsgType::TVERSION => Tmsg::Version { msize: r.u32()?, version: r.str()? },
            MsgType::TAUTH => Tmsg::Auth { afid: r.u32()?, uname: r.str()?, aname: r.str()?, n_uname: r.u32()? },
            MsgType::TATTACH => {
                Tmsg::Attach { fid: r.u32()?, afid: r.u32()?, uname: r.str()?, aname: r.str()?, n_uname: r.u32()? }
            }
            MsgType::TFLUSH => Tmsg::Flush { oldtag: r.u16()? },
            MsgType::TWALK => {
                let (fid, newfid, n) = (r.u32()?, r.u32()?, r.u16()?);
                if n as usize > MAX_WALK {
                    return Err(WireError::TooManyNames { n });
                }
                let mut names = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    names.push(r.str()?);
                }
                Tmsg::Walk { fid, newfid, names }
            }
            MsgType::TREAD => Tmsg::Read { fid: r.u32()?, offset: r.u64()?, count: r.u32()? },
            MsgType::TWRITE => Tmsg::Write { fid: r.u32()?, offset: r.u64()?, data: r.data()? },
            MsgType::TCLUNK => Tmsg::Clunk { fid: r.u32()? },
            MsgType::TREMOVE => Tmsg::Remove { fid: r.u32()? },
            MsgType::TSTATFS => Tmsg::Statfs { fid: r.u32()? },
            MsgType::TLOPEN => Tmsg::Lopen { fid: r.u32()?, flags: r.u32()? },
            MsgType::TLCREATE => {
                Tmsg::Lcreate { fid: r.u32()?, name: r.str()?, flags: r.u32()?, mode: r.u32()?, gid: r.u32()? }
            }
            MsgType::TSYMLINK => Tmsg::Symlink { fid: r.u32()?, name: r.str()?, target: r.str()?, gid: r.u32()? },
            MsgType::TMKNOD => Tmsg::Mknod {
                dfid: r.u32()?,
                name: r.str()?,
                mode: r.u32()?,
                major: r.u32()?,
                minor: r.u32()?,
                gid: r.u32()?,
            },
            MsgType::TRENAME => Tmsg::Rename { fid: r.u32()?, dfid: r.u32()?, name: r.str()? },
            MsgType::TREADLINK => Tmsg::Readlink { fid: r.u32()? },
            MsgType::TGETATTR => Tmsg::Getattr { fid: r.u32()?, mask: r.u64()? },
            MsgType::TSETATTR => Tmsg::Setattr { fid: r.u32()?, attr: SetAttr::read(r)? },
            MsgType::TXATTRWALK => Tmsg::Xattrwalk { fid: r.u32()?, newfid: r.u32()?, name: r.str()? },
            MsgType::TXATTRCREATE => {
                Tmsg::Xattrcreate { fid: r.u32()?, name: r.str()?, size: r.u64()?, flags: r.u32()? }
            }
            MsgType::TREADDIR => Tmsg::Readdir { fid: r.u32()?, offset: r.u64()?, count: r.u32()? },
            MsgType::TFSYNC => {
                let fid = r.u32()?;
                let datasync = if r.remaining() >= 4 { r.u32()? } else { 0 };
                Tmsg::Fsync { fid, datasync }
            }
            MsgType::TLOCK => Tmsg::Lock(Lock {
                fid: r.u32()?,
                lock_type: r.u8()?,
                flags: r.u32()?,
                start: r.u64()?,
                length: r.u64()?,
                proc_id: r.u32()?,
                client_id: r.str()?,
            }),
            MsgType::TGETLOCK => Tmsg::Getlock(Lock {
                fid: r.u32()?,
                lock_type: r.u8()?,
                flags: 0,
                start: r.u64()?,
                length: r.u64()?,
                proc_id: r.u32()?,
                client_id: r.str()?,
            }),
            MsgType::TLINK => Tmsg::Link { dfid: r.u32()?, fid: r.u32()?, name: r.str()? },
            MsgType::TMKDIR => Tmsg::Mkdir { dfid: r.u32()?, name: r.str()?, mode: r.u32()?, gid: r.u32()? },
            MsgType::TRENAMEAT => {
                Tmsg::Renameat { olddirfid: r.u32()?, oldname: r.str()?, newdirfid: r.u32()?, newname: r.str()? }
            }
            MsgType::TUNLINKAT => Tmsg::Unlinkat { dirfid: r.u32()?, name: r.str()?, flags: r.u32()? },
            other => return Err(WireError::UnknownType(other.0)),
        })
    }

    /// The message type of this request.
    pub fn msg_type(&self) -> MsgType {
        match self {
            Tmsg::Version { .. } => MsgType::TVERSION,
            Tmsg::Auth { .. } => MsgType::TAUTH,
            Tmsg::Attach { .. } => MsgType::TATTACH,
            Tmsg::Flush { .. } => MsgType::TFLUSH,
            Tmsg::Walk { .. } => MsgType::TWALK,
            Tmsg::Read { .. } => MsgType::TREAD,
            Tmsg::Write { .. } => MsgType::TWRITE,
            Tmsg::Clunk { .. } => MsgType::TCLUNK,
            Tmsg::Remove { .. } => MsgType::TREMOVE,
            Tmsg::Statfs { .. } => MsgType::TSTATFS,
            Tmsg::Lopen { .. } => MsgType::TLOPEN,
            Tmsg::Lcreate { .. } => MsgType::TLCREATE,
            Tmsg::Symlink { .. } => MsgType::TSYMLINK,
            Tmsg::Mknod { .. } => MsgType::TMKNOD,
            Tmsg::Rename { .. } => MsgType::TRENAME,
            Tmsg::Readlink { .. } => MsgType::TREADLINK,
            Tmsg::Getattr { .. } => MsgType::TGETATTR,
            Tmsg::Setattr { .. } => MsgType::TSETATTR,
            Tmsg::Xattrwalk { .. } => MsgType::TXATTRWALK,
            Tmsg::Xattrcreate { .. } => MsgType::TXATTRCREATE,
            Tmsg::Readdir { .. } => MsgType::TREADDIR,
            Tmsg::Fsync { .. } => MsgType::TFSYNC,
            Tmsg::Lock(_) => MsgType::TLOCK,
            Tmsg::Getlock(_) => MsgType::TGETLOCK,
            Tmsg::Link { .. } => MsgType::TLINK,
            Tmsg::Mkdir { .. } => MsgType::TMKDIR,
            Tmsg::Renameat { .. } => MsgType::TRENAMEAT,
            Tmsg::Unlinkat { .. } => MsgType::TUNLINKAT,
        }
    }

    /// Appends this request as one whole message with `tag`.
    pub fn encode(&self, tag: u16, out: &mut Vec<u8>) {
        let mut e = Encoder::begin(out, self.msg_type(), tag);
        match self {
            Tmsg::Version { msize, version } => e.u32(*msize).str(version),
            Tmsg::Auth { afid, uname, aname, n_uname } => e.u32(*afid).str(uname).str(aname).u32(*n_uname),
            Tmsg::Attach { fid, afid, uname, aname, n_uname } => {
                e.u32(*fid).u32(*afid).str(uname).str(aname).u32(*n_uname)
            }
            Tmsg::Flush { oldtag } => e.u16(*oldtag),
            Tmsg::Walk { fid, newfid, names } => {
                e.u32(*fid).u32(*newfid).u16(names.len() as u16);
                for n in names {
                    e.str(n);
                }
                &mut e
            }
            Tmsg::Read { fid, offset, count } | Tmsg::Readdir { fid, offset, count } => {
                e.u32(*fid).u64(*offset).u32(*count)
            }
            Tmsg::Write { fid, offset, data } => e.u32(*fid).u64(*offset).data(data),
            Tmsg::Clunk { fid } | Tmsg::Remove { fid } | Tmsg::Statfs { fid } | Tmsg::Readlink { fid } => e.u32(*fid),
            Tmsg::Lopen { fid, flags } => e.u32(*fid).u32(*flags),
            Tmsg::Lcreate { fid, name, flags, mode, gid } => e.u32(*fid).str(name).u32(*flags).u32(*mode).u32(*gid),
            Tmsg::Symlink { fid, name, target, gid } => e.u32(*fid).str(name).str(target).u32(*gid),
            Tmsg::Mknod { dfid, name, mode, major, minor, gid } => {
                e.u32(*dfid).str(name).u32(*mode).u32(*major).u32(*minor).u32(*gid)
            }
            Tmsg::Rename { fid, dfid, name } => e.u32(*fid).u32(*dfid).str(name),
            Tmsg::Getattr { fid, mask } => e.u32(*fid).u64(*mask),
            Tmsg::Setattr { fid, attr } => {
                e.u32(*fid);
                attr.put(e.buf());
                &mut e
            }
            Tmsg::Xattrwalk { fid, newfid, name } => e.u32(*fid).u32(*newfid).str(name),
            Tmsg::Xattrcreate { fid, name, size, flags } => e.u32(*fid).str(name).u64(*size).u32(*flags),
            Tmsg::Fsync { fid, datasync } => e.u32(*fid).u32(*datasync),
            Tmsg::Lock(l) => {
                e.u32(l.fid).u8(l.lock_type).u32(l.flags).u64(l.start).u64(l.length).u32(l.proc_id).str(l.client_id)
            }
            Tmsg::Getlock(l) => e.u32(l.fid).u8(l.lock_type).u64(l.start).u64(l.length).u32(l.proc_id).str(l.client_id),
            Tmsg::Link { dfid, fid, name } => e.u32(*dfid).u32(*fid).str(name),
            Tmsg::Mkdir { dfid, name, mode, gid } => e.u32(*dfid).str(name).u32(*mode).u32(*gid),
            Tmsg::Renameat { olddirfid, oldname, newdirfid, newname } => {
                e.u32(*olddirfid).str(oldname).u32(*newdirfid).str(newname)
            }
            Tmsg::Unlinkat { dirfid, name, flags } => e.u32(*dirfid).str(name).u32(*flags),
        };
        e.finish();
    }
}
