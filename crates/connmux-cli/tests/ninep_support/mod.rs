//! What the 9P server's test files share: the server as a child process
//! (its address from its first line, killed on drop), a raw 9P client, a
//! good client whose rate is measured beside an attack, and the server's
//! descriptors as `/proc` shows them.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use connmux_9p::rmsg::Rmsg;
use connmux_9p::{MsgType, Tmsg, NOFID};

pub const BIN: &str = env!("CARGO_BIN_EXE_connmux");
/// How long a good client may wait for any one reply.
pub const ANSWER_WITHIN: Duration = Duration::from_secs(5);

/// A server process whose standard output is collected; killed on drop.
pub struct Server {
    pub child: Child,
    pub addr: SocketAddr,
    pub lines: Arc<Mutex<Vec<String>>>,
}

impl Server {
    pub fn start(export: &Path, extra: &[&str]) -> Server {
        Server::start_in(Command::new(BIN), export, extra)
    }

    /// Started by `sh` with umask 022 (what a login shell has), so a mode
    /// the server lets the umask cut shows.
    pub fn start_umask_022(export: &Path, extra: &[&str]) -> Server {
        let mut sh = Command::new("sh");
        sh.args(["-c", "umask 022; exec \"$0\" \"$@\"", BIN]);
        Server::start_in(sh, export, extra)
    }

