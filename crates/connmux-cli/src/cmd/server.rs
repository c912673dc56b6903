//! `connmux echo-server` and `connmux rpc-server`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::BytesMut;
use connmux::service::{Handler, Messages, RunServed, Service, ServiceConfig, Verdict};
use connmux::{Bytes, Config, Mux, Placement, PsockId, SockType, Steering};

use crate::cmd::baseline;
use crate::cmd::rpcbind::Registration;
use crate::cmd::stat::{self, StatsEndpoint};
use crate::cmd::stop;

/// Options every server shares.
#[derive(clap::Args, Debug, Clone)]
pub struct Common {
    /// I/O worker threads, each pinned to a CPU [default: one per CPU: one per
    /// --cpus entry, else one per CPU this process may run on].
    #[arg(short = 'w', long, value_name = "N")]
    pub workers: Option<usize>,
    /// CPUs to pin workers to, e.g. "0" or "0,1" (default: all available, in order).
    #[arg(long, value_delimiter = ',')]
    pub cpus: Vec<usize>,
    /// Do not pin workers.
    #[arg(long)]
    pub no_pin: bool,
    /// Steering: affinity (default: requests handled where read until load is
    /// uneven), rr (KCM's round robin), key.
    #[arg(long, default_value = "affinity")]
    pub steering: String,
    /// Largest message accepted (bytes); larger ones abort the connection.
    #[arg(long, default_value_t = 1 << 20)]
    pub max_msg: usize,
    /// Assembly timeout in milliseconds from a message's first byte (0 = none).
    /// On by default: a peer that sends a message's first bytes and then
    /// nothing (slowloris) would otherwise hold its connection and buffer
    /// forever. The clock stops while the server itself is not reading the
    /// connection (its replies backed up, the memory budget) and restarts in
    /// full when it reads again. Counted in `rx_msg_timeouts`.
    #[arg(long, default_value_t = connmux::DEFAULT_ASSEMBLY_TIMEOUT.as_millis() as u64)]
    pub assembly_timeout_ms: u64,
    /// Memory budget for all connections together: assembly buffers, queued
    /// requests and replies (e.g. 64M, 1G, or bytes). Past it the largest
    /// holders stop being read; those still stuck a second later are reset
    /// (counted in `mem_pauses`, `mem_aborts`).
    #[arg(long, value_name = "SIZE", default_value_t = connmux::DEFAULT_MEM_LIMIT, value_parser = parse_size)]
    pub mem_limit: usize,
    /// Most connections attached at once; past it the connection idle
    /// longest, if idle for a second or more, is reset to make room
    /// (counted in `evicted`), else the new connection is reset as soon as
    /// it is accepted (counted in `refused`; 0 = no cap).
    #[arg(long, default_value_t = connmux::DEFAULT_MAX_CONNS)]
    pub max_conns: usize,
    /// TLS handshake timeout in milliseconds: a handshake not finished by
    /// then resets the connection (counted in `handshake_timeouts`; 0 = none).
    #[arg(long, default_value_t = 5_000)]
    pub handshake_timeout_ms: u64,
    /// Close a connection with no bytes received or sent for this many
    /// milliseconds (counted in `idle_timeouts`; 0 = never, the default).
    #[arg(long, default_value_t = 0)]
    pub idle_timeout_ms: u64,
    /// Stop after this many seconds (default: run until killed).
    #[arg(long)]
    pub duration: Option<f64>,
    /// Print statistics every this many seconds (0 = only at exit).
    #[arg(long, default_value_t = 0.0)]
    pub stats_every: f64,
    /// Server implementation: "connmux" (default) or "thread" (one thread per
    /// connection, the baseline with no framework).
    #[arg(long, default_value = "connmux")]
    pub engine: String,
    /// I/O driver of the workers: auto (io_uring where the kernel has it, else
    /// epoll), epoll or uring.
    #[arg(long, default_value = "auto")]
    pub driver: String,
    /// Unix socket where `connmux stat` reads this server's statistics
    /// [default: <server>-<pid>.sock in $XDG_RUNTIME_DIR/connmux or /tmp/connmux-<uid>].
    #[arg(long, value_name = "PATH")]
    pub stats_socket: Option<std::path::PathBuf>,
    /// Do not open a statistics socket.
    #[arg(long, conflicts_with = "stats_socket")]
    pub no_stats_socket: bool,
    /// Which worker reads a new connection: "incoming-cpu" (the one on the
    /// CPU its packets arrive on) or "in-turn" (round robin).
    #[arg(long, default_value = "incoming-cpu")]
    pub attach: String,
    /// Nice steps below its worker at which a heavy lane runs (a connection
    /// whose requests run long is answered there).
    #[arg(long, default_value_t = 3, allow_negative_numbers = true)]
    pub lane_nice: i32,
    /// The scheduler slice a worker asks for while its heavy lane has work,
    /// microseconds (0: never asked; Linux 6.12 and later): longer than the
    /// kernel's default, the lane's heavy handlers cut the worker's passes
    /// less often.
    #[arg(long, default_value_t = connmux::Config::default().lane_worker_slice.as_micros() as u64)]
    pub lane_worker_slice_us: u64,
    /// The scheduler slice a heavy lane asks for, microseconds (0: the
    /// kernel's default; Linux 6.12 and later): short, so that light
    /// requests on its CPU wait less behind its heavy handlers.
    #[arg(long, default_value_t = connmux::Config::default().lane_slice.as_micros() as u64)]
    pub lane_slice_us: u64,
    /// Answer a heavy connection's requests in order, on its worker's CPU
    /// alone. By default a helper on every worker's CPU (in its spare time)
    /// answers the other workers' heavy requests too: one heavy connection
    /// is answered on all CPUs, and its replies may leave out of request
    /// order (as under KCM).
    #[arg(long)]
    pub lane_in_order: bool,
    #[command(flatten)]
    pub tls: crate::cmd::tls::ServerTls,
    #[command(flatten)]
    pub stop: crate::cmd::stop::StopArgs,
}

