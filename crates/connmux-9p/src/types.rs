//! Structures carried inside messages: qids, getattr results, setattr
//! requests, statfs results, directory entries.

use crate::wire::{put_str, Reader, WireError};

/// Bytes of a qid on the wire: `type[1] version[4] path[8]`.
pub const QID_LEN: usize = 13;

/// The kind of file a qid names (the high bits of a mode).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QidType(pub u8);

#[allow(missing_docs)]
impl QidType {
    pub const DIR: QidType = QidType(0x80);
    pub const APPEND: QidType = QidType(0x40);
    pub const EXCL: QidType = QidType(0x20);
    pub const MOUNT: QidType = QidType(0x10);
    pub const AUTH: QidType = QidType(0x08);
    pub const TMP: QidType = QidType(0x04);
    pub const SYMLINK: QidType = QidType(0x02);
    pub const FILE: QidType = QidType(0x00);
}

/// A server's unique id of a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Qid {
    /// File kind.
    pub ty: QidType,
    /// Version (changes with the file; 0 where not tracked).
    pub version: u32,
    /// Unique per file in the export (the inode number).
    pub path: u64,
}

impl Qid {
    /// Appends the 13 bytes.
    pub fn put(&self, out: &mut Vec<u8>) {
        out.push(self.ty.0);
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&self.path.to_le_bytes());
    }
    /// Reads 13 bytes.
    pub fn read(r: &mut Reader<'_>) -> Result<Qid, WireError> {
        Ok(Qid { ty: QidType(r.u8()?), version: r.u32()?, path: r.u64()? })
    }
}

/// getattr request/valid mask bits.
#[allow(missing_docs)]
pub mod getattr {
    pub const MODE: u64 = 0x1;
    pub const NLINK: u64 = 0x2;
    pub const UID: u64 = 0x4;
    pub const GID: u64 = 0x8;
    pub const RDEV: u64 = 0x10;
    pub const ATIME: u64 = 0x20;
    pub const MTIME: u64 = 0x40;
    pub const CTIME: u64 = 0x80;
    pub const INO: u64 = 0x100;
    pub const SIZE: u64 = 0x200;
    pub const BLOCKS: u64 = 0x400;
    pub const BTIME: u64 = 0x800;
    pub const GEN: u64 = 0x1000;
    pub const DATA_VERSION: u64 = 0x2000;
    /// Everything of `struct stat`.
    pub const BASIC: u64 = 0x7ff;
    /// Every bit.
    pub const ALL: u64 = 0x3fff;
}

/// setattr valid mask bits.
#[allow(missing_docs)]
pub mod setattr {
    pub const MODE: u32 = 0x1;
    pub const UID: u32 = 0x2;
    pub const GID: u32 = 0x4;
    pub const SIZE: u32 = 0x8;
    pub const ATIME: u32 = 0x10;
    pub const MTIME: u32 = 0x20;
    pub const CTIME: u32 = 0x40;
    pub const ATIME_SET: u32 = 0x80;
    pub const MTIME_SET: u32 = 0x100;
}

/// Rgetattr's body after `valid[8]` and the qid: a file's attributes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct Attr {
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u64,
    pub rdev: u64,
    pub size: u64,
    pub blksize: u64,
    pub blocks: u64,
    pub atime_sec: u64,
    pub atime_nsec: u64,
    pub mtime_sec: u64,
    pub mtime_nsec: u64,
    pub ctime_sec: u64,
    pub ctime_nsec: u64,
    pub btime_sec: u64,
    pub btime_nsec: u64,
    pub gen: u64,
    pub data_version: u64,
}

/// Bytes of an Rgetattr body: valid, qid, then [`Attr`].
pub const GETATTR_BODY_LEN: usize = 8 + QID_LEN + 3 * 4 + 15 * 8;

