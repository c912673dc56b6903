//! NFS version 3 types (RFC 1813 §2.5–2.6): status codes, file types,
//! times, attributes (`fattr3`, `sattr3`, `wcc_attr`) with their XDR.

use core::fmt;

use crate::xdr::{put_bool, put_u32, put_u64, Reader, XdrError};

/// The NFS program number.
pub const NFS_PROGRAM: u32 = 100003;
/// The NFS version this crate speaks.
pub const NFS_V3: u32 = 3;
/// The MOUNT program number.
pub const MOUNT_PROGRAM: u32 = 100005;
/// The MOUNT version this crate speaks.
pub const MOUNT_V3: u32 = 3;
/// Largest file handle (`NFS3_FHSIZE`).
pub const FHSIZE: u32 = 64;
/// Bytes of a cookie verifier, a create verifier and a write verifier.
pub const VERFSIZE: usize = 8;
/// Longest name or path this crate decodes (`MNTPATHLEN`, and a bound for
/// `filename3` and `nfspath3`, which RFC 1813 leaves unbounded).
pub const MAXPATHLEN: u32 = 4096;
/// Longest single name (`MNTNAMLEN`; also Linux's `NAME_MAX` + 1).
pub const MAXNAMLEN: u32 = 255;

/// `nfsstat3` as an open newtype: every value is representable.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Nfsstat3(pub u32);

macro_rules! stats {
    ($($name:ident = $v:expr,)*) => {
        impl Nfsstat3 {
            $(#[doc = concat!("`NFS3", stringify!($name), "` = ", stringify!($v))] pub const $name: Nfsstat3 = Nfsstat3($v);)*
            /// RFC 1813's name, when the value has one.
            pub fn name(self) -> Option<&'static str> {
                match self.0 {
                    $($v => Some(stringify!($name)),)*
                    _ => None,
                }
            }
        }
    };
}

stats! {
    OK = 0,
    ERR_PERM = 1,
    ERR_NOENT = 2,
    ERR_IO = 5,
    ERR_NXIO = 6,
    ERR_ACCES = 13,
    ERR_EXIST = 17,
    ERR_XDEV = 18,
    ERR_NODEV = 19,
    ERR_NOTDIR = 20,
    ERR_ISDIR = 21,
    ERR_INVAL = 22,
    ERR_FBIG = 27,
    ERR_NOSPC = 28,
    ERR_ROFS = 30,
    ERR_MLINK = 31,
    ERR_NAMETOOLONG = 63,
    ERR_NOTEMPTY = 66,
    ERR_DQUOT = 69,
    ERR_STALE = 70,
    ERR_REMOTE = 71,
    ERR_BADHANDLE = 10001,
    ERR_NOT_SYNC = 10002,
    ERR_BAD_COOKIE = 10003,
    ERR_NOTSUPP = 10004,
    ERR_TOOSMALL = 10005,
    ERR_SERVERFAULT = 10006,
    ERR_BADTYPE = 10007,
    ERR_JUKEBOX = 10008,
}

impl fmt::Display for Nfsstat3 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => write!(f, "NFS3{n}"),
            None => write!(f, "nfsstat3({})", self.0),
        }
    }
}

impl fmt::Debug for Nfsstat3 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// `ftype3`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Ftype3 {
    /// Regular file.
    Reg = 1,
    /// Directory.
    Dir = 2,
    /// Block device.
    Blk = 3,
    /// Character device.
    Chr = 4,
    /// Symbolic link.
    Lnk = 5,
    /// Socket.
    Sock = 6,
    /// Named pipe.
    Fifo = 7,
}

impl Ftype3 {
    /// From its wire value.
    pub fn from_u32(v: u32) -> Option<Ftype3> {
        Some(match v {
            1 => Ftype3::Reg,
            2 => Ftype3::Dir,
            3 => Ftype3::Blk,
            4 => Ftype3::Chr,
            5 => Ftype3::Lnk,
            6 => Ftype3::Sock,
            7 => Ftype3::Fifo,
            _ => return None,
        })
    }
}