/// A size in bytes: a number with an optional K, M or G (powers of 1024).
pub fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let (num, mul) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let mul: usize = match c.to_ascii_uppercase() {
                'K' => 1 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                _ => return Err(format!("{s:?}: want bytes or a number with K, M or G")),
            };
            (&t[..i], mul)
        }
        _ => (t, 1),
    };
    num.parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(mul))
        .filter(|&n| n > 0)
        .ok_or_else(|| format!("{s:?}: want bytes or a number with K, M or G"))
}

/// `--attach`: whether connections go to the worker on their incoming CPU.
pub fn parse_attach(s: &str) -> anyhow::Result<bool> {
    match s {
        "incoming-cpu" => Ok(true),
        "in-turn" => Ok(false),
        other => anyhow::bail!("unknown --attach {other:?} (incoming-cpu, in-turn)"),
    }
}

/// UDP beside TCP (the echo, RPC and NFS servers).
#[derive(clap::Args, Debug, Clone)]
pub struct UdpArgs {
    /// Do not answer on UDP. By default the server also answers datagrams
    /// on the same port number over UDP (one datagram is one whole message:
    /// an echo, an RPC call without record mark), on one SO_REUSEPORT socket
    /// and thread per worker, pinned like the workers. Off with --tls (UDP
    /// would be plaintext) and --engine thread.
    #[arg(long)]
    pub no_udp: bool,
    /// Datagrams one recvmmsg takes at most (each worker keeps this many
    /// buffers of --udp-max bytes).
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub udp_batch: u32,
    /// Largest datagram taken and largest reply sent over UDP, bytes
    /// (longer requests are dropped, longer replies refused; both counted).
    #[arg(long, default_value_t = connmux::udp::MAX_UDP_PAYLOAD, value_parser = parse_udp_max)]
    pub udp_max: usize,
    /// Send each UDP reply on its own, never a batch's replies to one peer
    /// as one segmented buffer (UDP GSO; for comparisons).
    #[arg(long)]
    pub no_udp_gso: bool,
}

fn parse_udp_max(s: &str) -> Result<usize, String> {
    let n = parse_size(s)?;
    if n > connmux::udp::MAX_UDP_PAYLOAD {
        return Err(format!("{s:?}: at most {}", connmux::udp::MAX_UDP_PAYLOAD));
    }
    Ok(n)
}

impl UdpArgs {
    /// The UDP service beside `tcp` (its port) with `common`'s workers, or
    /// `None` when turned off (or with TLS).
    pub fn start(
        &self,
        common: &Common,
        tcp: SocketAddr,
        handler: Arc<dyn Handler>,
    ) -> anyhow::Result<Option<connmux::udp::UdpService>> {
        if self.no_udp || common.tls.wanted() {
            return Ok(None);
        }
        let mut cfg = connmux::udp::UdpConfig::new(tcp);
        cfg.batch = self.udp_batch as usize;
        cfg.max_datagram = self.udp_max;
        cfg.gso = !self.no_udp_gso;
        let u = connmux::udp::UdpService::start(&common.mux_config()?, cfg, handler)
            .with_context(|| format!("binding UDP {tcp} (--no-udp turns UDP off)"))?;
        Ok(Some(u))
    }
}

