//! `connmux bench nfs`: `connmux nfs-server` beside nfs-ganesha 4.3 with
//! FSAL_VFS (Debian's `nfs-ganesha nfs-ganesha-vfs`) on the same export and
//! CPUs, under the same loads from `connmux rpctest --proc`, in interleaved
//! rounds: GETATTR at -j1 -a1 and -j8 -a16, 4 KiB READs at -j8 -a16, 1 MiB
//! READs and WRITEs (bytes/s), 4 KiB WRITEs.
//!
//! ganesha registers with rpcbind and will not start without one: when
//! nothing answers on 127.0.0.1:111 the benchmark starts `rpcbind -f -w`
//! for its run and stops it after. ganesha listens on 127.0.0.1 with NFS and
//! MOUNT on ports of their own (NLM, RQUOTA, UDP off), exports the directory
//! with `Squash = No_Root_Squash`, and is reached with AUTH_SYS as the
//! caller (`-A sys`, which it requires); the nfs-server is given the same
//! calls. Both offer 1 MiB reads and writes (the nfs-server with
//! `--max-msg 1126400`). The WRITEs are UNSTABLE, at offset 0 of one file
//! per server.

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
    /// A smoke run: two rounds of 0.3 s.
    #[arg(long)]
    pub quick: bool,
}

const MIB: u64 = 1 << 20;

/// A load: rpctest arguments, bytes per call (for bytes/s), and its target.
struct Load {
    name: &'static str,
    args: Vec<String>,
    bytes: u64,
    /// The least ratio to ganesha the issue asks for, if any.
    target: Option<f64>,
}

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

fn loads() -> Vec<Load> {
    let l = |name, args: &[&str], bytes, target| Load { name, args: s(args), bytes, target };
    vec![
        l("getattr -j1 -a1", &["--proc", "getattr", "--file", "small", "-j", "1", "-a", "1"], 0, None),
        l("getattr -j8 -a16", &["--proc", "getattr", "--file", "small", "-j", "8", "-a", "16"], 0, Some(3.0)),
        l(
            "read 4 KiB -j8 -a16",
            &["--proc", "read", "--file", "big", "--size", "4096", "-j", "8", "-a", "16"],
            4096,
            Some(2.0),
        ),
        l(
            "read 1 MiB -j1 -a1",
            &["--proc", "read", "--file", "big", "--size", "1M", "-j", "1", "-a", "1"],
            MIB,
            Some(1.0),
        ),
        l("read 1 MiB -j4 -a2", &["--proc", "read", "--file", "big", "--size", "1M", "-j", "4", "-a", "2"], MIB, None),
        l(
            "write 4 KiB -j8 -a16",
            &["--proc", "write", "--file", "w4k", "--size", "4096", "-j", "8", "-a", "16"],
            4096,
            None,
        ),
        l(
            "write 1 MiB -j1 -a1",
            &["--proc", "write", "--file", "w1m", "--size", "1M", "-j", "1", "-a", "1"],
            MIB,
            Some(1.0),
        ),
    ]
}

/// The export: a small file and an 8 MiB one.
fn make_export() -> anyhow::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("connmux-bench-nfs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::write(dir.join("small"), b"small file\n")?;
    let mut big = vec![0u8; 8 * MIB as usize];
    SmallRng::seed_from_u64(0x9e37_79b9).fill_bytes(&mut big);
    std::fs::write(dir.join("big"), big)?;
    Ok(dir)
}

struct Server {
    proc: Proc,
    /// rpctest arguments to reach it.
    extra: Vec<String>,
}

fn start_connmux(p: &super::rpc::Placement, dir: &Path) -> anyhow::Result<Server> {
    let port = free_port()?;
    let mut c = taskset(&p.cpus, exe()?);
    c.args(["nfs-server", "--export"]).arg(dir);
    c.args(["-l", &format!("127.0.0.1:{port}"), "--workers", &p.cpus.len().to_string()]).args([
        "--cpus",
        &cpu_list(&p.cpus),
        "--max-msg",
        "1126400",
        "--no-stats-socket",
    ]);
    let extra = vec!["-A".into(), "sys".into(), "--mount".into(), dir.display().to_string()];
    Ok(Server { proc: Proc::spawn("nfs-server", c, port)?, extra })
}

/// ganesha's configuration: NFS and MOUNT on loopback ports, v3 over TCP only.
fn ganesha_conf(dir: &Path, nfs: u16, mnt: u16, nlm: u16, rq: u16) -> String {
    format!(
        "NFS_CORE_PARAM {{\n NFS_Port = {nfs};\n MNT_Port = {mnt};\n NLM_Port = {nlm};\n Rquota_Port = {rq};\n \
         Bind_addr = 127.0.0.1;\n Protocols = 3;\n Enable_NLM = false;\n Enable_RQUOTA = false;\n Enable_UDP = false;\n}}\n\
         NFS_KRB5 {{ Active_krb5 = false; }}\n\
         EXPORT {{\n Export_Id = 1;\n Path = {d};\n Pseudo = {d};\n Access_Type = RW;\n Squash = No_Root_Squash;\n \
         Protocols = 3;\n Transports = TCP;\n SecType = sys;\n FSAL {{ Name = VFS; }}\n}}\n\
         LOG {{ Default_Log_Level = WARN; }}\n",
        d = dir.display()
    )
}

