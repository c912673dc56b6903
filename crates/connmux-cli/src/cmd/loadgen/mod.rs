//! Shared machinery of the load generators `connmux rpctest`, `connmux
//! echotest` (modelled on ksf's tools of the same names) and `connmux 9ptest`:
//! their common flags ([`CommonArgs`]), rounds, output and `--json` config.
//!
//! # How a run goes
//!
//! A run is `-i` rounds. Each round starts `-j` threads; each thread opens its
//! own TCP connection (`TCP_NODELAY`, optionally pinned with `--cpu`), all
//! threads meet at a barrier, and the clock starts (connection setup is not
//! timed). Each connection then keeps up to `-a` requests in flight: it writes
//! every free slot's request in one `send`, reads whatever replies have
//! arrived with one `read`, checks each one, and refills (see [`engine`]).
//! A round ends when every connection has had `-c` requests answered, or, with
//! `-d SECONDS`, when that time is up and the requests in flight have been
//! answered (with both, whichever comes first). Every round uses new threads
//! and new connections, as ksf does.
//!
//! Every reply is checked. The first bad reply, I/O error, closed connection or
//! stall longer than `--io-timeout` fails that connection; the other
//! connections of the round are then shut down, no further round runs, the
//! error is printed on stderr and the exit status is 1. A round that does not
//! end within its `-d` plus `--timeout` is stopped the same way, and so is one
//! that got no reply at all. So the tool always ends, and it ends with 0 only
//! when every request got the right reply.
//!
//! A failed round prints no figures: its row is `N FAILED <error>`, no
//! `median` row follows, and the summary line carries no figures, only
//! `errors=N result=FAILED` (rounds finished before it keep their rows).
//! With `--json`, a failed run has `"ok": false`, its `error`, and `null`
//! for `median` and `all`. When a plain client's first bytes from the server
//! are a TLS record (0x15 alert, 0x16 handshake) and fail the reply check,
//! the error says "the server speaks TLS (try --tls)".
//!
//! # Output
//!
//! A header, one row per round, then a `median` row, then one `summary` line:
//!
//! ```text
//!  round  TD   INF      calls    secs      RPC/s    min_us    p50_us    p99_us  p99.9_us    max_us     Mbps errs
//!      1   1    32     100000   0.302     331046      55.3      92.7     148.5     201.2    1890.3     76.3    0
//!      2   1    32     100000   0.297     336700      54.1      91.9     147.0     199.9     950.1     77.6    0
//! median   1    32     100000   0.300     333873      54.7      92.3     147.8     200.6    1420.2     77.0    0
//! summary tool=rpctest target=127.0.0.1:62049 j=1 a=32 rounds=2 calls=200000 rpc_per_s=333873 rtt_us_p50=92.3 rtt_us_p99=147.8 rtt_us_p999=200.6 rtt_us_min=54.1 rtt_us_max=1890.3 mbps=77.0 cpu_us_per_call=1.20 errors=0 result=ok
//! ```
//!
//! | column | meaning |
//! |---|---|
//! | `round` | round number from 1; `median` for the median row |
//! | `TD` | `-j`: threads = connections |
//! | `INF` | `-a`: requests in flight per connection |
//! | `calls` | requests answered in the round, all connections together |
//! | `secs` | from the common start to the last reply of the slowest connection |
//! | `RPC/s` (`msgs/s` for echotest) | `calls / secs` |
//! | `min_us`, `max_us` | fastest and slowest RTT of the round, µs |
//! | `pNN_us` | RTT percentiles of the round (all connections' RTTs in one HDR histogram, 3 significant digits), µs; `-q` picks them, default 50, 99, 99.9 |
//! | `Mbps` | bytes on the wire both ways (record marks and length headers included) × 8 / `secs` |
//! | `errs` | connections that failed (plus 1 if the round hit its time limit) |
//!
//! The `median` row holds, column by column, the median of the rounds'
//! values (the mean of the two middle ones for an even number of rounds), so
//! its `RPC/s` and `p50_us` are ksf's `MedRPC` and `MedLat` in spirit; `errs`
//! there is the total. The `summary` line repeats the median row's rate and
//! percentiles as `key=value` pairs (`rpc_per_s`/`msg_per_s`, `rtt_us_p50`,
//! `rtt_us_p99`, `rtt_us_p999`), adds the minimum and maximum RTT over all
//! rounds, the client's CPU time (user + system, from `/proc/self/stat`, 10 ms
//! resolution) per answered request, the error count and `result=ok|FAILED`:
//! `grep '^summary '` finds it.
//!
//! `--json` prints one JSON document instead of the table: the configuration,
//! every round (the columns above plus mean RTT, bytes, reads and writes, CPU
//! seconds and per-connection counts), the median row, all rounds pooled in
//! one histogram (`all`), and `ok`. `--plot FILE.svg|FILE.png` draws RTT by
//! percentile. On a terminal, a progress line is kept on stderr while a round
//! runs (never when stderr is not a terminal, or with `--no-progress`).
//!
//! # Differences from ksf
//!
//! - Exit status 1 on any error (ksf prints zeros and exits 0).
//! - Rates use the slowest connection's time, not a median of per-thread
//!   times; the median row is over rounds, not a running median.
//! - Defaults: 5 rounds of 100 000 requests per connection (ksf: 99 rounds of
//!   1 000 000, which take hours on a small machine); `-H` only suppresses the
//!   header (it is not a toggle); `-d` is the round duration (ksf's `-d` is
//!   a gnuplot data directory; here `--plot` draws the chart itself).
//! - Requests of one batch go out in one `send`, not one `send` per request.
//! - `-u` (UDP, echotest and rpctest's NULL calls): one socket per thread,
//!   a request per datagram, replies matched by tag in any order; a request
//!   unanswered for `--udp-retry` is counted lost (`lost=` in the summary,
//!   `lost` in the JSON rows) and its slot sends a new one ([`udp`]).
//! - Not done: `-m` running averages and `-x` columns.