/// The UDP counters, by name.
fn udp_counters(u: &connmux::udp::UdpService) -> [(&'static str, u64); 8] {
    let s = u.stats();
    [
        ("datagrams_in", s.datagrams_in),
        ("datagrams_out", s.datagrams_out),
        ("malformed", s.malformed),
        ("truncated", s.truncated),
        ("refused_too_large", s.refused_too_large),
        ("send_errors", s.send_errors),
        ("batches", s.batches),
        ("roams", s.roams),
    ]
}

/// The UDP counters as `name=value` lines (`connmux stat`).
pub fn udp_lines(u: &connmux::udp::UdpService) -> String {
    udp_counters(u).iter().map(|(k, v)| format!("udp_{k}={v}\n")).collect()
}

impl Common {
    /// `--workers`, or one per CPU: the `--cpus` list, else the CPUs in this
    /// process's affinity mask (a server should use the machine it is given).
    pub fn worker_count(&self) -> usize {
        if let Some(n) = self.workers {
            return n.max(1);
        }
        if !self.cpus.is_empty() {
            return self.cpus.len();
        }
        connmux_sys::affinity::available_cpus()
            .map(|c| c.len())
            .ok()
            .filter(|&n| n > 0)
            .or_else(|| std::thread::available_parallelism().ok().map(|n| n.get()))
            .unwrap_or(1)
    }

    /// Serve `snapshot` on the statistics socket unless disabled.
    pub fn stats_endpoint(
        &self,
        what: &str,
        snapshot: Arc<dyn Fn() -> String + Send + Sync>,
    ) -> anyhow::Result<Option<StatsEndpoint>> {
        if self.no_stats_socket {
            return Ok(None);
        }
        let path = match &self.stats_socket {
            Some(p) => p.clone(),
            None => stat::default_dir().join(format!("{what}-{}.sock", std::process::id())),
        };
        StatsEndpoint::start(path, snapshot).map(Some)
    }

    pub fn mux_config(&self) -> anyhow::Result<Config> {
        let mut c = Config::default();
        c.workers = self.worker_count();
        c.placement = if self.no_pin {
            Placement::Unpinned
        } else if self.cpus.is_empty() {
            Placement::Pinned
        } else {
            Placement::Cpus(self.cpus.clone())
        };
        c.core.steering = match self.steering.as_str() {
            "affinity" => Steering::Affinity,
            "rr" | "round-robin" => Steering::RoundRobin,
            "key" => Steering::Key,
            other => anyhow::bail!("unknown steering {other:?} (affinity, rr, key)"),
        };
        c.driver = parse_driver(&self.driver)?;
        c.incoming_cpu = parse_attach(&self.attach)?;
        c.lane_nice = self.lane_nice;
        c.lane_worker_slice = Duration::from_micros(self.lane_worker_slice_us);
        c.lane_slice = Duration::from_micros(self.lane_slice_us);
        c.lane_in_order = self.lane_in_order;
        c.core.max_msg_size = self.max_msg;
        c.core.assembly_timeout =
            (self.assembly_timeout_ms > 0).then(|| Duration::from_millis(self.assembly_timeout_ms));
        c.core.mem_limit = self.mem_limit;
        c.max_conns = (self.max_conns > 0).then_some(self.max_conns);
        c.core.handshake_timeout =
            (self.handshake_timeout_ms > 0).then(|| Duration::from_millis(self.handshake_timeout_ms));
        c.core.idle_timeout = (self.idle_timeout_ms > 0).then(|| Duration::from_millis(self.idle_timeout_ms));
        Ok(c)
    }
}

#[derive(clap::Args, Debug)]
pub struct EchoArgs {
    /// Address to listen on.
    #[arg(short, long, default_value = "127.0.0.1:60007")]
    pub listen: SocketAddr,
    /// "message": echo whole messages framed by --parser; "bytes": echo every
    /// byte as it arrives (ksf's kecho).
    #[arg(long, default_value = "message")]
    pub mode: String,
    /// Parser for message mode (a built-in parser spec, e.g. l4, oncrpc, 9p).
    /// Over UDP each datagram is echoed whole, whatever it holds.
    #[arg(long, default_value = "l4")]
    pub parser: String,
    #[command(flatten)]
    pub udp: UdpArgs,
    #[command(flatten)]
    pub common: Common,
}

#[derive(clap::Args, Debug)]
pub struct RpcArgs {
    /// Address to listen on.
    #[arg(short, long, default_value = "127.0.0.1:62049")]
    pub listen: SocketAddr,
    /// Extra programs to answer NULL for: PROG:LOW-HIGH (e.g. 100005:1-3).
    /// NFS (100003, versions 3-4) is always registered.
    #[arg(long = "register")]
    pub register: Vec<String>,
    /// Register the served programs with rpcbind (portmapper v2) for TCP
    /// (and UDP unless --no-udp), and withdraw them at exit; ADDR defaults
    /// to 127.0.0.1:111.
    #[arg(long, value_name = "ADDR", num_args = 0..=1, default_missing_value = "127.0.0.1:111")]
    pub rpcbind: Option<SocketAddr>,
    #[command(flatten)]
    pub udp: UdpArgs,
    #[command(flatten)]
    pub common: Common,
}

/// A parser that makes every chunk of bytes a message: byte echo.
struct RawChunks;
impl connmux::Parser for RawChunks {
    fn parse(&mut self, buf: &[u8]) -> connmux::Parse {
        if buf.is_empty() {
            connmux::Parse::NeedMore(1)
        } else {
            connmux::Parse::Length(buf.len())
        }
    }
    fn name(&self) -> &str {
        "raw"
    }
}

struct Echo;
impl Handler for Echo {
    fn handle(&self, request: Bytes, _from: PsockId, _scratch: &mut BytesMut) -> Verdict {
        Verdict::Reply(request)
    }
    fn handle_in_place(&self, request: &[u8], _from: PsockId, _scratch: &mut BytesMut, out: &mut BytesMut) -> Verdict {
        // Small replies join the run of replies to the connection; a large
        // one is its own buffer (one copy either way).
        if request.len() <= 4096 {
            out.extend_from_slice(request);
            Verdict::Appended
        } else {
            Verdict::Reply(Bytes::copy_from_slice(request))
        }
    }
}

/// The ONC RPC NULL service as a handler: one record in, one record out.
pub struct RpcHandler {
    pub registry: connmux_oncrpc::Registry,
    /// Connections closed because a record was not a well-formed call.
    pub bad_calls: std::sync::atomic::AtomicU64,
}

impl RpcHandler {
    pub fn new(registry: connmux_oncrpc::Registry) -> RpcHandler {
        RpcHandler { registry, bad_calls: Default::default() }
    }
}

impl RpcHandler {
    /// Answer one record, appending the reply record to `out`.
    fn answer(&self, request: &[u8], out: &mut BytesMut) -> bool {
        // The common NULL call: its 28-byte reply straight into the run.
        if let Some(reply) = self.registry.null_fast(request) {
            out.extend_from_slice(&reply);
            return true;
        }
        self.answer_general(request, out)
    }

    /// A call datagram (RPC over UDP: no record mark), its reply appended
    /// to `out` unmarked; `false`: not a call, or a marked one (dropped).
    fn answer_datagram(&self, dgram: &[u8], out: &mut BytesMut) -> bool {
        if let Some(reply) = self.registry.null_fast_datagram(dgram) {
            out.extend_from_slice(&reply);
            return true;
        }
        self.reply_with(out, |registry, buf| registry.handle_datagram(dgram, buf))
    }

    /// [`RpcHandler::answer`] for a record that is not the common NULL call.
    fn answer_general(&self, request: &[u8], out: &mut BytesMut) -> bool {
        // Only records the fast path declined come here.
        self.reply_with(out, |registry, buf| registry.handle_marked_decoded(request, buf))
    }

    /// The registry's answer, through a buffer kept per worker thread (the
    /// registry writes into a `Vec`; the hot path does not allocate),
    /// appended to `out`; `false`, and counted, where the call is refused.
    fn reply_with(
        &self,
        out: &mut BytesMut,
        handle: impl FnOnce(&connmux_oncrpc::Registry, &mut Vec<u8>) -> connmux_oncrpc::Outcome,
    ) -> bool {
        thread_local!(static OUT: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) });
        OUT.with(|buf| {
            let mut buf = buf.borrow_mut();
            buf.clear();
            match handle(&self.registry, &mut buf) {
                connmux_oncrpc::Outcome::Replied { .. } => {
                    out.extend_from_slice(&buf);
                    true
                }
                connmux_oncrpc::Outcome::CloseConnection(_) => {
                    self.bad_calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    false
                }
            }
        })
    }
}

