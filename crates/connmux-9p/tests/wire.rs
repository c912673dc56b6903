//! Round trips of every request and reply, and the typed errors of short,
//! long and inconsistent messages.

use connmux_9p::rmsg::{self, Rmsg};
use connmux_9p::tmsg::Lock;
use connmux_9p::types::{getattr, QID_LEN};
use connmux_9p::{Attr, Dirent, Encoder, MsgType, Qid, QidType, SetAttr, StatFs, Tmsg, WireError};

fn every_request() -> Vec<Tmsg<'static>> {
    let lock = Lock { fid: 3, lock_type: 1, flags: 1, start: 10, length: 0, proc_id: 77, client_id: "host" };
    vec![
        Tmsg::Version { msize: 65536, version: "9P2000.L" },
        Tmsg::Auth { afid: 1, uname: "u", aname: "/srv", n_uname: 1000 },
        Tmsg::Attach { fid: 0, afid: connmux_9p::NOFID, uname: "root", aname: "/srv", n_uname: 0 },
        Tmsg::Flush { oldtag: 9 },
        Tmsg::Walk { fid: 0, newfid: 1, names: vec!["a", "bb", "ccc"] },
        Tmsg::Walk { fid: 0, newfid: 1, names: vec![] },
        Tmsg::Read { fid: 1, offset: 1 << 40, count: 8192 },
        Tmsg::Write { fid: 1, offset: 5, data: b"hello" },
        Tmsg::Write { fid: 1, offset: 0, data: b"" },
        Tmsg::Clunk { fid: 1 },
        Tmsg::Remove { fid: 1 },
        Tmsg::Statfs { fid: 0 },
        Tmsg::Lopen { fid: 1, flags: 2 },
        Tmsg::Lcreate { fid: 0, name: "new", flags: 0o102, mode: 0o644, gid: 0 },
        Tmsg::Symlink { fid: 0, name: "l", target: "../t", gid: 0 },
        Tmsg::Mknod { dfid: 0, name: "fifo", mode: 0o10644, major: 0, minor: 0, gid: 0 },
        Tmsg::Rename { fid: 1, dfid: 0, name: "moved" },
        Tmsg::Readlink { fid: 1 },
        Tmsg::Getattr { fid: 1, mask: getattr::BASIC },
        Tmsg::Setattr {
            fid: 1,
            attr: SetAttr {
                valid: 8,
                mode: 1,
                uid: 2,
                gid: 3,
                size: 4,
                atime_sec: 5,
                atime_nsec: 6,
                mtime_sec: 7,
                mtime_nsec: 8,
            },
        },
        Tmsg::Xattrwalk { fid: 1, newfid: 2, name: "user.x" },
        Tmsg::Xattrcreate { fid: 1, name: "user.x", size: 3, flags: 0 },
        Tmsg::Readdir { fid: 1, offset: 0, count: 4096 },
        Tmsg::Fsync { fid: 1, datasync: 1 },
        Tmsg::Lock(lock),
        Tmsg::Getlock(Lock { flags: 0, ..lock }),
        Tmsg::Link { dfid: 0, fid: 1, name: "hard" },
        Tmsg::Mkdir { dfid: 0, name: "d", mode: 0o755, gid: 0 },
        Tmsg::Renameat { olddirfid: 0, oldname: "a", newdirfid: 2, newname: "b" },
        Tmsg::Unlinkat { dirfid: 0, name: "d", flags: 0x200 },
    ]
}

#[test]
fn every_request_round_trips() {
    for (i, m) in every_request().into_iter().enumerate() {
        let mut buf = Vec::new();
        m.encode(i as u16, &mut buf);
        assert_eq!(u32::from_le_bytes(buf[..4].try_into().unwrap()) as usize, buf.len());
        assert_eq!(buf[4], m.msg_type().0);
        let (tag, back) = Tmsg::decode(&buf).unwrap_or_else(|e| panic!("{m:?}: {e}"));
        assert_eq!(tag, i as u16);
        assert_eq!(back, m);
    }
}

