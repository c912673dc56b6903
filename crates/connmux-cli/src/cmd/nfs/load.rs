//! `connmux rpctest --proc getattr|lookup|read|write`: NFSv3 calls as the
//! load, on the loadgen engine rpctest's NULL calls run on.
//!
//! Each connection opens its session before the clock starts: MNT of
//! `--mount` (default "/"; on the connection itself, or over one of its
//! own to `--mount-port`), LOOKUP of each component of `--file`, and for
//! WRITE a CREATE (UNCHECKED) of the file when it is missing. The call is
//! then encoded once and each further one is a copy with its xid patched:
//! GETATTR of the file (the export's root without `--file`), LOOKUP of the
//! file's name in its directory, READ of `--size` bytes at offset 0, WRITE
//! of `--size` bytes at offset 0 (UNSTABLE). Every reply is checked: an
//! accepted RPC reply with NFS3_OK, and for READ the bytes expected.

use connmux_nfs::res;
use connmux_nfs::{
    mount, CreateHow, DirOp, MountCall, NfsCall, Nfsstat3, Sattr3, StableHow, MOUNT_PROGRAM, NFS_PROGRAM,
};
use connmux_oncrpc::{decode_reply, Call, Credential, RecordLimits, RecordReader, Reply};
use serde::Serialize;

use crate::cmd::loadgen::engine::{Client, Exchange, Workload};

/// The procedure each call runs.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Proc {
    /// The NULL procedure (rpctest's own load).
    Null,
    /// GETATTR of the file.
    Getattr,
    /// LOOKUP of the file's name in its directory.
    Lookup,
    /// READ of --size bytes.
    Read,
    /// WRITE of --size bytes, UNSTABLE.
    Write,
}

/// The load's settings.
#[derive(Clone, Debug, Serialize)]
pub struct NfsLoad {
    pub proc: Proc,
    pub size: u32,
    pub file: Option<String>,
    pub mount: String,
    /// Where MNT goes when not on the connection itself (a server with
    /// MOUNT on a port of its own, as nfs-ganesha and nfsd).
    pub mount_addr: Option<std::net::SocketAddr>,
    /// AUTH_SYS with this uid and gid (`-A sys`), else AUTH_NONE.
    pub sys: Option<(u32, u32)>,
}

/// MNT of `path` over a connection of its own to `addr`: the root handle.
fn mnt_apart(addr: std::net::SocketAddr, path: &str, sys: Option<(u32, u32)>) -> Result<Vec<u8>, String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_secs(5))
        .map_err(|e| format!("MNT: connect to {addr}: {e}"))?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(10))).map_err(|e| e.to_string())?;
    let mut args = Vec::new();
    MountCall::Mnt(path.as_bytes()).encode(&mut args);
    let mut out = Vec::new();
    encode(sys, 1, MOUNT_PROGRAM, mount::mproc::MNT, &args, &mut out);
    s.write_all(&out).map_err(|e| format!("MNT: {e}"))?;
    let mut rr = RecordReader::new(RecordLimits::default());
    let mut buf = [0u8; 4096];
    // Bounded: each turn reads bytes or fails (the read has a timeout).
    loop {
        if let Some(rec) = rr.next_record().map_err(|e| format!("MNT: {e}"))? {
            let d = decode_reply(rec).map_err(|e| format!("MNT: {e}"))?;
            if d.reply != Reply::Success {
                return Err(format!("MNT: {}", d.reply));
            }
            return match mount::decode_mnt(d.results).map_err(|e| e.to_string())? {
                Ok(fh) => Ok(fh.to_vec()),
                Err(st) => Err(format!("MNT {path}: mountstat3 {st}")),
            };
        }
        match s.read(&mut buf) {
            Ok(0) => return Err("MNT: connection closed".into()),
            Ok(n) => rr.push(&buf[..n]),
            Err(e) => return Err(format!("MNT: {e}")),
        }
    }
}

impl Workload for NfsLoad {
    type Client = NfsClient;
    fn client(&self, _conn: usize) -> NfsClient {
        let limits = RecordLimits { max_record_len: self.size as usize + 8192, max_fragments: 64 };
        NfsClient { load: self.clone(), call: Vec::new(), expect: 0, reader: RecordReader::new(limits) }
    }
}

/// One connection: the call (xid 0, patched per call) and the replies' reader.
pub struct NfsClient {
    load: NfsLoad,
    call: Vec<u8>,
    /// Bytes a READ must return.
    expect: usize,
    reader: RecordReader,
}

/// Encodes a call of `procedure`, one fragment: AUTH_SYS with `sys`'s uid
/// and gid, else AUTH_NONE.
fn encode(sys: Option<(u32, u32)>, xid: u32, prog: u32, procedure: u32, args: &[u8], out: &mut Vec<u8>) {
    let cred = match sys {
        None => Credential::None,
        Some((uid, gid)) => Credential::Sys { stamp: 0, machine_name: b"rpctest", uid, gid, gids: &[] },
    };
    let call = Call { xid, prog, vers: 3, procedure, cred, args };
    call.encode(1, out).expect("a credential within limits");
}

