//! `connmux bench 9p`: `connmux 9p-server` beside diod (Debian's threaded
//! 9P2000.L server) under the same loads from `connmux 9ptest`, in
//! interleaved rounds: small operations (getattr at -j1 -a1 and -j8 -a16,
//! walk+clunk at -j8 -a16), 1 MiB reads (bytes/s), an uneven mix (one
//! connection streaming 1 MiB reads beside 7 doing getattr: the light
//! connections' p99), and the seed's workload (nfs-ganesha's KCM patch
//! measured one mount with 32 processes doing 32-byte I/O): one connection
//! with 32 requests in flight, of getattr, 32-byte reads and 32-byte
//! writes. `--busy N` measures 60 KiB reads alone, with N processes
//! spinning on the servers' CPUs: file I/O on a host whose CPUs others want.
//!
//! diod serves only its own uid: as root it is started as `nobody` (uid
//! 65534, with `setpriv`) and the load attaches as that uid; otherwise it runs
//! as the caller. Both export the same directory, attached by its path.
//! diod negotiates an msize of 64 KiB, so a 1 MiB read is 17 Treads there and
//! one here (msize 1 MiB): the same bytes asked of both, each as its server
//! allows.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context;
use rand::rngs::SmallRng;
use rand::{RngCore, SeedableRng};

use super::rpc::placement;
use super::{cpu_list, exe, free_port, loadavg, loadgen, ratio, taskset, verdict, Figures, Proc, Rounds};

#[derive(clap::Args, Debug)]
#[command(
    mut_arg("rounds", |a| a.help("Rounds (each measures every load on both servers, order alternating)")),
    mut_arg("seconds", |a| a.help("Seconds per measurement"))
)]
pub struct Args {
    #[command(flatten)]
    pub run: Rounds,
    /// CPUs of the servers and the load generator: cpu0, spread (0 and 1), or a list.
    #[arg(long, default_value = "spread")]
    pub placement: String,
    /// I/O driver of the 9p-server: auto, epoll or uring.
    #[arg(long, default_value = "auto")]
    pub driver: String,
    /// A smoke run: two rounds of 0.3 s.
    #[arg(long)]
    pub quick: bool,
    /// Busy processes (a shell loop each) on the servers' CPUs for the
    /// whole run; with it only 60 KiB reads are measured: file I/O on a
    /// host whose CPUs other processes want.
    #[arg(long, default_value_t = 0)]
    pub busy: usize,
}

/// Processes that spin on the given CPUs until dropped (killed and reaped
/// by their handles).
struct Busy(Vec<std::process::Child>);

