//! A 9P2000.L client nobody here wrote — gVisor's `p9` package (Go module
//! `github.com/hugelgupf/p9` v0.3.0) — runs one script against `connmux
//! 9p-server` and, when it is installed, diod, side by side: file I/O from
//! 0 B to 8 MiB, a 2,000-operation fsx-style run, a directory of 1,000
//! entries read at several buffer sizes, setattr, rename/renameat/unlinkat,
//! renameat with one directory fid, the escapes (`..`, symlinks out, `/` in
//! a name), a Tflush of a stuck open and a second Tversion. Every row must
//! pass on connmux; diod's rows are printed beside them (each row a
//! process of its own, diod started again if one killed it; the row whose
//! Trename of an open fid kills diod 1.0.24 is not run there; diod's rows
//! are not run, and the test says why, when diod cannot start).
//!
//! The program is `tests/p9client` (go.mod, go.sum), built here with the Go
//! toolchain (/usr/local/go/bin/go, else `go` on the PATH; 1.20 or later:
//! scripts/setup.sh installs one). Its modules come from the Go module proxy the first time
//! and from the module cache (GOMODCACHE) after; offline with an empty
//! cache the build, and so this test, fails and says why.

mod ninep_support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ninep_support::{scratch, Server};

/// /usr/local/go's Go (where scripts/setup.sh puts one), else the PATH's.
fn go() -> PathBuf {
    let local = PathBuf::from("/usr/local/go/bin/go");
    if local.is_file() {
        return local;
    }
    std::env::var_os("PATH")
        .and_then(|p| std::env::split_paths(&p).map(|d| d.join("go")).find(|g| g.is_file()))
        .unwrap_or_else(|| {
            panic!("no Go toolchain (/usr/local/go/bin/go or `go` on the PATH): scripts/setup.sh installs Go 1.22")
        })
}

/// Builds tests/p9client into the test's scratch directory.
fn build() -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/p9client");
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("p9client");
    let t0 = Instant::now();
    let r = Command::new(go())
        .current_dir(&src)
        .args(["build", "-mod=readonly", "-buildvcs=false", "-o"])
        .arg(&out)
        .arg(".")
        // The toolchain found, never one fetched for the build.
        .env("GOTOOLCHAIN", "local")
        .output()
        .expect("running go build");
    assert!(
        r.status.success(),
        "building tests/p9client failed. It needs github.com/hugelgupf/p9 v0.3.0 and the modules in \
         tests/p9client/go.sum, from the Go module proxy (GOPROXY, now {:?}) or already in the module \
         cache (GOMODCACHE); offline, fill the cache first (`go mod download` in tests/p9client).\n{}",
        std::env::var("GOPROXY").unwrap_or_else(|_| "the default".into()),
        String::from_utf8_lossy(&r.stderr)
    );
    eprintln!("p9client built in {:.1} s", t0.elapsed().as_secs_f64());
    out
}

/// The rows the program prints: (name, None when ok, else why).
fn run(client: &Path, addr: &str, aname: &str, only: Option<&str>) -> Vec<(String, Option<String>)> {
    let mut c = Command::new(client);
    c.args(["-addr", addr, "-aname", aname]);
    if let Some(o) = only {
        c.args(["-only", o]);
    }
    let out = c.output().expect("running p9client");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("ROW ")?;
            let (name, verdict) = rest.split_once(' ')?;
            Some((name.to_string(), verdict.strip_prefix("FAIL ").map(str::to_string)))
        })
        .collect()
}

/// Rows not run against diod, and why.
const DIOD_NOT_RUN: [(&str, &str); 1] = [(
    "rename/renameat/unlinkat",
    "not run: a Trename of an open fid kills diod 1.0.24 (assertion failure, ioctx.c:380, and a core of ~290 MB)",
)];

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A diod serving the test, and the port it listens on.
struct Diod {
    child: Child,
    port: u16,
}

