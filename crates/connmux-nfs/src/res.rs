//! NFS version 3 results (RFC 1813 §3.3): encoders that append a
//! procedure's result after the RPC reply header, and decoders of the
//! results a client reads (status, attributes, handles, data).
//!
//! A failed procedure still carries attributes: [`put_failure`] writes the
//! `resfail` arm RFC 1813 gives each procedure (`post_op_attr` of the object
//! or directory, or `wcc_data`), from what the server could learn.

use crate::args::proc3;
use crate::types::{get_post_op_attr, put_post_op_attr, Fattr3, Nfsstat3, Wcc, FHSIZE, MAXPATHLEN, VERFSIZE};
use crate::xdr::{opaque_len, put_bool, put_fixed, put_opaque, put_u32, put_u64, Reader, XdrError};

/// What the `resfail` arm of a procedure carries, as far as known.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FailAttrs {
    /// The object's (or for LOOKUP and READDIR, the directory's) attributes.
    pub attr: Option<Fattr3>,
    /// The `wcc_data` of the object or directory changed.
    pub wcc: Wcc,
    /// RENAME's target directory's `wcc_data`.
    pub wcc2: Wcc,
}

/// Appends `status` and the `resfail` arm of procedure `proc`.
pub fn put_failure(out: &mut Vec<u8>, proc: u32, status: Nfsstat3, f: &FailAttrs) {
    use proc3::*;
    put_u32(out, status.0);
    match proc {
        GETATTR => {}
        LOOKUP | ACCESS | READLINK | READ | READDIR | READDIRPLUS | FSSTAT | FSINFO | PATHCONF => {
            put_post_op_attr(out, f.attr.as_ref())
        }
        RENAME => {
            f.wcc.put(out);
            f.wcc2.put(out);
        }
        LINK => {
            put_post_op_attr(out, f.attr.as_ref());
            f.wcc.put(out);
        }
        // SETATTR WRITE CREATE MKDIR SYMLINK MKNOD REMOVE RMDIR COMMIT
        _ => f.wcc.put(out),
    }
}

/// Appends a `post_op_fh3`.
pub fn put_post_op_fh(out: &mut Vec<u8>, fh: Option<&[u8]>) {
    put_bool(out, fh.is_some());
    if let Some(fh) = fh {
        put_opaque(out, fh);
    }
}

/// GETATTR's success.
pub fn getattr_ok(out: &mut Vec<u8>, attr: &Fattr3) {
    put_u32(out, 0);
    attr.put(out);
}

/// SETATTR's, REMOVE's and RMDIR's success.
pub fn wcc_ok(out: &mut Vec<u8>, wcc: &Wcc) {
    put_u32(out, 0);
    wcc.put(out);
}

/// LOOKUP's success.
pub fn lookup_ok(out: &mut Vec<u8>, fh: &[u8], obj: Option<&Fattr3>, dir: Option<&Fattr3>) {
    put_u32(out, 0);
    put_opaque(out, fh);
    put_post_op_attr(out, obj);
    put_post_op_attr(out, dir);
}

/// ACCESS's success.
pub fn access_ok(out: &mut Vec<u8>, attr: Option<&Fattr3>, access: u32) {
    put_u32(out, 0);
    put_post_op_attr(out, attr);
    put_u32(out, access);
}

/// READLINK's success.
pub fn readlink_ok(out: &mut Vec<u8>, attr: Option<&Fattr3>, target: &[u8]) {
    put_u32(out, 0);
    put_post_op_attr(out, attr);
    put_opaque(out, target);
}

/// READ's success up to its data: append the data's length word's place
/// with this, the data after it, then [`read_finish`].
pub fn read_begin(out: &mut Vec<u8>, attr: Option<&Fattr3>) -> usize {
    put_u32(out, 0);
    put_post_op_attr(out, attr);
    let at = out.len();
    // count, eof, data length: patched by read_finish.
    put_u32(out, 0);
    put_u32(out, 0);
    put_u32(out, 0);
    at
}