impl Handler for RpcHandler {
    fn handle(&self, request: Bytes, from: PsockId, scratch: &mut BytesMut) -> Verdict {
        let answered = match connmux::udp::is_udp(from) {
            true => self.answer_datagram(&request, scratch),
            false => self.answer(&request, scratch),
        };
        if answered {
            Verdict::Reply(scratch.split().freeze())
        } else {
            Verdict::Close
        }
    }
    /// A record (TCP: marked), or a datagram (UDP: unmarked, `from` says so;
    /// a `Close` there drops the datagram).
    fn handle_in_place(&self, request: &[u8], from: PsockId, _scratch: &mut BytesMut, out: &mut BytesMut) -> Verdict {
        let answered = match connmux::udp::is_udp(from) {
            true => self.answer_datagram(request, out),
            false => self.answer(request, out),
        };
        if answered {
            Verdict::Appended
        } else {
            Verdict::Close
        }
    }
    fn handle_run_in_place(
        &self,
        requests: Messages<'_>,
        _from: PsockId,
        _scratch: &mut BytesMut,
        out: &mut BytesMut,
    ) -> RunServed {
        // NULL calls answered from the template in a tight loop, run by run;
        // any other record takes the general answer (which closes on a
        // record that is no call), then the loop goes on after it. Every
        // record handled is one reply appended, until a close.
        let mut rest = requests;
        let mut handled = 0;
        // Bounded: each turn handles at least one record or ends.
        while let Some(run) = rest.first_run() {
            let fast = match (run.is_whole(), run.count) {
                // One call (one in flight): no `chunks_exact` to set up.
                (true, 1) => self.registry.null_fast_run([run.wire], out),
                (true, _) => self.registry.null_fast_run(run.wire.chunks_exact(run.stride), out),
                (false, _) => 0,
            };
            rest = rest.after(fast);
            handled += fast;
            if fast == run.count {
                continue;
            }
            let Some(request) = rest.first() else { break };
            rest = rest.after(1);
            handled += 1;
            if !self.answer_general(request, out) {
                return RunServed { handled, appended: handled as u32 - 1, stop: Some(Verdict::Close) };
            }
        }
        RunServed { handled, appended: handled as u32, stop: None }
    }
}

