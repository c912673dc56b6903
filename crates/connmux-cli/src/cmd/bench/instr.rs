//! `connmux bench instructions`: user-space instructions per NULL call.
//!
//! Each server runs under `valgrind --tool=callgrind` for a fixed time
//! (`--server-seconds`) with one worker on CPU 0 and answers a fixed number of
//! calls from `connmux rpctest -c` (also on CPU 0); it is run twice, with N
//! and 2N calls, and (Ir(2N) − Ir(N)) / N cancels start-up, shut-down and the
//! idle wake-ups of the fixed run time. Callgrind counts user space only, all
//! threads together, exactly and reproducibly; syscalls, wake-ups and copies
//! in the kernel (most of the real cost) are not in it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context};

use super::{build_yardstick, exe, free_port, loadgen, on_path, taskset, Proc};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Calls in the smaller run at -a1 (the larger makes twice as many).
    #[arg(long, default_value_t = 20_000)]
    pub calls: u64,
    /// Calls in the smaller run at -a32 and above.
    #[arg(long, default_value_t = 100_000)]
    pub batched_calls: u64,
    /// In-flight settings (-j1 -aA).
    #[arg(long, value_delimiter = ',', default_value = "1,32")]
    pub inflight: Vec<u64>,
    /// Servers: connmux, raw; yardstick (an external C ceiling server) when
    /// --yardstick DIR is given.
    #[arg(long, value_delimiter = ',', default_value = "connmux,raw")]
    pub servers: Vec<String>,
    /// How long each server runs under callgrind (all calls must fit in it).
    #[arg(long, default_value_t = 15.0)]
    pub server_seconds: f64,
    /// Also print instructions per call by component and the top this
    /// many functions (self cost from callgrind_annotate, 2N run minus N run).
    #[arg(long, default_value_t = 0)]
    pub annotate: usize,
    /// Directory for the callgrind output files [default: a temporary one].
    #[arg(long)]
    pub keep: Option<PathBuf>,
    /// Directory of an external ceiling server's limit_server.c (built at
    /// run time); without it only connmux's own servers run.
    #[arg(long)]
    pub yardstick: Option<PathBuf>,
    /// A smoke run: 2 000 calls at -a1 only, connmux only.
    #[arg(long)]
    pub quick: bool,
}

/// Total Ir of a callgrind output file (its `summary:` or `totals:` line).
fn total_ir(path: &Path) -> anyhow::Result<u64> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    text.lines()
        .find_map(|l| l.strip_prefix("summary:").or_else(|| l.strip_prefix("totals:")))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .with_context(|| format!("no summary line in {}", path.display()))
}

/// Self cost per function (`file:function` as callgrind_annotate names it).
fn self_costs(path: &Path) -> anyhow::Result<Vec<(String, u64)>> {
    let out = Command::new("callgrind_annotate").args(["--inclusive=no", "--threshold=100"]).arg(path).output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut v = Vec::new();
    let mut in_table = false;
    for l in text.lines() {
        if l.contains("file:function") {
            in_table = true;
            continue;
        }
        if !in_table || l.starts_with("--") {
            continue;
        }
        if l.trim().is_empty() {
            if !v.is_empty() {
                break;
            }
            continue;
        }
        // "  8,880,962 ( 4.07%)  file:function [object]"
        let t = l.trim_start();
        let Some((num, rest)) = t.split_once(' ') else {
            continue;
        };
        let Ok(ir) = num.replace(',', "").parse::<u64>() else {
            continue;
        };
        let name = rest.split_once(')').map_or(rest, |x| x.1).trim();
        let name = name.rsplit_once(" [").map_or(name, |x| x.0).to_string();
        v.push((name, ir));
    }
    Ok(v)
}

/// The component a `file:function` belongs to, for the summary.
fn group(name: &str) -> &'static str {
    let func = name.split_once(':').map_or(name, |x| x.1);
    if name.contains("hash") || name.contains("sip.rs") {
        "hashing (std HashMap, SipHash)"
    } else if name.contains("malloc") || func == "free" || func.starts_with("cfree") {
        "allocator (malloc/free)"
    } else if name.contains("sysdeps/") || name.contains("nptl") || name.contains("libc") {
        "libc (syscall wrappers)"
    } else if func.contains("connmux_core::") {
        "connmux-core (parser, mux queues, transmit)"
    } else if func.contains("connmux_oncrpc::") {
        "connmux-oncrpc (call decode, reply encode)"
    } else if func.contains("connmux::") {
        "connmux runtime (worker loop, dispatch, flush)"
    } else if func.contains("bytes::") {
        "bytes"
    } else if name.contains("limit_server.c") {
        "limit_server.c"
    } else {
        "other"
    }
}

