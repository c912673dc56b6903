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
/// `MuxStats` and `PsockStats`), and the memory budget's parts
/// ([`MemParts`]).
pub fn format_mux_stats(mux: &Mux) -> String {
    let st = mux.stats();
    let parts = MemParts::of(st.mem_used, &mux.proc_kcm());
    let p = &st.psock;
    let mut out = mux.proc_kcm_stats();
    out.push('\n');
    let pairs: [(&str, u64); 35] = [
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
        ("mem_peak", st.mem_peak as u64),
        ("mem_sock_rx", parts.sock_rx as u64),
        ("mem_sock_tx", parts.sock_tx as u64),
        ("mem_psock_rx", parts.psock_rx as u64),
        ("mem_pauses", st.mem_pauses),
        ("mem_aborts", st.mem_aborts),
        ("idle_timeouts", st.idle_timeouts),
        ("handshake_timeouts", st.handshake_timeouts),
        // Connections found heavy or busy and moved to a heavy lane, back
        // with their workers, and lane replies posted without a wake-up.
        ("lane_moves", mux.lane_moves()),
        ("lane_returns", mux.lane_returns()),
        ("lane_quiet_replies", mux.lane_quiet_replies()),
        // Epoll workers' passes run by receiving application threads.
        ("led_passes", mux.led_passes()),
    ];
    for (k, v) in pairs {
        out.push_str(&format!("{k}={v}\n"));
    }
    out
}

/// What the memory budget (`mem_used`, against `--mem-limit`) holds, in
/// parts that add up to it. The library's statistics give the total
/// (`MuxStats::mem_used`); the sockets' queues are its `/proc/net/kcm`
/// view's `Rmem` and `Smem` columns (`Mux::proc_kcm`), as the budget counts
/// them. The rest is the connections' receive side, which the library
/// does not tell apart: assembly buffers as allocated, a message parsed and
/// not yet queued, what lies below the parser (TLS, io_uring buffers
/// spilled) and the hold queue.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemParts {
    /// Messages queued on the KCM sockets for the application (or the
    /// service's handler), bytes (`Rmem`).
    pub sock_rx: usize,
    /// Messages the sockets accepted and have not yet written (replies
    /// waiting for their connection, open messages), bytes (`Smem`).
    pub sock_tx: usize,
    /// The rest of `mem_used`: the connections' receive side.
    pub psock_rx: usize,
}

impl MemParts {
    /// The parts of `mem_used` from a `Mux::proc_kcm` text taken just after it.
    pub fn of(mem_used: usize, proc_kcm: &str) -> MemParts {
        let (mut sock_rx, mut sock_tx) = (0usize, 0usize);
        for l in proc_kcm.lines() {
            let cols: Vec<&str> = l.split_whitespace().collect();
            // kcm-N RX-Msgs RX-Bytes TX-Msgs TX-Bytes Recv-Q Rmem Send-Q Smem [status]
            if cols.len() >= 9 && cols[0].starts_with("kcm-") {
                sock_rx += cols[6].parse::<usize>().unwrap_or(0);
                sock_tx += cols[8].parse::<usize>().unwrap_or(0);
            }
        }
        MemParts { sock_rx, sock_tx, psock_rx: mem_used.saturating_sub(sock_rx + sock_tx) }
    }
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

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::net::{TcpListener, TcpStream};
    use std::time::{Duration, Instant};

    use super::{format_mux_stats, MemParts};

    fn counter(text: &str, name: &str) -> usize {
        text.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix('=')))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {text}"))
    }

    /// A real mux over loopback: one whole message queued on a socket and
    /// the start of another in assembly; the parts name each and add up to
    /// `mem_used`.
    #[test]
    fn the_memory_budget_is_shown_in_its_parts() {
        let mut c = connmux::Config::default();
        c.workers = 1;
        c.placement = connmux::Placement::Unpinned;
        c.driver = connmux::Driver::Epoll;
        let mux = connmux::Mux::new(c).unwrap();
        let sock = mux.socket(connmux::SockType::Dgram).unwrap();
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut peer = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (ours, _) = l.accept().unwrap();
        mux.attach(&ours, connmux::parsers::from_spec("l4").unwrap()).unwrap();
        let mut wire = 1000u32.to_be_bytes().to_vec();
        wire.resize(1004, 7);
        // The next message: 100,000 bytes announced, 5,000 sent.
        wire.extend_from_slice(&100_000u32.to_be_bytes());
        wire.resize(1004 + 4 + 5000, 9);
        peer.write_all(&wire).unwrap();
        let t0 = Instant::now();
        let text = loop {
            let text = format_mux_stats(&mux);
            let st = sock.stats().unwrap();
            if st.rx_queued == 1 && counter(&text, "mem_psock_rx") >= 5000 {
                break text;
            }
            assert!(t0.elapsed() < Duration::from_secs(10), "never queued and assembling: {text}");
            std::thread::sleep(Duration::from_millis(5));
        };
        let (rx, tx, ps) =
            (counter(&text, "mem_sock_rx"), counter(&text, "mem_sock_tx"), counter(&text, "mem_psock_rx"));
        assert!(rx >= 1004, "the queued message: {text}");
        assert_eq!(tx, 0, "nothing sent: {text}");
        assert_eq!(rx + tx + ps, counter(&text, "mem_used"), "{text}");
        drop(peer);
    }

    #[test]
    fn parts_are_read_from_the_sockets_lines() {
        let text = "\
*** KCM statistics (1 MUX) ****
Object         RX-Msgs    RX-Bytes         TX-Msgs    TX-Bytes         Recv-Q   Rmem     Send-Q   Smem     Status
mux                       3          300              2          200              -        -        -        -        KCMs: 2, Psocks 1
   kcm-0       1          100              1          100              1        120      1        64       RxWait
   kcm-1       2          200              1          100              0        0        2        300      
   psock-0     3          300              2          200              0        4096     0        0        RxWait
";
        assert_eq!(MemParts::of(10_000, text), MemParts { sock_rx: 120, sock_tx: 364, psock_rx: 10_000 - 484 });
        assert_eq!(MemParts::of(100, text).psock_rx, 0, "saturates when the two views were taken apart");
    }
}
