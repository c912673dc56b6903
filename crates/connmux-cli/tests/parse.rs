//! `connmux parse` run as a program on captures: built-in parsers, BPF parser
//! objects built from `bpf/*.c`, the same framing from both on the same bytes
//! (ONC RPC record marking, 9P, Thrift, HTTP/2, a length prefix), refusals,
//! a stream cut mid-message, and the exit statuses.
//!
//! The BPF objects are built with `bpf/build.sh` (clang). Where clang is not
//! installed the BPF comparisons print why and check only the built-in side;
//! `scripts/setup.sh` installs clang, so CI runs them.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::Value;

/// Most time one run of the command may take (inputs are at most a few MiB).
const RUN_LIMIT: Duration = Duration::from_secs(60);

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Out {
    /// The JSON lines of a `--json` run.
    fn json(&self) -> Vec<Value> {
        self.stdout
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l:?}: {e}")))
            .collect()
    }
    /// (offset, len) of each message line of a `--json` run.
    fn messages(&self) -> Vec<(u64, u64)> {
        self.json()
            .iter()
            .filter(|v| v.get("end").is_none())
            .map(|v| (v["offset"].as_u64().unwrap(), v["len"].as_u64().unwrap()))
            .collect()
    }
    /// The final (`end`) object of a `--json` run.
    fn end(&self) -> Value {
        let all = self.json();
        let last = all.last().cloned().unwrap_or_else(|| panic!("no output; stderr: {}", self.stderr));
        assert!(last.get("end").is_some(), "last line is not the end: {last}");
        assert_eq!(all.iter().filter(|v| v.get("end").is_some()).count(), 1);
        last
    }
}

/// Run `connmux parse ARGS` with `stdin` as standard input.
fn parse(args: &[&str], stdin: &[u8]) -> Out {
    let mut child = Command::new(env!("CARGO_BIN_EXE_connmux"))
        .arg("parse")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start connmux");
    let mut input = child.stdin.take().expect("stdin");
    let data = stdin.to_vec();
    // The command may stop reading early (a refusal): a write error is expected then.
    let writer = std::thread::spawn(move || {
        let _ = input.write_all(&data);
    });
    let start = Instant::now();
    while child.try_wait().expect("wait").is_none() {
        if start.elapsed() > RUN_LIMIT {
            let _ = child.kill();
            panic!("connmux parse {args:?} ran longer than {RUN_LIMIT:?}");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let o = child.wait_with_output().expect("output");
    writer.join().expect("writer");
    Out {
        code: o.status.code().expect("exit code"),
        stdout: String::from_utf8(o.stdout).expect("utf-8 stdout"),
        stderr: String::from_utf8(o.stderr).expect("utf-8 stderr"),
    }
}

/// Write a capture file in this test's scratch folder.
fn capture(name: &str, bytes: &[u8]) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("parse-captures");
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The folder of BPF objects built from `bpf/*.c`, or None (with the reason
/// printed) where clang is not installed. A failed build with clang present fails.
fn bpf_objects() -> Option<&'static Path> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    DIR.get_or_init(|| {
        let clang = std::env::var("CLANG").unwrap_or_else(|_| "clang".into());
        let found =
            Command::new("sh").arg("-c").arg(format!("command -v {clang}")).output().is_ok_and(|o| o.status.success());
        if !found {
            eprintln!("SKIPPED (BPF side): clang is not installed (Debian/Ubuntu: apt-get install clang)");
            return None;
        }
        let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("parse-bpf");
        let script = repo_root().join("bpf/build.sh");
        let o = Command::new("sh").arg(&script).arg(&out).output().expect("run bpf/build.sh");
        assert!(o.status.success(), "bpf/build.sh failed: {}", String::from_utf8_lossy(&o.stderr));
        Some(out)
    })
    .as_deref()
}

