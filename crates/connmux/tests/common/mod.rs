//! Helpers for the loopback tests: real TCP on 127.0.0.1, bounded waits.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use std::cell::Cell;

use connmux::service::{Handler, Service, ServiceConfig};
use connmux::{Config, Driver, Mux, Parser, SockType};

pub const WAIT: Duration = Duration::from_secs(10);

/// A connected pair over loopback: (the side we attach, the raw peer).
pub fn pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let peer = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (ours, _) = l.accept().unwrap();
    peer.set_nodelay(true).unwrap();
    peer.set_read_timeout(Some(WAIT)).unwrap();
    (ours, peer)
}

pub fn l4() -> Box<dyn Parser> {
    connmux::parsers::from_spec("l4").unwrap()
}

/// An L4-framed message: 4-byte big-endian length of the body, then the body.
pub fn framed(body: &[u8]) -> Vec<u8> {
    let mut v = (body.len() as u32).to_be_bytes().to_vec();
    v.extend_from_slice(body);
    v
}

thread_local! {
    /// The driver the muxes of this test thread run (see [`run_on`]).
    static DRIVER: Cell<Driver> = const { Cell::new(Driver::Epoll) };
}

/// The driver of the test running on this thread.
pub fn driver() -> Driver {
    DRIVER.with(|d| d.get())
}

/// Whether `d` can run here (io_uring may be disabled or missing). Where
/// the test run says io_uring must be there (`CONNMUX_TEST_REQUIRE_URING`,
/// which `scripts/test.sh` sets on a kernel that has it), a missing ring
/// fails the test instead of skipping it: a probe that fails for a wrong
/// reason must not pass every io_uring test in silence.
pub fn available(d: Driver) -> bool {
    if d != Driver::Uring || connmux_sys::uring::supported() {
        return true;
    }
    let required = std::env::var("CONNMUX_TEST_REQUIRE_URING").is_ok_and(|v| !v.is_empty() && v != "0");
    assert!(!required, "io_uring is required here (CONNMUX_TEST_REQUIRE_URING) but the ring cannot be set up");
    false
}

/// Run a test body with every mux it makes on driver `d`; a driver that cannot
/// run here is reported as skipped (on stderr), not passed in silence.
pub fn run_on(d: Driver, body: impl FnOnce()) {
    if !available(d) {
        eprintln!("SKIPPED on {d:?}: io_uring is not available on this machine");
        return;
    }
    eprintln!("driver: {d:?}");
    DRIVER.with(|c| c.set(d));
    body();
}

/// One `#[test]` per driver for each named test body: `name::epoll`, `name::uring`.
#[allow(unused_macros)]
macro_rules! on_both_drivers {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                #[test]
                fn epoll() {
                    super::common::run_on(connmux::Driver::Epoll, super::$name)
                }
                #[test]
                fn uring() {
                    super::common::run_on(connmux::Driver::Uring, super::$name)
                }
            }
        )*
    };
}

pub fn mux_with(f: impl FnOnce(&mut Config)) -> Mux {
    let mut c = Config::default();
    c.workers = 1;
    c.placement = connmux::Placement::Unpinned;
    c.driver = driver();
    f(&mut c);
    let want = c.driver;
    let m = Mux::new(c).unwrap();
    assert_eq!(m.driver(), want, "the mux runs another driver than asked");
    m
}

/// Read one L4 message from a raw peer (bounded by the peer's read timeout).
pub fn read_framed(peer: &mut TcpStream) -> Vec<u8> {
    let mut hdr = [0u8; 4];
    peer.read_exact(&mut hdr).unwrap();
    let mut body = vec![0u8; u32::from_be_bytes(hdr) as usize];
    peer.read_exact(&mut body).unwrap();
    body
}

pub fn write_all(peer: &mut TcpStream, b: &[u8]) {
    peer.write_all(b).unwrap();
}

/// Poll `f` until it returns Some, for at most WAIT.
pub fn eventually<T>(mut f: impl FnMut() -> Option<T>) -> T {
    let end = Instant::now() + WAIT;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < end, "condition not met within {WAIT:?}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Calls (`call`: one request and its answer) until the service's only
/// connection is attached: its psock, and the calls made.
pub fn calls_until_attached(svc: &Service, mut call: impl FnMut()) -> (connmux::PsockId, u64) {
    let mut calls = 0;
    let p = eventually(|| {
        call();
        calls += 1;
        svc.mux().psocks().first().copied()
    });
    (p, calls)
}

/// A DGRAM service on an ephemeral loopback port, `l4` framing, `handler`
/// answering in place.
pub fn l4_service(mux: Mux, handler: std::sync::Arc<dyn Handler>) -> Service {
    Service::start(
        mux,
        ServiceConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            sock_type: SockType::Dgram,
            parser: std::sync::Arc::new(l4),
        },
        handler,
    )
    .unwrap()
}

/// Tests that must not overlap others in the same file (they measure the
/// process's memory, or need CPUs with time to spare) hold this while they
/// run (one lock per test binary).
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Busy and total jiffies of each CPU so far (`/proc/stat`), for saying how
/// busy the CPUs were when a spread did not happen.
pub fn cpu_jiffies() -> Vec<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    stat.lines()
        .filter(|l| l.starts_with("cpu") && l.as_bytes().get(3).is_some_and(u8::is_ascii_digit))
        .map(|l| {
            let v: Vec<u64> = l.split_whitespace().skip(1).filter_map(|x| x.parse().ok()).collect();
            let total: u64 = v.iter().sum();
            // idle and iowait are not busy.
            let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
            (total - idle.min(total), total)
        })
        .collect()
}

/// This process's CPU time so far (user + system), in clock ticks.
pub fn self_jiffies() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name's closing parenthesis: state is the
    // first, utime the 12th, stime the 13th.
    let f: Vec<u64> =
        stat.rsplit_once(')').map_or("", |(_, r)| r).split_whitespace().map(|x| x.parse().unwrap_or(0)).collect();
    f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0)
}

/// CPUs' worth of time other processes used since `before` (`cpu_jiffies`)
/// and `mine` (`self_jiffies`): the busy time of every CPU but this
/// process's, over one CPU's time.
pub fn others_busy(before: &[(u64, u64)], mine: u64) -> f64 {
    let after = cpu_jiffies();
    let busy: u64 = before.iter().zip(&after).map(|((b0, _), (b1, _))| b1 - b0).sum();
    let span = before.iter().zip(&after).map(|((_, t0), (_, t1))| t1 - t0).max().unwrap_or(0).max(1);
    busy.saturating_sub(self_jiffies() - mine) as f64 / span as f64
}

/// Each CPU's busy share between two `cpu_jiffies` readings, as text.
pub fn busy_since(before: &[(u64, u64)]) -> String {
    let after = cpu_jiffies();
    let shares: Vec<String> = before
        .iter()
        .zip(&after)
        .enumerate()
        .map(|(i, ((b0, t0), (b1, t1)))| format!("cpu{i} {}%", 100 * (b1 - b0) / (t1 - t0).max(1)))
        .collect();
    shares.join(", ")
}
