//! `connmux rpctest`: ONC RPC NULL-call load generator (ksf's rpctest).
//!
//! Each of `-j` connections keeps `-a` NULL calls (procedure 0 of `--prog`
//! `--vers`, NFS v3 by default) in flight over TCP with record marking: the
//! 44-byte call of ksf.md §2.4 with AUTH_NONE, or a 64-byte body with `-A sys`.
//! `-f` sends each call as three record fragments of 1, n−2 and 1 bytes (ksf's
//! `-f`); `--fragments N` picks another count.
//!
//! Every reply is reassembled from its record fragments and checked: it must
//! be a REPLY, MSG_ACCEPTED, SUCCESS, void results, and its xid must be that of
//! a call in flight on that connection (replies may come in any order). The
//! xid of a call carries its slot number in the low bits and a per-slot use
//! counter above, so ksf's "xid = sequence number" does not hold here; any
//! server that echoes the xid works. Anything else (another xid, PROG_UNAVAIL,
//! a denied reply, garbage, a record over 1 KiB, a closed connection, no reply
//! within `--io-timeout`) fails the run with exit status 1.
//!
//! `--proc getattr|lookup|read|write` sends NFSv3 calls instead (see
//! `cmd::nfs::load`): `--file`, `--size`, `--mount`.
//!
//! `-u` sends the NULL calls over UDP (ksf's `-u`): one call per datagram,
//! without record mark (RFC 5531 §11), each reply checked as above and
//! matched by xid; a call unanswered for `--udp-retry` is counted lost and
//! its slot sends a new one. Not with `-f`/`--fragments` (no record marks
//! over UDP), `--proc` other than null, or several servers.
//!
//! Output columns: see [`super::loadgen`]; the rate column is `RPC/s` and the
//! summary key `rpc_per_s`. Not done: `-m`, `-x`.

use connmux_oncrpc::record::MARK_LEN;
use connmux_oncrpc::{check_reply, Call, Credential, RecordLimits, RecordMark, RecordReader};
use serde::Serialize;

use super::loadgen::{self, CommonArgs, Target, Units};

/// The default port of ksf's krpc2 and of `connmux rpc-server`.
pub const DEFAULT_PORT: u16 = 62049;
/// Largest reply record accepted: a NULL reply is 24 to 432 bytes (ksf asserts < 1024).
const MAX_REPLY: usize = 1024;

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Auth {
    /// AUTH_NONE.
    None,
    /// AUTH_SYS with this machine's name and the caller's uid, gid and groups.
    #[value(alias = "unix")]
    Sys,
}

#[derive(clap::Args, Debug)]
#[command(after_help = loadgen::after_help(UNITS.rate_col))]
pub struct Args {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Send each call as three record fragments (1, n-2 and 1 bytes), as ksf's -f.
    #[arg(short = 'f')]
    pub three_fragments: bool,
    /// Send each call as N record fragments (1..64; overrides -f).
    #[arg(long = "fragments", value_name = "N", value_parser = clap::value_parser!(u32).range(1..=64))]
    pub fragments: Option<u32>,
    /// Program number of the NULL calls.
    #[arg(long, default_value_t = 100_003)]
    pub prog: u32,
    /// Program version of the NULL calls.
    #[arg(long, default_value_t = 3)]
    pub vers: u32,
    /// Credential: none (AUTH_NONE) or sys (AUTH_SYS; "unix" also works).
    #[arg(short = 'A', long = "auth", value_enum, default_value = "none")]
    pub auth: Auth,
    /// More RPC servers, [user@]host[:port] (repeat, or separate with commas).
    /// With more than one server in all, the calls go through one client mux
    /// with a connection to each (--tx-policy picks the server of each call;
    /// -j x -a calls in flight from one thread, -j x -c per round) and the
    /// output counts the calls each server answered.
    #[arg(short = 's', long = "server", value_name = "HOST:PORT")]
    pub servers: Vec<String>,
    /// With several servers: which connection carries each call.
    #[arg(long = "tx-policy", value_enum, default_value = "least-outstanding")]
    pub tx_policy: super::rpctest_mux::Policy,
    /// The procedure of each call: null (--prog/--vers), or an NFSv3
    /// getattr, lookup, read or write against an NFS server with MOUNT on
    /// the same port (`connmux nfs-server`).
    #[arg(long = "proc", value_enum, default_value = "null")]
    pub proc: crate::cmd::nfs::load::Proc,
    /// Bytes of each READ or WRITE (e.g. 4K, 1M).
    #[arg(long, value_name = "SIZE", default_value = "4096", value_parser = crate::cmd::server::parse_size)]
    pub size: usize,
    /// The file of getattr, lookup, read and write, beneath the mount
    /// (getattr: the root without it; write: created if missing).
    #[arg(long, value_name = "PATH")]
    pub file: Option<String>,
    /// The path given to MNT.
    #[arg(long, value_name = "PATH", default_value = "/")]
    pub mount: String,
    /// MOUNT's port on the server's host, when it is not the NFS port
    /// (nfs-ganesha, the kernel's nfsd) [default: the same connection].
    #[arg(long, value_name = "PORT")]
    pub mount_port: Option<u16>,
    /// RPC server, [user@]host[:port] (default port 62049); names are resolved
    /// [default: 127.0.0.1 unless -s is given].
    pub target: Option<String>,
}

