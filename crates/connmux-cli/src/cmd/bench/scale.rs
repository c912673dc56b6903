//! `connmux bench scale`: many connections.
//!
//! - Active: N connections (8, 1 000, 10 000) with one NULL call in flight
//!   each, driven by one epoll thread (`bench scale-load`; thread-per-connection
//!   clients cannot reach 10 000). Calls/s and RTT, against the rpc-server and
//!   the yardstick, everything on the placement's CPUs; the ratio of N
//!   connections to 8 shows what the connection count alone costs.
//! - Idle: RSS of a fresh server process before and after N connections have
//!   each made one call and gone quiet: (after − before) / N is the user-space
//!   memory per idle connection (kernel socket buffers are not in RSS).

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use connmux_oncrpc::{check_reply, encode_null_call};
use connmux_sys::epoll::{Epoll, Events, Interest};
use serde_json::Value;

use super::rpc::{placement, start_server};
use super::{build_yardstick, exe, loadavg, median, rss_kib, taskset, verdict};
use crate::cmd::loadgen::engine::new_histogram;

const REPLY: usize = 28;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Active connection counts (one call in flight each).
    #[arg(long, value_delimiter = ',', default_value = "8,1000,10000")]
    pub conns: Vec<usize>,
    /// Idle connection counts for RSS per connection.
    #[arg(long, value_delimiter = ',', default_value = "1000,10000")]
    pub idle: Vec<usize>,
    /// Rounds (interleaved), seconds each.
    #[arg(short = 'i', long, default_value_t = 3)]
    pub rounds: usize,
    #[arg(short = 'd', long, default_value_t = 1.5)]
    pub seconds: f64,
    /// Placement of servers and load: cpu0 or spread.
    #[arg(long, default_value = "cpu0")]
    pub placement: String,
    /// Servers: connmux, raw; yardstick (an external C ceiling server) when
    /// --yardstick DIR is given.
    #[arg(long, value_delimiter = ',', default_value = "connmux,raw")]
    pub servers: Vec<String>,
    /// Directory of an external ceiling server's limit_server.c (built at
    /// run time); without it only connmux's own servers run.
    #[arg(long)]
    pub yardstick: Option<PathBuf>,
    /// A smoke run: 8 and 200 connections, one round of 0.5 s, idle 200.
    #[arg(long)]
    pub quick: bool,
}

#[derive(clap::Args, Debug)]
pub struct LoadArgs {
    #[arg(long)]
    pub conns: usize,
    #[arg(short = 'd', long, default_value_t = 1.0)]
    pub seconds: f64,
    /// Pin the load thread to this CPU.
    #[arg(long)]
    pub cpu: Option<usize>,
    pub target: SocketAddr,
}

/// Connect `n` connections in batches, each making one call (so the server
/// has accepted it before the next batch: no listen-queue overflow).
pub fn connect_many(addr: SocketAddr, n: usize) -> anyhow::Result<Vec<TcpStream>> {
    let mut conns: Vec<TcpStream> = Vec::with_capacity(n);
    let mut call = Vec::new();
    let mut buf = [0u8; 64];
    while conns.len() < n {
        let start = conns.len();
        let batch = (n - start).min(100);
        for _ in 0..batch {
            let s = TcpStream::connect_timeout(&addr, Duration::from_secs(10))
                .with_context(|| format!("connection {}", conns.len()))?;
            s.set_nodelay(true)?;
            s.set_read_timeout(Some(Duration::from_secs(10)))?;
            conns.push(s);
        }
        for (i, s) in conns[start..].iter_mut().enumerate() {
            call.clear();
            encode_null_call((start + i) as u32, 100_003, 3, 1, &mut call);
            s.write_all(&call)?;
        }
        for s in conns[start..].iter_mut() {
            s.read_exact(&mut buf[..REPLY]).context("first reply")?;
        }
    }
    Ok(conns)
}

