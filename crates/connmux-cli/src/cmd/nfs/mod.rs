//! `connmux nfs-server`: an NFS version 3 server (RFC 1813) exporting one
//! directory, with the MOUNT version 3 program on the same port.
//!
//! [`fs`] holds the export and its file handles; [`serve`] the handler on
//! the workers and the file-system threads; this module starts them on a
//! connmux service.

pub mod fs;
pub mod ids;
pub mod load;
pub mod serve;
pub mod udp;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use connmux::service::{Service, ServiceConfig};
use connmux::{Mux, SockType};

use crate::cmd::server::{udp_lines, wait_and_report, Common, UdpArgs};
use crate::cmd::{stat, stop};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The directory to export.
    #[arg(long)]
    pub export: PathBuf,
    /// Address to listen on: NFS (program 100003, version 3) and MOUNT
    /// (100005, version 3) on this one port (clients are given it as both
    /// their NFS and their mount port; nothing is registered with rpcbind).
    #[arg(short, long, default_value = "127.0.0.1:2049")]
    pub listen: SocketAddr,
    /// Refuse every change (NFS3ERR_ROFS).
    #[arg(long)]
    pub read_only: bool,
    /// Run each call as its AUTH_SYS caller (uid, gid, groups; AUTH_NONE
    /// calls as nobody, 65534). Needs the server to run as root. Without
    /// it every call runs as the server's own user.
    #[arg(long)]
    pub auth_sys: bool,
    /// With --auth-sys: calls from uid 0 run as nobody (65534).
    #[arg(long, requires = "auth_sys")]
    pub root_squash: bool,
    /// File-system threads: every procedure but NULL runs there
    /// (default: 4 per worker, at least 8).
    #[arg(long)]
    pub fs_threads: Option<usize>,
    /// Calls of one connection waiting for a file-system thread, at most; a call past it
    /// closes its connection (counted in `overloads`; the client reconnects
    /// and sends it again).
    #[arg(long, default_value_t = 1024)]
    pub fs_queue: usize,
    /// Calls of one connection with the file-system threads at a time, at
    /// most; the rest wait in the connection's own backlog (default: half
    /// of the threads, at least 1).
    #[arg(long)]
    pub fs_share: Option<usize>,
    /// (Over UDP every call runs on the UDP thread that took it, and READ,
    /// READDIR and READDIRPLUS counts are cut to fit a datagram: docs/nfs.md.)
    #[command(flatten)]
    pub udp: UdpArgs,
    #[command(flatten)]
    pub common: Common,
}

/// Bytes of the largest READ reply's data.
const RTMAX_BYTES: usize = serve::RTMAX as usize + 4096;

/// Largest WRITE the server takes (FSINFO's wtmax): a power of two that
/// fits in a message of `max_msg` bytes with its headers, at most 1 MiB.
pub fn wtmax(max_msg: usize) -> u32 {
    let room = max_msg.saturating_sub(1024).clamp(4096, 1 << 20);
    1 << (usize::BITS - 1 - room.leading_zeros())
}