/// The settings of its own in the `--json` config.
#[derive(Serialize)]
struct Config {
    prog: u32,
    vers: u32,
    auth: Auth,
    fragments: usize,
    call_bytes: usize,
}

const UNITS: Units = Units { tool: "rpctest", rate_col: "RPC/s", rate_key: "rpc_per_s" };

/// The AUTH_SYS credential fields, read once per run.
#[derive(Clone, Debug)]
struct SysCred {
    stamp: u32,
    machine_name: Vec<u8>,
    uid: u32,
    gid: u32,
    gids: Vec<u32>,
}

impl SysCred {
    /// Like `authunix_create_default()`: host name, effective uid and gid, and
    /// up to 16 supplementary groups, read from /proc (no libc calls needed).
    fn current() -> anyhow::Result<SysCred> {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_else(|_| "localhost".into());
        let mut machine_name = host.trim().as_bytes().to_vec();
        machine_name.truncate(connmux_oncrpc::call::MAX_MACHINE_NAME);
        let status = std::fs::read_to_string("/proc/self/status")?;
        let field = |name: &str| -> Vec<u32> {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|v| v.split_whitespace().filter_map(|x| x.parse().ok()).collect())
                .unwrap_or_default()
        };
        // "Uid:" lists real, effective, saved, filesystem.
        let uid = *field("Uid:").get(1).ok_or_else(|| anyhow::anyhow!("no Uid in /proc/self/status"))?;
        let gid = *field("Gid:").get(1).ok_or_else(|| anyhow::anyhow!("no Gid in /proc/self/status"))?;
        let mut gids = field("Groups:");
        gids.truncate(connmux_oncrpc::call::MAX_GIDS);
        let stamp =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as u32);
        Ok(SysCred { stamp, machine_name, uid, gid, gids })
    }
}

struct Rpc {
    prog: u32,
    vers: u32,
    fragments: usize,
    cred: Option<SysCred>,
}

impl Rpc {
    fn call(&self, xid: u32, out: &mut Vec<u8>) {
        let cred = match &self.cred {
            None => Credential::None,
            Some(c) => {
                Credential::Sys { stamp: c.stamp, machine_name: &c.machine_name, uid: c.uid, gid: c.gid, gids: &c.gids }
            }
        };
        let call = Call { xid, prog: self.prog, vers: self.vers, procedure: 0, cred, args: &[] };
        // Name and group count were bounded when the credential was built.
        call.encode(self.fragments, out).expect("AUTH_SYS credential within limits");
    }
}

/// A call encoded once by connmux-oncrpc, with the byte positions its xid
/// occupies: each further call is a copy with those 4 bytes patched, which
/// keeps the client's per-call cost far below the server's.
#[derive(Clone)]
struct Template {
    bytes: Vec<u8>,
    xid_at: [usize; 4],
}