pub fn registry(extra: &[String]) -> anyhow::Result<connmux_oncrpc::Registry> {
    let mut reg = connmux_oncrpc::Registry::default();
    for r in extra {
        let (prog, range) = r.split_once(':').with_context(|| format!("--register {r}: want PROG:LOW-HIGH"))?;
        let (lo, hi) = range.split_once('-').unwrap_or((range, range));
        reg.register(prog.parse()?, lo.parse()?, hi.parse()?).map_err(|e| anyhow::anyhow!("--register {r}: {e:?}"))?;
    }
    Ok(reg)
}

fn print_udp_stats(u: &connmux::udp::UdpService) {
    let fields: Vec<String> = udp_counters(u).iter().map(|(k, v)| format!("{k}={v}")).collect();
    println!("udp: {}", fields.join(" "));
}

fn print_stats(svc: &Service, started: Instant) {
    let s = svc.mux().stats();
    let st = svc.stats();
    use std::sync::atomic::Ordering::Relaxed;
    println!(
        "after {:.1}s: accepted={} closed={} attach_errors={} open={} refused={} evicted={} rx_msgs={} tx_msgs={} rx_bytes={} tx_bytes={} too_big={} bad_len={} parser_errors={} timeouts={} mem_aborts={} idle_timeouts={} handshake_timeouts={}",
        started.elapsed().as_secs_f64(),
        st.accepted.load(Relaxed),
        st.closed.load(Relaxed),
        st.attach_errors.load(Relaxed),
        s.psocks,
        st.refused.load(Relaxed),
        st.evicted.load(Relaxed),
        s.rx_msgs,
        s.tx_msgs,
        s.rx_bytes,
        s.tx_bytes,
        s.psock.rx_msg_too_big,
        s.psock.rx_bad_hdr_len,
        s.psock.rx_interrupted,
        s.psock.rx_msg_timeouts,
        s.mem_aborts,
        s.idle_timeouts,
        s.handshake_timeouts,
    );
    let t = svc.mux().tls_stats();
    if t.attached > 0 {
        println!(
            "tls: attached={} handshakes={} handshake_failures={} errors={}",
            t.attached, t.handshakes, t.handshake_failures, t.errors
        );
    }
}

/// What `connmux stat` prints for a connmux server.
fn service_snapshot(what: &str, svc: &Service, started: Instant) -> String {
    use std::sync::atomic::Ordering::Relaxed;
    let st = svc.stats();
    let t = svc.mux().tls_stats();
    let tls = if t.attached > 0 {
        format!(
            "tls_attached={}\ntls_handshakes={}\ntls_handshake_failures={}\ntls_errors={}\n",
            t.attached, t.handshakes, t.handshake_failures, t.errors
        )
    } else {
        String::new()
    };
    format!(
        "{what} pid={} listen={} uptime_s={:.1}\naccepted={}\nattach_errors={}\nclosed={}\nrefused={}\nevicted={}\n{tls}\n{}\n{}",
        std::process::id(),
        svc.local_addr(),
        started.elapsed().as_secs_f64(),
        st.accepted.load(Relaxed),
        st.attach_errors.load(Relaxed),
        st.closed.load(Relaxed),
        st.refused.load(Relaxed),
        st.evicted.load(Relaxed),
        svc.mux().proc_kcm(),
        stat::format_mux_stats(svc.mux()),
    )
}

/// `--driver` values.
pub fn parse_driver(s: &str) -> anyhow::Result<connmux::Driver> {
    Ok(match s {
        "auto" => connmux::Driver::Auto,
        "epoll" => connmux::Driver::Epoll,
        "uring" | "io_uring" => connmux::Driver::Uring,
        other => anyhow::bail!("unknown driver {other:?} (auto, epoll, uring)"),
    })
}

/// Every (program, version) a registry serves.
pub fn rpcbind_entries(reg: &connmux_oncrpc::Registry) -> Vec<(u32, u32)> {
    reg.programs().iter().flat_map(|v| (v.low..=v.high).map(move |vers| (v.prog.0, vers))).collect()
}

