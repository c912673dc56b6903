//! Cases of the public API's backends (not in kcm-semantics §7): which
//! backend `Auto` and `Kernel` give, the calls the kernel backend refuses, and
//! bad input reported the same way on both (typed event, counter, that
//! connection stopped and reset). Everything goes through `connmux::Mux` and
//! `connmux::KcmSocket`.

use std::io::{self, Read, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use connmux::{
    Backend, BackendError, BpfProgram, Config, KernelError, Mux, PsockError, RxError, SockType, UNKNOWN_PSOCK,
};
use connmux_core::parser::ParseError;
use connmux_core::stats::PsockStats;

use crate::backend::{config, frame, tcp_pair, Kind, Opts};
use crate::outcome::Outcome::{self, *};

const WAIT: Duration = Duration::from_secs(5);
const QUIET: Duration = Duration::from_millis(300);

type R = Result<Outcome, String>;

macro_rules! ensure {
    ($c:expr, $($t:tt)*) => { if !$c { return Err(format!($($t)*)); } };
}

fn ctx<T>(r: io::Result<T>, what: &str) -> Result<T, String> {
    r.map_err(|e| format!("{what}: {e}"))
}

fn run(f: impl FnOnce() -> R) -> Outcome {
    f().unwrap_or_else(Fail)
}

fn mux(kind: Kind) -> Result<Mux, String> {
    ctx(Mux::new(config(kind, Opts::default())), "Mux::new")
}

/// 44: what `Auto` and `Kernel` give on this kernel, and that the mux works.
pub fn case_44_backend_choice_auto_and_kernel(kind: Kind) -> Outcome {
    run(|| {
        let have = connmux::KernelMux::supported();
        ensure!(Config::default().backend == Backend::Userspace, "default backend {:?}", Config::default().backend);
        let auto = ctx(Mux::new(Config { backend: Backend::Auto, ..Config::default() }), "Auto")?;
        let want = if have { Backend::Kernel } else { Backend::Userspace };
        ensure!(auto.backend() == want, "Auto chose {:?} with AF_KCM {have}", auto.backend());
        let kernel_note = match Mux::new(Config { backend: Backend::Kernel, ..Config::default() }) {
            Ok(m) => {
                ensure!(have, "Backend::Kernel without AF_KCM gave a mux");
                ensure!(
                    m.backend() == Backend::Kernel && m.workers() == 0,
                    "{:?}, {} workers",
                    m.backend(),
                    m.workers()
                );
                "Kernel: AF_KCM mux, 0 workers".to_owned()
            }
            Err(e) => {
                ensure!(!have, "Backend::Kernel failed with AF_KCM present: {e}");
                ensure!(e.kind() == io::ErrorKind::Unsupported, "kind {:?}: {e}", e.kind());
                let Some(BackendError::KernelUnavailable(why)) = BackendError::of(&e) else {
                    return Err(format!("not KernelUnavailable: {e:?}"));
                };
                ensure!(why.raw_os_error() == Some(libc::EAFNOSUPPORT), "{why}");
                format!("Kernel: Unsupported, \"{e}\"")
            }
        };
        // The mux of this kind carries a message.
        let m = mux(kind)?;
        let s = ctx(m.socket(SockType::Dgram), "socket")?;
        ctx(s.set_read_timeout(Some(WAIT)), "SO_RCVTIMEO")?;
        let (mut peer, low) = ctx(tcp_pair(), "tcp")?;
        ctx(m.attach(&low, connmux::parsers::from_spec("l4").unwrap()), "attach")?;
        ctx(peer.write_all(&frame(b"hello")), "write")?;
        let mut b = [0u8; 64];
        let n = ctx(s.recv(&mut b), "recv")?;
        ensure!(b[..n] == frame(b"hello")[..], "got {n} B");
        Ok(Pass(format!(
            "Auto -> {:?} (AF_KCM {}); {kernel_note}; {:?} mux carries a message",
            auto.backend(),
            if have { "yes" } else { "no" },
            m.backend()
        )))
    })
}

fn refused(r: io::Result<impl Sized>, call: &str) -> Result<(), String> {
    match r {
        Ok(_) => Err(format!("{call} worked on the kernel backend")),
        Err(e) => {
            ensure!(e.kind() == io::ErrorKind::Unsupported, "{call}: kind {:?}: {e}", e.kind());
            match BackendError::of(&e) {
                Some(BackendError::Unsupported { call: c, .. }) if c.contains(call) => Ok(()),
                other => Err(format!("{call}: {other:?}")),
            }
        }
    }
}

/// 45: the calls the kernel backend cannot do with the same meaning are
/// refused with a typed error naming them; a parser with no kernel form is
/// refused naming the parser; the mux keeps working. Userspace: they work.
pub fn case_45_calls_without_a_kernel_form_are_refused(kind: Kind) -> Outcome {
    run(|| {
        let m = mux(kind)?;
        let s = ctx(m.socket(SockType::Dgram), "socket")?;
        ctx(s.set_read_timeout(Some(WAIT)), "SO_RCVTIMEO")?;
        let (mut peer, low) = ctx(tcp_pair(), "tcp")?;
        let p = ctx(m.attach(&low, connmux::parsers::from_spec("l4").unwrap()), "attach")?;
        ctx(peer.write_all(&frame(b"one")), "write")?;
        ctx(peer.write_all(&frame(b"two")), "write")?;
        if kind == Kind::User {
            let msg = ctx(s.recv_msg(), "recv_msg")?;
            ensure!(msg.psock == p && msg.data[..] == frame(b"one")[..], "recv_msg {msg:?}");
            ctx(s.send_to(&frame(b"re"), msg.psock), "send_to")?;
            ctx(s.set_affinity(Some(0)), "set_affinity")?;
            let mut b = [0u8; 7];
            ctx(peer.set_read_timeout(Some(WAIT)), "timeout")?;
            ctx(peer.read_exact(&mut b[..6]), "peer read")?;
            ensure!(b[..6] == frame(b"re")[..], "reply {:?}", &b[..6]);
            return Ok(Pass("recv_msg names the psock, send_to replies on it, set_affinity works".into()));
        }
        let mut b = [0u8; 64];
        // The refused calls consume nothing.
        refused(s.recv_msg(), "recv_msg")?;
        refused(s.recv_from(&mut b), "recv_from")?;
        refused(s.recv_batch(&mut Vec::new(), 4), "recv_batch")?;
        refused(s.send_to(&frame(b"x"), p), "send_to")?;
        refused(s.send_msg(connmux::Bytes::from_static(b"\0\0\0\x01x"), Some(p)), "send_msg")?;
        refused(s.set_affinity(Some(0)), "set_affinity")?;
        let h = Arc::new(|_: connmux::Bytes, _: connmux::PsockId, _: &mut bytes::BytesMut| {
            connmux::service::Verdict::NoReply
        });
        refused(m.serve(SockType::Dgram, h), "serve")?;
        // A parser with no kernel form, and a program that is not offset-safe.
        let (_p2, low2) = ctx(tcp_pair(), "tcp")?;
        let e = m.attach(&low2, connmux::parsers::from_spec("oncrpc").unwrap()).err().ok_or("oncrpc attached")?;
        ensure!(e.kind() == io::ErrorKind::Unsupported, "oncrpc: kind {:?}", e.kind());
        ensure!(
            matches!(BackendError::of(&e), Some(BackendError::Parser { parser, source: KernelError::UnsupportedParser(_) }) if parser == "oncrpc"),
            "oncrpc: {e:?}"
        );
        ensure!(e.to_string().contains("oncrpc"), "message does not name the parser: {e}");
        // r9 = 1; r0 = 0; exit: uses a register the rewrite needs.
        let uses_r9: Vec<u8> =
            [[0xb7, 0x09, 0, 0, 1, 0, 0, 0], [0xb7, 0, 0, 0, 0, 0, 0, 0], [0x95, 0, 0, 0, 0, 0, 0, 0]].concat();
        let e2 = m.attach_bpf(&low2, &BpfProgram::Bytecode(uses_r9)).err().ok_or("r9 program attached")?;
        ensure!(
            matches!(BackendError::of(&e2), Some(BackendError::Parser { source: KernelError::NotOffsetSafe(_), .. })),
            "r9 program: {e2:?}"
        );
        ensure!(m.psocks() == vec![p], "psocks {:?}", m.psocks());
        // Still working: both messages arrive, with the unknown psock.
        let i = ctx(s.recv_flags(&mut b, Default::default()), "recv")?;
        ensure!(b[..i.len] == frame(b"one")[..] && i.psock == UNKNOWN_PSOCK, "first {i:?}");
        let n = ctx(s.recv(&mut b), "recv")?;
        ensure!(b[..n] == frame(b"two")[..], "second {n} B");
        Ok(Pass(format!(
            "recv_msg/recv_from/recv_batch/send_to/send_msg/set_affinity/serve Unsupported; \"{e}\"; r9 program NotOffsetSafe; messages intact after"
        )))
    })
}

/// The receive-abort counters of one error kind.
fn counter(kind: &str, s: &PsockStats) -> u64 {
    match kind {
        "TooBig" => s.rx_msg_too_big,
        _ => s.rx_interrupted,
    }
}

fn kind_of(e: &PsockError) -> &'static str {
    match e {
        PsockError::Rx(RxError::TooBig { .. }) => "TooBig",
        PsockError::Rx(RxError::Parser(ParseError::LengthBelowHeader { .. })) => "LengthBelowHeader",
        _ => "other",
    }
}