impl Template {
    /// `None` when the positions cannot be found (then every call is encoded).
    fn new(rpc: &Rpc) -> Option<Template> {
        let (mut zero, mut ones) = (Vec::new(), Vec::new());
        rpc.call(0, &mut zero);
        rpc.call(u32::MAX, &mut ones);
        let diff: Vec<usize> = (0..zero.len()).filter(|&i| zero.get(i) != ones.get(i)).collect();
        let xid_at: [usize; 4] = diff.try_into().ok()?;
        let t = Template { bytes: zero, xid_at };
        // Trust the positions only if they reproduce the encoder exactly.
        for xid in [0x0102_0304, 0xdead_beef, 7] {
            let (mut want, mut got) = (Vec::new(), Vec::new());
            rpc.call(xid, &mut want);
            t.put(xid, &mut got);
            if want != got {
                return None;
            }
        }
        Some(t)
    }

    fn put(&self, xid: u32, out: &mut Vec<u8>) {
        let at = out.len();
        out.extend_from_slice(&self.bytes);
        for (k, b) in xid.to_be_bytes().into_iter().enumerate() {
            out[at + self.xid_at[k]] = b;
        }
    }
}

impl loadgen::Workload for Rpc {
    type Client = RpcClient;
    fn client(&self, _conn: usize) -> RpcClient {
        let rpc = Rpc { prog: self.prog, vers: self.vers, fragments: self.fragments, cred: self.cred.clone() };
        RpcClient {
            template: Template::new(&rpc),
            usual: usual_reply_tail(),
            rpc,
            reader: RecordReader::new(RecordLimits { max_record_len: MAX_REPLY, max_fragments: 64 }),
        }
    }
}

/// One connection: the call encoder and the reply reassembler.
pub struct RpcClient {
    rpc: Rpc,
    template: Option<Template>,
    usual: Vec<u8>,
    reader: RecordReader,
}

/// Checks one reply record (marks stripped) and records its xid. `usual` is
/// the body of the common reply after the xid (REPLY, MSG_ACCEPTED, AUTH_NONE
/// verifier, SUCCESS): a reply equal to it needs no decoding; any other goes
/// through `check_reply`.
fn check(rec: &[u8], usual: &[u8], done: &mut Vec<u32>) -> Result<(), String> {
    if rec.len() == 4 + usual.len() && rec[4..] == *usual {
        done.push(u32::from_be_bytes([rec[0], rec[1], rec[2], rec[3]]));
        return Ok(());
    }
    let xid = check_reply(rec, None).map_err(|e| format!("bad reply: {e}"))?;
    done.push(xid);
    Ok(())
}

fn usual_reply_tail() -> Vec<u8> {
    let mut body = Vec::new();
    connmux_oncrpc::reply::encode_reply_body(0, &connmux_oncrpc::Reply::Success, &mut body);
    // The encoder's own output passes the full check.
    debug_assert_eq!(check_reply(&body, Some(0)), Ok(0));
    body.split_off(4)
}

impl loadgen::Client for RpcClient {
    fn encode(&mut self, tag: u32, out: &mut Vec<u8>) {
        match &self.template {
            Some(t) => t.put(tag, out),
            None => self.rpc.call(tag, out),
        }
    }

    fn decode(&mut self, mut input: &[u8], done: &mut Vec<u32>) -> Result<(), String> {
        // Fast path, when no partial record is held: whole single-fragment
        // records are checked where they lie, without a copy.
        if self.reader.buffered() == 0 {
            while let Some(m) = RecordMark::parse(input) {
                let end = MARK_LEN + m.len as usize;
                if !m.last || m.len as usize > MAX_REPLY || input.len() < end {
                    break;
                }
                check(&input[MARK_LEN..end], &self.usual, done)?;
                input = &input[end..];
            }
        }
        if input.is_empty() {
            return Ok(());
        }
        // The rest (split records, several fragments, oversized marks) goes
        // through the reassembler, which enforces the limits.
        self.reader.push(input);
        // Each pass pops one record; at most input.len() / 4 records can be ready.
        loop {
            match self.reader.next_record() {
                Ok(Some(rec)) => check(rec, &self.usual, done)?,
                Ok(None) => return Ok(()),
                Err(e) => return Err(format!("bad reply stream: {e}")),
            }
        }
    }
}

/// One NULL call per datagram (no record mark), a template with the xid
/// patched in.
pub struct RpcDgram {
    call: Vec<u8>,
    usual: Vec<u8>,
    done: Vec<u32>,
}

