//! The README's first snippet, run: application threads, each on its own
//! cloned `KcmSocket`, take whole messages with `recv_msg` and answer each on
//! its connection with `send_to`; one heavy connection (every request costs
//! 1 ms of CPU, 16 in flight) is answered on every CPU.
//!
//! ```text
//! cargo run --release -p connmux --example readme_threads
//! ```
//!
//! The peer that sends the requests is a thread of this program behind a
//! loopback listener (the snippet's `127.0.0.1:9000`); each reply says the
//! CPU it was computed on (`sched_getcpu`), and the peer prints how many
//! replies each CPU computed.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use connmux::{Config, Mux, SockType};

const REQUESTS: u32 = 2_000;
const IN_FLIGHT: u32 = 16;
const WORK: Duration = Duration::from_millis(1);

fn main() -> std::io::Result<()> {
    let peer = TcpListener::bind("127.0.0.1:0")?;
    let addr = peer.local_addr()?;
    let client = std::thread::spawn(move || send_requests(peer));

    // The snippet, with one change: the first socket only makes the clones
    // (KCM_RECV_DISABLE), so that no message is steered to a socket nobody
    // reads, where it would wait forever (as on AF_KCM). A clone has the
    // default options, receiving on.
    let mux = Mux::new(Config::default())?; // a worker per CPU
    let sock = mux.socket(SockType::Dgram)?; // socket(AF_KCM, SOCK_DGRAM, 0)
    sock.set_recv_disable(true)?; // KCM_RECV_DISABLE: this one only clones
    let conn = TcpStream::connect(addr)?;
    mux.attach(&conn, connmux::parsers::from_spec("l4").unwrap())?; // SIOCKCMATTACH
    for _ in 0..connmux::default_workers() {
        let worker = sock.try_clone()?; // SIOCKCMCLONE, one per thread
        std::thread::spawn(move || -> std::io::Result<()> {
            loop {
                let msg = worker.recv_msg()?; // one whole message + its connection
                let reply = answer(&msg.data);
                worker.send_to(&reply, msg.psock)?; // the reply, on that connection
            }
        });
    }

    let per_cpu = client.join().expect("the peer thread")?;
    let cpus = per_cpu.len();
    println!(
        "{REQUESTS} requests of one connection ({} ms of CPU each, {IN_FLIGHT} in flight), {} workers, {} threads on cloned sockets",
        WORK.as_millis(),
        mux.workers(),
        connmux::default_workers()
    );
    println!("replies computed per CPU: {per_cpu:?}");
    println!("answered on {cpus} CPU{}", if cpus == 1 { "" } else { "s" });
    Ok(())
}

/// A request's reply: its 4-byte id and the CPU that computed it (after
/// `WORK` of computing), L4-framed.
fn answer(request: &[u8]) -> Vec<u8> {
    let started = Instant::now();
    let mut x = 0u64;
    // Bounded by the clock (and by a count, should it stand still).
    for i in 0..u64::MAX {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(i);
        if i % 1024 == 0 && started.elapsed() >= WORK {
            break;
        }
    }
    std::hint::black_box(x);
    let cpu = connmux_sys::affinity::current_cpu().map_or(u32::MAX, |c| c as u32);
    let mut reply = 8u32.to_be_bytes().to_vec();
    reply.extend_from_slice(&request[4..8]);
    reply.extend_from_slice(&cpu.to_be_bytes());
    reply
}

/// The peer: accepts the snippet's connection, keeps `IN_FLIGHT` requests
/// outstanding (a new one as each reply comes), and counts the replies by
/// the CPU that computed them.
fn send_requests(listener: TcpListener) -> std::io::Result<BTreeMap<u32, u32>> {
    let (mut conn, _) = listener.accept()?;
    conn.set_nodelay(true)?;
    conn.set_read_timeout(Some(Duration::from_secs(10)))?;
    let request = |id: u32| {
        let mut r = 4u32.to_be_bytes().to_vec();
        r.extend_from_slice(&id.to_be_bytes());
        r
    };
    let mut per_cpu = BTreeMap::new();
    let mut answered = vec![false; REQUESTS as usize];
    let mut sent = 0;
    while sent < IN_FLIGHT {
        conn.write_all(&request(sent))?;
        sent += 1;
    }
    for _ in 0..REQUESTS {
        let mut reply = [0u8; 12];
        conn.read_exact(&mut reply)?;
        let id = u32::from_be_bytes(reply[4..8].try_into().expect("4 bytes"));
        let cpu = u32::from_be_bytes(reply[8..12].try_into().expect("4 bytes"));
        if id >= sent || std::mem::replace(&mut answered[id as usize], true) {
            return Err(std::io::Error::other(format!("reply {id} unexpected or twice")));
        }
        *per_cpu.entry(cpu).or_insert(0) += 1;
        if sent < REQUESTS {
            conn.write_all(&request(sent))?;
            sent += 1;
        }
    }
    Ok(per_cpu)
}