pub fn run_load(a: LoadArgs) -> anyhow::Result<i32> {
    if let Some(c) = a.cpu {
        connmux_sys::affinity::pin_current_thread(c)?;
    }
    let mut conns = connect_many(a.target, a.conns)?;
    let ep = Epoll::new()?;
    for (i, s) in conns.iter().enumerate() {
        s.set_nonblocking(true)?;
        ep.add(s.as_raw_fd(), i as u64, Interest::READ)?;
    }
    let mut hist = new_histogram();
    let mut sent_at = vec![Instant::now(); conns.len()];
    let mut carry: Vec<Vec<u8>> = vec![Vec::new(); conns.len()];
    let mut xid = vec![0u32; conns.len()];
    let mut call = Vec::with_capacity(64);
    let t0 = Instant::now();
    for (i, s) in conns.iter_mut().enumerate() {
        xid[i] = i as u32;
        call.clear();
        encode_null_call(xid[i], 100_003, 3, 1, &mut call);
        s.write_all(&call)?;
        sent_at[i] = Instant::now();
    }
    let end = t0 + Duration::from_secs_f64(a.seconds);
    let hard_end = end + Duration::from_secs(20);
    let mut outstanding = conns.len();
    let mut calls = 0u64;
    let mut events = Events::with_capacity(1024);
    let mut buf = [0u8; 4096];
    let mut last = t0;
    while outstanding > 0 {
        let now = Instant::now();
        if now >= hard_end {
            println!("{}", serde_json::json!({"ok": false, "error": format!("{outstanding} calls unanswered")}));
            return Ok(1);
        }
        ep.wait(&mut events, Some(Duration::from_millis(100)))?;
        for ev in events.iter() {
            let i = ev.token as usize;
            let n = match conns[i].read(&mut buf) {
                Ok(0) => bail!("connection {i} closed by the server"),
                Ok(n) => n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e.into()),
            };
            carry[i].extend_from_slice(&buf[..n]);
            if carry[i].len() < REPLY {
                continue;
            }
            if carry[i].len() > REPLY {
                bail!("connection {i}: {} bytes for one reply", carry[i].len());
            }
            let got = check_reply(&carry[i][4..], Some(xid[i])).map_err(|e| anyhow::anyhow!("bad reply: {e}"))?;
            debug_assert_eq!(got, xid[i]);
            carry[i].clear();
            let now = Instant::now();
            hist.saturating_record((now - sent_at[i]).as_nanos() as u64);
            calls += 1;
            last = now;
            if now < end {
                xid[i] = xid[i].wrapping_add(conns.len() as u32);
                call.clear();
                encode_null_call(xid[i], 100_003, 3, 1, &mut call);
                // 44 bytes into an empty socket buffer: never short.
                conns[i].write_all(&call)?;
                sent_at[i] = Instant::now();
            } else {
                outstanding -= 1;
            }
        }
    }
    let secs = (last - t0).as_secs_f64().max(1e-9);
    let q = |p: f64| hist.value_at_quantile(p) as f64 / 1e3;
    println!(
        "{}",
        serde_json::json!({"ok": true, "calls": calls, "secs": secs, "rate": calls as f64 / secs, "p50_us": q(0.5), "p99_us": q(0.99)})
    );
    Ok(0)
}

#[derive(Clone, Copy, Default, Debug)]
struct Active {
    rate: f64,
    p50_us: f64,
    p99_us: f64,
}

fn active_once(cpus: &[usize], conns: usize, seconds: f64, addr: SocketAddr) -> anyhow::Result<Active> {
    let out = taskset(cpus, exe()?)
        .args(["bench", "scale-load", "--conns", &conns.to_string(), "-d", &seconds.to_string()])
        .args(["--cpu", &cpus[0].to_string()])
        .arg(addr.to_string())
        .output()?;
    let doc: Value = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("scale-load printed no JSON: {}", String::from_utf8_lossy(&out.stderr)))?;
    if doc["ok"] != Value::Bool(true) {
        bail!("scale load ({conns} connections) against {addr} failed: {}", doc["error"]);
    }
    let f = |k: &str| doc[k].as_f64().unwrap_or(0.0);
    Ok(Active { rate: f("rate"), p50_us: f("p50_us"), p99_us: f("p99_us") })
}