/// Completes a READ begun at `at` ([`read_begin`]) with the `n` bytes of
/// data appended since: count, eof and padding.
pub fn read_finish(out: &mut [u8], at: usize, eof: bool) -> usize {
    let n = out.len() - at - 12;
    out[at..at + 4].copy_from_slice(&(n as u32).to_be_bytes());
    out[at + 4..at + 8].copy_from_slice(&u32::from(eof).to_be_bytes());
    out[at + 8..at + 12].copy_from_slice(&(n as u32).to_be_bytes());
    n
}

/// The zero padding a READ of `n` bytes needs after its data.
pub fn read_padding(n: usize) -> &'static [u8] {
    &[0u8; 3][..(4 - n % 4) % 4]
}

/// WRITE's success.
pub fn write_ok(out: &mut Vec<u8>, wcc: &Wcc, count: u32, committed: crate::StableHow, verf: &[u8; VERFSIZE]) {
    put_u32(out, 0);
    wcc.put(out);
    put_u32(out, count);
    put_u32(out, committed as u32);
    put_fixed(out, verf);
}

/// CREATE's, MKDIR's, SYMLINK's and MKNOD's success.
pub fn create_ok(out: &mut Vec<u8>, fh: Option<&[u8]>, attr: Option<&Fattr3>, dir: &Wcc) {
    put_u32(out, 0);
    put_post_op_fh(out, fh);
    put_post_op_attr(out, attr);
    dir.put(out);
}

/// RENAME's success.
pub fn rename_ok(out: &mut Vec<u8>, from: &Wcc, to: &Wcc) {
    put_u32(out, 0);
    from.put(out);
    to.put(out);
}

/// LINK's success.
pub fn link_ok(out: &mut Vec<u8>, attr: Option<&Fattr3>, dir: &Wcc) {
    put_u32(out, 0);
    put_post_op_attr(out, attr);
    dir.put(out);
}

/// READDIR's and READDIRPLUS's success up to the entries.
pub fn readdir_begin(out: &mut Vec<u8>, dir: Option<&Fattr3>, verf: &[u8; VERFSIZE]) {
    put_u32(out, 0);
    put_post_op_attr(out, dir);
    put_fixed(out, verf);
}

/// Bytes of a READDIR entry named `name` (`entry3` with its list word).
pub fn readdir_entry_len(name: &[u8]) -> usize {
    4 + 8 + opaque_len(name.len()) + 8
}

/// Appends a READDIR entry.
pub fn readdir_entry(out: &mut Vec<u8>, fileid: u64, name: &[u8], cookie: u64) {
    put_bool(out, true);
    put_u64(out, fileid);
    put_opaque(out, name);
    put_u64(out, cookie);
}

/// Bytes of a READDIRPLUS entry (`entryplus3` with its list word).
pub fn readdirplus_entry_len(name: &[u8], attr: bool, fh: Option<usize>) -> usize {
    readdir_entry_len(name) + 4 + if attr { crate::FATTR3_LEN } else { 0 } + 4 + fh.map_or(0, opaque_len)
}

/// Appends a READDIRPLUS entry.
pub fn readdirplus_entry(
    out: &mut Vec<u8>,
    fileid: u64,
    name: &[u8],
    cookie: u64,
    attr: Option<&Fattr3>,
    fh: Option<&[u8]>,
) {
    readdir_entry(out, fileid, name, cookie);
    put_post_op_attr(out, attr);
    put_post_op_fh(out, fh);
}

/// Ends a READDIR or READDIRPLUS list.
pub fn readdir_end(out: &mut Vec<u8>, eof: bool) {
    put_bool(out, false);
    put_bool(out, eof);
}

/// Bytes [`readdir_end`] appends.
pub const READDIR_END_LEN: usize = 8;

/// FSSTAT's results.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Fsstat {
    /// Total bytes.
    pub tbytes: u64,
    /// Free bytes.
    pub fbytes: u64,
    /// Bytes free to the caller.
    pub abytes: u64,
    /// Total file slots.
    pub tfiles: u64,
    /// Free file slots.
    pub ffiles: u64,
    /// File slots free to the caller.
    pub afiles: u64,
    /// Seconds for which these do not change.
    pub invarsec: u32,
}

