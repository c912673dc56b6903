//! The baseline servers: one thread per connection, blocking reads, no framework.
//! They do the same job as the connmux servers so both can be measured in one run.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::cmd::server::{wait_and_report, EchoArgs, RpcArgs};
use crate::cmd::stop;

/// Counters of a baseline server.
#[derive(Default, Debug)]
pub struct BaselineStats {
    pub accepted: AtomicU64,
    pub calls: AtomicU64,
    pub closed_bad: AtomicU64,
    /// Connections open now.
    pub open: AtomicU64,
}

/// A running thread-per-connection server.
pub struct Baseline {
    pub local: SocketAddr,
    pub stats: Arc<BaselineStats>,
    stop: Arc<AtomicBool>,
    accept: Option<std::thread::JoinHandle<()>>,
}

impl Baseline {
    /// ONC RPC NULL server, one thread per connection.
    pub fn start_rpc(listen: SocketAddr, reg: connmux_oncrpc::Registry) -> std::io::Result<Baseline> {
        let reg = Arc::new(reg);
        Self::start(listen, move |conn, stats| serve_rpc(conn, &reg, stats))
    }

    /// Echo server (every byte back), one thread per connection.
    pub fn start_echo(listen: SocketAddr) -> std::io::Result<Baseline> {
        Self::start(listen, |mut conn, stats| {
            let mut buf = vec![0u8; 64 << 10];
            loop {
                match conn.read(&mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => {
                        stats.calls.fetch_add(1, Ordering::Relaxed);
                        if conn.write_all(&buf[..n]).is_err() {
                            return;
                        }
                    }
                }
            }
        })
    }

    fn start(
        listen: SocketAddr,
        serve: impl Fn(TcpStream, &BaselineStats) + Send + Sync + Clone + 'static,
    ) -> std::io::Result<Baseline> {
        let listener = TcpListener::bind(listen)?;
        let local = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(BaselineStats::default());
        let (stop2, stats2) = (stop.clone(), stats.clone());
        let accept = std::thread::Builder::new().name("baseline-accept".into()).spawn(move || {
            while !stop2.load(Ordering::Acquire) {
                match listener.accept() {
                    Ok((conn, _)) => {
                        stats2.accepted.fetch_add(1, Ordering::Relaxed);
                        let _ = conn.set_nonblocking(false);
                        let _ = conn.set_nodelay(true);
                        let (serve, stats) = (serve.clone(), stats2.clone());
                        stats.open.fetch_add(1, Ordering::Relaxed);
                        let spawned = std::thread::Builder::new().name("baseline-conn".into()).spawn(move || {
                            serve(conn, &stats);
                            stats.open.fetch_sub(1, Ordering::Relaxed);
                        });
                        if spawned.is_err() {
                            stats2.open.fetch_sub(1, Ordering::Relaxed);
                        }
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(2)),
                }
            }
        })?;
        Ok(Baseline { local, stats, stop, accept: Some(accept) })
    }
}

impl Baseline {
    /// Stop accepting (the listener closes within a few milliseconds); the
    /// connections' threads go on.
    pub fn stop_accepting(&self) {
        self.stop.store(true, Ordering::Release);
    }
}

impl Drop for Baseline {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
    }
}

/// Read records, answer each; all replies to one read go out in one write.
fn serve_rpc(mut conn: TcpStream, reg: &connmux_oncrpc::Registry, stats: &BaselineStats) {
    let mut reader = connmux_oncrpc::RecordReader::new(connmux_oncrpc::RecordLimits::default());
    let mut buf = vec![0u8; 64 << 10];
    let mut out = Vec::with_capacity(64 << 10);
    loop {
        let n = match conn.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        reader.push(&buf[..n]);
        let mut close = false;
        loop {
            match reader.next_record() {
                Ok(Some(rec)) => {
                    stats.calls.fetch_add(1, Ordering::Relaxed);
                    if let connmux_oncrpc::Outcome::CloseConnection(_) = reg.handle(rec, &mut out) {
                        close = true;
                        break;
                    }
                }
                Err(_) => {
                    close = true;
                    break;
                }
                Ok(None) => break,
            }
        }
        if !out.is_empty() && conn.write_all(&out).is_err() {
            return;
        }
        out.clear();
        if close {
            stats.closed_bad.fetch_add(1, Ordering::Relaxed);
            return;
        }
    }
}

fn report(b: &Baseline, started: Instant) {
    println!(
        "after {:.1}s: accepted={} calls={} closed_bad={}",
        started.elapsed().as_secs_f64(),
        b.stats.accepted.load(Ordering::Relaxed),
        b.stats.calls.load(Ordering::Relaxed),
        b.stats.closed_bad.load(Ordering::Relaxed)
    );
}

/// What a baseline server's statistics endpoint answers: its counters now.
fn snapshot(what: &'static str, b: &Baseline, started: Instant) -> Arc<dyn Fn() -> String + Send + Sync> {
    let (stats, local) = (b.stats.clone(), b.local);
    Arc::new(move || {
        format!(
            "{what} (thread per connection) pid={} listen={local} uptime_s={:.1}\naccepted={}\ncalls={}\nclosed_bad={}\n",
            std::process::id(),
            started.elapsed().as_secs_f64(),
            stats.accepted.load(Ordering::Relaxed),
            stats.calls.load(Ordering::Relaxed),
            stats.closed_bad.load(Ordering::Relaxed)
        )
    })
}

pub fn run_rpc(a: &RpcArgs, reg: connmux_oncrpc::Registry) -> anyhow::Result<i32> {
    let rpcbind = a.rpcbind.map(|addr| (addr, crate::cmd::server::rpcbind_entries(&reg)));
    let b = Baseline::start_rpc(a.listen, reg)?;
    let started = Instant::now();
    let endpoint = a.common.stats_endpoint("rpc-server", snapshot("rpc-server", &b, started))?;
    println!("rpc-server (thread per connection) listening on {}", b.local);
    let registration = crate::cmd::server::register_rpcbind(rpcbind, b.local, false)?;
    stop::flush();
    let ending = wait_and_report(&a.common, || report(&b, started));
    let stopped = drain(&b, "rpc-server", ending, &a.common.stop);
    drop(registration);
    drop(endpoint);
    report(&b, started);
    Ok(stopped.finish())
}

/// The graceful stop of a baseline server ([`stop::drain`]); bytes moved are
/// not counted here, so its calls stand for them.
fn drain(b: &Baseline, what: &str, ending: stop::Ending, args: &stop::StopArgs) -> stop::Stop {
    stop::drain(
        what,
        ending,
        args,
        || b.stop_accepting(),
        || stop::Progress { open: b.stats.open.load(Ordering::Relaxed), moved: b.stats.calls.load(Ordering::Relaxed) },
    )
}

pub fn run_echo(a: &EchoArgs) -> anyhow::Result<i32> {
    let b = Baseline::start_echo(a.listen)?;
    let started = Instant::now();
    let endpoint = a.common.stats_endpoint("echo-server", snapshot("echo-server", &b, started))?;
    println!("echo-server (thread per connection) listening on {}", b.local);
    stop::flush();
    let ending = wait_and_report(&a.common, || report(&b, started));
    let stopped = drain(&b, "echo-server", ending, &a.common.stop);
    drop(endpoint);
    report(&b, started);
    Ok(stopped.finish())
}
