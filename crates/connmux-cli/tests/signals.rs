//! Stopping the servers with signals, `connmux stat` against servers that are
//! gone, a closed standard output, and `connmux parse` on inputs that are not
//! what they claim: the `connmux` binary as a user runs it, real TCP on
//! loopback, real signals.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use connmux_sys::signal;

const BIN: &str = env!("CARGO_BIN_EXE_connmux");

/// A scratch directory of this test process, removed on drop.
struct Scratch(PathBuf);
impl Scratch {
    fn new(name: &str) -> Scratch {
        let d = std::env::temp_dir().join(format!("connmux-signals-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Scratch(d)
    }
}
impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A server subprocess whose standard output is collected line by line;
/// killed on drop if still running.
struct Server {
    child: Child,
    addr: SocketAddr,
    socket: PathBuf,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Server {
    /// `connmux <args> -l 127.0.0.1:0 --stats-socket DIR/s.sock`, with DIR
    /// as its `XDG_RUNTIME_DIR` (where files at default places go); waits
    /// for the listening line.
    fn start(args: &[&str], dir: &Path) -> Server {
        let socket = dir.join("s.sock");
        let mut child = Command::new(BIN)
            .env("XDG_RUNTIME_DIR", dir)
            .args(args)
            // Unpinned: tests run side by side, and every server pinned to
            // CPU 0 would starve the others.
            .args(["-l", "127.0.0.1:0", "--no-pin", "--stats-socket"])
            .arg(&socket)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn connmux");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let out = child.stdout.take().unwrap();
        let l2 = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                l2.lock().unwrap().push(line);
            }
        });
        let mut s = Server { child, addr: SocketAddr::from(([0, 0, 0, 0], 0)), socket, lines };
        let first = s.wait_line("listening on", Duration::from_secs(20));
        s.addr = first
            .split_whitespace()
            .find_map(|w| w.trim_end_matches(',').parse::<SocketAddr>().ok())
            .unwrap_or_else(|| panic!("no address in {first:?}"));
        s
    }