impl Busy {
    fn start(n: usize, cpus: &[usize]) -> anyhow::Result<Busy> {
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            let mut c = taskset(cpus, "sh");
            c.args(["-c", "while :; do :; done"]);
            v.push(c.spawn().context("starting a busy process (taskset, sh)")?);
        }
        Ok(Busy(v))
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

const MIB: u64 = 1 << 20;

/// A load: 9ptest arguments, and whether it is the uneven mix.
struct Load {
    name: &'static str,
    args: Vec<String>,
    uneven: bool,
    /// Bytes per operation (reads), for bytes/s.
    bytes: u64,
}

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

/// 60 KiB reads, one at a time: what a reader of files gets beside busy
/// processes (`--busy`).
fn busy_loads(busy: usize) -> Vec<Load> {
    vec![Load {
        name: if busy == 1 { "read 60 KiB -j1 -a1, 1 busy" } else { "read 60 KiB -j1 -a1, busy" },
        args: s(&["--op", "read", "--file", "big", "--size", "61440", "-j", "1", "-a", "1"]),
        uneven: false,
        bytes: 61440,
    }]
}

fn loads() -> Vec<Load> {
    vec![
        Load {
            name: "getattr -j1 -a1",
            args: s(&["--op", "getattr", "--file", "small", "-j", "1", "-a", "1"]),
            uneven: false,
            bytes: 0,
        },
        Load {
            name: "getattr -j8 -a16",
            args: s(&["--op", "getattr", "--file", "small", "-j", "8", "-a", "16"]),
            uneven: false,
            bytes: 0,
        },
        Load {
            name: "walk+clunk -j8 -a16",
            args: s(&["--op", "walk", "--file", "small", "-j", "8", "-a", "16"]),
            uneven: false,
            bytes: 0,
        },
        Load {
            name: "read 1 MiB -j1 -a1",
            args: s(&["--op", "read", "--file", "big", "--size", "1m", "-j", "1", "-a", "1"]),
            uneven: false,
            bytes: MIB,
        },
        Load {
            name: "read 1 MiB -j4 -a2",
            args: s(&["--op", "read", "--file", "big", "--size", "1m", "-j", "4", "-a", "2"]),
            uneven: false,
            bytes: MIB,
        },
        Load {
            name: "seed: getattr -j1 -a32",
            args: s(&["--op", "getattr", "--file", "small", "-j", "1", "-a", "32"]),
            uneven: false,
            bytes: 0,
        },
        Load {
            name: "seed: read 32 B -j1 -a32",
            args: s(&["--op", "read", "--file", "rw", "--size", "32", "-j", "1", "-a", "32"]),
            uneven: false,
            bytes: 0,
        },
        Load {
            name: "seed: write 32 B -j1 -a32",
            args: s(&["--op", "write", "--file", "rw", "--size", "32", "-j", "1", "-a", "32"]),
            uneven: false,
            bytes: 0,
        },
        Load {
            name: "uneven: 7 getattr + 1 reader",
            args: s(&["--op", "getattr", "--file", "small", "-j", "7", "-a", "1"]),
            uneven: true,
            bytes: 0,
        },
    ]
}

/// The uid diod runs as and the command prefix that makes it so.
fn diod_user() -> (u32, Vec<String>) {
    let euid = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| l.strip_prefix("Uid:")).and_then(|v| v.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0u32);
    if euid == 0 {
        (65534, s(&["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]))
    } else {
        (euid, Vec::new())
    }
}

fn diod_path() -> Option<PathBuf> {
    ["/usr/sbin/diod", "/usr/bin/diod", "/usr/local/sbin/diod"].iter().map(PathBuf::from).find(|p| p.is_file())
}

/// The export: a small file, a 2 MiB file, readable by everyone, and a
/// 4 KiB file everyone may write (diod runs as `nobody`).
fn make_export() -> anyhow::Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("connmux-bench-9p-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::write(dir.join("small"), b"small file\n")?;
    let mut big = vec![0u8; 2 * MIB as usize];
    SmallRng::seed_from_u64(0x9e37_79b9).fill_bytes(&mut big);
    std::fs::write(dir.join("big"), big)?;
    std::fs::write(dir.join("rw"), vec![b'x'; 4096])?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))?;
    for f in ["small", "big"] {
        std::fs::set_permissions(dir.join(f), std::fs::Permissions::from_mode(0o644))?;
    }
    std::fs::set_permissions(dir.join("rw"), std::fs::Permissions::from_mode(0o666))?;
    Ok(dir)
}

struct Server {
    proc: Proc,
    /// 9ptest arguments to reach it.
    attach: Vec<String>,
}

fn start_connmux(p: &super::rpc::Placement, driver: &str, dir: &Path) -> anyhow::Result<Server> {
    let port = free_port()?;
    let mut c = taskset(&p.cpus, exe()?);
    c.args(["9p-server", "--export"]).arg(dir);
    c.args(["-l", &format!("127.0.0.1:{port}"), "--workers", &p.cpus.len().to_string()]).args([
        "--cpus",
        &cpu_list(&p.cpus),
        "--driver",
        driver,
        "--no-stats-socket",
    ]);
    let attach = vec!["--aname".into(), dir.display().to_string()];
    Ok(Server { proc: Proc::spawn("9p-server", c, port)?, attach })
}

fn start_diod(p: &super::rpc::Placement, diod: &Path, dir: &Path) -> anyhow::Result<Server> {
    let port = free_port()?;
    let (uid, prefix) = diod_user();
    let mut c = Command::new("taskset");
    c.arg("-c").arg(cpu_list(&p.cpus)).args(&prefix).arg(diod);
    c.args(["-f", "-n", "-L", "/dev/null", "-e"]).arg(dir).args(["-l", &format!("127.0.0.1:{port}")]);
    let attach = vec![
        "--aname".into(),
        dir.display().to_string(),
        "--uid".into(),
        uid.to_string(),
        "--msize".into(),
        "65536".into(),
    ];
    Ok(Server { proc: Proc::spawn("diod", c, port)?, attach })
}

/// One measurement of `load` against `srv`: (rate or bytes/s, p99 of the light connections).
fn measure(load: &Load, srv: &Server, cpus: &[usize], seconds: f64) -> anyhow::Result<Figures> {
    let mut args = load.args.clone();
    args.extend(["-d".into(), seconds.to_string()]);
    args.extend(srv.attach.iter().cloned());
    if !load.uneven {
        return loadgen("9ptest", &[], cpus, &args, srv.proc.addr);
    }
    // The heavy connection streams 1 MiB reads for the whole measurement
    // (started first, and given a little longer so it outlasts the light ones).
    let mut heavy = s(&["--op", "read", "--file", "big", "--size", "1m", "-j", "1", "-a", "1", "-d"]);
    heavy.push((seconds + 0.5).to_string());
    heavy.extend(srv.attach.iter().cloned());
    let addr = srv.proc.addr;
    std::thread::scope(|sc| {
        let h = sc.spawn(|| loadgen("9ptest", &[], cpus, &heavy, addr));
        std::thread::sleep(std::time::Duration::from_millis(200));
        let light = loadgen("9ptest", &[], cpus, &args, addr);
        let heavy = h.join().map_err(|_| anyhow::anyhow!("heavy load thread panicked"))?;
        heavy?;
        light
    })
}

pub fn run(mut a: Args) -> anyhow::Result<i32> {
    if a.quick {
        a.run = Rounds::quick(2);
    }
    a.run.check()?;
    let Some(diod) = diod_path() else {
        println!(
            "connmux bench 9p: diod is not installed (Debian package diod; scripts/setup.sh installs it): skipped"
        );
        return Ok(0);
    };
    let p = placement(&a.placement)?;
    let dir = make_export()?;
    let loads = if a.busy > 0 { busy_loads(a.busy) } else { loads() };
    let servers = [start_connmux(&p, &a.driver, &dir)?, start_diod(&p, &diod, &dir)?];
    println!(
        "connmux bench 9p: 9p-server vs diod over loopback, CPUs {} for servers and load, driver {}; {} round(s) of {} s, \
         interleaved; medians over rounds; load avg {}{}",
        cpu_list(&p.cpus),
        a.driver,
        a.run.rounds,
        a.run.seconds,
        loadavg(),
        if a.busy > 0 { format!("; {} busy processes on those CPUs", a.busy) } else { String::new() }
    );
    let busy = Busy::start(a.busy, &p.cpus)?;
    // results[load][0 = connmux, 1 = diod]
    let mut results: Vec<[Vec<Figures>; 2]> = (0..loads.len()).map(|_| [Vec::new(), Vec::new()]).collect();
    for round in 0..a.run.rounds {
        for (li, l) in loads.iter().enumerate() {
            for k in 0..2 {
                let which = (k + round + li) % 2;
                let f = measure(l, &servers[which], &p.cpus, a.run.seconds)
                    .with_context(|| format!("round {} {} against {}", round + 1, l.name, servers[which].proc.name))?;
                results[li][which].push(f);
            }
        }
        eprintln!("bench 9p: round {}/{} done (load avg {})", round + 1, a.run.rounds, loadavg());
    }
    drop(busy);
    drop(servers);
    let _ = std::fs::remove_dir_all(&dir);
    println!();
    println!(
        "{:<30} {:>14} {:>14} {:>7} {:>10} {:>10} {:>7}  target",
        "load", "connmux", "diod", "ratio", "cm p99", "diod p99", "ratio"
    );
    let mut all_ok = true;
    for (li, l) in loads.iter().enumerate() {
        let c = Figures::median_of(&results[li][0]);
        let d = Figures::median_of(&results[li][1]);
        let (cr, dr, unit) = if l.bytes > 0 {
            (c.rate * l.bytes as f64 / MIB as f64, d.rate * l.bytes as f64 / MIB as f64, "MiB/s")
        } else {
            (c.rate, d.rate, "ops/s")
        };
        let target = match l.name {
            "getattr -j8 -a16"
            | "walk+clunk -j8 -a16"
            | "seed: getattr -j1 -a32"
            | "seed: read 32 B -j1 -a32"
            | "seed: write 32 B -j1 -a32" => {
                let ok = cr >= 2.0 * dr;
                all_ok &= ok;
                format!("ops/s >= 2x diod: {}", verdict(ok))
            }
            "read 1 MiB -j1 -a1" | "read 60 KiB -j1 -a1, 1 busy" | "read 60 KiB -j1 -a1, busy" => {
                let ok = cr >= dr;
                all_ok &= ok;
                format!("bytes/s >= 1.0x diod: {}", verdict(ok))
            }
            _ if l.uneven => {
                let ok = c.p99_us <= 0.5 * d.p99_us;
                all_ok &= ok;
                format!("light p99 <= 0.5x diod: {}", verdict(ok))
            }
            _ => String::new(),
        };
        println!(
            "{:<30} {:>8.0} {:<5} {:>8.0} {:<5} {:>7} {:>10.1} {:>10.1} {:>7}  {}",
            l.name,
            cr,
            unit,
            dr,
            unit,
            ratio(cr, dr),
            c.p99_us,
            d.p99_us,
            ratio(c.p99_us, d.p99_us),
            target
        );
    }
    println!(
        "(rates and p99 RTT in µs are medians over {} rounds; the uneven row's figures are the 7 light connections'; \
         the machine is shared and noisy: compare ratios, not absolutes){}",
        a.run.rounds,
        if all_ok { "" } else { "; a MISS is a target not met in this run" }
    );
    Ok(0)
}