/// Every built object of one source (`oncrpc` → oncrpc.v1.o, oncrpc.v3.o, …).
fn objects_of(source: &str) -> Vec<PathBuf> {
    let Some(dir) = bpf_objects() else { return Vec::new() };
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let n = p.file_name().unwrap().to_string_lossy();
            n.starts_with(&format!("{source}.")) && n.ends_with(".o")
        })
        .collect();
    v.sort();
    assert!(v.len() >= 2, "expected v1 and v3 objects of {source} in {}", dir.display());
    v
}

fn l4(body: &[u8]) -> Vec<u8> {
    let mut v = (body.len() as u32).to_be_bytes().to_vec();
    v.extend_from_slice(body);
    v
}

fn be(words: &[u32]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_be_bytes()).collect()
}

/// The three calls of the ksf capture (ksf.md §2.4), as rpctest sends them:
/// AUTH_NONE (44 bytes), `-f` (the same body in 3 fragments, 52 bytes),
/// `-A sys` (68 bytes).
fn ksf_rpc_capture() -> (Vec<u8>, Vec<(u64, u64)>, Vec<u64>) {
    let body = |xid: u32| be(&[xid, 0, 2, 100003, 3, 0, 0, 0, 0, 0]);
    let mut none = be(&[0x8000_0028]);
    none.extend(body(0));
    // Cross-check the hand-written bytes with the library's encoder.
    let mut enc = Vec::new();
    connmux_oncrpc::encode_null_call(0, 100003, 3, 1, &mut enc);
    assert_eq!(none, enc);

    let b1 = body(1);
    let mut frag = be(&[1]);
    frag.push(b1[0]);
    frag.extend(be(&[38]));
    frag.extend_from_slice(&b1[1..39]);
    frag.extend(be(&[0x8000_0001]));
    frag.push(b1[39]);
    assert_eq!(frag.len(), 52);

    // cred AUTH_SYS (flavor 1, 24 bytes): stamp, "vm", uid, gid, 0 gids.
    let mut sys = be(&[0x8000_0040, 2, 0, 2, 100003, 3, 0, 1, 24, 0x5eed]);
    sys.extend(be(&[2]));
    sys.extend_from_slice(b"vm\0\0");
    sys.extend(be(&[65534, 65534, 0, 0, 0]));
    assert_eq!(sys.len(), 68);

    let mut wire = none;
    wire.extend(frag);
    wire.extend(sys);
    (wire, vec![(0, 44), (44, 52), (96, 68)], vec![40, 40, 64])
}

/// 9P2000: Tversion, Rversion, Tattach-like, each `size[4] type[1] tag[2]` + body, little-endian.
fn ninep_capture() -> (Vec<u8>, Vec<(u64, u64)>) {
    let mut wire = Vec::new();
    let mut want = Vec::new();
    for (ty, body) in [
        (100u8, &b"\x00\x20\x00\x00\x06\x009P2000"[..]),
        (101, b"\x00\x20\x00\x00\x06\x009P2000"),
        (104, &[7u8; 30][..]),
    ] {
        let size = 7 + body.len() as u32;
        want.push((wire.len() as u64, u64::from(size)));
        wire.extend(size.to_le_bytes());
        wire.push(ty);
        wire.extend(0xffffu16.to_le_bytes());
        wire.extend_from_slice(body);
    }
    (wire, want)
}

/// Run the built-in `spec` and every object of `source` on `wire`; all must
/// find `want` and end on a boundary.
fn agree(spec: &str, source: &str, wire: &[u8], want: &[(u64, u64)]) {
    let cap = capture(&format!("{source}.bin"), wire);
    let cap = cap.to_str().unwrap();
    let o = parse(&["--json", "--parser", spec, cap], b"");
    assert_eq!(o.code, 0, "{spec}: {}{}", o.stdout, o.stderr);
    assert_eq!(o.messages(), want, "{spec}");
    assert_eq!(o.end()["end"], "boundary");
    assert_eq!(o.end()["bytes"], wire.len() as u64);
    for obj in objects_of(source) {
        let b = parse(&["--json", "--bpf", obj.to_str().unwrap(), cap], b"");
        assert_eq!(b.code, 0, "{}: {}{}", obj.display(), b.stdout, b.stderr);
        assert_eq!(b.stdout, o.stdout, "{} and {spec} disagree", obj.display());
    }
}