impl loadgen::udp::DgramWorkload for Rpc {
    type Client = RpcDgram;
    fn client(&self, _conn: usize) -> RpcDgram {
        let mut marked = Vec::new();
        self.call(0, &mut marked);
        // One fragment (checked by `run`): the call is the record's body.
        RpcDgram { call: marked.split_off(MARK_LEN), usual: usual_reply_tail(), done: Vec::with_capacity(1) }
    }
}

impl loadgen::udp::Dgram for RpcDgram {
    fn encode(&mut self, tag: u32, out: &mut Vec<u8>) {
        let at = out.len();
        out.extend_from_slice(&self.call);
        out[at..at + 4].copy_from_slice(&tag.to_be_bytes());
    }

    fn decode(&mut self, d: &[u8]) -> Result<u32, String> {
        if d.len() > MAX_REPLY {
            return Err(format!("a {}-byte reply (NULL replies are at most {MAX_REPLY})", d.len()));
        }
        self.done.clear();
        check(d, &self.usual, &mut self.done)?;
        Ok(self.done[0])
    }
}

pub fn run(a: Args) -> anyhow::Result<i32> {
    let mut specs: Vec<&str> =
        a.target.iter().chain(&a.servers).flat_map(|s| s.split(',')).filter(|s| !s.is_empty()).collect();
    if specs.is_empty() {
        specs.push("127.0.0.1");
    }
    let target = Target::resolve(specs[0], DEFAULT_PORT)?;
    let fragments = match (a.fragments, a.three_fragments) {
        (Some(n), _) => n as usize,
        (None, true) => 3,
        (None, false) => 1,
    };
    let cred = match a.auth {
        Auth::None => None,
        Auth::Sys => Some(SysCred::current()?),
    };
    let rpc = Rpc { prog: a.prog, vers: a.vers, fragments, cred };
    let mut sample = Vec::new();
    rpc.call(0, &mut sample);
    let c = &a.common;
    if c.verbose > 0 {
        eprintln!(
            "rpctest: prog {} vers {} auth {:?}, {} fragment(s), {} bytes per call on the wire",
            a.prog,
            a.vers,
            a.auth,
            fragments,
            sample.len()
        );
    }
    if a.proc != crate::cmd::nfs::load::Proc::Null {
        anyhow::ensure!(specs.len() == 1, "--proc {:?}: one server", a.proc);
        anyhow::ensure!(a.size > 0 && a.size <= 1 << 20, "--size: 1 byte to 1 MiB");
        let mount_addr = match a.mount_port {
            None => None,
            Some(p) => Some(std::net::SocketAddr::new(
                target.addrs.first().ok_or_else(|| anyhow::anyhow!("no address for the target"))?.ip(),
                p,
            )),
        };
        let sys = rpc.cred.as_ref().map(|c| (c.uid, c.gid));
        let load = crate::cmd::nfs::load::NfsLoad {
            proc: a.proc,
            size: a.size as u32,
            file: a.file,
            mount: a.mount,
            mount_addr,
            sys,
        };
        return loadgen::run_load(c, UNITS, &target, &load, load.clone());
    }
    if c.udp {
        anyhow::ensure!(fragments == 1, "-u: a call is one datagram, with no record marks (no -f, --fragments)");
        anyhow::ensure!(a.proc == crate::cmd::nfs::load::Proc::Null, "-u: NULL calls only (--proc null)");
        anyhow::ensure!(specs.len() == 1, "-u: one server");
        let config = Config { prog: a.prog, vers: a.vers, auth: a.auth, fragments: 0, call_bytes: sample.len() - 4 };
        return loadgen::run_load_udp(c, UNITS, &target, &rpc, config);
    }
    let config = Config { prog: a.prog, vers: a.vers, auth: a.auth, fragments, call_bytes: sample.len() };
    if specs.len() > 1 {
        let servers = specs.iter().map(|s| Target::resolve(s, DEFAULT_PORT)).collect::<anyhow::Result<Vec<_>>>()?;
        return super::rpctest_mux::run(c, &servers, a.tx_policy, &|xid, out| rpc.call(xid, out));
    }
    loadgen::run_load(c, UNITS, &target, &rpc, config)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd::loadgen::{Client, Workload};
    use connmux_oncrpc::{encode_reply, Reply};

    fn rpc(fragments: usize) -> Rpc {
        Rpc { prog: 100_003, vers: 3, fragments, cred: None }
    }

    #[test]
    fn default_call_is_ksf_44_bytes_and_f_is_52() {
        let mut out = Vec::new();
        rpc(1).call(5, &mut out);
        assert_eq!(out.len(), 44);
        assert_eq!(&out[..8], &[0x80, 0, 0, 0x28, 0, 0, 0, 5]);
        out.clear();
        rpc(3).call(5, &mut out);
        assert_eq!(out.len(), 52);
        assert_eq!(&out[..4], &[0, 0, 0, 1], "first fragment: 1 byte, not last");
    }

    #[test]
    fn template_reproduces_the_encoder_for_every_fragment_count_and_auth() {
        let sys = Some(SysCred::current().unwrap());
        for (fragments, cred) in [(1, None), (3, None), (40, None), (64, None), (1, sys.clone()), (5, sys)] {
            let r = Rpc { cred, ..rpc(fragments) };
            let mut c = r.client(0);
            assert!(c.template.is_some(), "fragments {fragments}");
            for xid in [0u32, 1, 0x8000_0001, u32::MAX, 0x00ff_ff00] {
                let (mut want, mut got) = (Vec::new(), Vec::new());
                r.call(xid, &mut want);
                c.encode(xid, &mut got);
                assert_eq!(want, got, "fragments {fragments} xid {xid:#x}");
            }
        }
    }

    #[test]
    fn auth_sys_call_has_a_sys_credential() {
        let r = Rpc { cred: Some(SysCred::current().unwrap()), ..rpc(1) };
        let mut out = Vec::new();
        r.call(1, &mut out);
        let h = connmux_oncrpc::CallHeader::new_checked(&out[4..]).unwrap();
        assert_eq!(h.cred().flavor, connmux_oncrpc::AuthFlavor::AUTH_SYS);
    }

    #[test]
    fn decodes_split_and_out_of_order_replies_and_refuses_bad_ones() {
        let mut c = rpc(1).client(0);
        let mut wire = Vec::new();
        encode_reply(9, &Reply::Success, &mut wire);
        encode_reply(3, &Reply::Success, &mut wire);
        let mut done = Vec::new();
        for b in wire.chunks(5) {
            c.decode(b, &mut done).unwrap();
        }
        assert_eq!(done, vec![9, 3]);

        let mut c = rpc(1).client(0);
        let mut wire = Vec::new();
        encode_reply(4, &Reply::ProgUnavail, &mut wire);
        let e = c.decode(&wire, &mut Vec::new()).unwrap_err();
        assert!(e.contains("PROG_UNAVAIL"), "{e}");

        let mut c = rpc(1).client(0);
        let e = c.decode(&[0x80, 0, 0x10, 0], &mut Vec::new()).unwrap_err();
        assert!(e.contains("exceeds"), "{e}");

        // A reply in three fragments, then a whole one, split at every byte.
        let mut body = Vec::new();
        connmux_oncrpc::reply::encode_reply_body(11, &Reply::Success, &mut body);
        let mut wire = Vec::new();
        connmux_oncrpc::encode_record(&body, 3, &mut wire);
        encode_reply(12, &Reply::Success, &mut wire);
        for cut in 0..wire.len() {
            let mut c = rpc(1).client(0);
            let mut done = Vec::new();
            c.decode(&wire[..cut], &mut done).unwrap();
            c.decode(&wire[cut..], &mut done).unwrap();
            assert_eq!(done, vec![11, 12], "cut at {cut}");
        }
    }

    #[test]
    fn a_udp_call_is_the_record_without_its_mark() {
        use crate::cmd::loadgen::udp::{Dgram, DgramWorkload};
        let r = rpc(1);
        let mut c = DgramWorkload::client(&r, 0);
        let (mut d, mut marked) = (Vec::new(), Vec::new());
        c.encode(77, &mut d);
        r.call(77, &mut marked);
        assert_eq!(d, marked[4..]);
        let mut reply = Vec::new();
        encode_reply(77, &Reply::Success, &mut reply);
        assert_eq!(c.decode(&reply[4..]), Ok(77));
        reply.clear();
        encode_reply(78, &Reply::ProgUnavail, &mut reply);
        assert!(c.decode(&reply[4..]).unwrap_err().contains("PROG_UNAVAIL"));
    }
}
