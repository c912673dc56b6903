//! connmux-conformance: the KCM acceptance cases (kcm-semantics §7) over
//! loopback TCP, against the userspace runtime and/or the kernel's AF_KCM.
//!
//! ```text
//! connmux-conformance [--backend userspace|kernel|all] [--cases 1,8,19] [--bench N REPS]
//! ```
//!
//! One line per case and backend:
//! `CASE <n> <backend> <PASS|D|FAIL|NOTRUN> <note> [<name>; <ms> ms]`, where
//! the name is the case's as the tests name it (`case_37_unattach_mid_...`).
//! `--cases` takes numbers or names.
//! PASS: the behaviour §7 asks for. D: a documented departure (the kernel's
//! behaviour that kcm-semantics records, observed as recorded; the note shows
//! what was seen). FAIL: anything else. NOTRUN: a case this runner does not
//! automate (the note says why). Exit status 1 if any case FAILed.
//! `--backend all` skips the kernel (with a line saying so) where AF_KCM is absent.

mod api;
mod backend;
mod bench;
mod cases;
mod outcome;

use std::time::Instant;

use backend::Kind;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut kinds = vec![Kind::User, Kind::Kernel];
    let mut only: Option<Vec<u32>> = None;
    let mut i = 0;
    while i < args.len() {
        match args[i].as_str() {
            "--backend" => {
                kinds = match args.get(i + 1).map(String::as_str) {
                    Some("userspace") => vec![Kind::User],
                    Some("kernel") => vec![Kind::Kernel],
                    Some("all") => vec![Kind::User, Kind::Kernel],
                    other => usage(&format!("bad --backend {other:?}")),
                };
                i += 2;
            }
            "--cases" => {
                let mut picked = Vec::new();
                for c in args.get(i + 1).map(String::as_str).unwrap_or("").split(',') {
                    let c = c.trim();
                    match c.parse::<u32>().ok().or_else(|| cases::ALL.iter().find(|k| k.1 == c).map(|k| k.0)) {
                        Some(n) => picked.push(n),
                        None => usage(&format!("--cases: no case {c:?}")),
                    }
                }
                only = Some(picked);
                i += 2;
            }
            "--bench" => {
                let n = args.get(i + 1).and_then(|s| s.parse().ok()).unwrap_or(20_000);
                let reps = args.get(i + 2).and_then(|s| s.parse().ok()).unwrap_or(3);
                std::process::exit(bench::run(n, reps));
            }
            "-h" | "--help" => usage(""),
            other => usage(&format!("unknown argument {other}")),
        }
    }
    let osrelease = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    println!(
        "INFO kernel {} AF_KCM {}",
        osrelease.trim(),
        if connmux_kernel::KernelMux::supported() { "yes" } else { "no" }
    );
    let (mut pass, mut dep, mut fail, mut notrun) = (0, 0, 0, 0);
    for kind in kinds {
        if kind == Kind::Kernel && !connmux_kernel::KernelMux::supported() {
            println!("SKIP kernel backend: AF_KCM is not available on this kernel");
            continue;
        }
        if kind == Kind::Kernel {
            let line = cases::rewritten_textbook_parser();
            if line.starts_with("FAILED") {
                fail += 1;
            }
            println!("{line}");
        }
        for case in cases::ALL {
            if only.as_ref().is_some_and(|o| !o.contains(&case.0)) {
                continue;
            }
            let t = Instant::now();
            let out =
                std::panic::catch_unwind(|| (case.2)(kind)).unwrap_or_else(|_| cases::Outcome::Fail("panicked".into()));
            let (word, note) = match &out {
                cases::Outcome::Pass(n) => {
                    pass += 1;
                    ("PASS", n)
                }
                cases::Outcome::Depart(n) => {
                    dep += 1;
                    ("D", n)
                }
                cases::Outcome::Fail(n) => {
                    fail += 1;
                    ("FAIL", n)
                }
                cases::Outcome::NotRun(n) => {
                    notrun += 1;
                    ("NOTRUN", n)
                }
            };
            println!(
                "CASE {:>2} {:<9} {:<6} {} [{}; {} ms]",
                case.0,
                kind.name(),
                word,
                note,
                case.1,
                t.elapsed().as_millis()
            );
        }
    }
    println!("SUMMARY pass={pass} departures={dep} fail={fail} notrun={notrun}");
    println!("{} passed, {fail} failed", pass + dep);
    std::process::exit(if fail > 0 { 1 } else { 0 });
}

fn usage(why: &str) -> ! {
    if !why.is_empty() {
        eprintln!("connmux-conformance: {why}");
    }
    eprintln!("usage: connmux-conformance [--backend userspace|kernel|all] [--cases N,N...] | --bench [N] [REPS]");
    std::process::exit(2);
}
