//! `connmux stat`: the statistics of running connmux servers, as
//! `/proc/net/kcm` and `/proc/net/kcm_stats` show them for the kernel's KCM.
//!
//! Each server started by this command listens on a Unix socket (by default
//! `$XDG_RUNTIME_DIR/connmux/` or `/tmp/connmux-<uid>/`, named
//! `<server>-<pid>.sock`) and answers every connection with a snapshot of its
//! counters, then closes it. `connmux stat` with no argument reads every such
//! socket in the default directory; with paths, those.

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use connmux::Mux;

#[derive(clap::Args, Debug)]
#[command(after_help = "\
Exit status:
  0  every server listed answered
  1  a server listed could not be reached (each is named on standard error),
     or none was found, or standard output could not be written (the error
     is named on standard error; a reader that left, as `| head` does, ends
     it quietly by SIGPIPE instead)")]
pub struct Args {
    /// Statistics sockets of running servers (default: every one in the
    /// default directory).
    pub sockets: Vec<PathBuf>,
}

/// The directory where servers put their statistics sockets by default.
pub fn default_dir() -> PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d).join("connmux"),
        _ => std::env::temp_dir().join(format!("connmux-{}", uid())),
    }
}

fn uid() -> u32 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").map(|m| m.uid()).unwrap_or(0)
}

/// A statistics socket served by a background thread; removed on drop.
pub struct StatsEndpoint {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl StatsEndpoint {
    /// Listen on `path` (its directory is created) and answer each connection
    /// with `snapshot()`.
    pub fn start(path: PathBuf, snapshot: Arc<dyn Fn() -> String + Send + Sync>) -> anyhow::Result<StatsEndpoint> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        // A socket file left by a process that died would refuse the bind.
        if path.exists() && UnixStream::connect(&path).is_err() {
            let _ = std::fs::remove_file(&path);
        }
        let listener = UnixListener::bind(&path).with_context(|| format!("binding {}", path.display()))?;
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let thread = std::thread::Builder::new().name("connmux-stats".into()).spawn(move || {
            while !stop2.load(Ordering::Acquire) {
                match listener.accept() {
                    Ok((mut conn, _)) => {
                        let _ = conn.set_nonblocking(false);
                        let _ = conn.set_write_timeout(Some(Duration::from_secs(2)));
                        let _ = conn.write_all(snapshot().as_bytes());
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        })?;
        Ok(StatsEndpoint { path, stop, thread: Some(thread) })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for StatsEndpoint {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The library's `/proc/net/kcm_stats`-style table of `mux`, then every
/// counter as `name=value` (greppable; the names are the fields of
/// `MuxStats` and `PsockStats`).
pub fn format_mux_stats(mux: &Mux) -> String {
    let st = mux.stats();
    let p = &st.psock;
    let mut out = mux.proc_kcm_stats();
    out.push('\n');
    let pairs: [(&str, u64); 33] = [
        ("rx_msgs", st.rx_msgs),
        ("rx_bytes", st.rx_bytes),
        ("tx_msgs", st.tx_msgs),
        ("tx_bytes", st.tx_bytes),
        ("tx_retries", st.tx_retries),
        ("psock_attach", st.psock_attach),
        ("psock_unattach", st.psock_unattach),
        ("psock_unattach_rsvd", st.psock_unattach_rsvd),
        ("rx_ready_drops", st.rx_ready_drops),
        ("kcms", st.kcms as u64),
        ("psocks", st.psocks as u64),
        ("rx_aborts", p.rx_aborts),
        ("rx_interrupted", p.rx_interrupted),
        ("rx_unrecov_intr", p.rx_unrecov_intr),
        ("rx_mem_fail", p.rx_mem_fail),
        ("rx_need_more_hdr", p.rx_need_more_hdr),
        ("rx_bad_hdr_len", p.rx_bad_hdr_len),
        ("rx_msg_too_big", p.rx_msg_too_big),
        ("rx_msg_timeouts", p.rx_msg_timeouts),
        ("tx_aborts", p.tx_aborts),
        ("tx_addressed_drops", p.tx_addressed_drops),
        ("tx_backlog_refusals", p.tx_backlog_refusals),
        ("mem_used", st.mem_used as u64),
        ("mem_pauses", st.mem_pauses),
        ("mem_aborts", st.mem_aborts),
        ("idle_timeouts", st.idle_timeouts),
        ("handshake_timeouts", st.handshake_timeouts),
        ("leases", st.leases),
        ("lease_returns", st.lease_returns),
        ("lease_backlogs", st.lease_backlogs),
        // Connections found heavy or busy and moved to a heavy lane, back
        // with their workers, and lane replies posted without a wake-up.
        ("lane_moves", mux.lane_moves()),
        ("lane_returns", mux.lane_returns()),
        ("lane_quiet_replies", mux.lane_quiet_replies()),
    ];
    for (k, v) in pairs {
        out.push_str(&format!("{k}={v}\n"));
    }
    out
}

/// One server's snapshot.
pub fn read_one(path: &Path) -> anyhow::Result<String> {
    let mut c = UnixStream::connect(path).with_context(|| format!("connecting to {}", path.display()))?;
    c.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut s = String::new();
    c.read_to_string(&mut s).with_context(|| format!("reading {}", path.display()))?;
    Ok(s)
}

pub fn run(a: Args) -> anyhow::Result<i32> {
    let paths: Vec<PathBuf> = if a.sockets.is_empty() {
        let dir = default_dir();
        let mut v: Vec<PathBuf> = match std::fs::read_dir(&dir) {
            Ok(rd) => rd
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "sock"))
                .collect(),
            Err(_) => Vec::new(),
        };
        v.sort();
        if v.is_empty() {
            eprintln!("connmux stat: no running connmux server found in {}", dir.display());
            return Ok(EXIT_UNREACHABLE);
        }
        v
    } else {
        a.sockets
    };
    let mut unreachable = Vec::new();
    let mut out = std::io::stdout().lock();
    for p in &paths {
        match read_one(p) {
            Ok(text) => {
                if let Err(e) = write!(out, "==> {} <==\n{text}\n", p.display()).and_then(|()| out.flush()) {
                    return Ok(stdout_failed(&e));
                }
            }
            Err(e) => {
                eprintln!("connmux stat: {e:#}");
                unreachable.push(p);
            }
        }
    }
    if unreachable.is_empty() {
        return Ok(0);
    }
    // Named again at the end, where a long listing does not hide them.
    eprintln!(
        "connmux stat: {} of {} server(s) could not be reached (not running? a socket left by a \
         server that was killed): {}",
        unreachable.len(),
        paths.len(),
        unreachable.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
    );
    Ok(EXIT_UNREACHABLE)
}

/// What a failed write of the listing means: a reader that left wanted no
/// more (the process ends quietly, as `SIGPIPE` ends `cat`:
/// `crate::cmd::pipe`); any other error (a full disk, `/dev/full`) is
/// named, with status 1.
fn stdout_failed(e: &std::io::Error) -> i32 {
    if e.kind() == std::io::ErrorKind::BrokenPipe && crate::cmd::pipe::closed() {
        crate::cmd::pipe::die();
    }
    eprintln!("connmux stat: writing to standard output: {e}");
    EXIT_UNREACHABLE
}

/// Exit status when a server could not be reached (or none was found).
pub const EXIT_UNREACHABLE: i32 = 1;