pub mod conn;
pub mod engine;
pub mod plot;
pub mod report;
pub mod target;
pub mod udp;

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;

pub use engine::{Client, Workload};
pub use report::Units;
pub use target::Target;

/// A parsed `-q` list (a newtype so clap takes it as one value).
#[derive(Debug, Clone)]
pub struct Quantiles(pub Vec<f64>);

/// A parsed `--cpu` list.
#[derive(Debug, Clone)]
pub struct CpuList(pub Vec<usize>);

fn quantiles_arg(s: &str) -> Result<Quantiles, String> {
    target::parse_quantiles(s).map(Quantiles)
}

fn cpus_arg(s: &str) -> Result<CpuList, String> {
    target::parse_cpu_list(s).map(CpuList)
}

/// Most threads (connections) per round.
pub const MAX_THREADS: u64 = 1024;
/// Requests per connection per round when neither `-c` nor `-d` is given.
pub const DEFAULT_COUNT: u64 = 100_000;

/// Flags common to both load generators.
#[derive(clap::Args, Debug, Clone)]
pub struct CommonArgs {
    /// Threads; each opens its own TCP connection.
    #[arg(short = 'j', long = "threads", default_value = "1", value_parser = target::parse_count)]
    pub threads: u64,
    /// Requests in flight per connection (0 means 1: one at a time).
    #[arg(short = 'a', long = "inflight", default_value = "1", value_parser = target::parse_count)]
    pub inflight: u64,
    /// Requests per connection per round [default: 100K unless -d is given]. Numbers take
    /// ksf's suffixes: K M G = 1000^n, k m g = 1024^n.
    #[arg(short = 'c', long = "count", value_parser = target::parse_count)]
    pub count: Option<u64>,
    /// Round duration in seconds (instead of, or as well as, -c: whichever ends first).
    #[arg(short = 'd', long = "duration", value_name = "SECONDS", value_parser = target::parse_seconds)]
    pub duration: Option<f64>,
    /// Rounds; one output row each, then a median row.
    #[arg(short = 'i', long = "rounds", default_value = "5", value_parser = target::parse_count)]
    pub rounds: u64,
    /// Latency percentiles to show, comma-separated (at most 16).
    #[arg(short = 'q', long = "quantiles", value_name = "LIST", default_value = "50,99,99.9", value_parser = quantiles_arg)]
    pub quantiles: Quantiles,
    /// Do not print the header line.
    #[arg(short = 'H', long = "no-header")]
    pub no_header: bool,
    /// Print one JSON document (all rounds, median, pooled percentiles) instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Draw RTT by percentile to FILE (.svg or .png).
    #[arg(long, value_name = "FILE")]
    pub plot: Option<PathBuf>,
    /// Pin connection thread i to the i-th CPU of LIST (cyclically), e.g. 0 or 0-1 or 0,2.
    #[arg(long = "cpu", value_name = "LIST", value_parser = cpus_arg)]
    pub cpus: Option<CpuList>,
    /// Fail a connection when connect, a read awaiting replies or a send stalls this long (s).
    #[arg(long = "io-timeout", value_name = "SECONDS", default_value = "5", value_parser = target::parse_seconds)]
    pub io_timeout: f64,
    /// Stop and fail a round that runs this long past its -d (or at all, without -d) (s).
    #[arg(long = "timeout", value_name = "SECONDS", default_value = "300", value_parser = target::parse_seconds)]
    pub timeout: f64,
    /// No progress line on stderr even when it is a terminal.
    #[arg(long = "no-progress")]
    pub no_progress: bool,
    /// Also print per-connection figures on stderr after each round.
    #[arg(short = 'v', long = "verbose", action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// Send over UDP (echotest; rpctest NULL calls): one socket per thread,
    /// one request per datagram, one reply datagram per request.
    #[arg(short = 'u', long = "udp", conflicts_with = "tls")]
    pub udp: bool,
    /// Over UDP: a request unanswered this long (ms) is counted lost and its
    /// slot sends a new one (the summary's `lost=`).
    #[arg(long = "udp-retry", value_name = "MS", default_value = "200", value_parser = clap::value_parser!(u64).range(1..=60_000))]
    pub udp_retry_ms: u64,
    #[command(flatten)]
    pub tls: crate::cmd::tls::ClientTls,
}

