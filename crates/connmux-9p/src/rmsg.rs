//! Writing messages ([`Encoder`]) and reading replies ([`Rmsg`], for clients).
//!
//! Each reply body, after the header:
//! ```text
//! Rlerror    ecode[4]
//! Rversion   msize[4] version[s]
//! Rattach    qid[13]
//! Rwalk      nwqid[2] nwqid*(qid[13])
//! Rread      count[4] data[count]          (Rreaddir: the same, data = dirents)
//! Rwrite     count[4]
//! Rlopen     qid[13] iounit[4]             (Rlcreate: the same)
//! Rgetattr   valid[8] qid[13] Attr
//! Rstatfs    StatFs
//! Rreadlink  target[s]
//! Rxattrwalk size[8]
//! Rlock      status[1]
//! Rgetlock   type[1] start[8] length[8] proc_id[4] client_id[s]
//! Rmkdir, Rsymlink, Rmknod: qid[13]
//! Rflush, Rclunk, Rremove, Rsetattr, Rfsync, Rrename, Rrenameat,
//! Runlinkat, Rlink, Rxattrcreate: empty
//! ```

use crate::header::{Header, MsgType};
use crate::types::{Attr, Qid, StatFs};
use crate::wire::{put_str, Reader, WireError};

/// Writes one message into a buffer; [`Encoder::finish`] patches its size.
pub struct Encoder<'a> {
    out: &'a mut Vec<u8>,
    start: usize,
}

impl<'a> Encoder<'a> {
    /// Starts a message of type `ty` with `tag` at the end of `out`.
    pub fn begin(out: &'a mut Vec<u8>, ty: MsgType, tag: u16) -> Self {
        let start = out.len();
        out.extend_from_slice(&[0, 0, 0, 0, ty.0]);
        out.extend_from_slice(&tag.to_le_bytes());
        Encoder { out, start }
    }
    /// u8.
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.out.push(v);
        self
    }
    /// u16.
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.out.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// u32.
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.out.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// u64.
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.out.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// `s[2]` string.
    pub fn str(&mut self, s: &str) -> &mut Self {
        put_str(self.out, s);
        self
    }
    /// `count[4]` + bytes.
    pub fn data(&mut self, d: &[u8]) -> &mut Self {
        self.u32(d.len() as u32);
        self.out.extend_from_slice(d);
        self
    }
    /// A qid.
    pub fn qid(&mut self, q: &Qid) -> &mut Self {
        q.put(self.out);
        self
    }
    /// The buffer, to append a structure or read data straight into it.
    pub fn buf(&mut self) -> &mut Vec<u8> {
        self.out
    }
    /// Bytes written so far from this message's start.
    pub fn len(&self) -> usize {
        self.out.len() - self.start
    }
    /// Whether nothing was written (never: the header is always there).
    pub fn is_empty(&self) -> bool {
        false
    }
    /// Overwrites the u32 at `at` (from this message's start).
    pub fn patch_u32(&mut self, at: usize, v: u32) {
        self.out[self.start + at..self.start + at + 4].copy_from_slice(&v.to_le_bytes());
    }
    /// Patches the size field; returns the message's length.
    pub fn finish(self) -> usize {
        let len = self.out.len() - self.start;
        self.out[self.start..self.start + 4].copy_from_slice(&(len as u32).to_le_bytes());
        len
    }
}

/// Appends Rlerror `errno` for `tag`.
pub fn rlerror(out: &mut Vec<u8>, tag: u16, errno: u32) {
    let mut e = Encoder::begin(out, MsgType::RLERROR, tag);
    e.u32(errno);
    e.finish();
}

/// Appends a reply with an empty body (Rclunk, Rflush, ...).
pub fn empty(out: &mut Vec<u8>, ty: MsgType, tag: u16) {
    Encoder::begin(out, ty, tag).finish();
}

/// Appends a reply whose body is one qid (Rattach, Rmkdir, Rsymlink, Rmknod).
pub fn qid(out: &mut Vec<u8>, ty: MsgType, tag: u16, q: &Qid) {
    let mut e = Encoder::begin(out, ty, tag);
    e.qid(q);
    e.finish();
}