/// FSSTAT's success.
pub fn fsstat_ok(out: &mut Vec<u8>, attr: Option<&Fattr3>, s: &Fsstat) {
    put_u32(out, 0);
    put_post_op_attr(out, attr);
    for v in [s.tbytes, s.fbytes, s.abytes, s.tfiles, s.ffiles, s.afiles] {
        put_u64(out, v);
    }
    put_u32(out, s.invarsec);
}

/// FSINFO's results.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Fsinfo {
    /// Largest READ.
    pub rtmax: u32,
    /// Preferred READ.
    pub rtpref: u32,
    /// READ size multiple.
    pub rtmult: u32,
    /// Largest WRITE.
    pub wtmax: u32,
    /// Preferred WRITE.
    pub wtpref: u32,
    /// WRITE size multiple.
    pub wtmult: u32,
    /// Preferred READDIR size.
    pub dtpref: u32,
    /// Largest file size.
    pub maxfilesize: u64,
    /// Time granularity (seconds, nanoseconds).
    pub time_delta: (u32, u32),
    /// FSF3_* bits.
    pub properties: u32,
}

/// FSINFO's success.
pub fn fsinfo_ok(out: &mut Vec<u8>, attr: Option<&Fattr3>, s: &Fsinfo) {
    put_u32(out, 0);
    put_post_op_attr(out, attr);
    for v in [s.rtmax, s.rtpref, s.rtmult, s.wtmax, s.wtpref, s.wtmult, s.dtpref] {
        put_u32(out, v);
    }
    put_u64(out, s.maxfilesize);
    put_u32(out, s.time_delta.0);
    put_u32(out, s.time_delta.1);
    put_u32(out, s.properties);
}

/// PATHCONF's success.
pub fn pathconf_ok(out: &mut Vec<u8>, attr: Option<&Fattr3>, linkmax: u32, name_max: u32) {
    put_u32(out, 0);
    put_post_op_attr(out, attr);
    put_u32(out, linkmax);
    put_u32(out, name_max);
    // no_trunc, chown_restricted, case_insensitive, case_preserving
    for b in [true, true, false, true] {
        put_bool(out, b);
    }
}

/// COMMIT's success.
pub fn commit_ok(out: &mut Vec<u8>, wcc: &Wcc, verf: &[u8; VERFSIZE]) {
    put_u32(out, 0);
    wcc.put(out);
    put_fixed(out, verf);
}

// ---- decoders (clients) ----

/// A result's status and, for NFS3_OK, a reader at the rest.
pub fn status<'a>(results: &'a [u8]) -> Result<(Nfsstat3, Reader<'a>), XdrError> {
    let mut r = Reader::new(results);
    let s = Nfsstat3(r.u32("nfsstat3")?);
    Ok((s, r))
}

/// GETATTR's result: the attributes, or the status.
pub fn decode_getattr(results: &[u8]) -> Result<Result<Fattr3, Nfsstat3>, XdrError> {
    let (s, mut r) = status(results)?;
    if s != Nfsstat3::OK {
        return Ok(Err(s));
    }
    Ok(Ok(Fattr3::get(&mut r)?))
}

/// LOOKUP's result as a client reads it: the handle and the attributes.
pub type LookupRes<'a> = (&'a [u8], Option<Fattr3>);

/// LOOKUP's result: the handle and the object's attributes, or the status.
pub fn decode_lookup(results: &[u8]) -> Result<Result<LookupRes<'_>, Nfsstat3>, XdrError> {
    let (s, mut r) = status(results)?;
    if s != Nfsstat3::OK {
        return Ok(Err(s));
    }
    let fh = r.opaque("nfs_fh3", FHSIZE)?;
    let attr = get_post_op_attr(&mut r)?;
    get_post_op_attr(&mut r)?;
    Ok(Ok((fh, attr)))
}