impl Attr {
    /// Appends the fields after the qid.
    pub fn put(&self, out: &mut Vec<u8>) {
        for w in [self.mode, self.uid, self.gid] {
            out.extend_from_slice(&w.to_le_bytes());
        }
        for d in [
            self.nlink,
            self.rdev,
            self.size,
            self.blksize,
            self.blocks,
            self.atime_sec,
            self.atime_nsec,
            self.mtime_sec,
            self.mtime_nsec,
            self.ctime_sec,
            self.ctime_nsec,
            self.btime_sec,
            self.btime_nsec,
            self.gen,
            self.data_version,
        ] {
            out.extend_from_slice(&d.to_le_bytes());
        }
    }
    /// Reads the fields after the qid.
    pub fn read(r: &mut Reader<'_>) -> Result<Attr, WireError> {
        Ok(Attr {
            mode: r.u32()?,
            uid: r.u32()?,
            gid: r.u32()?,
            nlink: r.u64()?,
            rdev: r.u64()?,
            size: r.u64()?,
            blksize: r.u64()?,
            blocks: r.u64()?,
            atime_sec: r.u64()?,
            atime_nsec: r.u64()?,
            mtime_sec: r.u64()?,
            mtime_nsec: r.u64()?,
            ctime_sec: r.u64()?,
            ctime_nsec: r.u64()?,
            btime_sec: r.u64()?,
            btime_nsec: r.u64()?,
            gen: r.u64()?,
            data_version: r.u64()?,
        })
    }
}

/// Tsetattr's body after the fid.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct SetAttr {
    /// Which fields to set ([`setattr`] bits).
    pub valid: u32,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub atime_sec: u64,
    pub atime_nsec: u64,
    pub mtime_sec: u64,
    pub mtime_nsec: u64,
}

impl SetAttr {
    /// Reads the fields after the fid.
    pub fn read(r: &mut Reader<'_>) -> Result<SetAttr, WireError> {
        Ok(SetAttr {
            valid: r.u32()?,
            mode: r.u32()?,
            uid: r.u32()?,
            gid: r.u32()?,
            size: r.u64()?,
            atime_sec: r.u64()?,
            atime_nsec: r.u64()?,
            mtime_sec: r.u64()?,
            mtime_nsec: r.u64()?,
        })
    }
    /// Appends the fields after the fid.
    pub fn put(&self, out: &mut Vec<u8>) {
        for w in [self.valid, self.mode, self.uid, self.gid] {
            out.extend_from_slice(&w.to_le_bytes());
        }
        for d in [self.size, self.atime_sec, self.atime_nsec, self.mtime_sec, self.mtime_nsec] {
            out.extend_from_slice(&d.to_le_bytes());
        }
    }
}

/// Rstatfs's body.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct StatFs {
    pub fs_type: u32,
    pub bsize: u32,
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub fsid: u64,
    pub namelen: u32,
}

impl StatFs {
    /// Appends the body.
    pub fn put(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.fs_type.to_le_bytes());
        out.extend_from_slice(&self.bsize.to_le_bytes());
        for d in [self.blocks, self.bfree, self.bavail, self.files, self.ffree, self.fsid] {
            out.extend_from_slice(&d.to_le_bytes());
        }
        out.extend_from_slice(&self.namelen.to_le_bytes());
    }
    /// Reads the body.
    pub fn read(r: &mut Reader<'_>) -> Result<StatFs, WireError> {
        Ok(StatFs {
            fs_type: r.u32()?,
            bsize: r.u32()?,
            blocks: r.u64()?,
            bfree: r.u64()?,
            bavail: r.u64()?,
            files: r.u64()?,
            ffree: r.u64()?,
            fsid: r.u64()?,
            namelen: r.u32()?,
        })
    }
}

/// One directory entry of Rreaddir: `qid[13] offset[8] type[1] name[s]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dirent<'a> {
    /// The entry's qid.
    pub qid: Qid,
    /// The offset to ask for to continue after this entry.
    pub offset: u64,
    /// `d_type` (DT_REG, DT_DIR, ...).
    pub dtype: u8,
    /// Its name.
    pub name: &'a str,
}

impl Dirent<'_> {
    /// Bytes the entry takes.
    pub fn wire_len(name: &str) -> usize {
        QID_LEN + 8 + 1 + 2 + name.len()
    }
    /// Appends the entry.
    pub fn put(&self, out: &mut Vec<u8>) {
        self.qid.put(out);
        out.extend_from_slice(&self.offset.to_le_bytes());
        out.push(self.dtype);
        put_str(out, self.name);
    }
    /// Reads every entry of an Rreaddir's data.
    pub fn read_all(data: &[u8]) -> Result<Vec<Dirent<'_>>, WireError> {
        let mut r = Reader::new(data, 0);
        let mut v = Vec::new();
        while r.remaining() > 0 {
            let qid = Qid::read(&mut r)?;
            let offset = r.u64()?;
            let dtype = r.u8()?;
            let name = r.str()?;
            v.push(Dirent { qid, offset, dtype, name });
        }
        Ok(v)
    }
}