    pub fn start_in(mut cmd: Command, export: &Path, extra: &[&str]) -> Server {
        let mut child = cmd
            .args(["9p-server", "--export"])
            .arg(export)
            .args(["-l", "127.0.0.1:0", "--duration", "300", "--no-pin", "--fs-threads", "8"])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn connmux");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let (out, l2) = (child.stdout.take().unwrap(), lines.clone());
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                l2.lock().unwrap().push(line);
            }
        });
        let deadline = Instant::now() + Duration::from_secs(20);
        let first = loop {
            if let Some(l) = lines.lock().unwrap().iter().find(|l| l.contains("listening on")) {
                break l.clone();
            }
            assert!(Instant::now() < deadline, "the server did not start");
            std::thread::sleep(Duration::from_millis(10));
        };
        let addr = first
            .split_whitespace()
            .find_map(|w| w.parse::<SocketAddr>().ok())
            .unwrap_or_else(|| panic!("no address in {first:?}"));
        Server { child, addr, lines }
    }

    /// CPU seconds (user + system) the server has used so far.
    pub fn cpu_seconds(&self) -> f64 {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).unwrap();
        // Fields after the command name (which may hold spaces): utime is the 14th field.
        let rest = &stat[stat.rfind(')').unwrap() + 2..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        let ticks: f64 = f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap();
        // USER_HZ is 100 on every Linux this runs on.
        ticks / 100.0
    }

    /// Waits, at most `limit`, for a second in which the server used less
    /// than `most` CPU seconds; returns the lowest second seen.
    pub fn wait_quiet(&self, most: f64, limit: Duration) -> f64 {
        let deadline = Instant::now() + limit;
        let mut lowest = f64::MAX;
        while Instant::now() < deadline {
            let before = self.cpu_seconds();
            std::thread::sleep(Duration::from_secs(1));
            let used = self.cpu_seconds() - before;
            lowest = lowest.min(used);
            if used < most {
                break;
            }
        }
        lowest
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A fresh directory under the system's temporary directory.
pub fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("connmux-9ph-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A raw 9P client; tags are chosen by the caller or counted from 1.
pub struct Client {
    pub c: TcpStream,
    pub tag: u16,
}

impl Client {
    pub fn connect(addr: SocketAddr) -> Client {
        let c = TcpStream::connect(addr).unwrap();
        c.set_read_timeout(Some(ANSWER_WITHIN)).unwrap();
        c.set_nodelay(true).unwrap();
        Client { c, tag: 0 }
    }

    pub fn send_tag(&mut self, tag: u16, m: &Tmsg<'_>) {
        let mut b = Vec::new();
        m.encode(tag, &mut b);
        self.c.write_all(&b).unwrap();
    }

    pub fn send(&mut self, m: &Tmsg<'_>) -> u16 {
        self.tag = self.tag % 900 + 1;
        self.send_tag(self.tag, m);
        self.tag
    }

    pub fn recv(&mut self) -> std::io::Result<Vec<u8>> {
        let mut size = [0u8; 4];
        self.c.read_exact(&mut size)?;
        let n = u32::from_le_bytes(size) as usize;
        let mut b = size.to_vec();
        b.resize(n, 0);
        self.c.read_exact(&mut b[4..])?;
        Ok(b)
    }

    /// One request and its reply, which must come within [`ANSWER_WITHIN`].
    pub fn call(&mut self, m: &Tmsg<'_>) -> Vec<u8> {
        let tag = self.send(m);
        let b = self.recv().unwrap_or_else(|e| panic!("{m:?}: no reply within {ANSWER_WITHIN:?}: {e}"));
        assert_eq!(tag_of(&b), tag, "reply to {m:?}");
        b
    }

    pub fn ok(&mut self, m: &Tmsg<'_>) -> Vec<u8> {
        let b = self.call(m);
        if let (_, Rmsg::Lerror { errno }) = Rmsg::decode(&b).unwrap() {
            panic!("{m:?}: Rlerror {errno}");
        }
        b
    }

    /// Tversion and Tattach of fid 0.
    pub fn session(addr: SocketAddr, export: &Path) -> Client {
        let mut c = Client::connect(addr);
        c.ok(&Tmsg::Version { msize: (1 << 20) + 4096, version: "9P2000.L" });
        c.ok(&Tmsg::Attach { fid: 0, afid: NOFID, uname: "u", aname: export.to_str().unwrap(), n_uname: 0 });
        c
    }

    /// Fid `fid` walked from the root to `name` and opened for reading.
    pub fn open(&mut self, fid: u32, name: &str) {
        self.ok(&Tmsg::Walk { fid: 0, newfid: fid, names: vec![name] });
        self.ok(&Tmsg::Lopen { fid, flags: 0 });
    }
}

pub fn tag_of(b: &[u8]) -> u16 {
    u16::from_le_bytes([b[5], b[6]])
}

pub fn type_of(b: &[u8]) -> MsgType {
    MsgType(b[4])
}

/// The good client: a new connection, a session, a file opened, and 4 KiB
/// reads of it for `run` (each answered within [`ANSWER_WITHIN`], or the
/// test fails). Returns the reads per second.
pub fn good_client(addr: SocketAddr, export: &Path, run: Duration) -> f64 {
    let mut c = Client::session(addr, export);
    c.open(1, "good");
    let start = Instant::now();
    let mut n = 0u64;
    // Bounded by the clock (each read is answered within ANSWER_WITHIN or panics).
    while start.elapsed() < run {
        let b = c.ok(&Tmsg::Read { fid: 1, offset: (n % 16) * 4096, count: 4096 });
        assert_eq!(type_of(&b), MsgType::RREAD);
        n += 1;
    }
    n as f64 / start.elapsed().as_secs_f64()
}

pub fn export_with_good_file(name: &str) -> PathBuf {
    let ex = scratch(name);
    std::fs::write(ex.join("good"), vec![7u8; 64 * 1024]).unwrap();
    ex
}

pub fn errno_of(b: &[u8]) -> Option<u32> {
    match Rmsg::decode(b).unwrap().1 {
        Rmsg::Lerror { errno } => Some(errno),
        _ => None,
    }
}

impl Server {
    /// Descriptors the server holds now.
    pub fn fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.child.id())).map(|d| d.count()).unwrap_or(0)
    }

    /// The server's soft descriptor limit (from `/proc/PID/limits`).
    pub fn fd_limit(&self) -> usize {
        let l = std::fs::read_to_string(format!("/proc/{}/limits", self.child.id())).unwrap();
        let line = l.lines().find(|l| l.starts_with("Max open files")).expect("Max open files");
        line.split_whitespace().nth(3).unwrap().parse().unwrap()
    }

    /// The statistics `connmux stat` shows for the socket at `sock`.
    pub fn stat(sock: &Path) -> String {
        let out = Command::new(BIN).arg("stat").arg(sock).output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

/// A counter's value in `connmux stat`'s text.
pub fn counter(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix('=')))
        .unwrap_or_else(|| panic!("no {name} in {text}"))
        .parse()
        .unwrap()
}

/// Samples the server's descriptor count every 20 ms until dropped; the
/// highest count seen is `max()`.
pub struct FdWatch {
    max: Arc<std::sync::atomic::AtomicUsize>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    t: Option<std::thread::JoinHandle<()>>,
}

impl FdWatch {
    pub fn start(pid: u32) -> FdWatch {
        use std::sync::atomic::Ordering::Relaxed;
        let max = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (m, s) = (max.clone(), stop.clone());
        let t = std::thread::spawn(move || {
            // Bounded by the flag, set on drop.
            while !s.load(Relaxed) {
                let n = std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0);
                m.fetch_max(n, Relaxed);
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        FdWatch { max, stop, t: Some(t) }
    }

    pub fn max(&self) -> usize {
        self.max.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Drop for FdWatch {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.t.take() {
            let _ = t.join();
        }
    }
}
