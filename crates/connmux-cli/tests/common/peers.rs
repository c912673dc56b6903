//! Clients of the RPC and echo servers that the hostile-peer tests share: a
//! request of each service, a count of whole replies, one call with a
//! deadline, a good client and its rate.

use std::io::{self, ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The server a test attacks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Service {
    /// `rpc-server`: NULL calls in marked records.
    Rpc,
    /// `echo-server --mode message --parser l4`: each message comes back.
    Echo,
}

impl Service {
    /// The server's command and the flags that make it this service.
    pub fn args(self) -> &'static [&'static str] {
        match self {
            Service::Rpc => &["rpc-server"],
            Service::Echo => &["echo-server", "--mode", "message", "--parser", "l4"],
        }
    }
}

/// One request: a NULL call (NFS v3, AUTH_NONE) in one record, or an `l4`
/// message of `body` bytes (at least 4: the sequence number first).
pub fn request(service: Service, n: u32, body: usize) -> Vec<u8> {
    match service {
        Service::Rpc => {
            let mut b = Vec::new();
            for w in [n, 0, 2, 100_003, 3, 0, 0, 0, 0, 0] {
                b.extend_from_slice(&w.to_be_bytes());
            }
            let mut rec = (0x8000_0000u32 | b.len() as u32).to_be_bytes().to_vec();
            rec.extend_from_slice(&b);
            rec
        }
        Service::Echo => {
            let mut m = (body as u32).to_be_bytes().to_vec();
            m.extend_from_slice(&n.to_be_bytes());
            m.resize(4 + body, 0x5a);
            m
        }
    }
}

/// Counts whole replies in a byte stream: both services answer with a
/// 4-byte header whose low 31 bits are the length that follows.
#[derive(Default)]
pub struct Counter {
    buf: Vec<u8>,
    pub replies: u64,
}

impl Counter {
    pub fn push(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
        let mut at = 0;
        while self.buf.len() - at >= 4 {
            let len = (u32::from_be_bytes(self.buf[at..at + 4].try_into().unwrap()) & 0x7fff_ffff) as usize;
            if self.buf.len() - at < 4 + len {
                break;
            }
            at += 4 + len;
            self.replies += 1;
        }
        self.buf.drain(..at);
    }
}

/// How long any one call of a good client, or of a new client beside an
/// attack, may wait for its reply.
pub const CALL_LIMIT: Duration = Duration::from_secs(5);

/// Send one request (a 36-byte body for echo) and wait for its reply,
/// within `limit`.
pub fn one_call(c: &mut TcpStream, service: Service, n: u32, limit: Duration) -> io::Result<()> {
    c.set_read_timeout(Some(limit))?;
    c.write_all(&request(service, n, 36))?;
    let mut counter = Counter::default();
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + limit;
    while counter.replies == 0 {
        if Instant::now() >= deadline {
            return Err(io::Error::from(ErrorKind::TimedOut));
        }
        match c.read(&mut buf)? {
            0 => return Err(io::Error::from(ErrorKind::UnexpectedEof)),
            k => counter.push(&buf[..k]),
        }
    }
    Ok(())
}