#[test]
fn every_truncation_is_a_typed_error() {
    for m in every_request() {
        let mut full = Vec::new();
        m.encode(1, &mut full);
        for cut in 0..full.len() {
            let mut short = full[..cut].to_vec();
            if cut >= 4 {
                // A consistent size field: the fields themselves are short.
                short[..4].copy_from_slice(&(cut as u32).to_le_bytes());
            }
            // Tfsync's datasync is optional: without it the message is the
            // older client's form, and valid.
            if matches!(m, Tmsg::Fsync { .. }) && cut == full.len() - 4 {
                assert!(matches!(Tmsg::decode(&short), Ok((1, Tmsg::Fsync { fid: 1, datasync: 0 }))));
                continue;
            }
            let err = Tmsg::decode(&short).expect_err("short message decoded");
            assert!(
                matches!(
                    err,
                    WireError::Truncated { .. }
                        | WireError::Count { .. }
                        | WireError::Size { .. }
                        | WireError::Trailing { .. }
                ),
                "{m:?} cut at {cut}: {err:?}"
            );
        }
    }
}

#[test]
fn trailing_bytes_and_size_mismatch_are_refused() {
    let mut buf = Vec::new();
    Tmsg::Clunk { fid: 7 }.encode(3, &mut buf);
    let mut long = buf.clone();
    long.push(0);
    let n = long.len() as u32;
    long[..4].copy_from_slice(&n.to_le_bytes());
    assert_eq!(Tmsg::decode(&long), Err(WireError::Trailing { extra: 1 }));
    let mut lying = buf.clone();
    lying[..4].copy_from_slice(&(1u32 << 31).to_le_bytes());
    assert_eq!(Tmsg::decode(&lying), Err(WireError::Size { size: 1 << 31, have: buf.len() }));
}

#[test]
fn oversized_fields_are_refused() {
    // A write whose count says 2 GiB in a 30-byte message.
    let mut e = Vec::new();
    let mut enc = Encoder::begin(&mut e, MsgType::TWRITE, 1);
    enc.u32(1).u64(0).u32(1 << 31).u8(0);
    enc.finish();
    assert_eq!(Tmsg::decode(&e), Err(WireError::Count { count: 1 << 31, room: 1 }));
    // A walk of 17 names.
    let names: Vec<&str> = (0..17).map(|_| "x").collect();
    let mut w = Vec::new();
    Tmsg::Walk { fid: 0, newfid: 1, names }.encode(1, &mut w);
    assert_eq!(Tmsg::decode(&w), Err(WireError::TooManyNames { n: 17 }));
    // A string whose length runs past the message.
    let mut s = Vec::new();
    let mut enc = Encoder::begin(&mut s, MsgType::TVERSION, 0xffff);
    enc.u32(8192).u16(60000).u8(b'9');
    enc.finish();
    assert!(matches!(Tmsg::decode(&s), Err(WireError::Truncated { at: 13, need: 60000, .. })));
    // Not UTF-8.
    let mut s = Vec::new();
    let mut enc = Encoder::begin(&mut s, MsgType::TVERSION, 0xffff);
    enc.u32(8192).u16(2).u8(0xff).u8(0xfe);
    enc.finish();
    assert_eq!(Tmsg::decode(&s), Err(WireError::NotUtf8 { at: 11 }));
    // A reply type, and 9P2000's Topen, are not 9P2000.L requests.
    for ty in [MsgType::RREAD.0, 112] {
        let mut r = Vec::new();
        Encoder::begin(&mut r, MsgType(ty), 1).finish();
        assert_eq!(Tmsg::decode(&r), Err(WireError::UnknownType(ty)));
    }
}