/// Register with rpcbind when asked to.
pub fn register_rpcbind(
    rpcbind: Option<(SocketAddr, Vec<(u32, u32)>)>,
    local: SocketAddr,
    udp: bool,
) -> anyhow::Result<Option<Registration>> {
    match rpcbind {
        None => Ok(None),
        Some((addr, entries)) => {
            let r = Registration::register(addr, local.port(), entries, udp)
                .with_context(|| format!("registering with rpcbind at {addr}"))?;
            println!(
                "registered with rpcbind at {addr} for TCP{} port {}",
                if udp { " and UDP" } else { "" },
                r.port()
            );
            Ok(Some(r))
        }
    }
}

/// Extra `name=value` lines a server adds to its statistics.
type Extra = Arc<dyn Fn() -> String + Send + Sync>;

#[allow(clippy::too_many_arguments)]
fn run_service(
    common: &Common,
    udp: &UdpArgs,
    listen: SocketAddr,
    parser: Arc<dyn Fn() -> Box<dyn connmux::Parser> + Send + Sync>,
    handler: Arc<dyn Handler>,
    extra: Option<Extra>,
    rpcbind: Option<(SocketAddr, Vec<(u32, u32)>)>,
    what: &str,
) -> anyhow::Result<i32> {
    keep_message_buffers(common.max_msg);
    let mux = Mux::new(common.mux_config()?)?;
    let cfg = ServiceConfig { listen, sock_type: SockType::Dgram, parser };
    let tls = common.tls.config(listen, what)?;
    let svc = Arc::new(
        match &tls {
            None => Service::start(mux, cfg, handler.clone()),
            // TLS psocks: the handshake and the records run in the workers.
            Some(t) => Service::start_tls(mux, cfg, handler.clone(), t.config.clone()),
        }
        .with_context(|| format!("starting {what} on {listen}"))?,
    );
    svc.set_max_conns((common.max_conns > 0).then_some(common.max_conns));
    let udp_svc = udp.start(common, svc.local_addr(), handler.clone())?.map(Arc::new);
    let trimmer = Trimmer::start(svc.clone());
    let started = Instant::now();
    let snap = {
        let (svc, what, u) = (svc.clone(), what.to_string(), udp_svc.clone());
        Arc::new(move || {
            let mut text = service_snapshot(&what, &svc, started);
            if let Some(u) = &u {
                text.push_str(&udp_lines(u));
            }
            if let Some(x) = &extra {
                text.push_str(&x());
            }
            text
        }) as Arc<dyn Fn() -> String + Send + Sync>
    };
    let endpoint = common.stats_endpoint(what, snap)?;
    let registration = register_rpcbind(rpcbind, svc.local_addr(), udp_svc.is_some())?;
    println!(
        "{what} listening on {} ({} workers, {:?} driver{}){}",
        svc.local_addr(),
        common.worker_count(),
        svc.mux().driver(),
        if udp_svc.is_some() { "; UDP on the same port" } else { "" },
        endpoint.as_ref().map(|e| format!("; statistics: connmux stat {}", e.path().display())).unwrap_or_default()
    );
    if let Some(t) = &tls {
        println!("{}", t.note);
    }
    // Line by line even into a pipe: a script waits for these two lines.
    let _ = std::io::Write::flush(&mut std::io::stdout());
    let report = || {
        print_stats(&svc, started);
        if let Some(u) = &udp_svc {
            print_udp_stats(u);
        }
    };
    let ending = wait_and_report(common, report);
    let stopped = stop::drain(
        what,
        ending,
        &common.stop,
        || svc.stop_accepting(),
        || {
            let s = svc.mux().stats();
            stop::Progress { open: s.psocks as u64, moved: s.rx_bytes + s.tx_bytes }
        },
    );
    report();
    drop(registration);
    drop(endpoint);
    // The UDP threads end before the service's workers.
    if let Some(u) = udp_svc.and_then(|u| Arc::try_unwrap(u).ok()) {
        u.shutdown();
    }
    drop(tls);
    drop(trimmer);
    if stopped.forced() {
        std::process::exit(stopped.finish());
    }
    if let Ok(svc) = Arc::try_unwrap(svc) {
        svc.shutdown();
    }
    Ok(stopped.finish())
}

/// Where the allocator puts message buffers (see `connmux_sys::malloc`):
/// in its heap arenas, so that the next message reuses the pages the last
/// one freed, rather than each large message in a mapping of its own, whose
/// page faults, zeroing and unmapping cost more than its copies where faults
/// are dear (1 MiB messages: 485 against 1,311 a second on one connection
/// in a virtual machine; `docs/performance.md`, "Message size"). Up to
/// `max_msg` (and at most glibc's own ceiling, 32 MiB) from the arenas;
/// an arena's free top given back past twice that (glibc's own rule when
/// it moves the thresholds itself). What peers held inside the arenas goes
/// back at the [`Trimmer`]'s trims.
pub(crate) fn keep_message_buffers(max_msg: usize) {
    let block = (max_msg + (64 << 10)).clamp(1 << 20, 32 << 20);
    connmux_sys::malloc::set_mmap_threshold(block);
    connmux_sys::malloc::set_trim_threshold(2 * block);
}

