//! `connmux 9ptest`: a 9P2000.L load generator in the manner of rpctest.
//!
//! Each of `-j` connections opens a session before the clock starts
//! (Tversion, Tattach of `--aname` as `--uid`, a walk to `--file` and, for
//! reads, Tlopen) and then keeps `-a` operations in flight:
//!
//! - `getattr`: Tgetattr of the file (one message each way);
//! - `walk`: Twalk from the root to the file on a fresh fid, then, on its
//!   reply, Tclunk of that fid (one operation is both round trips);
//! - `read`: `--size` bytes from offset 0, in Treads of at most msize−24
//!   bytes one after another (diod negotiates 64 KiB, connmux up to its
//!   `--max-msg`); every reply must carry exactly the bytes asked for;
//! - `write`: one Twrite of `--size` bytes (at most msize−24) at offset 0 of
//!   the file, opened for reading and writing; the reply must count them all.
//!
//! Every reply is checked against the request in flight under its tag: the
//! expected type, the walk's one qid, the read's byte count. An Rlerror, a
//! tag not in flight or a malformed reply fails the run (exit status 1).
//! Output: see `loadgen`; the rate column is `ops/s`, the summary key `ops_per_s`.

use std::collections::HashMap;

use connmux_9p::types::getattr;
use connmux_9p::{MsgType, Rmsg, Tmsg, NOFID, NOTAG};
use serde::Serialize;

use crate::cmd::loadgen::engine::Exchange;
use crate::cmd::loadgen::{self, CommonArgs, Target, Units};

/// The server's default port (`connmux 9p-server`).
pub const DEFAULT_PORT: u16 = 5640;

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    /// Tgetattr of the file.
    Getattr,
    /// Twalk to the file on a new fid, then Tclunk of it.
    Walk,
    /// Tread of --size bytes.
    Read,
    /// Twrite of --size bytes (one message).
    Write,
}

#[derive(clap::Args, Debug)]
#[command(after_help = "Output: as rpctest's (rounds, median row, 'summary key=value' with ops_per_s). \
Exit status 0 only if every reply was right; 1 on any error.")]
pub struct Args {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Operation.
    #[arg(long, value_enum, default_value = "getattr")]
    pub op: Op,
    /// Path of the file inside the export (components separated by '/'); the
    /// root when empty (not for read).
    #[arg(long, default_value = "")]
    pub file: String,
    /// Bytes per read.
    #[arg(long, default_value = "4096", value_parser = loadgen::target::parse_count)]
    pub size: u64,
    /// Attach name (the export's path for diod; empty is accepted by connmux).
    #[arg(long, default_value = "")]
    pub aname: String,
    /// Numeric uid to attach as [default: this process's effective uid].
    #[arg(long)]
    pub uid: Option<u32>,
    /// msize to ask for.
    #[arg(long, default_value = "1048576", value_parser = loadgen::target::parse_count)]
    pub msize: u64,
    /// 9P server, host[:port] (default port 5640).
    #[arg(default_value = "127.0.0.1")]
    pub target: String,
}

/// The settings of its own in the `--json` config.
#[derive(Serialize)]
struct Config {
    op: Op,
    file: String,
    size: u64,
    msize: u64,
}

struct Load {
    op: Op,
    names: Vec<String>,
    size: u32,
    aname: String,
    uid: u32,
    msize: u32,
}

/// Fid of the file walked to at setup; per-operation walk fids start above.
const FILE_FID: u32 = 1;
const WALK_FID_BASE: u32 = 0x1000_0000;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    Getattr,
    Walk,
    Clunk,
    Read,
    Write,
}

/// One connection.
pub struct NinepClient {
    load: Load,
    /// In flight: 9P tag → (engine tag, what its reply must be).
    inflight: HashMap<u16, (u32, Phase)>,
    /// Bytes per Tread (msize − 24).
    chunk: u32,
    /// Reads: bytes already received and bytes asked in the Tread in flight, by tag.
    reads: HashMap<u16, (u32, u32)>,
    /// The first bytes of the message being received (up to 11: the header and
    /// the count or errno), and how many bytes of it are still to skip.
    head: Vec<u8>,
    size: usize,
    skip: usize,
    follow: Vec<u8>,
    /// What each Twrite writes.
    data: Vec<u8>,
}

impl loadgen::Workload for Load {
    type Client = NinepClient;
    fn client(&self, _conn: usize) -> NinepClient {
        NinepClient {
            load: Load { names: self.names.clone(), aname: self.aname.clone(), ..*self },
            inflight: HashMap::new(),
            chunk: self.size.max(1),
            reads: HashMap::new(),
            head: Vec::with_capacity(11),
            size: 0,
            skip: 0,
            follow: Vec::new(),
            data: Vec::new(),
        }
    }
}

impl Clone for Load {
    fn clone(&self) -> Self {
        Load { names: self.names.clone(), aname: self.aname.clone(), ..*self }
    }
}