impl CommonArgs {
    /// Checks ranges and builds the round plan.
    pub fn plan(&self) -> anyhow::Result<engine::RoundPlan> {
        if !(1..=MAX_THREADS).contains(&self.threads) {
            anyhow::bail!("-j must be 1..{MAX_THREADS}, got {}", self.threads);
        }
        if self.inflight > engine::MAX_INFLIGHT as u64 {
            anyhow::bail!("-a must be 0..{}, got {}", engine::MAX_INFLIGHT, self.inflight);
        }
        if !(1..=1_000_000).contains(&self.rounds) {
            anyhow::bail!("-i must be 1..1000000, got {}", self.rounds);
        }
        if self.count == Some(0) {
            anyhow::bail!("-c must be at least 1");
        }
        if let Some(CpuList(cpus)) = &self.cpus {
            let avail = connmux_sys::affinity::available_cpus()?;
            if let Some(c) = cpus.iter().find(|c| !avail.contains(c)) {
                anyhow::bail!("--cpu: CPU {c} is not available to this process (available: {avail:?})");
            }
        }
        let count = match (self.count, self.duration) {
            (None, None) => Some(DEFAULT_COUNT),
            (c, _) => c,
        };
        let duration = self.duration.map(Duration::from_secs_f64);
        Ok(engine::RoundPlan {
            threads: self.threads as usize,
            inflight: self.inflight.max(1) as usize,
            count,
            duration,
            limit: duration.unwrap_or(Duration::ZERO) + Duration::from_secs_f64(self.timeout),
            io_timeout: Duration::from_secs_f64(self.io_timeout),
            cpus: self.cpus.as_ref().map(|c| c.0.clone()),
            tls: None,
        })
    }
}

/// The `after_help` of a generator with the usual output; `rate_col` names
/// its rate column.
pub fn after_help(rate_col: &str) -> String {
    format!(
        "Output: a header, one row per round (calls answered, secs to the last reply, {rate_col} = calls/secs, \
RTT min/percentiles/max in microseconds from an HDR histogram, Mbps both ways, errs), a median row (median of the rounds), \
and a line 'summary key=value ...' (grep '^summary '). Exit status 0 only if every reply was right; 1 on any error."
    )
}

/// The `config` of the `--json` document: the common flags, with a
/// generator's own settings (`own`, its fields inlined) between the round
/// plan and the I/O settings.
#[derive(Serialize)]
struct RunConfig<'a, C: Serialize> {
    threads: u64,
    inflight: u64,
    count: Option<u64>,
    duration_s: Option<f64>,
    rounds: u64,
    #[serde(flatten)]
    own: &'a C,
    io_timeout_s: f64,
    cpus: Option<&'a [usize]>,
}