pub fn run(a: Args) -> anyhow::Result<i32> {
    if a.common.engine != "connmux" {
        anyhow::bail!("nfs-server runs on the connmux runtime only (--engine connmux)");
    }
    if a.auth_sys {
        anyhow::ensure!(ids::is_root(), "--auth-sys: the server must run as root to take its callers' identities");
        ids::init()?;
    }
    let export = Arc::new(fs::Export::open(&a.export, a.read_only, a.auth_sys)?);
    // Messages and READ replies (up to 1 MiB) from the allocator's arenas,
    // as the RPC server's: no mapping, faults and unmapping per reply.
    crate::cmd::server::keep_message_buffers(a.common.max_msg.max(RTMAX_BYTES));
    let mux = Mux::new(a.common.mux_config()?)?;
    let threads = a.fs_threads.unwrap_or((a.common.worker_count() * 4).max(8)).max(1);
    let wt = wtmax(a.common.max_msg);
    let share = a.fs_share.unwrap_or(threads / 2).max(1);
    let identity = a.auth_sys.then_some(a.root_squash);
    let pool = connmux_fsd::Options {
        name: "connmux-nfs".into(),
        threads,
        queue: a.fs_queue,
        share,
        ..connmux_fsd::Options::default()
    };
    let handler = serve::NfsHandler::start(&mux, export.clone(), wt, identity, pool)?;
    let cfg = ServiceConfig {
        listen: a.listen,
        sock_type: SockType::Dgram,
        parser: Arc::new(|| connmux::parsers::from_spec("oncrpc").expect("built-in")),
    };
    let what = "nfs-server";
    let tls = a.common.tls.config(a.listen, what)?;
    let svc = Arc::new(
        match &tls {
            None => Service::start(mux, cfg, handler.clone()),
            Some(t) => Service::start_tls(mux, cfg, handler.clone(), t.config.clone()),
        }
        .with_context(|| format!("starting {what} on {}", a.listen))?,
    );
    svc.set_max_conns((a.common.max_conns > 0).then_some(a.common.max_conns));
    let udp_handler = Arc::new(udp::NfsUdp::new(handler.clone(), a.udp.udp_max));
    let udp_svc = a.udp.start(&a.common, svc.local_addr(), udp_handler)?.map(Arc::new);
    let started = Instant::now();
    let snap = {
        let (svc, h, x, u) = (svc.clone(), handler.clone(), export.clone(), udp_svc.clone());
        Arc::new(move || snapshot(&svc, &h, &x, started) + &u.as_deref().map(udp_lines).unwrap_or_default())
            as Arc<dyn Fn() -> String + Send + Sync>
    };
    let endpoint = a.common.stats_endpoint(what, snap)?;
    println!(
        "{what} listening on {} exporting {} ({} workers, {threads} fs threads, {share} a connection, wtmax {wt}, calls as {}, {:?} driver{}){}",
        svc.local_addr(),
        export.path.display(),
        a.common.worker_count(),
        match identity {
            None => "the server's user",
            Some(false) => "their AUTH_SYS caller",
            Some(true) => "their AUTH_SYS caller, root squashed",
        },
        svc.mux().driver(),
        if udp_svc.is_some() { "; UDP on the same port" } else { "" },
        endpoint.as_ref().map(|e| format!("; statistics: connmux stat {}", e.path().display())).unwrap_or_default()
    );
    if let Some(t) = &tls {
        println!("{}", t.note);
    }
    let _ = std::io::Write::flush(&mut std::io::stdout());
    let report =
        || print!("{}{}", counters(&svc, &handler, &export), udp_svc.as_deref().map(udp_lines).unwrap_or_default());
    let ending = wait_and_report(&a.common, report);
    let stopped = stop::drain(
        what,
        ending,
        &a.common.stop,
        || svc.stop_accepting(),
        || {
            let s = svc.mux().stats();
            stop::Progress { open: s.psocks as u64, moved: s.rx_bytes + s.tx_bytes }
        },
    );
    report();
    drop(endpoint);
    if let Some(u) = udp_svc.and_then(|u| Arc::try_unwrap(u).ok()) {
        u.shutdown();
    }
    // The file-system threads (and the waker) end and are joined.
    handler.pool().stop();
    drop(tls);
    if stopped.forced() {
        std::process::exit(stopped.finish());
    }
    Ok(stopped.finish())
}

fn counters(svc: &Service, h: &serve::NfsHandler, x: &fs::Export) -> String {
    let (st, n, p) = (svc.stats(), &h.stats, &h.pool().stats);
    let mut procs = String::new();
    for (i, c) in n.procs.iter().enumerate() {
        let c = c.load(Relaxed);
        if c > 0 {
            procs.push_str(&format!("nfs_{}={c}\n", connmux_nfs::proc_name(i as u32).to_ascii_lowercase()));
        }
    }
    format!(
        "accepted={}\nclosed={}\nconnections={}\ncalls={}\nmount_calls={}\n{procs}nfs_errors={}\ngarbage_args={}\nbad_calls={}\noverloads={}\npaused={}\nsend_waits={}\nsend_failures={}\nbad_handles={}\nstale_handles={}\nhandle_searches={}\nreads_on_workers={}\nread_bytes={}\nwrite_bytes={}\n",
        st.accepted.load(Relaxed),
        st.closed.load(Relaxed),
        h.conns(),
        n.calls.load(Relaxed),
        n.mount_calls.load(Relaxed),
        n.nfs_errors.load(Relaxed),
        n.garbage_args.load(Relaxed),
        n.bad_calls.load(Relaxed),
        p.overloads.load(Relaxed),
        p.paused.load(Relaxed),
        p.send_waits.load(Relaxed),
        p.send_failures.load(Relaxed),
        n.bad_handles.load(Relaxed),
        n.stale_handles.load(Relaxed),
        x.searches.load(Relaxed),
        n.reads_on_workers.load(Relaxed),
        n.read_bytes.load(Relaxed),
        n.write_bytes.load(Relaxed),
    )
}

fn snapshot(svc: &Service, h: &serve::NfsHandler, x: &fs::Export, started: Instant) -> String {
    format!(
        "nfs-server pid={} listen={} uptime_s={:.1}\n{}\n{}\n{}",
        std::process::id(),
        svc.local_addr(),
        started.elapsed().as_secs_f64(),
        counters(svc, h, x),
        svc.mux().proc_kcm(),
        stat::format_mux_stats(svc.mux()),
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn wtmax_is_a_power_of_two_that_fits() {
        assert_eq!(super::wtmax(1 << 20), 512 << 10);
        assert_eq!(super::wtmax((1 << 20) + 1024), 1 << 20);
        assert_eq!(super::wtmax(64 << 20), 1 << 20);
        assert_eq!(super::wtmax(100), 4096);
    }
}