#[test]
fn l4_text_output_and_boundary() {
    let mut wire = l4(b"hello");
    wire.extend(l4(b""));
    wire.extend(l4(&[9u8; 300]));
    let o = parse(&[], &wire);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(
        o.stdout,
        "offset=0 len=9\noffset=9 len=4\noffset=13 len=304\n\
         end: on a message boundary after 3 messages, 317 bytes\n"
    );
    let q = parse(&["-q", "--parser", "l4"], &wire);
    assert_eq!(q.stdout, "end: on a message boundary after 3 messages, 317 bytes\n");
}

#[test]
fn empty_input_is_a_boundary() {
    let o = parse(&["--json"], b"");
    assert_eq!(o.code, 0);
    assert_eq!(o.messages(), []);
    assert_eq!(o.end(), serde_json::json!({"end": "boundary", "messages": 0, "bytes": 0}));
}

#[test]
fn file_and_stdin_give_the_same_answer() {
    let (wire, _, _) = ksf_rpc_capture();
    let cap = capture("ksf-stdin.bin", &wire);
    let a = parse(&["--parser", "oncrpc", cap.to_str().unwrap()], b"");
    let b = parse(&["--parser", "oncrpc"], &wire);
    let c = parse(&["--parser", "oncrpc", "-"], &wire);
    assert_eq!(a.code, 0);
    assert_eq!(a.stdout, b.stdout);
    assert_eq!(a.stdout, c.stdout);
}

#[test]
fn ksf_rpc_capture_record_marking_builtin_and_bpf() {
    let (wire, want, bodies) = ksf_rpc_capture();
    agree("oncrpc", "oncrpc", &wire, &want);
    // Stripping the marks changes what is delivered, not where messages are.
    let o = parse(&["--json", "--parser", "oncrpc:strip"], &wire);
    assert_eq!(o.code, 0);
    assert_eq!(o.messages(), want);
    let delivered: Vec<u64> = o.json().iter().filter_map(|v| v.get("delivered").and_then(Value::as_u64)).collect();
    assert_eq!(delivered, bodies);
    let t = parse(&["--parser", "oncrpc:strip"], &wire);
    assert!(t.stdout.starts_with("offset=0 len=44 delivered=40\noffset=44 len=52 delivered=40\n"), "{}", t.stdout);
    // A record of more fragments than allowed is refused where it starts.
    let r = parse(&["--json", "--parser", "oncrpc:max_fragments=2"], &wire);
    assert_eq!(r.code, 4);
    assert_eq!(r.messages(), [(0, 44)]);
    assert_eq!(r.end()["offset"], 44);
    assert_eq!(r.end()["kind"], "parser");
}

#[test]
fn ninep_builtin_and_bpf() {
    let (wire, want) = ninep_capture();
    agree("9p", "ninep", &wire, &want);
}

#[test]
fn thrift_builtin_and_bpf() {
    let mut wire = Vec::new();
    let mut want = Vec::new();
    for n in [1usize, 40, 3] {
        // Strict binary protocol: version word 0x80010001 (a call), then filler.
        let mut frame = vec![0x80, 0x01, 0x00, 0x01];
        frame.resize(4 + n, 0x2a);
        want.push((wire.len() as u64, 4 + frame.len() as u64));
        wire.extend(l4(&frame));
    }
    agree("thrift", "thrift", &wire, &want);
}