/// Appends Rgetattr.
pub fn getattr(out: &mut Vec<u8>, tag: u16, valid: u64, q: &Qid, a: &Attr) {
    let mut e = Encoder::begin(out, MsgType::RGETATTR, tag);
    e.u64(valid).qid(q);
    a.put(e.buf());
    e.finish();
}

/// Appends Rstatfs.
pub fn statfs(out: &mut Vec<u8>, tag: u16, s: &StatFs) {
    let mut e = Encoder::begin(out, MsgType::RSTATFS, tag);
    s.put(e.buf());
    e.finish();
}

/// One reply, decoded (for clients).
#[derive(Clone, Debug, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum Rmsg<'a> {
    Lerror {
        errno: u32,
    },
    Version {
        msize: u32,
        version: &'a str,
    },
    /// Rattach, Rmkdir, Rsymlink, Rmknod.
    Qid {
        ty: MsgType,
        qid: Qid,
    },
    Walk {
        qids: Vec<Qid>,
    },
    /// Rread and Rreaddir.
    Data {
        ty: MsgType,
        data: &'a [u8],
    },
    Write {
        count: u32,
    },
    /// Rlopen and Rlcreate.
    Open {
        ty: MsgType,
        qid: Qid,
        iounit: u32,
    },
    Getattr {
        valid: u64,
        qid: Qid,
        attr: Attr,
    },
    Statfs(StatFs),
    Readlink {
        target: &'a str,
    },
    Xattrwalk {
        size: u64,
    },
    Lock {
        status: u8,
    },
    Getlock {
        lock_type: u8,
        start: u64,
        length: u64,
        proc_id: u32,
        client_id: &'a str,
    },
    /// A reply with no body.
    Empty {
        ty: MsgType,
    },
}

impl<'a> Rmsg<'a> {
    /// Decodes one whole reply: its tag and body.
    pub fn decode(buf: &'a [u8]) -> Result<(u16, Rmsg<'a>), WireError> {
        let h = Header::new_checked(buf)?;
        let mut r = Reader::new(buf, crate::header::field::BODY);
        let ty = h.msg_type();
        let m = match ty {
            MsgType::RLERROR => Rmsg::Lerror { errno: r.u32()? },
            MsgType::RVERSION => Rmsg::Version { msize: r.u32()?, version: r.str()? },
            MsgType::RATTACH | MsgType::RMKDIR | MsgType::RSYMLINK | MsgType::RMKNOD => {
                Rmsg::Qid { ty, qid: Qid::read(&mut r)? }
            }
            MsgType::RWALK => {
                let n = r.u16()?;
                if n as usize > crate::MAX_WALK {
                    return Err(WireError::TooManyNames { n });
                }
                let mut qids = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    qids.push(Qid::read(&mut r)?);
                }
                Rmsg::Walk { qids }
            }
            MsgType::RREAD | MsgType::RREADDIR => Rmsg::Data { ty, data: r.data()? },
            MsgType::RWRITE => Rmsg::Write { count: r.u32()? },
            MsgType::RLOPEN | MsgType::RLCREATE => Rmsg::Open { ty, qid: Qid::read(&mut r)?, iounit: r.u32()? },
            MsgType::RGETATTR => Rmsg::Getattr { valid: r.u64()?, qid: Qid::read(&mut r)?, attr: Attr::read(&mut r)? },
            MsgType::RSTATFS => Rmsg::Statfs(StatFs::read(&mut r)?),
            MsgType::RREADLINK => Rmsg::Readlink { target: r.str()? },
            MsgType::RXATTRWALK => Rmsg::Xattrwalk { size: r.u64()? },
            MsgType::RLOCK => Rmsg::Lock { status: r.u8()? },
            MsgType::RGETLOCK => Rmsg::Getlock {
                lock_type: r.u8()?,
                start: r.u64()?,
                length: r.u64()?,
                proc_id: r.u32()?,
                client_id: r.str()?,
            },
            MsgType::RFLUSH
            | MsgType::RCLUNK
            | MsgType::RREMOVE
            | MsgType::RSETATTR
            | MsgType::RFSYNC
            | MsgType::RRENAME
            | MsgType::RRENAMEAT
            | MsgType::RUNLINKAT
            | MsgType::RLINK
            | MsgType::RXATTRCREATE => Rmsg::Empty { ty },
            other => return Err(WireError::UnknownType(other.0)),
        };
        r.finish()?;
        Ok((h.tag(), m))
    }
}