#[test]
fn fsync_without_datasync_is_accepted() {
    let mut b = Vec::new();
    let mut e = Encoder::begin(&mut b, MsgType::TFSYNC, 4);
    e.u32(9);
    e.finish();
    assert_eq!(Tmsg::decode(&b), Ok((4, Tmsg::Fsync { fid: 9, datasync: 0 })));
}

#[test]
fn replies_round_trip() {
    let q = Qid { ty: QidType::DIR, version: 3, path: 0x1234_5678_9abc };
    let attr =
        Attr { mode: 0o40755, uid: 1, gid: 2, nlink: 3, size: 4096, mtime_sec: 99, data_version: 7, ..Attr::default() };
    let sf = StatFs {
        fs_type: 0x01021997,
        bsize: 4096,
        blocks: 10,
        bfree: 5,
        bavail: 4,
        files: 100,
        ffree: 50,
        fsid: 8,
        namelen: 255,
    };
    let mut buf = Vec::new();
    rmsg::rlerror(&mut buf, 1, 2);
    rmsg::qid(&mut buf, MsgType::RATTACH, 2, &q);
    rmsg::getattr(&mut buf, 3, getattr::BASIC, &q, &attr);
    rmsg::statfs(&mut buf, 4, &sf);
    rmsg::empty(&mut buf, MsgType::RFLUSH, 5);
    let mut e = Encoder::begin(&mut buf, MsgType::RWALK, 6);
    e.u16(2).qid(&q).qid(&q);
    e.finish();
    let mut e = Encoder::begin(&mut buf, MsgType::RREAD, 7);
    e.data(b"abc");
    e.finish();
    let mut e = Encoder::begin(&mut buf, MsgType::RLOPEN, 8);
    e.qid(&q).u32(8168);
    e.finish();
    let mut e = Encoder::begin(&mut buf, MsgType::RREADLINK, 9);
    e.str("target");
    e.finish();
    let want = [
        Rmsg::Lerror { errno: 2 },
        Rmsg::Qid { ty: MsgType::RATTACH, qid: q },
        Rmsg::Getattr { valid: getattr::BASIC, qid: q, attr },
        Rmsg::Statfs(sf),
        Rmsg::Empty { ty: MsgType::RFLUSH },
        Rmsg::Walk { qids: vec![q, q] },
        Rmsg::Data { ty: MsgType::RREAD, data: b"abc" },
        Rmsg::Open { ty: MsgType::RLOPEN, qid: q, iounit: 8168 },
        Rmsg::Readlink { target: "target" },
    ];
    let mut at = 0;
    for (i, w) in want.iter().enumerate() {
        let len = u32::from_le_bytes(buf[at..at + 4].try_into().unwrap()) as usize;
        let (tag, m) = Rmsg::decode(&buf[at..at + len]).unwrap();
        assert_eq!(tag as usize, i + 1);
        assert_eq!(&m, w);
        at += len;
    }
    assert_eq!(at, buf.len());
    // Rgetattr's length is fixed.
    let mut g = Vec::new();
    rmsg::getattr(&mut g, 1, 0, &q, &attr);
    assert_eq!(g.len(), 7 + connmux_9p::types::GETATTR_BODY_LEN);
}

#[test]
fn dirents_round_trip_and_short_ones_fail() {
    let q = Qid { ty: QidType::FILE, version: 0, path: 42 };
    let ents =
        [Dirent { qid: q, offset: 1, dtype: 8, name: "a" }, Dirent { qid: q, offset: 2, dtype: 4, name: "directory" }];
    let mut data = Vec::new();
    for d in &ents {
        d.put(&mut data);
    }
    assert_eq!(data.len(), Dirent::wire_len("a") + Dirent::wire_len("directory"));
    assert_eq!(Dirent::read_all(&data).unwrap(), ents.to_vec());
    assert!(matches!(Dirent::read_all(&data[..QID_LEN + 3]), Err(WireError::Truncated { .. })));
}