/// `nfstime3`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Nfstime3 {
    /// Seconds since the epoch.
    pub seconds: u32,
    /// Nanoseconds.
    pub nseconds: u32,
}

impl Nfstime3 {
    /// Appends it.
    pub fn put(&self, out: &mut Vec<u8>) {
        put_u32(out, self.seconds);
        put_u32(out, self.nseconds);
    }
    /// Reads one.
    pub fn get(r: &mut Reader<'_>) -> Result<Self, XdrError> {
        Ok(Nfstime3 { seconds: r.u32("nfstime3")?, nseconds: r.u32("nfstime3")? })
    }
}

/// `fattr3`: a file's attributes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fattr3 {
    /// Its type.
    pub ftype: Ftype3,
    /// Permission bits (and set-id and sticky bits).
    pub mode: u32,
    /// Hard links.
    pub nlink: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Size in bytes.
    pub size: u64,
    /// Bytes of disk used.
    pub used: u64,
    /// Device numbers (major, minor) of a device file.
    pub rdev: (u32, u32),
    /// File system id.
    pub fsid: u64,
    /// File id (inode number).
    pub fileid: u64,
    /// Last access.
    pub atime: Nfstime3,
    /// Last change of the contents.
    pub mtime: Nfstime3,
    /// Last change of the attributes.
    pub ctime: Nfstime3,
}

/// Bytes of an encoded [`Fattr3`].
pub const FATTR3_LEN: usize = 84;

impl Fattr3 {
    /// Appends it.
    pub fn put(&self, out: &mut Vec<u8>) {
        put_u32(out, self.ftype as u32);
        put_u32(out, self.mode);
        put_u32(out, self.nlink);
        put_u32(out, self.uid);
        put_u32(out, self.gid);
        put_u64(out, self.size);
        put_u64(out, self.used);
        put_u32(out, self.rdev.0);
        put_u32(out, self.rdev.1);
        put_u64(out, self.fsid);
        put_u64(out, self.fileid);
        self.atime.put(out);
        self.mtime.put(out);
        self.ctime.put(out);
    }

    /// Reads one.
    pub fn get(r: &mut Reader<'_>) -> Result<Self, XdrError> {
        let t = r.u32("ftype3")?;
        let ftype = Ftype3::from_u32(t).ok_or(XdrError::BadValue { what: "ftype3", value: t })?;
        Ok(Fattr3 {
            ftype,
            mode: r.u32("mode")?,
            nlink: r.u32("nlink")?,
            uid: r.u32("uid")?,
            gid: r.u32("gid")?,
            size: r.u64("size")?,
            used: r.u64("used")?,
            rdev: (r.u32("rdev")?, r.u32("rdev")?),
            fsid: r.u64("fsid")?,
            fileid: r.u64("fileid")?,
            atime: Nfstime3::get(r)?,
            mtime: Nfstime3::get(r)?,
            ctime: Nfstime3::get(r)?,
        })
    }

    /// The `wcc_attr` subset (size, mtime, ctime).
    pub fn wcc(&self) -> WccAttr {
        WccAttr { size: self.size, mtime: self.mtime, ctime: self.ctime }
    }
}

/// `wcc_attr`: what weak cache consistency compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WccAttr {
    /// Size.
    pub size: u64,
    /// Last change of the contents.
    pub mtime: Nfstime3,
    /// Last change of the attributes.
    pub ctime: Nfstime3,
}

/// Appends a `post_op_attr`.
pub fn put_post_op_attr(out: &mut Vec<u8>, a: Option<&Fattr3>) {
    put_bool(out, a.is_some());
    if let Some(a) = a {
        a.put(out);
    }
}

/// Reads a `post_op_attr`.
pub fn get_post_op_attr(r: &mut Reader<'_>) -> Result<Option<Fattr3>, XdrError> {
    Ok(if r.bool("post_op_attr")? { Some(Fattr3::get(r)?) } else { None })
}

