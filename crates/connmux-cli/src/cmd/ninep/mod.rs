//! `connmux 9p-server`: a 9P2000.L file server exporting one directory.
//!
//! [`fs`] resolves and operates on the export; [`serve`] is the handler and
//! the file-system threads; this module starts them on a connmux service.

pub mod fs;
pub mod loadtest;
pub mod serve;
pub mod users;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use connmux::service::{Service, ServiceConfig};
use connmux::{Mux, SockType};

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
    /// Requests waiting for a file-system thread, at most (bounds the memory
    /// they hold to this many times the message size limit).
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
    /// A positive value lets the small requests answered on the workers go
    /// first under CPU contention, but starves file I/O beside busy
    /// processes of the host.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    pub fs_nice: i32,
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
    // Descriptors: the soft limit raised to the hard one; open files and
    // fids' O_PATH handles take a quarter of it each, at most, so sockets
    // and the descriptors an operation opens for its length keep the rest.
    let limit = connmux_sys::fileserver::raise_nofile_limit().context("RLIMIT_NOFILE")?;
    let quarter = (limit / 4).max(16) as usize;
    let max_open = a.max_open.unwrap_or(quarter).max(1);
    let max_open_conn = a.max_open_conn.unwrap_or(max_open / 4).clamp(1, max_open);
    if (max_open as u64).saturating_mul(2) > limit {
        eprintln!("9p-server: --max-open {max_open} with a descriptor limit of {limit}: opens may meet EMFILE from the system before the budget");
    }
    let open_files = fs::Budget::new(max_open, max_open_conn);
    let handles = fs::Budget::new(quarter, max_open_conn.min(quarter));
    let opts = fs::Options { read_only: a.read_only, xattrs: !a.no_xattrs, open_files, handles };
    let export = Arc::new(fs::Export::open(&a.export, opts)?);
    let mux = Mux::new(a.common.mux_config()?)?;
    let threads = a.fs_threads.unwrap_or((a.common.worker_count() * 4).max(8)).max(1);
    // msize is capped by the largest message the parser accepts.
    let max_msize = a.common.max_msg.min(u32::MAX as usize) as u32;
    // Half: one connection (a kernel mount is one) keeps much of the
    // parallelism, and the other half is always left to the others.
    let share = a.fs_share.unwrap_or(threads / 2).max(1);
    let users = Arc::new(users::Users::for_this_process(a.squash_users)?);
    let who = match &*users {
        users::Users::Switch => "as each attach's user".to_string(),
        users::Users::Own { me, .. } => format!("as uid {} only", me.uid),
        users::Users::Squash { me } => format!("every attach as uid {}", me.uid),
    };
    let (handler, pool) = serve::NinepHandler::new(export.clone(), max_msize, a.fs_queue, a.max_fids, share, users);
    let mut senders = Vec::with_capacity(threads);
    for _ in 0..threads {
        let s = mux.socket(SockType::Dgram)?;
        // Only for sending: no request is steered here.
        s.set_recv_disable(true)?;
        s.set_sndbuf(usize::MAX / 4)?;
        s.set_write_timeout(Some(serve::SEND_TIMEOUT))?;
        senders.push(s);
    }
    let _ = pool.senders.set(senders);
    let _ = pool.mux.set(mux.clone());
    {
        let pool = pool.clone();
        std::thread::Builder::new().name("connmux-9p-waker".into()).spawn(move || pool.waker())?;
    }
    for i in 0..threads {
        let (pool, mux, nice) = (pool.clone(), mux.clone(), a.fs_nice);
        std::thread::Builder::new().name(format!("connmux-9p-fs{i}")).spawn(move || pool.run(i, mux, nice))?;
    }
    let cfg = ServiceConfig {
        listen: a.listen,
        sock_type: SockType::Dgram,
        parser: Arc::new(|| connmux::parsers::from_spec("9p").expect("built-in")),
    };
    let what = "9p-server";
    let tls = a.common.tls.config(a.listen, what)?;
    let svc = Arc::new(
        match &tls {
            None => Service::start(mux, cfg, handler.clone()),
            Some(t) => Service::start_tls(mux, cfg, handler.clone(), t.config.clone()),
        }
        .with_context(|| format!("starting {what} on {}", a.listen))?,
    );
    svc.set_max_conns((a.common.max_conns > 0).then_some(a.common.max_conns));
    {
        // Forget the state of connections that are gone.
        let (svc, h) = (Arc::downgrade(&svc), handler.clone());
        std::thread::Builder::new().name("connmux-9p-sweep".into()).spawn(move || {
            while let Some(svc) = svc.upgrade() {
                h.sweep(|| svc.mux().psocks());
                drop(svc);
                std::thread::sleep(Duration::from_secs(1));
            }
        })?;
    }
    let started = Instant::now();
    let snap = {
        let (svc, h) = (svc.clone(), handler.clone());
        Arc::new(move || snapshot(&svc, &h, started)) as Arc<dyn Fn() -> String + Send + Sync>
    };
    let endpoint = a.common.stats_endpoint(what, snap)?;
    println!(
        "{what} listening on {} exporting {} ({who}; {} workers, {threads} fs threads, {:?} driver){}",
        svc.local_addr(),
        export.path.display(),
        a.common.worker_count(),
        svc.mux().driver(),
        endpoint.as_ref().map(|e| format!("; statistics: connmux stat {}", e.path().display())).unwrap_or_default()
    );
    if let Some(t) = &tls {
        println!("{}", t.note);
    }
    let _ = std::io::Write::flush(&mut std::io::stdout());
    let report = || print!("{}", counters(&svc, &handler));
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
    print!("{}", counters(&svc, &handler));
    drop(endpoint);
    drop(tls);
    if stopped.forced() {
        std::process::exit(stopped.finish());
    }
    Ok(stopped.finish())
}

fn counters(svc: &Service, h: &serve::NinepHandler) -> String {
    let (st, n, x) = (svc.stats(), &h.stats, h.export());
    format!(
        "accepted={}\nclosed={}\nconnections={}\nrequests={}\nfs_thread_requests={}\nerrors={}\nflushes={}\nflushes_deferred={}\nreplies_dropped={}\npaused={}\nbad_messages={}\noverloads={}\nsend_failures={}\nopen_files={}\nmax_open={}\nopen_refused={}\nhandles={}\nfds={}\nfd_limit={}\n",
        st.accepted.load(Relaxed),
        st.closed.load(Relaxed),
        h.conns(),
        n.requests.load(Relaxed),
        n.to_pool.load(Relaxed),
        n.errors.load(Relaxed),
        n.flushes.load(Relaxed),
        n.flushes_deferred.load(Relaxed),
        n.replies_dropped.load(Relaxed),
        n.paused.load(Relaxed),
        n.bad_messages.load(Relaxed),
        n.overloads.load(Relaxed),
        n.send_failures.load(Relaxed),
        x.open_files.used(),
        x.open_files.max_total,
        x.open_files.refused.load(Relaxed),
        x.handles.used(),
        std::fs::read_dir("/proc/self/fd").map(|d| d.count()).unwrap_or(0),
        connmux_sys::fileserver::nofile_limit().unwrap_or(0),
    )
}

fn snapshot(svc: &Service, h: &serve::NinepHandler, started: Instant) -> String {
    format!(
        "9p-server pid={} listen={} uptime_s={:.1}\n{}\n{}\n{}",
        std::process::id(),
        svc.local_addr(),
        started.elapsed().as_secs_f64(),
        counters(svc, h),
        svc.mux().proc_kcm(),
        stat::format_mux_stats(svc.mux()),
    )
}
