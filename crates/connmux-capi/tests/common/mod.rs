//! Shared by the tests that compile C against libconnmux.
//!
//! Where the library comes from: the target directory and profile of the
//! running test binary (`<target>/<profile>/deps/<test>`). Each test binary
//! first runs `cargo build -p connmux-capi --lib` for that same target
//! directory and profile, so the `.so`/`.a` it links are those of the source
//! under test (cargo does not rebuild a cdylib/staticlib for integration
//! tests by itself; in CI the workspace build has already made them and this
//! is a no-op). If that build cannot run, an existing library is used.

#![allow(dead_code)]

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub struct Lib {
    /// `<target>/<profile>`: libconnmux.so and libconnmux.a.
    pub dir: PathBuf,
    /// The header folder.
    pub include: PathBuf,
    /// Where the tests write their binaries.
    pub scratch: PathBuf,
}

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("repository root")
}

/// Build (once per test binary) and locate the library.
pub fn lib() -> &'static Lib {
    static LIB: OnceLock<Lib> = OnceLock::new();
    LIB.get_or_init(|| {
        let exe = std::env::current_exe().expect("test binary path");
        let deps = exe.parent().expect("deps folder");
        let dir = deps.parent().expect("profile folder").to_path_buf();
        let target = dir.parent().expect("target folder").to_path_buf();
        let profile = dir.file_name().and_then(|s| s.to_str()).expect("profile name").to_owned();
        let mut cmd = Command::new(env!("CARGO"));
        cmd.args(["build", "-p", "connmux-capi", "--lib"]);
        match profile.as_str() {
            "debug" => {}
            "release" => {
                cmd.arg("--release");
            }
            other => {
                cmd.args(["--profile", other]);
            }
        }
        cmd.env("CARGO_TARGET_DIR", &target).current_dir(env!("CARGO_MANIFEST_DIR"));
        match run(cmd, Duration::from_secs(900)) {
            Ok(out) if out.status.success() => {}
            Ok(out) => eprintln!(
                "cargo build of connmux-capi failed; using the library already in {}:\n{}",
                dir.display(),
                String::from_utf8_lossy(&out.stderr)
            ),
            Err(e) => eprintln!("cannot run cargo ({e}); using the library already in {}", dir.display()),
        }
        for f in ["libconnmux.so", "libconnmux.a"] {
            assert!(
                dir.join(f).exists(),
                "{} missing: build it with `cargo build -p connmux-capi`",
                dir.join(f).display()
            );
        }
        let scratch = dir.join("capi-tests");
        std::fs::create_dir_all(&scratch).expect("scratch folder");
        Lib { dir, include: Path::new(env!("CARGO_MANIFEST_DIR")).join("include"), scratch }
    })
}

/// How a C program links libconnmux.
#[derive(Clone, Copy)]
pub enum Link {
    Shared,
    Static,
}

/// Compile C sources into `<scratch>/<name>` with the system's C compiler
/// (`$CC`, else `cc`), warnings as errors. Returns the binary's path.
pub fn compile(name: &str, sources: &[PathBuf], link: Link) -> PathBuf {
    let lib = lib();
    let out = lib.scratch.join(name);
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let mut cmd = Command::new(&cc);
    cmd.args(["-std=c11", "-O1", "-g", "-Wall", "-Wextra", "-Werror", "-pthread"])
        .arg("-I")
        .arg(&lib.include)
        .arg("-o")
        .arg(&out)
        .args(sources);
    match link {
        Link::Shared => {
            cmd.arg(format!("-L{}", lib.dir.display()))
                .arg("-lconnmux")
                .arg(format!("-Wl,-rpath,{}", lib.dir.display()));
        }
        Link::Static => {
            cmd.arg(lib.dir.join("libconnmux.a")).args(["-ldl", "-lm", "-lrt"]);
        }
    }
    let o = run(cmd, Duration::from_secs(120)).unwrap_or_else(|e| panic!("cannot run {cc}: {e}"));
    assert!(
        o.status.success(),
        "{cc} failed for {name}:\n{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    out
}

/// Run a command to completion, killing it after `limit`.
pub fn run(mut cmd: Command, limit: Duration) -> std::io::Result<Output> {
    let child = cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
    wait_output(child, limit)
}

/// Collect a child's output, killing it after `limit` (the output so far is kept).
pub fn wait_output(mut child: Child, limit: Duration) -> std::io::Result<Output> {
    let mut so = child.stdout.take();
    let mut se = child.stderr.take();
    let t1 = std::thread::spawn(move || {
        let mut v = Vec::new();
        if let Some(s) = so.as_mut() {
            let _ = s.read_to_end(&mut v);
        }
        v
    });
    let t2 = std::thread::spawn(move || {
        let mut v = Vec::new();
        if let Some(s) = se.as_mut() {
            let _ = s.read_to_end(&mut v);
        }
        v
    });
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(st) = child.try_wait()? {
            break st;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            break child.wait()?;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Ok(Output { status, stdout: t1.join().unwrap_or_default(), stderr: t2.join().unwrap_or_default() })
}

/// Build a BPF parser program from bpf/NAME.c with clang (installed by
/// scripts/setup.sh); returns the object's path.
pub fn bpf_object(name: &str) -> PathBuf {
    let root = repo_root();
    let out = lib().scratch.join(format!("{name}.bpf.o"));
    let mut cmd = Command::new(std::env::var("CLANG").unwrap_or_else(|_| "clang".into()));
    cmd.args(["-target", "bpf", "-O2", "-Wall", "-c"])
        .arg("-I")
        .arg(root.join("bpf"))
        .arg(root.join(format!("bpf/{name}.c")))
        .arg("-o")
        .arg(&out);
    let o = run(cmd, Duration::from_secs(120))
        .unwrap_or_else(|e| panic!("clang is needed for the BPF parser checks (scripts/setup.sh installs it): {e}"));
    assert!(o.status.success(), "clang failed on bpf/{name}.c:\n{}", String::from_utf8_lossy(&o.stderr));
    out
}