/// READ's result: the data and eof, or the status.
pub fn decode_read(results: &[u8]) -> Result<Result<(&[u8], bool), Nfsstat3>, XdrError> {
    let (s, mut r) = status(results)?;
    if s != Nfsstat3::OK {
        return Ok(Err(s));
    }
    get_post_op_attr(&mut r)?;
    let count = r.u32("count")?;
    let eof = r.bool("eof")?;
    let data = r.opaque("data", count)?;
    Ok(Ok((data, eof)))
}

/// WRITE's result as a client reads it: (count, committed, verifier).
pub type WriteRes = (u32, u32, [u8; VERFSIZE]);

/// WRITE's result: count, committed and verifier, or the status.
pub fn decode_write(results: &[u8]) -> Result<Result<WriteRes, Nfsstat3>, XdrError> {
    let (s, mut r) = status(results)?;
    Wcc::get(&mut r)?;
    if s != Nfsstat3::OK {
        return Ok(Err(s));
    }
    let count = r.u32("count")?;
    let committed = r.u32("committed")?;
    let verf = r.fixed("writeverf3", VERFSIZE)?.try_into().expect("8 bytes");
    Ok(Ok((count, committed, verf)))
}

/// CREATE's (MKDIR's, SYMLINK's) result: the new handle if given, or the status.
pub fn decode_create(results: &[u8]) -> Result<Result<Option<&[u8]>, Nfsstat3>, XdrError> {
    let (s, mut r) = status(results)?;
    if s != Nfsstat3::OK {
        return Ok(Err(s));
    }
    let fh = if r.bool("post_op_fh3")? { Some(r.opaque("nfs_fh3", FHSIZE)?) } else { None };
    get_post_op_attr(&mut r)?;
    Wcc::get(&mut r)?;
    Ok(Ok(fh))
}

/// One READDIRPLUS entry as decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EntryPlus<'a> {
    /// File id.
    pub fileid: u64,
    /// Name.
    pub name: &'a [u8],
    /// Cookie.
    pub cookie: u64,
    /// Attributes, if given.
    pub attr: Option<Fattr3>,
    /// Handle, if given.
    pub fh: Option<&'a [u8]>,
}

/// READDIRPLUS's result as a client reads it: the entries and eof.
pub type ReaddirplusRes<'a> = (Vec<EntryPlus<'a>>, bool);