/// What the large blocks in use must fall by, from the most since the last
/// trim, for the [`Trimmer`] to trim without a connection closing: a burst
/// of large messages from peers that stay.
const TRIM_AFTER_FREED: usize = 16 << 20;

/// Less than [`TRIM_AFTER_FREED`] is enough when it is half of that most
/// (all that was held at the end of a trim's round, freed later, must not
/// stay for want of 16 MiB), but no less than this: a trim holds each
/// arena's lock while it walks its free blocks, and a busy server's large
/// blocks come and go.
const TRIM_AFTER_HALF: usize = 4 << 20;

/// Whether large blocks in use falling from `high` (their most since the
/// last trim) to `held` is reason enough to trim: [`TRIM_AFTER_FREED`], or
/// half of `high` when that is at least [`TRIM_AFTER_HALF`].
fn freed_enough(high: usize, held: usize) -> bool {
    let freed = high.saturating_sub(held);
    freed >= TRIM_AFTER_FREED || (freed >= TRIM_AFTER_HALF && freed * 2 >= high)
}

/// Gives free allocator pages back to the system (glibc keeps freed arena
/// pages otherwise): when connections closed since the last look (every
/// 250 ms), or when the large blocks the program holds
/// (`connmux_sys::malloc::large_in_use`, counted by the binary's global
/// allocator) fell by [`TRIM_AFTER_FREED`], or by half of their most since
/// the last trim (at least [`TRIM_AFTER_HALF`]; the allocator's most, so
/// that blocks taken and freed all between two looks count); each time again 750 ms
/// later, and every 750 ms after while that count still falls. The
/// allocator's count, not the core's: a message the core let go of may
/// still be a reply being written to a slow reader, freed seconds later.
struct Trimmer {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Trimmer {
    fn start(svc: Arc<Service>) -> Trimmer {
        use std::sync::atomic::Ordering::{Acquire, Relaxed};
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::Builder::new()
            .name("connmux-trim".into())
            .spawn(move || {
                // The allocator's most counts from each trim on.
                let trim = || {
                    connmux_sys::malloc::take_large_high();
                    connmux_sys::malloc::trim();
                };
                let (mut seen, mut high) = (0, 0);
                while !s.load(Acquire) {
                    std::thread::sleep(Duration::from_millis(250));
                    let st = svc.stats();
                    let closed = st.closed.load(Relaxed) + st.refused.load(Relaxed);
                    let held = connmux_sys::malloc::large_in_use();
                    // The allocator's most, not only what this look sees:
                    // a burst of frees all within one sleep is a fall too.
                    high = high.max(connmux_sys::malloc::take_large_high()).max(held);
                    if closed != seen || freed_enough(high, held) {
                        seen = closed;
                        trim();
                        // Again a moment later, and as long as the count
                        // still falls: the reaper may still be unattaching
                        // the rest of a burst, replies to slow readers are
                        // freed as they are read (bounded: 30 s).
                        let mut last = held;
                        for _ in 0..40 {
                            std::thread::sleep(Duration::from_millis(750));
                            trim();
                            let now = connmux_sys::malloc::large_in_use();
                            if now >= last || s.load(Acquire) {
                                break;
                            }
                            last = now;
                        }
                        high = 0;
                    }
                }
            })
            .ok();
        Trimmer { stop, thread }
    }
}

impl Drop for Trimmer {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Sleep until --duration elapses or a stop signal comes, printing stats every
/// --stats-every.
pub fn wait_and_report(common: &Common, mut report: impl FnMut()) -> stop::Ending {
    let start = Instant::now();
    let end = common.duration.map(|d| start + Duration::from_secs_f64(d));
    let every = (common.stats_every > 0.0).then(|| Duration::from_secs_f64(common.stats_every));
    let mut next = every.map(|e| start + e);
    loop {
        let now = Instant::now();
        if end.is_some_and(|e| now >= e) {
            return stop::Ending::Duration;
        }
        let mut wake = now + Duration::from_secs(3600);
        if let Some(e) = end {
            wake = wake.min(e);
        }
        if let Some(n) = next {
            if now >= n {
                report();
                next = Some(n + every.unwrap());
                continue;
            }
            wake = wake.min(n);
        }
        if let Some(sig) = stop::pause(wake - now) {
            return stop::Ending::Signal(sig);
        }
    }
}

pub fn run_echo(a: EchoArgs) -> anyhow::Result<i32> {
    if a.common.engine == "thread" && a.common.tls.wanted() {
        anyhow::bail!("--tls runs in the connmux runtime: not with --engine thread");
    }
    if a.common.engine == "thread" {
        return baseline::run_echo(&a);
    }
    let parser: Arc<dyn Fn() -> Box<dyn connmux::Parser> + Send + Sync> = match a.mode.as_str() {
        "bytes" => Arc::new(|| Box::new(RawChunks) as Box<dyn connmux::Parser>),
        "message" => {
            let spec = a.parser.clone();
            connmux::parsers::from_spec(&spec).map_err(|e| anyhow::anyhow!("--parser {spec}: {e}"))?;
            Arc::new(move || connmux::parsers::from_spec(&spec).expect("checked above"))
        }
        other => anyhow::bail!("--mode {other}: want message or bytes"),
    };
    run_service(&a.common, &a.udp, a.listen, parser, Arc::new(Echo), None, None, "echo-server")
}

pub fn run_rpc(a: RpcArgs) -> anyhow::Result<i32> {
    let reg = registry(&a.register)?;
    if a.common.engine == "thread" && a.common.tls.wanted() {
        anyhow::bail!("--tls runs in the connmux runtime: not with --engine thread");
    }
    if a.common.engine == "thread" {
        return baseline::run_rpc(&a, reg);
    }
    let handler = Arc::new(RpcHandler::new(reg));
    let h = handler.clone();
    let extra: Extra =
        Arc::new(move || format!("rpc_bad_calls={}\n", h.bad_calls.load(std::sync::atomic::Ordering::Relaxed)));
    let rpcbind = a.rpcbind.map(|addr| (addr, rpcbind_entries(&handler.registry)));
    run_service(&a.common, &a.udp, a.listen, rpc_parser(), handler, Some(extra), rpcbind, "rpc-server")
}

/// Records are framed by the core's ONC RPC parser with fragment marks kept;
/// the handler reads through them (multi-fragment calls arrive whole).
fn rpc_parser() -> Arc<dyn Fn() -> Box<dyn connmux::Parser> + Send + Sync> {
    Arc::new(|| connmux::parsers::from_spec("oncrpc").expect("built-in"))
}

/// Start the ONC RPC NULL service on `listen` in this process.
pub fn start_rpc_service(config: Config, listen: SocketAddr, reg: connmux_oncrpc::Registry) -> anyhow::Result<Service> {
    let mux = Mux::new(config)?;
    Service::start(
        mux,
        ServiceConfig { listen, sock_type: SockType::Dgram, parser: rpc_parser() },
        Arc::new(RpcHandler::new(reg)),
    )
    .with_context(|| format!("starting rpc-server on {listen}"))
}

#[cfg(test)]
mod tests {
    use super::freed_enough;