fn one_run(
    a: &Args,
    kind: &str,
    inflight: u64,
    calls: u64,
    dir: &Path,
    yard: Option<&PathBuf>,
) -> anyhow::Result<PathBuf> {
    let port = free_port()?;
    let out = dir.join(format!("callgrind.{kind}.a{inflight}.n{calls}.out"));
    let _ = std::fs::remove_file(&out);
    let mut cmd = taskset(&[0], "valgrind");
    cmd.args(["--tool=callgrind", "-q"]).arg(format!("--callgrind-out-file={}", out.display()));
    let listen = format!("127.0.0.1:{port}");
    let secs = a.server_seconds.to_string();
    match kind {
        "connmux" => {
            // io_uring does not run under valgrind: the epoll driver.
            // (Never heavy: ~50 times as slow under callgrind, a NULL call
            // would look heavy at times and go to a lane.)
            cmd.arg(exe()?).args(["bench", "mux-server", "-l", &listen, "--cpus", "0", "--never-heavy"]);
            cmd.args(["--driver", "epoll", "--duration", &secs]);
        }
        "raw" => {
            cmd.arg(exe()?).args(["bench", "raw-server", "-l", &listen, "--threads", "1", "--cpus", "0"]);
            cmd.args(["--duration", &secs]);
        }
        "yardstick" => {
            let Some(y) = yard else { bail!("no yardstick") };
            cmd.arg(y).args(["-t", "1", "-p", &port.to_string(), "-q", "-T", &secs]);
        }
        o => bail!("unknown server {o}"),
    }
    let mut p = Proc::spawn_within(&format!("{kind} under callgrind"), cmd, port, Duration::from_secs(90))?;
    let args: Vec<String> =
        vec!["-j".into(), "1".into(), "-a".into(), inflight.to_string(), "-c".into(), calls.to_string()];
    loadgen("rpctest", &[], &[0], &args, p.addr)
        .with_context(|| format!("{calls} calls against {kind} under callgrind"))?;
    p.wait_exit(Duration::from_secs_f64(a.server_seconds + 60.0))?;
    Ok(out)
}

pub fn run(mut a: Args) -> anyhow::Result<i32> {
    if a.quick {
        a.calls = 2_000;
        a.inflight = vec![1];
        a.servers = vec!["connmux".into()];
        a.server_seconds = 4.0;
    }
    if !on_path("valgrind") {
        println!("connmux bench instructions: valgrind is not installed; skipped");
        return Ok(0);
    }
    let dir = match &a.keep {
        Some(d) => d.clone(),
        None => std::env::temp_dir().join(format!("connmux-bench-callgrind-{}", std::process::id())),
    };
    std::fs::create_dir_all(&dir)?;
    super::with_external(&mut a.servers, a.yardstick.as_deref(), &["yardstick"])?;
    let yard = a.servers.iter().any(|s| s == "yardstick").then(|| build_yardstick(a.yardstick.as_deref())).flatten();
    println!(
        "connmux bench instructions: user-space instructions (callgrind Ir, all threads) per NULL call, \
         (Ir(2N) - Ir(N)) / N, one worker, -j1; output in {}",
        dir.display()
    );
    let servers: Vec<&str> =
        a.servers.iter().map(String::as_str).filter(|s| *s != "yardstick" || yard.is_some()).collect();
    println!();
    print!("{:<8} {:>8}", "-a", "N");
    for s in &servers {
        print!(" {:>12}", format!("{s}/call"));
    }
    println!(" {:>10}", "vs_yard");
    let mut pairs = Vec::new();
    for &inflight in &a.inflight {
        let n = if inflight <= 1 { a.calls } else { a.batched_calls };
        let mut per = Vec::new();
        for &s in &servers {
            let f1 = one_run(&a, s, inflight, n, &dir, yard.as_ref())?;
            let f2 = one_run(&a, s, inflight, 2 * n, &dir, yard.as_ref())?;
            let (i1, i2) = (total_ir(&f1)?, total_ir(&f2)?);
            per.push((i2 as f64 - i1 as f64) / n as f64);
            pairs.push((s, inflight, f1, f2, n));
        }
        print!("{:<8} {:>8}", format!("-a{inflight}"), n);
        for x in &per {
            print!(" {:>12.0}", x);
        }
        let ci = servers.iter().position(|s| *s == "connmux");
        let yi = servers.iter().position(|s| *s == "yardstick");
        match (ci, yi) {
            (Some(c), Some(y)) => println!(" {:>10}", super::ratio(per[c], per[y])),
            _ => println!(" {:>10}", "-"),
        }
    }
    if a.annotate > 0 && on_path("callgrind_annotate") {
        for (s, inflight, f1, f2, n) in pairs {
            let (t1, t2) = (self_costs(&f1)?, self_costs(&f2)?);
            let mut per_fn: Vec<(String, f64)> = t2
                .iter()
                .map(|(name, ir2)| {
                    let ir1 = t1.iter().find(|(m, _)| m == name).map_or(0, |x| x.1);
                    (name.clone(), (*ir2 as f64 - ir1 as f64) / n as f64)
                })
                .collect();
            per_fn.sort_by(|a, b| b.1.total_cmp(&a.1));
            let mut groups: Vec<(&str, f64)> = Vec::new();
            for (name, x) in &per_fn {
                let g = group(name);
                match groups.iter_mut().find(|e| e.0 == g) {
                    Some(e) => e.1 += x,
                    None => groups.push((g, *x)),
                }
            }
            groups.sort_by(|a, b| b.1.total_cmp(&a.1));
            println!();
            println!("{s}, -a{inflight}: instructions per call by component (self cost, 2N run minus N run):");
            for (g, x) in &groups {
                if x.abs() >= 1.0 {
                    println!("  {x:>8.0}  {g}");
                }
            }
            println!("{s}, -a{inflight}: top {} functions, instructions per call:", a.annotate);
            for (name, x) in per_fn.iter().take(a.annotate) {
                println!("  {x:>8.1}  {}", name.chars().take(140).collect::<String>());
            }
        }
    }
    Ok(0)
}