/// One bad input on connection A while B carries on.
fn bad(kind: Kind, spec: &str, bytes: &[u8], want: &str, good: fn(&[u8]) -> Vec<u8>) -> Result<String, String> {
    let m = mux(kind)?;
    let s = ctx(m.socket(SockType::Dgram), "socket")?;
    ctx(s.set_read_timeout(Some(WAIT)), "SO_RCVTIMEO")?;
    let (mut pa, la) = ctx(tcp_pair(), "tcp")?;
    let (mut pb, lb) = ctx(tcp_pair(), "tcp")?;
    let a = ctx(m.attach(&la, connmux::parsers::from_spec(spec).unwrap()), "attach A")?;
    let _b = ctx(m.attach(&lb, connmux::parsers::from_spec(spec).unwrap()), "attach B")?;
    // The mux keeps its own reference to each connection.
    drop((la, lb));
    let before = m.stats().psock;
    ctx(pa.write_all(bytes), "write A")?;
    // The typed event.
    let ev = m.events().recv_timeout(WAIT).map_err(|_| "no psock event within the wait")?;
    ensure!(ev.psock == a && kind_of(&ev.error) == want, "event {ev:?}, want {want} on {a:?}");
    let err = m.psock_error(a).ok_or("no psock_error")?;
    ensure!(kind_of(&err) == want, "psock_error {err:?}");
    // The counters: this psock's, and the mux's (the namespace's on the kernel).
    let ps = ctx(m.psock_stats(a), "psock_stats")?;
    ensure!(counter(want, &ps) == 1 && ps.rx_aborts == 1, "psock counters {ps:?}");
    let d = counter(want, &m.stats().psock) - counter(want, &before);
    ensure!(d == 1, "mux counter +{d}");
    // That connection stopped: a good message on A is not delivered; B works.
    ctx(pa.write_all(&good(b"after")), "write A again")?;
    ctx(pb.write_all(&good(b"bee")), "write B")?;
    let mut buf = [0u8; 64];
    let n = ctx(s.recv(&mut buf), "recv B")?;
    ensure!(buf[..n] == good(b"bee")[..], "got {n} B: {:?}", &buf[..n]);
    ctx(s.set_read_timeout(Some(QUIET)), "SO_RCVTIMEO")?;
    ensure!(s.recv(&mut buf).is_err(), "A delivered after its error");
    // abort: unattached and reset.
    ctx(m.abort(a), "abort")?;
    ensure!(!m.psocks().contains(&a), "still attached");
    ctx(pa.set_read_timeout(Some(WAIT)), "timeout")?;
    let t = Instant::now();
    let mut sink = [0u8; 64];
    let reset = loop {
        match pa.read(&mut sink) {
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => break true,
            Ok(n) if n > 0 && t.elapsed() < WAIT => continue,
            _ => break false,
        }
    };
    ensure!(reset, "peer A saw no reset");
    Ok(format!("{want}: event + psock_error, psock counter 1 (RX-Aborts 1), mux counter +1, A stopped, B delivered, abort resets A"))
}

/// 46: bad input (oversize message, parser error) through the public API:
/// the same typed event, counters, stopped connection and reset on both backends.
pub fn case_46_bad_input_via_the_public_api_is_reported_alike(kind: Kind) -> Outcome {
    run(|| {
        // A 64 MiB length: above max_msg_size (1 MiB) on both backends.
        let big = bad(kind, "l4", &[0x04, 0, 0, 0, 1, 2, 3], "TooBig", frame)?;
        // A length below its own header: the parser refuses the stream.
        let with_header = |b: &[u8]| {
            let mut m = ((b.len() + 4) as u32).to_be_bytes().to_vec();
            m.extend_from_slice(b);
            m
        };
        let below = bad(kind, "len:includes_header=true", &[0, 0, 0, 2, 9, 9], "LengthBelowHeader", with_header)?;
        Ok(Pass(format!("{big}; {below}")))
    })
}