impl Diod {
    /// diod on `export`, once it answers: on a fresh port at each try, for
    /// the port `free_port` picked may be taken before diod binds it (by
    /// another test's listener or a connection's local port, both from
    /// the same range): diod then exits, and the next try picks another.
    /// `Err`, with diod's log, when three tries did not listen (diod
    /// 1.0.24 also refuses to start when it cannot lift its core-size
    /// limit: under a hard `ulimit -c 0` without CAP_SYS_RESOURCE).
    fn start(diod: &Path, export: &Path) -> Result<Diod, String> {
        let log = export.with_extension("diod.log");
        let mut tried = Vec::new();
        for _ in 0..3 {
            let port = free_port();
            let mut child = Command::new(diod)
                // (In the export's parent: were it to die, its core lands there.)
                .current_dir(export.parent().unwrap_or(export))
                .args(["-f", "-n", "-L", "stderr", "-e"])
                .arg(export)
                .args(["-l", &format!("127.0.0.1:{port}")])
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&log).expect("diod's log"))
                .spawn()
                .expect("spawn diod");
            let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
            let deadline = Instant::now() + Duration::from_secs(10);
            // Until it answers, exits, or the deadline passes (each connect
            // bounded: a listener that accepts nothing cannot hang it).
            let why = loop {
                if std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_ok() {
                    return Ok(Diod { child, port });
                }
                if let Some(st) = child.try_wait().unwrap() {
                    break format!("exited ({st})");
                }
                if Instant::now() >= deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    break "no answer within 10 s".to_string();
                }
                std::thread::sleep(Duration::from_millis(20));
            };
            let said = std::fs::read_to_string(&log).unwrap_or_default();
            tried.push(format!("port {port}: {why}; its log: {}", said.trim()));
        }
        Err(format!("diod did not listen: {}", tried.join("; ")))
    }

    /// Whether it is gone or no longer answers (a row killed it).
    fn down(&mut self) -> bool {
        self.child.try_wait().unwrap().is_some() || std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err()
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Diod {
    fn drop(&mut self) {
        self.stop();
    }
}

#[test]
fn gvisor_p9_client_runs_the_script_against_connmux_and_diod() {
    let client = build();
    let names: Vec<String> = String::from_utf8(Command::new(&client).arg("-list").output().unwrap().stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    assert!(names.len() >= 10, "{names:?}");

    let ex = scratch("p9client-connmux");
    let s = Server::start(&ex, &["--no-stats-socket"]);
    let t0 = Instant::now();
    let cm = run(&client, &s.addr.to_string(), "", None);
    eprintln!("connmux: {} rows in {:.1} s", cm.len(), t0.elapsed().as_secs_f64());
    drop(s);

    // diod: as root only (it serves other users' attaches as root), each
    // row a process of its own, diod started again when a row killed it.
    let diod = ["/usr/sbin/diod", "/usr/bin/diod"].iter().map(PathBuf::from).find(|p| p.is_file());
    let root = rustix::process::geteuid().is_root();
    let mut dd: Vec<(String, Option<String>)> = Vec::new();
    match (&diod, root) {
        (Some(diod), true) => {
            let dex = scratch("p9client-diod");
            let aname = dex.display().to_string();
            let mut d = None;
            let mut not_started = None;
            let t0 = Instant::now();
            for n in &names {
                if let Some((_, why)) = DIOD_NOT_RUN.iter().find(|(k, _)| k == n) {
                    dd.push((n.clone(), Some(why.to_string())));
                    continue;
                }
                // (A row that killed diod: it may take a moment to go.)
                if d.as_mut().is_none_or(Diod::down) && not_started.is_none() {
                    drop(d.take());
                    d = Diod::start(diod, &dex).map_err(|e| not_started = Some(e)).ok();
                }
                let Some(dp) = d.as_ref().map(|d| d.port) else {
                    dd.push((n.clone(), Some("not run: diod did not start (why above)".into())));
                    continue;
                };
                let mut r = run(&client, &format!("127.0.0.1:{dp}"), &aname, Some(n));
                if r.iter().any(|(_, v)| v.as_deref().is_some_and(|w| w.contains("connection refused"))) {
                    // diod was still going when the check above looked.
                    drop(d.take());
                    match Diod::start(diod, &dex) {
                        Ok(nd) => {
                            r = run(&client, &format!("127.0.0.1:{}", nd.port), &aname, Some(n));
                            d = Some(nd);
                        }
                        Err(e) => not_started = Some(e),
                    }
                }
                let why = r.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone()).unwrap_or_else(|| {
                    Some(r.first().and_then(|(_, v)| v.clone()).unwrap_or_else(|| "no row printed".into()))
                });
                dd.push((n.clone(), why));
            }
            if let Some(why) = &not_started {
                // (Its rows are printed beside connmux's, never asserted.)
                eprintln!("diod's rows not run from there on: {why}");
            }
            eprintln!("diod: {} rows in {:.1} s", dd.len(), t0.elapsed().as_secs_f64());
            drop(d);
            let _ = std::fs::remove_file(dex.with_extension("diod.log"));
            let _ = std::fs::remove_dir_all(&dex);
        }
        (None, _) => eprintln!("diod not installed (scripts/setup.sh installs it): connmux's rows only"),
        (Some(_), false) => eprintln!("not root: diod's rows not run (it serves attaches as root)"),
    }

    eprintln!("{:<26} {:<8} diod", "check", "connmux");
    let verdict = |v: Option<&Option<String>>| match v {
        None => "-".to_string(),
        Some(None) => "ok".to_string(),
        Some(Some(why)) => format!("FAIL {why}"),
    };
    for n in &names {
        let c = cm.iter().find(|(k, _)| k == n).map(|(_, v)| v);
        let d = dd.iter().find(|(k, _)| k == n).map(|(_, v)| v);
        eprintln!("{n:<26} {:<8} {}", verdict(c), verdict(d));
    }
    let failed: Vec<String> = names
        .iter()
        .filter(|n| !matches!(cm.iter().find(|(k, _)| k == *n), Some((_, None))))
        .map(|n| format!("{n}: {}", verdict(cm.iter().find(|(k, _)| k == n).map(|(_, v)| v))))
        .collect();
    assert!(failed.is_empty(), "connmux failed rows of the p9 client's script:\n{}", failed.join("\n"));
    let _ = std::fs::remove_dir_all(&ex);
}