/// READDIRPLUS's result: the entries and eof, or the status. The number
/// of entries is bounded by the input (each takes at least 28 bytes).
pub fn decode_readdirplus(results: &[u8]) -> Result<Result<ReaddirplusRes<'_>, Nfsstat3>, XdrError> {
    let (s, mut r) = status(results)?;
    if s != Nfsstat3::OK {
        return Ok(Err(s));
    }
    get_post_op_attr(&mut r)?;
    r.fixed("cookieverf3", VERFSIZE)?;
    let mut entries = Vec::new();
    // Bounded: every turn reads at least 4 bytes or returns.
    while r.bool("value_follows")? {
        let fileid = r.u64("fileid")?;
        let name = r.opaque("filename3", MAXPATHLEN)?;
        let cookie = r.u64("cookie")?;
        let attr = get_post_op_attr(&mut r)?;
        let fh = if r.bool("post_op_fh3")? { Some(r.opaque("nfs_fh3", FHSIZE)?) } else { None };
        entries.push(EntryPlus { fileid, name, cookie, attr, fh });
    }
    let eof = r.bool("eof")?;
    Ok(Ok((entries, eof)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{Ftype3, Nfstime3};
    use crate::StableHow;

    fn attr(id: u64) -> Fattr3 {
        Fattr3 {
            ftype: Ftype3::Dir,
            mode: 0o755,
            nlink: 2,
            uid: 0,
            gid: 0,
            size: 4096,
            used: 4096,
            rdev: (0, 0),
            fsid: 1,
            fileid: id,
            atime: Nfstime3::default(),
            mtime: Nfstime3 { seconds: 10, nseconds: 0 },
            ctime: Nfstime3 { seconds: 11, nseconds: 0 },
        }
    }

    fn every_cut_fails(out: &[u8], fails: impl Fn(&[u8]) -> bool) {
        for n in 0..out.len() {
            assert!(fails(&out[..n]), "cut at {n}");
        }
    }

    #[test]
    fn results_round_trip() {
        let a = attr(5);
        let mut out = Vec::new();
        getattr_ok(&mut out, &a);
        assert_eq!(decode_getattr(&out), Ok(Ok(a)));
        every_cut_fails(&out, |b| decode_getattr(b).is_err());

        let mut out = Vec::new();
        lookup_ok(&mut out, b"handle", Some(&a), None);
        assert_eq!(decode_lookup(&out), Ok(Ok((&b"handle"[..], Some(a)))));
        every_cut_fails(&out, |b| decode_lookup(b).is_err());

        let mut out = Vec::new();
        let at = read_begin(&mut out, Some(&a));
        out.extend_from_slice(b"hello");
        let n = read_finish(&mut out, at, true);
        out.extend_from_slice(read_padding(n));
        assert_eq!(decode_read(&out), Ok(Ok((&b"hello"[..], true))));
        every_cut_fails(&out, |b| decode_read(b).is_err());

        let mut out = Vec::new();
        let w = Wcc { before: Some(a.wcc()), after: Some(a) };
        write_ok(&mut out, &w, 7, StableHow::FileSync, b"verifier");
        assert_eq!(decode_write(&out), Ok(Ok((7, 2, *b"verifier"))));
        every_cut_fails(&out, |b| decode_write(b).is_err());

        let mut out = Vec::new();
        create_ok(&mut out, Some(b"fh"), Some(&a), &w);
        assert_eq!(decode_create(&out), Ok(Ok(Some(&b"fh"[..]))));
        every_cut_fails(&out, |b| decode_create(b).is_err());

        let mut out = Vec::new();
        readdir_begin(&mut out, Some(&a), &[0; 8]);
        let before = out.len();
        readdirplus_entry(&mut out, 9, b"file", 100, Some(&attr(9)), Some(b"h9"));
        assert_eq!(out.len() - before, readdirplus_entry_len(b"file", true, Some(2)));
        readdirplus_entry(&mut out, 10, b"x", 200, None, None);
        readdir_end(&mut out, true);
        let (entries, eof) = decode_readdirplus(&out).unwrap().unwrap();
        assert!(eof);
        assert_eq!(entries.len(), 2);
        assert_eq!((entries[0].name, entries[0].fh, entries[0].attr), (&b"file"[..], Some(&b"h9"[..]), Some(attr(9))));
        assert_eq!((entries[1].fileid, entries[1].cookie), (10, 200));
        every_cut_fails(&out, |b| decode_readdirplus(b).is_err());
    }

    #[test]
    fn failures_carry_the_attributes_of_their_procedure() {
        let a = attr(1);
        let f = FailAttrs { attr: Some(a), wcc: Wcc { before: Some(a.wcc()), after: Some(a) }, wcc2: Wcc::default() };
        let mut out = Vec::new();
        put_failure(&mut out, proc3::GETATTR, Nfsstat3::ERR_STALE, &f);
        assert_eq!(out, 70u32.to_be_bytes());
        assert_eq!(decode_getattr(&out), Ok(Err(Nfsstat3::ERR_STALE)));
        let mut out = Vec::new();
        put_failure(&mut out, proc3::LOOKUP, Nfsstat3::ERR_NOENT, &f);
        assert_eq!(out.len(), 4 + 4 + 84);
        let mut out = Vec::new();
        put_failure(&mut out, proc3::WRITE, Nfsstat3::ERR_ROFS, &f);
        assert_eq!(out.len(), 4 + 4 + 24 + 4 + 84);
        assert_eq!(decode_write(&out), Ok(Err(Nfsstat3::ERR_ROFS)));
        let mut out = Vec::new();
        put_failure(&mut out, proc3::RENAME, Nfsstat3::ERR_NOENT, &f);
        assert_eq!(out.len(), 4 + (4 + 24 + 4 + 84) + 8);
    }
}