pub fn run(mut a: Args) -> anyhow::Result<i32> {
    if a.quick {
        a.conns = vec![8, 200];
        a.idle = vec![200];
        a.rounds = 1;
        a.seconds = 0.5;
    }
    let p = placement(&a.placement)?;
    super::with_external(&mut a.servers, a.yardstick.as_deref(), &["yardstick"])?;
    let yard = a.servers.iter().any(|s| s == "yardstick").then(|| build_yardstick(a.yardstick.as_deref())).flatten();
    println!(
        "connmux bench scale: one NULL call in flight per connection, one epoll load thread on CPU {}; servers on {:?}; \
         {} round(s) of {} s, interleaved; medians; load avg {}",
        p.cpus[0],
        p.cpus,
        a.rounds,
        a.seconds,
        loadavg()
    );
    let mut servers = Vec::new();
    for k in &a.servers {
        if let Some(s) = start_server(k, &p, yard.as_ref())? {
            servers.push((k.clone(), s));
        }
    }
    let mut res = vec![vec![Vec::<Active>::new(); servers.len()]; a.conns.len()];
    for round in 0..a.rounds {
        for (ci, &n) in a.conns.iter().enumerate() {
            for k in 0..servers.len() {
                let si = (k + round) % servers.len();
                let r = active_once(&p.cpus, n, a.seconds, servers[si].1.addr)
                    .with_context(|| format!("{n} connections against {}", servers[si].0))?;
                res[ci][si].push(r);
            }
        }
        eprintln!("bench scale: round {}/{} done", round + 1, a.rounds);
    }
    drop(servers);
    println!();
    println!(
        "{:<10} {:>7} {:>11} {:>9} {:>9} {:>8} {:>8}",
        "server", "conns", "calls/s", "p50_us", "p99_us", "vs_8", "vs_yard"
    );
    let mut lines = Vec::new();
    let med = |v: &[Active]| Active {
        rate: median(v.iter().map(|x| x.rate).collect()),
        p50_us: median(v.iter().map(|x| x.p50_us).collect()),
        p99_us: median(v.iter().map(|x| x.p99_us).collect()),
    };
    let names: Vec<String> = a.servers.iter().filter(|s| *s != "yardstick" || yard.is_some()).cloned().collect();
    let yi = names.iter().position(|s| s == "yardstick");
    let base_i = a.conns.iter().position(|&n| n == 8);
    for (si, name) in names.iter().enumerate() {
        for (ci, &n) in a.conns.iter().enumerate() {
            let m = med(&res[ci][si]);
            let vs8 = base_i.map(|b| med(&res[b][si]).rate);
            let vy = yi.map(|y| med(&res[ci][y]).rate);
            println!(
                "{:<10} {:>7} {:>11.0} {:>9.1} {:>9.1} {:>8} {:>8}",
                name,
                n,
                m.rate,
                m.p50_us,
                m.p99_us,
                vs8.map_or("-".into(), |b| super::ratio(m.rate, b)),
                vy.map_or("-".into(), |b| super::ratio(m.rate, b)),
            );
            // The target is stated for 1,000 active connections; more are
            // printed above, for the record, not judged.
            if name == "connmux" && n == 1000 {
                if let Some(b) = vs8 {
                    let r = m.rate / b;
                    lines.push(format!(
                        "{} {n} active connections >= 0.8x the throughput of 8: {r:.2}x",
                        verdict(r >= 0.8)
                    ));
                }
            }
        }
    }

    println!();
    println!("{:<10} {:>7} {:>12} {:>12} {:>14}", "server", "idle", "rss_before_k", "rss_after_k", "bytes_per_conn");
    for k in &a.servers {
        for &n in &a.idle {
            let Some(srv) = start_server(k, &p, yard.as_ref())? else {
                continue;
            };
            // Warm up: one connection, one call, closed.
            drop(connect_many(srv.addr, 1)?);
            std::thread::sleep(Duration::from_millis(300));
            let before = rss_kib(srv.pid)?;
            let conns = connect_many(srv.addr, n)?;
            std::thread::sleep(Duration::from_millis(500));
            let after = rss_kib(srv.pid)?;
            let per = (after as f64 - before as f64) * 1024.0 / n as f64;
            println!("{:<10} {:>7} {:>12} {:>12} {:>14.0}", k, n, before, after, per);
            if k == "connmux" && n >= 10_000 {
                lines.push(format!(
                    "{} {n} idle connections <= 8 KiB of user-space memory each: {:.0} bytes",
                    verdict(per <= 8192.0),
                    per
                ));
            }
            drop(conns);
            drop(srv);
        }
    }
    if !lines.is_empty() {
        println!();
        println!("targets:");
        for l in lines {
            println!("  {l}");
        }
    }
    Ok(0)
}