#[test]
fn http2_builtin_and_bpf() {
    let mut wire = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    let mut want = vec![(0, 24)];
    // SETTINGS (6 bytes of payload), SETTINGS ack (empty), HEADERS (17 bytes).
    for (ty, flags, len) in [(4u8, 0u8, 6usize), (4, 1, 0), (1, 5, 17)] {
        want.push((wire.len() as u64, 9 + len as u64));
        wire.extend(&(len as u32).to_be_bytes()[1..]);
        wire.extend([ty, flags, 0, 0, 0, if ty == 1 { 1 } else { 0 }]);
        wire.extend(std::iter::repeat_n(0x55u8, len));
    }
    agree("http2", "http2", &wire, &want);
}

#[test]
fn length_prefix_builtin_and_bpf_across_read_chunks() {
    // Several hundred KiB of messages of many sizes, so messages straddle the
    // command's 64 KiB reads at every kind of offset.
    let mut wire = Vec::new();
    let mut want = Vec::new();
    let mut rng = SmallRng::seed_from_u64(0x1234_5678);
    for i in 0..400u32 {
        let n = if i % 50 == 0 { 70_000 } else { rng.gen_range(0..2000) };
        want.push((wire.len() as u64, 4 + n as u64));
        wire.extend(l4(&vec![i as u8; n]));
    }
    assert!(wire.len() > 4 * (64 << 10));
    agree("l4", "len_prefix", &wire, &want);
}

#[test]
fn section_chooses_a_program_in_an_object_of_several() {
    // 2-byte little-endian total length, header included.
    let mut wire = Vec::new();
    let mut want = Vec::new();
    for n in [2u16, 10, 257] {
        want.push((wire.len() as u64, u64::from(n)));
        wire.extend(n.to_le_bytes());
        wire.extend(std::iter::repeat_n(1u8, usize::from(n) - 2));
    }
    let spec = "len:width=2,endian=le,includes_header=true";
    let o = parse(&["--json", "--parser", spec], &wire);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(o.messages(), want);
    let Some(dir) = bpf_objects() else { return };
    let obj = dir.join("len_variants.v3.o");
    let obj = obj.to_str().unwrap();
    let amb = parse(&["--bpf", obj], &wire);
    assert_eq!(amb.code, 1);
    assert!(amb.stderr.contains("len16le") && amb.stderr.contains("len64be"), "{}", amb.stderr);
    for section in ["socket/len16le", "len16le"] {
        let b = parse(&["--json", "--bpf", obj, "--section", section], &wire);
        assert_eq!(b.code, 0, "{}", b.stderr);
        assert_eq!(b.stdout, o.stdout, "section {section}");
    }
    let none = parse(&["--bpf", obj, "--section", "nosuch"], &wire);
    assert_eq!(none.code, 1);
    assert!(none.stderr.contains("nosuch"), "{}", none.stderr);
}

#[test]
fn parser_error_is_reported_where_the_bad_message_starts() {
    let (mut wire, want) = ninep_capture();
    let at = wire.len() as u64;
    // size 3: below the 7-byte header.
    wire.extend([3, 0, 0, 0, 100, 0, 0, 1, 2, 3]);
    let o = parse(&["--json", "--parser", "9p"], &wire);
    assert_eq!(o.code, 4, "{}", o.stdout);
    assert_eq!(o.messages(), want);
    let end = o.end();
    assert_eq!(end["end"], "refused");
    assert_eq!(end["offset"], at);
    assert_eq!(end["messages"], 3);
    assert_eq!(end["kind"], "parser");
    assert_eq!(end["errno"], 71, "EPROTO: {end}");
    let t = parse(&["--parser", "9p"], &wire);
    assert_eq!(t.code, 4);
    assert!(
        t.stdout.ends_with(&format!(
            "end: refused at offset {at}: parser refused the stream: length 3 is shorter than the 7-byte header (errno 71) (after 3 messages)\n"
        )),
        "{}",
        t.stdout
    );
    // The BPF program refuses the same message with its own errno (EBADMSG).
    for obj in objects_of("ninep") {
        let b = parse(&["--json", "--bpf", obj.to_str().unwrap()], &wire);
        assert_eq!(b.code, 4, "{}", obj.display());
        assert_eq!(b.messages(), want);
        let e = b.end();
        assert_eq!(
            (e["offset"].as_u64(), e["kind"].as_str(), e["errno"].as_i64()),
            (Some(at), Some("parser"), Some(74))
        );
    }
}