impl CommonArgs {
    fn run_config<'a, C: Serialize>(&'a self, own: &'a C) -> RunConfig<'a, C> {
        RunConfig {
            threads: self.threads,
            inflight: self.inflight,
            count: self.count,
            duration_s: self.duration,
            rounds: self.rounds,
            own,
            io_timeout_s: self.io_timeout,
            cpus: self.cpus.as_ref().map(|l| l.0.as_slice()),
        }
    }
}

/// Client CPU seconds (user + system) of this process so far, from
/// `/proc/self/stat` (ticks of 1/100 s, the kernel's fixed USER_HZ).
fn process_cpu_s() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name may hold spaces and parentheses: fields start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    Some((utime + stime) as f64 / 100.0)
}

/// The progress line on a terminal's stderr.
struct TtyProgress {
    on: bool,
    tool: &'static str,
    round: u64,
    rounds: u64,
    shown: bool,
}

impl engine::Progress for TtyProgress {
    fn tick(&mut self, calls: u64, elapsed: Duration) {
        let secs = elapsed.as_secs_f64();
        let rate = if secs > 0.0 { calls as f64 / secs } else { 0.0 };
        let mut e = std::io::stderr().lock();
        let _ = write!(
            e,
            "\r\x1b[K{}: round {}/{}  {} answered  {:.0}/s  {:.1} s",
            self.tool, self.round, self.rounds, calls, rate, secs
        );
        let _ = e.flush();
        self.shown = true;
    }
    fn interval(&self) -> Option<Duration> {
        self.on.then_some(Duration::from_millis(200))
    }
}

impl TtyProgress {
    fn clear(&mut self) {
        if self.shown {
            let mut e = std::io::stderr().lock();
            let _ = write!(e, "\r\x1b[K");
            let _ = e.flush();
            self.shown = false;
        }
    }
}

/// Runs all rounds of `w` against `target`, prints the rows (or JSON), draws
/// the plot, and returns the exit status: 0 when every request of every round
/// was answered correctly, 1 otherwise. `own_config` holds the generator's
/// own settings for the `--json` document's `config`.
pub fn run_load<W: Workload, C: Serialize>(
    args: &CommonArgs,
    units: Units,
    target: &Target,
    w: &W,
    own_config: C,
) -> anyhow::Result<i32> {
    anyhow::ensure!(!args.udp, "{}: -u is not done for this load", units.tool);
    run_rounds(args, units, target, own_config, &mut |plan, progress| {
        engine::run_round(w, &target.addrs, plan, progress)
    })
}

/// [`run_load`] over UDP (`-u`): the same rounds, rows and summary (with
/// the requests given up as lost).
pub fn run_load_udp<W: udp::DgramWorkload, C: Serialize>(
    args: &CommonArgs,
    units: Units,
    target: &Target,
    w: &W,
    own_config: C,
) -> anyhow::Result<i32> {
    let retry = Duration::from_millis(args.udp_retry_ms);
    run_rounds(args, units, target, own_config, &mut |plan, progress| {
        udp::run_round(w, &target.addrs, plan, retry, progress)
    })
}

/// One round of a run: the plan and the progress display in, the round's
/// outcome out.
type RoundFn<'a> = dyn FnMut(&engine::RoundPlan, &mut dyn engine::Progress) -> engine::RoundOutcome + 'a;