impl NfsClient {
    /// One call in the session's setup, its results returned.
    fn exchange(&mut self, ex: &mut Exchange<'_>, prog: u32, procedure: u32, args: &[u8]) -> Result<Vec<u8>, String> {
        let mut out = Vec::new();
        encode(self.load.sys, 1, prog, procedure, args, &mut out);
        let mut reply = Vec::new();
        ex(&out, &mut reply)?;
        // Bounded: each turn reads bytes (the exchange fails on a stall).
        loop {
            self.reader.push(&reply);
            reply.clear();
            if let Some(rec) = self.reader.next_record().map_err(|e| format!("bad reply stream: {e}"))? {
                let d = decode_reply(rec).map_err(|e| format!("bad reply: {e}"))?;
                if d.reply != Reply::Success {
                    return Err(format!("setup call {procedure}: {}", d.reply));
                }
                return Ok(d.results.to_vec());
            }
            ex(&[], &mut reply)?;
        }
    }

    fn nfs(&mut self, ex: &mut Exchange<'_>, c: &NfsCall<'_>) -> Result<Vec<u8>, String> {
        let mut args = Vec::new();
        c.encode(&mut args);
        self.exchange(ex, NFS_PROGRAM, c.proc(), &args)
    }
}

fn stat_err(what: &str, s: Nfsstat3) -> String {
    format!("{what}: {s}")
}

impl Client for NfsClient {
    fn setup(&mut self, ex: &mut Exchange<'_>) -> Result<(), String> {
        let root = if let Some(addr) = self.load.mount_addr {
            mnt_apart(addr, &self.load.mount, self.load.sys)?
        } else {
            let mut args = Vec::new();
            MountCall::Mnt(self.load.mount.as_bytes()).encode(&mut args);
            let r = self.exchange(ex, MOUNT_PROGRAM, mount::mproc::MNT, &args)?;
            match mount::decode_mnt(&r).map_err(|e| e.to_string())? {
                Ok(fh) => fh.to_vec(),
                Err(s) => return Err(format!("MNT {}: mountstat3 {s}", self.load.mount)),
            }
        };
        let file = self.load.file.clone().unwrap_or_default();
        let names: Vec<&str> = file.split('/').filter(|n| !n.is_empty()).collect();
        let (mut dir, mut fh, mut size) = (root.clone(), root, 0u64);
        let last = names.len().saturating_sub(1);
        for (i, name) in names.iter().enumerate() {
            let r = self.nfs(ex, &NfsCall::Lookup(DirOp { dir: &fh, name: name.as_bytes() }))?;
            match res::decode_lookup(&r).map_err(|e| e.to_string())? {
                Ok((h, a)) => {
                    dir = std::mem::replace(&mut fh, h.to_vec());
                    size = a.map_or(0, |a| a.size);
                }
                Err(Nfsstat3::ERR_NOENT) if i == last && self.load.proc == Proc::Write => {
                    let how = CreateHow::Unchecked(Sattr3 { mode: Some(0o644), ..Sattr3::default() });
                    let r = self.nfs(ex, &NfsCall::Create { at: DirOp { dir: &fh, name: name.as_bytes() }, how })?;
                    let h = res::decode_create(&r)
                        .map_err(|e| e.to_string())?
                        .map_err(|s| stat_err("CREATE", s))?
                        .ok_or("CREATE returned no handle")?;
                    dir = std::mem::replace(&mut fh, h.to_vec());
                }
                Err(s) => return Err(stat_err(&format!("LOOKUP {name}"), s)),
            }
        }
        let size_arg = self.load.size;
        let data = vec![0x5au8; if self.load.proc == Proc::Write { size_arg as usize } else { 0 }];
        let call = match self.load.proc {
            Proc::Null => NfsCall::Null,
            Proc::Getattr => NfsCall::Getattr { fh: &fh },
            Proc::Lookup => {
                let name = names.last().ok_or("--proc lookup needs --file")?;
                NfsCall::Lookup(DirOp { dir: &dir, name: name.as_bytes() })
            }
            Proc::Read => {
                self.expect = (size_arg as u64).min(size) as usize;
                NfsCall::Read { fh: &fh, offset: 0, count: size_arg }
            }
            Proc::Write => NfsCall::Write { fh: &fh, offset: 0, stable: StableHow::Unstable, data: &data },
        };
        let mut args = Vec::new();
        call.encode(&mut args);
        self.call.clear();
        encode(self.load.sys, 0, NFS_PROGRAM, call.proc(), &args, &mut self.call);
        Ok(())
    }

    fn encode(&mut self, tag: u32, out: &mut Vec<u8>) {
        let at = out.len();
        out.extend_from_slice(&self.call);
        out[at + 4..at + 8].copy_from_slice(&tag.to_be_bytes());
    }

    fn decode(&mut self, input: &[u8], done: &mut Vec<u32>) -> Result<(), String> {
        self.reader.push(input);
        // Each pass pops one record.
        loop {
            let rec = match self.reader.next_record() {
                Ok(Some(rec)) => rec,
                Ok(None) => return Ok(()),
                Err(e) => return Err(format!("bad reply stream: {e}")),
            };
            let d = decode_reply(rec).map_err(|e| format!("bad reply: {e}"))?;
            if d.reply != Reply::Success {
                return Err(format!("server answered {}", d.reply));
            }
            if self.load.proc == Proc::Read {
                let (data, _) = res::decode_read(d.results)
                    .map_err(|e| format!("bad READ result: {e}"))?
                    .map_err(|s| stat_err("READ", s))?;
                if data.len() != self.expect {
                    return Err(format!("READ returned {} bytes, {} expected", data.len(), self.expect));
                }
            } else if self.load.proc != Proc::Null {
                let (s, _) = res::status(d.results).map_err(|e| format!("bad result: {e}"))?;
                if s != Nfsstat3::OK {
                    return Err(stat_err("call", s));
                }
            }
            done.push(d.xid);
        }
    }
}