/// A good client: one call at a time, counting replies in `done`, until
/// `stop`. An error or a reply later than [`CALL_LIMIT`] ends it with
/// that error.
pub fn good_client(
    addr: SocketAddr,
    service: Service,
    done: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
) -> JoinHandle<io::Result<()>> {
    std::thread::spawn(move || {
        let mut c = TcpStream::connect(addr)?;
        c.set_nodelay(true)?;
        let mut n = 0u32;
        while !stop.load(Ordering::Acquire) {
            one_call(&mut c, service, n, CALL_LIMIT)?;
            n = n.wrapping_add(1);
            done.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    })
}

/// Replies per second a good client gets over `window`.
pub fn rate(done: &AtomicU64, window: Duration) -> f64 {
    let a = done.load(Ordering::Relaxed);
    let t = Instant::now();
    std::thread::sleep(window);
    (done.load(Ordering::Relaxed) - a) as f64 / t.elapsed().as_secs_f64()
}

/// A client that pipelines `n` requests of `body` bytes, shuts its write
/// side after the last, and reads from `late` after it connected, `chunk`
/// bytes at a time with `pause` after each read, to the end of the stream.
#[derive(Clone, Copy)]
pub struct LateReader {
    pub n: u32,
    pub body: usize,
    pub late: Duration,
    pub chunk: usize,
    pub pause: Duration,
}

impl LateReader {
    /// Runs one such client; returns the replies counted and how the
    /// stream ended.
    pub fn run(self, addr: SocketAddr, service: Service) -> (u64, io::Result<()>) {
        let LateReader { n, body, late, chunk, pause } = self;
        let mut c = TcpStream::connect(addr).unwrap();
        let mut w = c.try_clone().unwrap();
        let writer = std::thread::spawn(move || -> io::Result<()> {
            let mut batch = Vec::new();
            let mut i = 0;
            while i < n {
                batch.clear();
                for _ in 0..256.min(n - i) {
                    batch.extend_from_slice(&request(service, i, body));
                    i += 1;
                }
                w.write_all(&batch)?;
            }
            w.shutdown(Shutdown::Write)
        });
        std::thread::sleep(late);
        c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut counter = Counter::default();
        let mut buf = vec![0u8; chunk];
        let t0 = Instant::now();
        let end = loop {
            if t0.elapsed() > Duration::from_secs(120) {
                break Err(io::Error::from(ErrorKind::TimedOut));
            }
            match c.read(&mut buf) {
                Ok(0) => break Ok(()),
                Ok(k) => counter.push(&buf[..k]),
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => break Err(e),
            }
            if !pause.is_zero() {
                std::thread::sleep(pause);
            }
        };
        let _ = writer.join().unwrap();
        (counter.replies, end)
    }
}

/// `n` connections that each send `head` (all but the end of a message),
/// then nothing: they hold what the server read of it. Reconnects those the
/// server resets, until `stop`; a few threads, each holding its share.
pub fn holders(addr: SocketAddr, head: Vec<u8>, n: usize, stop: Arc<AtomicBool>) -> Vec<JoinHandle<()>> {
    let head = Arc::new(head);
    (0..4)
        .map(|t| {
            let (head, stop) = (head.clone(), stop.clone());
            let share = n / 4 + usize::from(t < n % 4);
            std::thread::spawn(move || {
                let mut conns: Vec<Option<TcpStream>> = (0..share).map(|_| None).collect();
                while !stop.load(Ordering::Acquire) {
                    for slot in conns.iter_mut() {
                        if stop.load(Ordering::Acquire) {
                            break;
                        }
                        let alive = slot.as_mut().is_some_and(|c| {
                            let mut b = [0u8; 1];
                            c.set_nonblocking(true).ok();
                            match c.peek(&mut b) {
                                Ok(k) => k > 0,
                                Err(e) => e.kind() == ErrorKind::WouldBlock,
                            }
                        });
                        if alive {
                            continue;
                        }
                        *slot = None;
                        let Ok(mut c) = TcpStream::connect(addr) else { continue };
                        // The server may stop reading part way (its budget):
                        // a bounded write, the rest left unsent.
                        c.set_write_timeout(Some(Duration::from_millis(200))).ok();
                        let _ = c.write_all(&head);
                        *slot = Some(c);
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
            })
        })
        .collect()
}

/// The most a server's memory budget may count (`mem_peak`) with `conns`
/// connections read under a budget of `limit` bytes, `workers` workers on
/// `driver`: past the limit only by the last reads of the connections still
/// read (two reads of `MEM_FLOOR` each, in an allocation of at most
/// `memory_bound` of that) and, on io_uring, a ring buffer each (one buffer
/// a receive once the budget is over) and what one wait of each worker's
/// ring (256 x 16 KiB) delivered before it was seen over.
pub fn budget_peak_bound(limit: usize, conns: usize, driver: &str, workers: usize) -> usize {
    let mut per_conn = connmux_core::stream::memory_bound(2 * connmux_core::mux::MEM_FLOOR);
    let mut rings = 0;
    if driver == "uring" {
        per_conn += 16 << 10;
        rings = workers * 256 * (16 << 10);
    }
    limit + conns * per_conn + rings
}