fn run_rounds<C: Serialize>(
    args: &CommonArgs,
    units: Units,
    target: &Target,
    own_config: C,
    round: &mut RoundFn<'_>,
) -> anyhow::Result<i32> {
    let mut plan = args.plan()?;
    let host = target::split_host_port(&target.name, 0).ok().map(|(h, _)| h);
    plan.tls = args.tls.setup(host.as_deref(), target.addrs.first().map(|a| a.ip()))?;
    if let Some(p) = &args.plot {
        plot::check_path(p)?;
    }
    let quantiles = &args.quantiles.0;
    let mut progress = TtyProgress {
        on: !args.no_progress && std::io::stderr().is_terminal(),
        tool: units.tool,
        round: 0,
        rounds: args.rounds,
        shown: false,
    };
    let mut out = std::io::stdout().lock();
    if args.verbose > 0 {
        eprintln!(
            "{}: target {} ({}), -j{} -a{} {} x {} rounds, io timeout {} s, round limit {:.1} s",
            units.tool,
            target.name,
            target.addrs.iter().map(|a| a.to_string()).collect::<Vec<_>>().join(" "),
            plan.threads,
            plan.inflight,
            match (plan.count, plan.duration) {
                (Some(c), Some(d)) => format!("{c} requests or {} s per connection", d.as_secs_f64()),
                (Some(c), None) => format!("{c} requests per connection"),
                (None, Some(d)) => format!("{} s", d.as_secs_f64()),
                (None, None) => unreachable!("plan has a count or a duration"),
            },
            args.rounds,
            args.io_timeout,
            plan.limit.as_secs_f64()
        );
    }
    // The header goes out with the first row of figures: a run that fails in
    // its first round prints none.
    let mut header_due = !args.json && !args.no_header;
    let mut rows: Vec<report::Row> = Vec::new();
    let mut hists = Vec::new();
    let mut all = engine::new_histogram();
    for r in 1..=args.rounds {
        progress.round = r;
        let cpu0 = process_cpu_s();
        let outcome = round(&plan, &mut progress);
        let cpu_s = process_cpu_s().zip(cpu0).map(|(b, a)| b - a);
        progress.clear();
        let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let (row, h) = report::Row::from_round(
            r as usize,
            now,
            plan.threads,
            plan.inflight,
            &outcome,
            quantiles,
            plan.limit.as_secs_f64(),
            cpu_s,
        );
        let mut row = row;
        if row.errors == 0 && row.calls == 0 {
            row.errors = 1;
            row.error = Some("no request was answered (is -d too short?)".into());
        }
        if args.verbose > 0 {
            for (i, c) in row.conns.iter().enumerate() {
                eprintln!(
                    "{}: round {r} connection {i}: {} answered in {:.3} s{}",
                    units.tool,
                    c.calls,
                    c.secs,
                    c.error.as_deref().map(|e| format!(" error: {e}")).unwrap_or_default()
                );
            }
        }
        if !args.json {
            if row.errors > 0 {
                writeln!(out, "{}", report::failed_line(&row, &r.to_string()))?;
            } else {
                if std::mem::take(&mut header_due) {
                    writeln!(out, "{}", report::header(&units, quantiles))?;
                }
                writeln!(out, "{}", report::line(&row, &r.to_string()))?;
            }
            out.flush()?;
        }
        all.add(&h).expect("histograms share bounds");
        hists.push(h);
        let failed = row.errors > 0;
        rows.push(row);
        if failed {
            break;
        }
    }
    let med = report::Row::median(&rows);
    let total_calls: u64 = rows.iter().map(|r| r.calls).sum();
    let errors: usize = rows.iter().map(|r| r.errors).sum();
    let error = rows.iter().find_map(|r| r.error.as_ref().map(|e| format!("round {}: {e}", r.round)));
    let ok = errors == 0;
    if args.json {
        // A failed run has no median and no pooled figures; its rounds keep
        // theirs, each with its `errors` and `error`.
        let rep = report::Report {
            tool: units.tool,
            target: target.name.clone(),
            addrs: target.addrs.iter().map(|a| a.to_string()).collect(),
            config: args.run_config(&own_config),
            median: ok.then(|| med.clone()),
            all: ok.then(|| report::Pooled::new(&all, quantiles)),
            rounds: rows,
            errors,
            ok,
            error: error.clone(),
        };
        serde_json::to_writer_pretty(&mut out, &rep)?;
        writeln!(out)?;
    } else if ok {
        writeln!(out, "{}", report::line(&med, "median"))?;
        writeln!(out, "{}", report::summary_line(&units, &target.name, &med, hists.len(), total_calls, &all, errors))?;
    } else {
        writeln!(out, "{}", report::failed_summary_line(&units, &target.name, &med, hists.len(), errors))?;
    }
    out.flush()?;
    if let Some(path) = &args.plot {
        let title = format!("{}: RTT by percentile", units.tool);
        let subtitle = format!(
            "{}   -j{} -a{}   {} round(s), {} answered{}",
            target.name,
            plan.threads,
            plan.inflight,
            hists.len(),
            total_calls,
            if errors > 0 { ", FAILED" } else { "" }
        );
        let pooled = plot::Series { label: "all rounds".into(), hist: &all };
        let per: Vec<plot::Series<'_>> = hists
            .iter()
            .enumerate()
            .map(|(i, h)| plot::Series { label: format!("round {}", i + 1), hist: h })
            .collect();
        plot::write(path, &title, &subtitle, &pooled, &per)?;
    }
    if let Some(e) = error {
        eprintln!("{}: error: {e}", units.tool);
    }
    Ok(if errors == 0 { 0 } else { 1 })
}