/// Bytes kept of each reply: size, type, tag and one u32 (count or errno).
const KEEP: usize = 11;

impl NinepClient {
    fn tag_for(&mut self, tag: u32) -> u16 {
        let mut t = tag as u16;
        // Bounded: fewer than 65,535 tags are ever in flight (-a <= 65,536 is
        // checked against the free tags here).
        for _ in 0..=u16::MAX as usize {
            if t != NOTAG && !self.inflight.contains_key(&t) {
                return t;
            }
            t = t.wrapping_add(1);
        }
        panic!("no free 9P tag");
    }

    /// One whole reply whose first bytes are in `head` (size `size`).
    fn finish(&mut self, done: &mut Vec<u32>) -> Result<(), String> {
        let h = &self.head;
        let ty = MsgType(h[4]);
        let t = u16::from_le_bytes([h[5], h[6]]);
        let word = (h.len() >= KEEP).then(|| u32::from_le_bytes([h[7], h[8], h[9], h[10]]));
        let Some((etag, phase)) = self.inflight.remove(&t) else {
            return Err(format!("reply with tag {t} not in flight"));
        };
        if ty == MsgType::RLERROR {
            return Err(format!("Rlerror errno {} (tag {t})", word.unwrap_or(0)));
        }
        match phase {
            Phase::Getattr if ty == MsgType::RGETATTR => done.push(etag),
            Phase::Read if ty == MsgType::RREAD => {
                let (got, asked) = self.reads.remove(&t).unwrap_or((0, 0));
                if word != Some(asked) || self.size != KEEP + asked as usize {
                    return Err(format!("short read: {word:?} bytes of {asked} at offset {got}"));
                }
                let got = got + asked;
                if got < self.load.size {
                    let n = self.chunk.min(self.load.size - got);
                    self.inflight.insert(t, (etag, Phase::Read));
                    self.reads.insert(t, (got, n));
                    Tmsg::Read { fid: FILE_FID, offset: got as u64, count: n }.encode(t, &mut self.follow);
                } else {
                    done.push(etag);
                }
            }
            Phase::Walk if ty == MsgType::RWALK => {
                // nwqid[2] then one 13-byte qid: the walk reached the file.
                let n = u16::from_le_bytes([h[7], h[8]]) as usize;
                if n != self.load.names.len() || self.size != 9 + 13 * n {
                    return Err(format!("walk answered {n} of {} names", self.load.names.len()));
                }
                self.inflight.insert(t, (etag, Phase::Clunk));
                Tmsg::Clunk { fid: WALK_FID_BASE + t as u32 }.encode(t, &mut self.follow);
            }
            Phase::Clunk if ty == MsgType::RCLUNK => done.push(etag),
            Phase::Write if ty == MsgType::RWRITE => {
                let asked = self.chunk.min(self.load.size);
                if word != Some(asked) {
                    return Err(format!("short write: {word:?} bytes of {asked}"));
                }
                done.push(etag);
            }
            _ => return Err(format!("unexpected reply type {} (tag {t})", ty.0)),
        }
        Ok(())
    }
}

/// Reads one whole message with `exchange` (sending `req` first).
fn exchange_msg(exchange: &mut Exchange<'_>, req: &[u8]) -> Result<Vec<u8>, String> {
    let mut got = Vec::new();
    exchange(req, &mut got)?;
    // Bounded: each exchange reads at least one byte or fails.
    for _ in 0..100_000 {
        if got.len() >= 4 {
            let n = u32::from_le_bytes([got[0], got[1], got[2], got[3]]) as usize;
            if got.len() >= n {
                if got.len() > n {
                    return Err("more than one reply during setup".into());
                }
                return Ok(got);
            }
        }
        exchange(&[], &mut got)?;
    }
    Err("setup reply never completed".into())
}

fn expect_ok(b: &[u8], what: &str) -> Result<(), String> {
    match Rmsg::decode(b) {
        Ok((_, Rmsg::Lerror { errno })) => Err(format!("{what}: Rlerror errno {errno}")),
        Ok(_) => Ok(()),
        Err(e) => Err(format!("{what}: {e}")),
    }
}