fn start_ganesha(p: &super::rpc::Placement, dir: &Path, work: &Path) -> anyhow::Result<Server> {
    let (nfs, mnt, nlm, rq) = (free_port()?, free_port()?, free_port()?, free_port()?);
    let conf = work.join("ganesha.conf");
    std::fs::write(&conf, ganesha_conf(dir, nfs, mnt, nlm, rq))?;
    let mut c = Command::new("taskset");
    c.arg("-c").arg(cpu_list(&p.cpus)).arg("ganesha.nfsd").args(["-F", "-f"]).arg(&conf);
    c.arg("-L").arg(work.join("ganesha.log")).arg("-p").arg(work.join("ganesha.pid")).args(["-N", "NIV_WARN"]);
    let extra = vec![
        "-A".into(),
        "sys".into(),
        "--mount".into(),
        dir.display().to_string(),
        "--mount-port".into(),
        mnt.to_string(),
    ];
    let proc = Proc::spawn_within("ganesha", c, nfs, std::time::Duration::from_secs(60))
        .with_context(|| format!("ganesha did not start; its log: {}", work.join("ganesha.log").display()))?;
    Ok(Server { proc, extra })
}

/// An rpcbind of our own, stopped when dropped (whatever went wrong).
struct OwnRpcbind(std::process::Child);

impl Drop for OwnRpcbind {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// rpcbind for ganesha: none needed when one answers; else one of our own.
fn ensure_rpcbind() -> anyhow::Result<Option<OwnRpcbind>> {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], 111));
    if std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_millis(300)).is_ok() {
        return Ok(None);
    }
    let child = Command::new("rpcbind")
        .args(["-f", "-w"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .context("starting rpcbind (Debian package rpcbind) for ganesha")?;
    let child = OwnRpcbind(child);
    let t0 = std::time::Instant::now();
    while std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_millis(200)).is_err() {
        anyhow::ensure!(t0.elapsed() < std::time::Duration::from_secs(10), "rpcbind did not start listening");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    Ok(Some(child))
}

pub fn run(mut a: Args) -> anyhow::Result<i32> {
    if a.quick {
        a.run = Rounds::quick(2);
    }
    a.run.check()?;
    if !super::on_path("ganesha.nfsd") {
        println!(
            "connmux bench nfs: nfs-ganesha is not installed (Debian packages nfs-ganesha nfs-ganesha-vfs): skipped"
        );
        return Ok(0);
    }
    let p = placement(&a.placement)?;
    let dir = make_export()?;
    let work = dir.with_extension("ganesha");
    std::fs::create_dir_all(&work)?;
    let rpcbind = ensure_rpcbind()?;
    let loads = loads();
    let servers = [start_connmux(&p, &dir)?, start_ganesha(&p, &dir, &work)?];
    println!(
        "connmux bench nfs: nfs-server vs nfs-ganesha (FSAL_VFS) over loopback, CPUs {} for servers and load; \
         {} round(s) of {} s, interleaved; medians over rounds; load avg {}",
        cpu_list(&p.cpus),
        a.run.rounds,
        a.run.seconds,
        loadavg()
    );
    let mut results: Vec<[Vec<Figures>; 2]> = (0..loads.len()).map(|_| [Vec::new(), Vec::new()]).collect();
    let outcome = (|| -> anyhow::Result<()> {
        for round in 0..a.run.rounds {
            for (li, l) in loads.iter().enumerate() {
                for k in 0..2 {
                    let which = (k + round + li) % 2;
                    let srv = &servers[which];
                    let mut args = l.args.clone();
                    args.extend(["-d".into(), a.run.seconds.to_string()]);
                    args.extend(srv.extra.iter().cloned());
                    let f = loadgen("rpctest", &[], &p.cpus, &args, srv.proc.addr)
                        .with_context(|| format!("round {} {} against {}", round + 1, l.name, srv.proc.name))?;
                    results[li][which].push(f);
                }
            }
            eprintln!("bench nfs: round {}/{} done (load avg {})", round + 1, a.run.rounds, loadavg());
        }
        Ok(())
    })();
    drop(servers);
    drop(rpcbind);
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&work);
    outcome?;
    println!();
    println!(
        "{:<24} {:>14} {:>14} {:>7} {:>10} {:>10} {:>7}  target",
        "load", "connmux", "ganesha", "ratio", "cm p99", "gan p99", "ratio"
    );
    let mut all_ok = true;
    for (li, l) in loads.iter().enumerate() {
        let c = Figures::median_of(&results[li][0]);
        let g = Figures::median_of(&results[li][1]);
        let (cr, gr, unit) = if l.bytes >= MIB {
            (c.rate * l.bytes as f64 / MIB as f64, g.rate * l.bytes as f64 / MIB as f64, "MiB/s")
        } else {
            (c.rate, g.rate, "ops/s")
        };
        let target = match l.target {
            Some(t) => {
                let ok = cr >= t * gr;
                all_ok &= ok;
                format!("{} >= {t:.1}x ganesha: {}", if l.bytes >= MIB { "bytes/s" } else { "ops/s" }, verdict(ok))
            }
            None => String::new(),
        };
        println!(
            "{:<24} {:>8.0} {:<5} {:>8.0} {:<5} {:>7} {:>10.1} {:>10.1} {:>7}  {}",
            l.name,
            cr,
            unit,
            gr,
            unit,
            ratio(cr, gr),
            c.p99_us,
            g.p99_us,
            ratio(c.p99_us, g.p99_us),
            target
        );
    }
    println!(
        "(rates and p99 RTT in µs are medians over {} rounds; the machine is shared and noisy: compare ratios, \
         not absolutes){}",
        a.run.rounds,
        if all_ok { "" } else { "; a MISS is a target not met in this run" }
    );
    Ok(0)
}
