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
    /// Servers: connmux, raw, yardstick.
    #[arg(long, value_delimiter = ',', default_value = "connmux,raw,yardstick")]
    pub servers: Vec<String>,
    /// How long each server runs under callgrind (all calls must fit in it).
    #[arg(long, default_value_t = 8.0)]
    pub server_seconds: f64,
    /// Print this many top functions (callgrind_annotate, inclusive of
    /// nothing: self cost) of the larger -a1 run of connmux and the yardstick.
    #[arg(long, default_value_t = 0)]
    pub annotate: usize,
    /// Directory for the callgrind output files [default: a temporary one].
    #[arg(long)]
    pub keep: Option<PathBuf>,
    #[arg(long, default_value = super::YARDSTICK_DIR)]
    pub yardstick: PathBuf,
    /// A smoke run: 2 000 calls at -a1 only, connmux only.
    #[arg(long)]
    pub quick: bool,
}

/// Total Ir of a callgrind output file (its `summary:` or `totals:` line).
fn total_ir(path: &Path) -> anyhow::Result<u64> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    text.lines()
        .find_map(|l| {
            l.strip_prefix("summary:")
                .or_else(|| l.strip_prefix("totals:"))
        })
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .with_context(|| format!("no summary line in {}", path.display()))
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
    cmd.args(["--tool=callgrind", "-q"])
        .arg(format!("--callgrind-out-file={}", out.display()));
    let listen = format!("127.0.0.1:{port}");
    let secs = a.server_seconds.to_string();
    match kind {
        "connmux" => {
            cmd.arg(exe()?)
                .args(["rpc-server", "-l", &listen, "--workers", "1", "--cpus", "0"]);
            cmd.args(["--no-stats-socket", "--duration", &secs]);
        }
        "raw" => {
            cmd.arg(exe()?).args([
                "bench",
                "raw-server",
                "-l",
                &listen,
                "--threads",
                "1",
                "--cpus",
                "0",
            ]);
            cmd.args(["--duration", &secs]);
        }
        "yardstick" => {
            let Some(y) = yard else { bail!("no yardstick") };
            cmd.arg(y)
                .args(["-t", "1", "-p", &port.to_string(), "-q", "-T", &secs]);
        }
        o => bail!("unknown server {o}"),
    }
    let mut p = Proc::spawn(&format!("{kind} under callgrind"), cmd, port)?;
    let args: Vec<String> = vec![
        "-j".into(),
        "1".into(),
        "-a".into(),
        inflight.to_string(),
        "-c".into(),
        calls.to_string(),
    ];
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
        None => {
            std::env::temp_dir().join(format!("connmux-bench-callgrind-{}", std::process::id()))
        }
    };
    std::fs::create_dir_all(&dir)?;
    let yard = a
        .servers
        .iter()
        .any(|s| s == "yardstick")
        .then(|| build_yardstick(&a.yardstick))
        .flatten();
    println!(
        "connmux bench instructions: user-space instructions (callgrind Ir, all threads) per NULL call, \
         (Ir(2N) - Ir(N)) / N, one worker, -j1; output in {}",
        dir.display()
    );
    let servers: Vec<&str> = a
        .servers
        .iter()
        .map(String::as_str)
        .filter(|s| *s != "yardstick" || yard.is_some())
        .collect();
    println!();
    print!("{:<8} {:>8}", "-a", "N");
    for s in &servers {
        print!(" {:>12}", format!("{s}/call"));
    }
    println!(" {:>10}", "vs_yard");
    let mut big_a1 = Vec::new();
    for &inflight in &a.inflight {
        let n = if inflight <= 1 {
            a.calls
        } else {
            a.batched_calls
        };
        let mut per = Vec::new();
        for &s in &servers {
            let f1 = one_run(&a, s, inflight, n, &dir, yard.as_ref())?;
            let f2 = one_run(&a, s, inflight, 2 * n, &dir, yard.as_ref())?;
            let (i1, i2) = (total_ir(&f1)?, total_ir(&f2)?);
            per.push((i2 as f64 - i1 as f64) / n as f64);
            if inflight <= 1 {
                big_a1.push((s, f2));
            }
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
        for (s, f) in big_a1 {
            if s == "raw" {
                continue;
            }
            println!();
            println!(
                "top {} functions by self Ir, {s}, -a1, {} calls (start-up included):",
                a.annotate,
                2 * a.calls
            );
            let out = Command::new("callgrind_annotate")
                .arg("--inclusive=no")
                .arg(&f)
                .output()?;
            let text = String::from_utf8_lossy(&out.stdout);
            let mut in_table = false;
            let mut shown = 0;
            for l in text.lines() {
                if l.contains("file:function") {
                    in_table = true;
                    continue;
                }
                if in_table && !l.trim().is_empty() && !l.starts_with("--") {
                    println!("  {}", l.chars().take(150).collect::<String>());
                    shown += 1;
                    if shown >= a.annotate {
                        break;
                    }
                }
            }
        }
    }
    Ok(0)
}