impl loadgen::Client for NinepClient {
    fn setup(&mut self, exchange: &mut Exchange<'_>) -> Result<(), String> {
        let mut req = Vec::new();
        Tmsg::Version { msize: self.load.msize, version: connmux_9p::VERSION_L }.encode(NOTAG, &mut req);
        let b = exchange_msg(exchange, &req)?;
        match Rmsg::decode(&b) {
            Ok((_, Rmsg::Version { msize, version })) if version == connmux_9p::VERSION_L => {
                if (msize as usize) <= connmux_9p::IOHDRSZ {
                    return Err(format!("msize {msize} too small"));
                }
                self.chunk = msize - connmux_9p::IOHDRSZ as u32;
            }
            other => return Err(format!("version: {other:?}")),
        }
        let l = &self.load;
        req.clear();
        Tmsg::Attach { fid: 0, afid: NOFID, uname: "", aname: &l.aname, n_uname: l.uid }.encode(1, &mut req);
        expect_ok(&exchange_msg(exchange, &req)?, "attach")?;
        if l.op != Op::Walk {
            req.clear();
            let names: Vec<&str> = l.names.iter().map(|s| s.as_str()).collect();
            Tmsg::Walk { fid: 0, newfid: FILE_FID, names }.encode(2, &mut req);
            let b = exchange_msg(exchange, &req)?;
            match Rmsg::decode(&b) {
                Ok((_, Rmsg::Walk { qids })) if qids.len() == l.names.len() => {}
                other => return Err(format!("walk to --file: {other:?}")),
            }
        }
        if l.op == Op::Read || l.op == Op::Write {
            req.clear();
            // O_RDONLY, or O_RDWR to write.
            let flags = if l.op == Op::Write { 2 } else { 0 };
            Tmsg::Lopen { fid: FILE_FID, flags }.encode(3, &mut req);
            expect_ok(&exchange_msg(exchange, &req)?, "lopen")?;
        }
        if l.op == Op::Write {
            let n = self.chunk.min(l.size) as usize;
            self.data = (0..n).map(|i| b'a' + (i % 26) as u8).collect();
        }
        Ok(())
    }

    fn encode(&mut self, tag: u32, out: &mut Vec<u8>) {
        let t = self.tag_for(tag);
        let l = &self.load;
        let phase = match l.op {
            Op::Getattr => {
                Tmsg::Getattr { fid: FILE_FID, mask: getattr::BASIC }.encode(t, out);
                Phase::Getattr
            }
            Op::Read => {
                let n = self.chunk.min(l.size);
                Tmsg::Read { fid: FILE_FID, offset: 0, count: n }.encode(t, out);
                self.reads.insert(t, (0, n));
                Phase::Read
            }
            Op::Walk => {
                let names: Vec<&str> = l.names.iter().map(|s| s.as_str()).collect();
                Tmsg::Walk { fid: 0, newfid: WALK_FID_BASE + t as u32, names }.encode(t, out);
                Phase::Walk
            }
            Op::Write => {
                Tmsg::Write { fid: FILE_FID, offset: 0, data: &self.data }.encode(t, out);
                Phase::Write
            }
        };
        self.inflight.insert(t, (tag, phase));
    }

    fn decode(&mut self, mut input: &[u8], done: &mut Vec<u32>) -> Result<(), String> {
        // Bounded: each turn consumes at least one byte or ends.
        while !input.is_empty() {
            if self.skip > 0 {
                let n = self.skip.min(input.len());
                self.skip -= n;
                input = &input[n..];
                if self.skip == 0 {
                    self.finish(done)?;
                    self.head.clear();
                }
                continue;
            }
            let want = if self.head.len() < 4 { 4 } else { KEEP.min(self.size) };
            let n = (want - self.head.len()).min(input.len());
            self.head.extend_from_slice(&input[..n]);
            input = &input[n..];
            if self.head.len() == 4 {
                self.size = u32::from_le_bytes([self.head[0], self.head[1], self.head[2], self.head[3]]) as usize;
                if self.size < connmux_9p::HEADER_LEN || self.size > self.load.msize as usize {
                    return Err(format!("reply size {} outside 7..msize", self.size));
                }
                continue;
            }
            if self.head.len() == KEEP.min(self.size) {
                self.skip = self.size - self.head.len();
                if self.skip == 0 {
                    self.finish(done)?;
                    self.head.clear();
                }
            }
        }
        Ok(())
    }

    fn follow_up(&mut self, out: &mut Vec<u8>) {
        out.append(&mut self.follow);
    }
}

/// The effective uid (from /proc, no libc call).
fn euid() -> u32 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| l.strip_prefix("Uid:")).and_then(|v| v.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

pub fn run(a: Args) -> anyhow::Result<i32> {
    let target = Target::resolve(&a.target, DEFAULT_PORT)?;
    let names: Vec<String> = a.file.split('/').filter(|s| !s.is_empty()).map(String::from).collect();
    if a.op != Op::Getattr && names.is_empty() {
        anyhow::bail!("--op {:?} needs --file", a.op);
    }
    let msize = a.msize.clamp(4096, u32::MAX as u64) as u32;
    if a.size > u32::MAX as u64 {
        anyhow::bail!("--size too large");
    }
    let load =
        Load { op: a.op, names, size: a.size as u32, aname: a.aname.clone(), uid: a.uid.unwrap_or_else(euid), msize };
    let config = Config { op: a.op, file: a.file.clone(), size: a.size, msize: a.msize };
    let units = Units { tool: "9ptest", rate_col: "ops/s", rate_key: "ops_per_s" };
    loadgen::run_load(&a.common, units, &target, &load, config)
}
