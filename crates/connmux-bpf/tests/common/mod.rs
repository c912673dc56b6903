//! Shared by the integration tests: building `bpf/*.c` with clang, a seeded
//! random generator, and the inputs the programs are compared on.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

pub mod corpus;

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Build every program in `bpf/` (with `bpf/build.sh`, i.e. clang) into this
/// test target's scratch folder, once per test process. Without clang this
/// fails with a message saying what to install: the tests do not skip.
pub fn objects_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("bpf");
        let script = repo_root().join("bpf/build.sh");
        let res = Command::new("sh").arg(&script).arg(&out).output();
        match res {
            Ok(o) if o.status.success() => out,
            Ok(o) => panic!(
                "building the BPF parser programs with {} failed ({}):\n{}\n\
                 clang is required (Debian/Ubuntu: apt-get install clang)",
                script.display(),
                o.status,
                String::from_utf8_lossy(&o.stderr)
            ),
            Err(e) => panic!("cannot run sh {}: {e}", script.display()),
        }
    })
}

/// One program of one object: `label` is `file.cpu.o` or `file.cpu.o:section`.
#[derive(Clone, Debug)]
pub struct ProgramCase {
    pub label: String,
    /// The C file's stem (`len_prefix`, `oncrpc`, ...).
    pub source: String,
    pub object: PathBuf,
    pub section: Option<String>,
}

/// Every program in every built object, sorted.
pub fn program_cases() -> Vec<ProgramCase> {
    let dir = objects_dir();
    let mut objs: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("objects folder")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "o"))
        .collect();
    objs.sort();
    let mut out = Vec::new();
    for obj in objs {
        let file = obj.file_name().unwrap().to_string_lossy().into_owned();
        let source = file.split('.').next().unwrap().to_owned();
        let bytes = std::fs::read(&obj).expect("read object");
        let progs = connmux_bpf::elf::list_programs(&bytes).expect("list programs");
        assert!(!progs.is_empty(), "{file} has no program");
        for p in &progs {
            let section = (progs.len() > 1).then(|| p.section.clone());
            let label = match &section {
                Some(s) => format!("{file}:{s}"),
                None => file.clone(),
            };
            out.push(ProgramCase { label, source: source.clone(), object: obj.clone(), section });
        }
    }
    out
}

/// SplitMix64: small, seeded, reproducible.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    pub fn u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    pub fn u32(&mut self) -> u32 {
        self.u64() as u32
    }
    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.u64() % n
    }
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo)
    }
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
    pub fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len() as u64) as usize]
    }
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.u64() as u8).collect()
    }
}