#[test]
fn message_larger_than_max_msg_is_refused() {
    let mut wire = l4(&[1; 96]);
    wire.extend(l4(&[2; 97]));
    let o = parse(&["--json", "--max-msg", "100"], &wire);
    assert_eq!(o.code, 4);
    assert_eq!(o.messages(), [(0, 100)]);
    let e = o.end();
    assert_eq!((e["kind"].as_str(), e["errno"].as_i64(), e["offset"].as_u64()), (Some("too-big"), Some(90), Some(100)));
    // The default limit is the mux's (1 MiB): a 2 MiB message is refused, and
    // a larger --max-msg accepts it.
    let big = l4(&vec![0; 2 << 20]);
    assert_eq!(parse(&["-q"], &big).code, 4);
    let ok = parse(&["--json", "--max-msg", "3M"], &big);
    assert_eq!(ok.code, 0, "{}", ok.stdout);
    assert_eq!(ok.messages(), [(0, 4 + (2 << 20))]);
}

#[test]
fn input_ending_mid_message() {
    let (wire, _, _) = ksf_rpc_capture();
    // The first call whole, then 6 bytes of the 3-fragment call.
    let cut = &wire[..50];
    let o = parse(&["--json", "--parser", "oncrpc"], cut);
    assert_eq!(o.code, 3, "{}", o.stdout);
    assert_eq!(o.messages(), [(0, 44)]);
    let e = o.end();
    assert_eq!(e["end"], "mid-message");
    assert_eq!((e["offset"].as_u64(), e["buffered"].as_u64()), (Some(44), Some(6)));
    // The first fragment (mark + 1 byte) is in, and 1 byte of the next
    // 4-byte mark: the parser cannot decide before 3 more.
    assert_eq!(e["need"], 3);
    let t = parse(&["--parser", "oncrpc"], cut);
    assert!(t.stdout.ends_with("end: input ended mid-message at offset 44: 6 bytes of the message, at least 3 more needed (after 1 message)\n"), "{}", t.stdout);
    // Cut inside a header the parser has not seen whole yet.
    let h = parse(&["--json"], &[0, 0]);
    assert_eq!(h.code, 3);
    assert_eq!(h.end()["need"], 2);
    for obj in objects_of("oncrpc") {
        let b = parse(&["--json", "--bpf", obj.to_str().unwrap()], cut);
        assert_eq!(b.code, 3, "{}", obj.display());
        assert_eq!(b.messages(), [(0, 44)]);
        assert_eq!(b.end()["buffered"], 6);
    }
}

#[test]
fn bad_command_lines() {
    let bad_spec = parse(&["--parser", "nosuch"], b"");
    assert_eq!(bad_spec.code, 1);
    assert!(bad_spec.stderr.contains("valid forms"), "{}", bad_spec.stderr);
    assert_eq!(parse(&["--parser", "l4", "--bpf", "x.o"], b"").code, 2);
    assert_eq!(parse(&["--section", "x"], b"").code, 2);
    assert_eq!(parse(&["--max-msg", "0"], b"").code, 2);
    let missing = parse(&["/nonexistent/capture.bin"], b"");
    assert_eq!(missing.code, 1);
    assert!(missing.stderr.contains("/nonexistent/capture.bin"), "{}", missing.stderr);
    let not_elf = capture("not-elf.o", b"not an object");
    assert_eq!(parse(&["--bpf", not_elf.to_str().unwrap()], b"").code, 1);
    let help = parse(&["--help"], b"");
    assert_eq!(help.code, 0);
    for line in
        ["0  the input ended on a message boundary", "3  the input ended in the middle", "4  the stream was refused"]
    {
        assert!(help.stdout.contains(line), "--help lacks {line:?}");
    }
}