/// Appends a `pre_op_attr`.
pub fn put_pre_op_attr(out: &mut Vec<u8>, a: Option<&WccAttr>) {
    put_bool(out, a.is_some());
    if let Some(a) = a {
        put_u64(out, a.size);
        a.mtime.put(out);
        a.ctime.put(out);
    }
}

/// Reads a `pre_op_attr`.
pub fn get_pre_op_attr(r: &mut Reader<'_>) -> Result<Option<WccAttr>, XdrError> {
    if !r.bool("pre_op_attr")? {
        return Ok(None);
    }
    Ok(Some(WccAttr { size: r.u64("size")?, mtime: Nfstime3::get(r)?, ctime: Nfstime3::get(r)? }))
}

/// `wcc_data`: attributes before and after an operation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Wcc {
    /// Before.
    pub before: Option<WccAttr>,
    /// After.
    pub after: Option<Fattr3>,
}

impl Wcc {
    /// Appends it.
    pub fn put(&self, out: &mut Vec<u8>) {
        put_pre_op_attr(out, self.before.as_ref());
        put_post_op_attr(out, self.after.as_ref());
    }
    /// Reads one.
    pub fn get(r: &mut Reader<'_>) -> Result<Self, XdrError> {
        Ok(Wcc { before: get_pre_op_attr(r)?, after: get_post_op_attr(r)? })
    }
}

/// `set_atime` / `set_mtime` of a `sattr3`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SetTime {
    /// DONT_CHANGE.
    #[default]
    DontChange,
    /// SET_TO_SERVER_TIME.
    ServerTime,
    /// SET_TO_CLIENT_TIME.
    ClientTime(Nfstime3),
}

impl SetTime {
    fn put(&self, out: &mut Vec<u8>) {
        match self {
            SetTime::DontChange => put_u32(out, 0),
            SetTime::ServerTime => put_u32(out, 1),
            SetTime::ClientTime(t) => {
                put_u32(out, 2);
                t.put(out);
            }
        }
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, XdrError> {
        Ok(match r.u32("time_how")? {
            0 => SetTime::DontChange,
            1 => SetTime::ServerTime,
            2 => SetTime::ClientTime(Nfstime3::get(r)?),
            value => return Err(XdrError::BadValue { what: "time_how", value }),
        })
    }
}

/// `sattr3`: the attributes a client sets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sattr3 {
    /// New mode.
    pub mode: Option<u32>,
    /// New owner.
    pub uid: Option<u32>,
    /// New group.
    pub gid: Option<u32>,
    /// New size.
    pub size: Option<u64>,
    /// Access time.
    pub atime: SetTime,
    /// Modification time.
    pub mtime: SetTime,
}

impl Sattr3 {
    /// Appends it.
    pub fn put(&self, out: &mut Vec<u8>) {
        for v in [self.mode, self.uid, self.gid] {
            put_bool(out, v.is_some());
            if let Some(v) = v {
                put_u32(out, v);
            }
        }
        put_bool(out, self.size.is_some());
        if let Some(s) = self.size {
            put_u64(out, s);
        }
        self.atime.put(out);
        self.mtime.put(out);
    }

    /// Reads one.
    pub fn get(r: &mut Reader<'_>) -> Result<Self, XdrError> {
        let mut opt32 =
            |what| -> Result<Option<u32>, XdrError> { Ok(if r.bool(what)? { Some(r.u32(what)?) } else { None }) };
        let (mode, uid, gid) = (opt32("set_mode3")?, opt32("set_uid3")?, opt32("set_gid3")?);
        let size = if r.bool("set_size3")? { Some(r.u64("set_size3")?) } else { None };
        Ok(Sattr3 { mode, uid, gid, size, atime: SetTime::get(r)?, mtime: SetTime::get(r)? })
    }
}

/// `stable_how` of a WRITE and the `committed` of its result.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u32)]
pub enum StableHow {
    /// UNSTABLE: the server may keep the data in memory until COMMIT.
    Unstable = 0,
    /// DATA_SYNC: the data (and what finds it) on stable storage.
    DataSync = 1,
    /// FILE_SYNC: data and metadata on stable storage.
    FileSync = 2,
}