    /// The first line containing `what`, waiting at most `limit`.
    fn wait_line(&self, what: &str, limit: Duration) -> String {
        let start = Instant::now();
        loop {
            if let Some(l) = self.lines.lock().unwrap().iter().find(|l| l.contains(what)) {
                return l.clone();
            }
            assert!(
                start.elapsed() < limit,
                "no line with {what:?} within {limit:?}; output: {:?}",
                self.lines.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn signal(&self, sig: i32) {
        signal::kill(self.child.id(), sig).unwrap();
    }

    /// Wait at most `limit` for the exit.
    fn wait_exit(&mut self, limit: Duration) -> ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st;
            }
            assert!(start.elapsed() < limit, "still running after {limit:?}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Standard output so far (the reader thread ends with the process, but
    /// may lag it by a moment).
    fn output_with(&self, what: &str) -> String {
        self.wait_line(what, Duration::from_secs(5));
        self.lines.lock().unwrap().join("\n")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One NULL call record (NFS v3, AUTH_NONE) with the last-fragment mark.
fn null_call(xid: u32) -> Vec<u8> {
    let mut body = Vec::new();
    for w in [xid, 0, 2, 100_003, 3, 0, 0, 0, 0, 0] {
        body.extend_from_slice(&w.to_be_bytes());
    }
    let mut rec = (0x8000_0000u32 | body.len() as u32).to_be_bytes().to_vec();
    rec.extend_from_slice(&body);
    rec
}

/// The request a client sends and the reply length it reads back.
#[derive(Clone, Copy)]
enum Service {
    /// A NULL call; the accepted reply is 28 bytes with its mark.
    Rpc,
    /// `echo-server --mode bytes`: what goes out comes back.
    EchoBytes,
}

impl Service {
    fn request(self, i: u32) -> Vec<u8> {
        match self {
            Service::Rpc => null_call(i),
            Service::EchoBytes => i.to_be_bytes().to_vec(),
        }
    }
    fn reply_len(self) -> usize {
        match self {
            Service::Rpc => 28,
            Service::EchoBytes => 4,
        }
    }
}

/// Clients calling one request at a time, a call every millisecond or so,
/// until the server closes the connection or `stop` is set; `answered`
/// counts the replies. Paced: steady traffic without taking the CPUs from
/// the tests beside.
struct Load {
    stop: Arc<AtomicBool>,
    answered: Arc<AtomicU64>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Load {
    fn start(addr: SocketAddr, service: Service, clients: usize) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let answered = Arc::new(AtomicU64::new(0));
        let threads = (0..clients)
            .map(|_| {
                let (stop, answered) = (stop.clone(), answered.clone());
                let mut c = TcpStream::connect(addr).unwrap();
                c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
                std::thread::spawn(move || {
                    let mut buf = vec![0u8; service.reply_len()];
                    let mut i = 0u32;
                    while !stop.load(Ordering::Relaxed) {
                        i = i.wrapping_add(1);
                        if c.write_all(&service.request(i)).is_err() || c.read_exact(&mut buf).is_err() {
                            return;
                        }
                        answered.fetch_add(1, Ordering::Relaxed);
                        std::thread::sleep(Duration::from_millis(1));
                    }
                })
            })
            .collect();
        Load { stop, answered, threads }
    }

    /// Wait (bounded) until the replies pass `n`.
    fn wait_answered_past(&self, n: u64, limit: Duration) {
        let start = Instant::now();
        while self.answered.load(Ordering::Relaxed) <= n {
            assert!(start.elapsed() < limit, "replies stayed at {n} for {limit:?}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Wait (bounded) until a new connection to `addr` is refused.
fn wait_refused(addr: SocketAddr, limit: Duration) {
    let start = Instant::now();
    loop {
        match TcpStream::connect_timeout(&addr, Duration::from_millis(500)) {
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => return,
            _ => {}
        }
        assert!(start.elapsed() < limit, "{addr} still accepts connections after {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// SIGTERM while clients keep calling: the server stops accepting, goes on
/// answering the connections it has until the grace time is over, then
/// prints its totals, removes its statistics socket and exits 0.
fn sigterm_under_load(args: &[&str], service: Service, name: &str) {
    let dir = Scratch::new(name);
    // Its last tenth (250 ms here) is what the server keeps for closing.
    let grace_ms = 3000u64;
    let mut a = args.to_vec();
    let grace = grace_ms.to_string();
    a.extend(["--grace-ms", &grace]);
    let mut s = Server::start(&a, &dir.0);
    assert!(s.socket.exists(), "{name}: statistics socket {}", s.socket.display());
    let load = Load::start(s.addr, service, 4);
    load.wait_answered_past(200, Duration::from_secs(20));

    let signalled = Instant::now();
    s.signal(libc::SIGTERM);
    s.wait_line("SIGTERM: stopping", Duration::from_secs(5));
    // In flight: the connections it has are still answered...
    let at_signal = load.answered.load(Ordering::Relaxed);
    load.wait_answered_past(at_signal + 100, Duration::from_millis(grace_ms));
    // ...and new ones are not accepted.
    wait_refused(s.addr, Duration::from_millis(grace_ms));

    let st = s.wait_exit(Duration::from_millis(grace_ms + 5000));
    let took = signalled.elapsed();
    assert_eq!(st.code(), Some(0), "{name}: {st:?}");
    // Bounded by the grace time (plus the stop's own work: joining threads).
    assert!(took < Duration::from_millis(grace_ms + 3000), "{name}: took {took:?}");
    let out = s.output_with("ms after SIGTERM");
    // The clients keep calling, so the grace time ends the drain, unless the
    // clients stalled for the quiet time (a loaded machine).
    assert!(out.contains("grace time over") || out.contains("quiet,"), "{name}: {out}");
    // By the server's own clock, from taking the signal to its last line.
    let exit = out.lines().find(|l| l.contains("ms after SIGTERM")).unwrap();
    let ms: u64 = exit.split_whitespace().find_map(|w| w.parse().ok()).unwrap_or_else(|| panic!("{name}: {exit}"));
    assert!(exit.contains("exit 0,"), "{name}: {exit}");
    // The server ends its drain 250 ms early to close within the grace time;
    // a machine busy with other work can slow that closing down, hence the
    // slack here.
    assert!(ms <= grace_ms + 1000, "{name}: {out}");
    let totals = out.lines().rev().find(|l| l.contains("accepted=")).unwrap();
    assert!(totals.starts_with("after "), "{name}: {totals}");
    assert!(!s.socket.exists(), "{name}: statistics socket left behind");
    drop(load);
}

#[test]
fn sigterm_under_load_rpc_server_epoll() {
    sigterm_under_load(&["rpc-server", "--driver", "epoll"], Service::Rpc, "rpc-epoll");
}

#[test]
fn sigterm_under_load_rpc_server_default_driver() {
    sigterm_under_load(&["rpc-server"], Service::Rpc, "rpc-auto");
}

#[test]
fn sigterm_under_load_echo_server() {
    sigterm_under_load(&["echo-server", "--mode", "bytes", "--driver", "epoll"], Service::EchoBytes, "echo");
}

#[test]
fn sigterm_under_load_thread_engine() {
    sigterm_under_load(&["rpc-server", "--engine", "thread"], Service::Rpc, "thread");
}

/// A second signal during the drain stops the server at once (a grace time
/// of a minute is not waited for): totals printed, socket removed, exit
/// status 128 + SIGINT.
#[test]
fn a_second_signal_stops_at_once() {
    let dir = Scratch::new("second");
    let mut s = Server::start(&["rpc-server", "--driver", "epoll", "--grace-ms", "60000"], &dir.0);
    let load = Load::start(s.addr, Service::Rpc, 2);
    load.wait_answered_past(100, Duration::from_secs(20));
    s.signal(libc::SIGTERM);
    s.wait_line("SIGTERM: stopping", Duration::from_secs(5));
    let second = Instant::now();
    s.signal(libc::SIGINT);
    let st = s.wait_exit(Duration::from_secs(10));
    assert_eq!(st.code(), Some(128 + libc::SIGINT), "{st:?}");
    assert!(second.elapsed() < Duration::from_secs(10));
    let out = s.output_with("ms after SIGTERM");
    assert!(out.contains("SIGINT: stopping at once"), "{out}");
    assert!(out.contains("accepted="), "{out}");
    assert!(out.contains(&format!("exit {},", 128 + libc::SIGINT)), "{out}");
    assert!(!s.socket.exists(), "statistics socket left behind");
    drop(load);
}

/// An idle server stops on SIGHUP as on SIGTERM, without waiting the grace
/// time (no connection is open).
#[test]
fn sighup_stops_like_sigterm() {
    let dir = Scratch::new("hup");
    let mut s = Server::start(&["echo-server", "--grace-ms", "60000"], &dir.0);
    s.signal(libc::SIGHUP);
    let st = s.wait_exit(Duration::from_secs(10));
    assert_eq!(st.code(), Some(0), "{st:?}");
    let out = s.output_with("accepted=");
    assert!(out.contains("SIGHUP: stopping"), "{out}");
    assert!(out.contains("every connection closed"), "{out}");
    assert!(!s.socket.exists());
}

/// A server with a generated TLS certificate writes its CA where clients
/// find it (the default place: `$XDG_RUNTIME_DIR/connmux`), and removes it
/// when it stops: the CA is made anew each run.
#[test]
fn a_generated_ca_is_removed_when_the_server_stops() {
    let dir = Scratch::new("tls-ca");
    for what in ["rpc-server", "echo-server"] {
        let mut s = Server::start(&[what, "--tls", "--grace-ms", "60000"], &dir.0);
        let line = s.wait_line("--tls-ca ", Duration::from_secs(10));
        let ca = PathBuf::from(line.rsplit("--tls-ca ").next().unwrap().trim());
        assert!(ca.starts_with(dir.0.join("connmux")), "{what}: CA at {} ({line})", ca.display());
        let pem = std::fs::read_to_string(&ca).unwrap();
        assert!(pem.starts_with("-----BEGIN CERTIFICATE-----"), "{what}: {pem}");
        s.signal(libc::SIGTERM);
        let st = s.wait_exit(Duration::from_secs(10));
        assert_eq!(st.code(), Some(0), "{what}: {st:?}");
        assert!(!ca.exists(), "{what}: the generated CA {} left behind", ca.display());
        assert!(!s.socket.exists(), "{what}: statistics socket left behind");
    }
}

/// A connection that stays open but idle does not hold the stop for the
/// grace time: it ends once nothing moved for a moment.
#[test]
fn idle_connections_do_not_hold_the_stop() {
    let dir = Scratch::new("idle");
    let mut s = Server::start(&["rpc-server", "--driver", "epoll", "--grace-ms", "60000"], &dir.0);
    let mut c = TcpStream::connect(s.addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.write_all(&null_call(9)).unwrap();
    let mut reply = [0u8; 28];
    c.read_exact(&mut reply).unwrap();
    s.signal(libc::SIGTERM);
    let st = s.wait_exit(Duration::from_secs(20));
    assert_eq!(st.code(), Some(0), "{st:?}");
    let out = s.output_with("accepted=");
    assert!(out.contains("quiet, 1 connection(s) left open"), "{out}");
}

fn stat(args: &[&Path]) -> std::process::Output {
    Command::new(BIN).arg("stat").args(args).output().unwrap()
}

/// `connmux stat` with a live server and a socket left by a server that is
/// gone: the live one is shown, the dead one named, exit status 1.
#[test]
fn stat_names_a_server_it_cannot_reach_and_fails() {
    let dir = Scratch::new("stat");
    let live = Server::start(&["rpc-server", "--duration", "60"], &dir.0);
    // A socket file nobody listens on: what a killed server leaves.
    let dead = dir.0.join("dead.sock");
    drop(std::os::unix::net::UnixListener::bind(&dead).unwrap());
    assert!(dead.exists());

    let out = stat(&[&live.socket]);
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("accepted="));

    let out = stat(&[&live.socket, &dead]);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    assert!(stdout.contains("accepted="), "the live server is still shown: {stdout}");
    assert!(stderr.contains("could not be reached"), "{stderr}");
    assert!(stderr.contains(&*dead.to_string_lossy()), "{stderr}");
    assert!(!stderr.contains(&*live.socket.to_string_lossy()), "{stderr}");

    // Only the dead one: the same.
    let out = stat(&[&dead]);
    assert_eq!(out.status.code(), Some(1));
}

/// Run `connmux ARGS` with its standard output a pipe whose reader is already
/// closed: it must end by SIGPIPE with nothing on standard error.
fn into_closed_pipe(args: &[&str], stdin: Option<&Path>) -> (ExitStatus, String) {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let mut cmd = Command::new(BIN);
    cmd.args(args).stdout(writer).stderr(Stdio::piped());
    match stdin {
        Some(p) => cmd.stdin(std::fs::File::open(p).unwrap()),
        None => cmd.stdin(Stdio::null()),
    };
    let out = cmd.output().unwrap();
    (out.status, String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn a_closed_stdout_ends_the_command_quietly() {
    let dir = Scratch::new("pipe");
    let live = Server::start(&["rpc-server", "--duration", "60"], &dir.0);
    // stat (println!), and parse (a buffered writer returning the error).
    let input = dir.0.join("msgs");
    let mut bytes = Vec::new();
    for _ in 0..100_000 {
        bytes.extend_from_slice(&[0, 0, 0, 1, 7]);
    }
    std::fs::write(&input, &bytes).unwrap();
    let sock = live.socket.to_string_lossy().into_owned();
    for (args, stdin) in [(vec!["stat", sock.as_str()], None), (vec!["parse", "--parser", "l4"], Some(input.as_path()))]
    {
        let (st, stderr) = into_closed_pipe(&args, stdin);
        assert_eq!(st.signal(), Some(libc::SIGPIPE), "{args:?}: {st:?} {stderr}");
        assert!(stderr.is_empty(), "{args:?}: {stderr}");
    }
    // The same command into a pipe that is read works.
    let out = Command::new(BIN).args(["stat", &sock]).output().unwrap();
    assert!(out.status.success());
}

/// The ids of processes whose command line holds every one of `args` (as
/// separate arguments).
fn processes_with_args(args: &[&str]) -> Vec<i32> {
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
        let Ok(cmdline) = std::fs::read(e.path().join("cmdline")) else { continue };
        let argv: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
        if args.iter().all(|a| argv.contains(&a.as_bytes())) {
            found.push(pid);
        }
    }
    found
}

/// A bench whose standard output is closed stops the servers it started
/// before it ends by SIGPIPE (it used to die at its first print and leave
/// them running). The servers are known by a heavy request's cost no other
/// test uses; any left are killed before the test fails.
#[test]
fn a_bench_into_a_closed_pipe_stops_its_servers() {
    let dir = Scratch::new("bench-pipe");
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    // Standard error to a file: servers left running would hold a pipe open.
    let err = dir.0.join("stderr");
    let mut child = Command::new(BIN)
        .args(["bench", "uneven", "--quick", "--heavy-us", "1237"])
        .stdin(Stdio::null())
        .stdout(writer)
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let st = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the bench did not end within 60 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let left = processes_with_args(&["uneven-server", "--heavy-us", "1237"]);
    for &pid in &left {
        // What this test started: a failure leaves nothing running.
        let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
    }
    let stderr = std::fs::read_to_string(&err).unwrap_or_default();
    assert_eq!(st.signal(), Some(libc::SIGPIPE), "{st:?} {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(left.is_empty(), "servers left running: {left:?}");
}

/// `connmux parse --bpf FILE`, with its exit, stderr, time and peak RSS.
fn parse_bpf(file: &str) -> (signal::Exit, String, Duration) {
    parse_measured(&["--bpf", file])
}

/// `connmux parse ARGS`, with its exit, stderr, time and peak RSS.
// The child is reaped by wait4 (try_wait_rusage), which clippy does not see.
#[allow(clippy::zombie_processes)]
fn parse_measured(args: &[&str]) -> (signal::Exit, String, Duration) {
    let start = Instant::now();
    let mut child = Command::new(BIN)
        .arg("parse")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let exit = loop {
        if let Some(e) = signal::try_wait_rusage(child.id()).unwrap() {
            break e;
        }
        if start.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            panic!("parse {args:?} still running after 20 s");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let took = start.elapsed();
    (exit, reader.join().unwrap(), took)
}

#[test]
fn parse_bpf_of_an_endless_random_file_is_refused_at_once() {
    let (exit, stderr, took) = parse_bpf("/dev/urandom");
    assert_eq!(exit.code, Some(1), "{exit:?} {stderr}");
    assert!(took < Duration::from_secs(1), "took {took:?}");
    assert!(exit.max_rss_kib <= 50 * 1024, "peak RSS {} KiB", exit.max_rss_kib);
    assert_eq!(stderr.matches("not an ELF object").count(), 1, "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
}

#[test]
fn parse_bpf_errors_say_their_reason_once() {
    let dir = Scratch::new("bpf");
    // A missing file: the OS error once.
    let missing = dir.0.join("missing.o");
    let (exit, stderr, _) = parse_bpf(&missing.to_string_lossy());
    assert_eq!(exit.code, Some(1));
    assert_eq!(stderr.matches("No such file or directory").count(), 1, "{stderr}");
    // The ELF magic and then garbage: the object reader's reason once.
    let fake = dir.0.join("fake.o");
    let mut bytes = b"\x7fELF".to_vec();
    bytes.extend((0..4096u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8));
    std::fs::write(&fake, &bytes).unwrap();
    let (exit, stderr, _) = parse_bpf(&fake.to_string_lossy());
    assert_eq!(exit.code, Some(1));
    assert_eq!(stderr.matches("not a readable ELF object").count(), 1, "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    // Larger than the loader reads: refused without reading it all.
    let big = dir.0.join("big.o");
    let f = std::fs::File::create(&big).unwrap();
    f.set_len(connmux_bpf::MAX_OBJECT_SIZE as u64 + 4096).unwrap();
    drop(f);
    let mut f = std::fs::OpenOptions::new().write(true).open(&big).unwrap();
    f.write_all(b"\x7fELF").unwrap();
    drop(f);
    let (exit, stderr, _) = parse_bpf(&big.to_string_lossy());
    assert_eq!(exit.code, Some(1));
    assert_eq!(stderr.matches("larger than").count(), 1, "{stderr}");
    assert!(exit.max_rss_kib <= 50 * 1024, "peak RSS {} KiB", exit.max_rss_kib);
}

/// The input side: an endless random stream is read a chunk at a time and
/// refused at its first impossible length, in little memory.
#[test]
fn parse_of_an_endless_random_input_is_bounded() {
    let (exit, stderr, _) = parse_measured(&["--quiet", "--parser", "l4", "/dev/urandom"]);
    // 4: refused (a 4-byte length of random bytes is almost always over 1 MiB).
    assert_eq!(exit.code, Some(4), "{exit:?} {stderr}");
    assert!(exit.max_rss_kib <= 50 * 1024, "peak RSS {} KiB", exit.max_rss_kib);
}
