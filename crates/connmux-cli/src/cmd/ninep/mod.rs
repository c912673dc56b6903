//! `connmux 9p-server`: a 9P2000.L file server exporting one directory,
//! the `connmux-9p-server` library behind command-line flags.

pub mod loadtest;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use connmux::Mux;
use connmux_9p_server::{Config, Server, Users};

use crate::cmd::server::{wait_and_report, Common};
use crate::cmd::{stat, stop};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The directory to export.
    #[arg(long)]
    pub export: PathBuf,
    /// Address to listen on.
    #[arg(short, long, default_value = "127.0.0.1:5640")]
    pub listen: SocketAddr,
    /// Refuse every change (EROFS).
    #[arg(long)]
    pub read_only: bool,
    /// File-system threads: requests that may wait on the disk run there
    /// (default: 4 per worker, at least 8).
    #[arg(long)]
    pub fs_threads: Option<usize>,
    /// Requests of one connection waiting for a file-system thread, at most
    /// (more close the connection; bounds the memory they hold to this many
    /// times the message size limit).
    #[arg(long, default_value_t = 256)]
    pub fs_queue: usize,
    /// Most fids one connection may hold. A fid that is not open holds no
    /// descriptor of its own beyond the handle budget (about 200 bytes of
    /// memory each).
    #[arg(long, default_value_t = 131_072)]
    pub max_fids: usize,
    /// Files and directories open at once (Tlopen, Tlcreate), in all;
    /// beyond it an open is answered ENFILE [default: a quarter of the
    /// descriptor limit, which the server raises to its hard limit].
    #[arg(long)]
    pub max_open: Option<usize>,
    /// Files and directories one connection may have open at once; beyond
    /// it an open is answered EMFILE [default: a quarter of --max-open].
    #[arg(long)]
    pub max_open_conn: Option<usize>,
    /// Requests of one connection with the file-system threads at a time,
    /// at most; the rest wait in the connection's own backlog (default:
    /// half of the threads, at least 1).
    #[arg(long)]
    pub fs_share: Option<usize>,
    /// Nice steps of the file-system threads below the workers (0: none).
    /// Positive: the small requests answered on the workers go first
    /// under CPU contention (a burst of walks from many connections leaves
    /// a reader its rate); a large value starves file I/O beside busy
    /// processes of the host.
    #[arg(long, default_value_t = Config::default().fs_nice, allow_negative_numbers = true)]
    pub fs_nice: i32,
    /// The scheduler slice of the file-system threads, in µs (Linux 6.12
    /// and later; 0: the kernel's). Short, so that a thread woken for a
    /// request cuts in soon on a busy CPU despite its nice value.
    #[arg(long, default_value_t = Config::default().fs_slice.as_micros() as u64)]
    pub fs_slice_us: u64,
    /// Answer Txattrwalk and Txattrcreate with EOPNOTSUPP (by default
    /// `user.*` attributes and POSIX ACLs are served).
    #[arg(long)]
    pub no_xattrs: bool,
    /// Serve every attach as this server's own user, whoever it names.
    /// Without it, a server run as root does each attach's file operations
    /// as the user the attach names (`n_uname`, else `uname`), and one run
    /// as another user refuses attaches as anyone but itself (EPERM).
    #[arg(long)]
    pub squash_users: bool,
    #[command(flatten)]
    pub common: Common,
}

pub fn run(a: Args) -> anyhow::Result<i32> {
    if a.common.engine != "connmux" {
        anyhow::bail!("9p-server runs on the connmux runtime only (--engine connmux)");
    }
    let mux = Mux::new(a.common.mux_config()?)?;
    let what = "9p-server";
    let tls = a.common.tls.config(a.listen, what)?;
    let cfg = Config {
        export: a.export.clone(),
        listen: a.listen,
        read_only: a.read_only,
        xattrs: !a.no_xattrs,
        fs_threads: a.fs_threads.unwrap_or((a.common.worker_count() * 4).max(8)).max(1),
        fs_queue: a.fs_queue,
        fs_share: a.fs_share,
        fs_nice: a.fs_nice,
        fs_slice: std::time::Duration::from_micros(a.fs_slice_us),
        max_fids: a.max_fids,
        max_open: a.max_open,
        max_open_conn: a.max_open_conn,
        // msize is capped by the largest message the parser accepts.
        max_msize: a.common.max_msg.min(u32::MAX as usize) as u32,
        squash_users: a.squash_users,
        raise_fd_limit: true,
        tls: tls.as_ref().map(|t| t.config.clone()),
    };
    let server = Arc::new(
        Server::start(mux, cfg)
            .with_context(|| format!("starting {what} on {} exporting {}", a.listen, a.export.display()))?,
    );
    let x = server.export();
    if x.open_files.max_total.saturating_mul(2) as u64 > connmux_sys::fileserver::nofile_limit().unwrap_or(0) {
        eprintln!(
            "9p-server: --max-open {} with a descriptor limit of {}: opens may meet EMFILE from the system before the budget",
            x.open_files.max_total,
            connmux_sys::fileserver::nofile_limit().unwrap_or(0)
        );
    }
    let who = match server.users() {
        Users::Switch => "as each attach's user".to_string(),
        Users::Own { me, .. } => format!("as uid {} only", me.uid),
        Users::Squash { me } => format!("every attach as uid {}", me.uid),
    };
    let started = Instant::now();
    let snap = {
        let s = server.clone();
        Arc::new(move || snapshot(&s, started)) as Arc<dyn Fn() -> String + Send + Sync>
    };
    let endpoint = a.common.stats_endpoint(what, snap)?;
    println!(
        "{what} listening on {} exporting {} ({who}; {} workers, {} fs threads, {:?} driver){}",
        server.local_addr(),
        x.path.display(),
        a.common.worker_count(),
        server.fs_threads(),
        server.service().mux().driver(),
        endpoint.as_ref().map(|e| format!("; statistics: connmux stat {}", e.path().display())).unwrap_or_default()
    );
    if let Some(t) = &tls {
        println!("{}", t.note);
    }
    let _ = std::io::Write::flush(&mut std::io::stdout());
    let report = || print!("{}", server.counters());
    let ending = wait_and_report(&a.common, report);
    let stopped = stop::drain(
        what,
        ending,
        &a.common.stop,
        || server.stop_accepting(),
        || {
            let s = server.service().mux().stats();
            stop::Progress { open: s.psocks as u64, moved: s.rx_bytes + s.tx_bytes }
        },
    );
    print!("{}", server.counters());
    drop(endpoint);
    drop(tls);
    if stopped.forced() {
        std::process::exit(stopped.finish());
    }
    Ok(stopped.finish())
}

fn snapshot(s: &Server, started: Instant) -> String {
    format!(
        "9p-server pid={} listen={} uptime_s={:.1}\n{}\n{}\n{}",
        std::process::id(),
        s.local_addr(),
        started.elapsed().as_secs_f64(),
        s.counters(),
        s.service().mux().proc_kcm(),
        stat::format_mux_stats(s.service().mux()),
    )
}