impl StableHow {
    /// From its wire value.
    pub fn from_u32(v: u32) -> Option<StableHow> {
        Some(match v {
            0 => StableHow::Unstable,
            1 => StableHow::DataSync,
            2 => StableHow::FileSync,
            _ => return None,
        })
    }
}

/// `access` bits (ACCESS3_*).
pub mod access {
    /// Read data or list a directory.
    pub const READ: u32 = 0x01;
    /// Look up a name in a directory.
    pub const LOOKUP: u32 = 0x02;
    /// Rewrite data, or change a directory's entries.
    pub const MODIFY: u32 = 0x04;
    /// Write new data, or add entries to a directory.
    pub const EXTEND: u32 = 0x08;
    /// Remove a directory entry.
    pub const DELETE: u32 = 0x10;
    /// Execute a file.
    pub const EXECUTE: u32 = 0x20;
}

/// FSINFO `properties` bits.
pub mod fsf {
    /// Hard links are supported.
    pub const LINK: u32 = 0x01;
    /// Symbolic links are supported.
    pub const SYMLINK: u32 = 0x02;
    /// PATHCONF is the same for every file.
    pub const HOMOGENEOUS: u32 = 0x08;
    /// SETATTR can set times to the client's values.
    pub const CANSETTIME: u32 = 0x10;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr() -> Fattr3 {
        Fattr3 {
            ftype: Ftype3::Reg,
            mode: 0o644,
            nlink: 1,
            uid: 1000,
            gid: 100,
            size: 1 << 33,
            used: 4096,
            rdev: (0, 0),
            fsid: 7,
            fileid: 42,
            atime: Nfstime3 { seconds: 1, nseconds: 2 },
            mtime: Nfstime3 { seconds: 3, nseconds: 4 },
            ctime: Nfstime3 { seconds: 5, nseconds: 6 },
        }
    }

    #[test]
    fn fattr3_round_trips_at_84_bytes_and_rejects_every_truncation() {
        let mut out = Vec::new();
        attr().put(&mut out);
        assert_eq!(out.len(), FATTR3_LEN);
        assert_eq!(Fattr3::get(&mut Reader::new(&out)), Ok(attr()));
        for n in 0..out.len() {
            assert!(Fattr3::get(&mut Reader::new(&out[..n])).is_err(), "{n}");
        }
        out[3] = 9;
        assert_eq!(Fattr3::get(&mut Reader::new(&out)), Err(XdrError::BadValue { what: "ftype3", value: 9 }));
    }

    #[test]
    fn wcc_and_sattr_round_trip() {
        let a = attr();
        for w in [Wcc::default(), Wcc { before: Some(a.wcc()), after: Some(a) }, Wcc { before: None, after: Some(a) }] {
            let mut out = Vec::new();
            w.put(&mut out);
            let mut r = Reader::new(&out);
            assert_eq!(Wcc::get(&mut r), Ok(w));
            assert_eq!(r.remaining(), 0);
            for n in 0..out.len() {
                assert!(Wcc::get(&mut Reader::new(&out[..n])).is_err());
            }
        }
        let s = Sattr3 {
            mode: Some(0o600),
            uid: None,
            gid: Some(5),
            size: Some(99),
            atime: SetTime::ServerTime,
            mtime: SetTime::ClientTime(Nfstime3 { seconds: 9, nseconds: 1 }),
        };
        for s in [s, Sattr3::default()] {
            let mut out = Vec::new();
            s.put(&mut out);
            assert_eq!(Sattr3::get(&mut Reader::new(&out)), Ok(s));
            for n in 0..out.len() {
                assert!(Sattr3::get(&mut Reader::new(&out[..n])).is_err());
            }
        }
    }

    #[test]
    fn status_names() {
        assert_eq!(Nfsstat3::ERR_STALE.to_string(), "NFS3ERR_STALE");
        assert_eq!(Nfsstat3(12345).to_string(), "nfsstat3(12345)");
    }
}