    const MIB: usize = 1 << 20;

    /// What was still held when a trim's rounds stopped (here 15 MiB), freed
    /// later, is trimmed although it is less than 16 MiB; small swings of a
    /// busy server's large blocks are not.
    #[test]
    fn a_trim_follows_frees_of_half_what_was_held_or_16_mib() {
        assert!(freed_enough(15 * MIB, 0), "all of 15 MiB freed after the rounds stopped");
        assert!(freed_enough(8 * MIB, 4 * MIB), "half of 8 MiB");
        assert!(freed_enough(100 * MIB, 84 * MIB), "16 MiB of 100");
        assert!(!freed_enough(100 * MIB, 85 * MIB), "15 MiB of 100");
        assert!(!freed_enough(15 * MIB, 8 * MIB), "less than half");
        assert!(!freed_enough(3 * MIB, 0), "under 4 MiB, whatever the share");
        assert!(!freed_enough(2 * MIB, 3 * MIB), "grown, not freed");
    }

    /// A server given no flags runs with the library's defaults: the values
    /// have one source (`connmux::DEFAULT_*`).
    #[test]
    fn the_servers_defaults_are_the_librarys() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Args {
            #[command(flatten)]
            common: super::Common,
        }
        let a = Args::parse_from(["server"]);
        let c = a.common.mux_config().unwrap();
        let d = connmux::Config::default();
        assert_eq!(c.core.assembly_timeout, d.core.assembly_timeout);
        assert_eq!(c.core.assembly_timeout, Some(connmux::DEFAULT_ASSEMBLY_TIMEOUT));
        assert_eq!(c.core.mem_limit, connmux::DEFAULT_MEM_LIMIT);
        assert_eq!(c.max_conns, d.max_conns);
        assert_eq!(a.common.max_conns, connmux::DEFAULT_MAX_CONNS);
        assert_eq!(c.core.handshake_timeout, d.core.handshake_timeout);
        assert_eq!(c.core.idle_timeout, d.core.idle_timeout);
        assert_eq!(c.core.max_msg_size, d.core.max_msg_size);
    }
}
