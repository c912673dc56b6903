//! ONC RPC NULL served by tokio tasks, each on its own cloned KCM socket
//! (`AsyncKcmSocket`, feature `tokio`). The mux's workers read the
//! connections and frame the records (`oncrpc` parser); the tasks take whole
//! calls, build each reply with `connmux-oncrpc` (as `connmux rpc-server`
//! does), and send it back on the call's connection.
//!
//! ```text
//! cargo run --release -p connmux --features tokio --example tokio_rpc_null
//! cargo run --release -p connmux --features tokio --example tokio_rpc_null -- 127.0.0.1:2049
//! ```
//!
//! With no address it listens on an ephemeral loopback port, calls itself
//! (4 connections, 2,000 NULL calls each, 32 in flight per connection),
//! checks that every call got its one SUCCESS reply, prints what each task
//! answered and exits. With an address it serves until killed (call it with
//! `connmux rpctest`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use connmux::{AsyncKcmSocket, Config, Mux, SockType};
use connmux_oncrpc::{Outcome, RecordMark, Registry};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const CONNS: u32 = 4;
const CALLS: u32 = 2_000;
const IN_FLIGHT: u32 = 32;

type Error = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> Result<(), Error> {
    let serve_on = std::env::args().nth(1);
    // A worker per CPU, the assembly timeout, memory budget and connection
    // cap of `connmux rpc-server`: `Config::default()`.
    let mux = Mux::new(Config::default())?;
    let listener = tokio::net::TcpListener::bind(serve_on.as_deref().unwrap_or("127.0.0.1:0")).await?;
    let local = listener.local_addr()?;

    // Accept: each connection is attached to the mux, which keeps its own
    // descriptor (ours closes at the end of the turn).
    let m = mux.clone();
    tokio::spawn(async move {
        loop {
            let conn = match listener.accept().await {
                Ok((conn, _)) => conn,
                Err(e) => {
                    eprintln!("accept: {e}");
                    continue;
                }
            };
            let attached = conn.into_std().and_then(|c| {
                c.set_nodelay(true)?;
                m.attach(&c, connmux::parsers::from_spec("oncrpc").expect("a built-in parser"))
            });
            if let Err(e) = attached {
                eprintln!("attach: {e}");
            }
        }
    });

    // One serving task per worker, each on its own socket. Every socket
    // receives: a socket nobody reads would hold the messages steered to it.
    let registry = Arc::new(Registry::any_program());
    let tasks = mux.workers().max(2);
    let first = AsyncKcmSocket::new(mux.socket(SockType::Dgram)?)?;
    let mut socks: Vec<AsyncKcmSocket> = Vec::new();
    for _ in 1..tasks {
        socks.push(first.try_clone()?);
    }
    socks.push(first);
    let answered: Arc<Vec<AtomicU64>> = Arc::new((0..tasks).map(|_| AtomicU64::new(0)).collect());
    for (i, sock) in socks.into_iter().enumerate() {
        tokio::spawn(serve(sock, registry.clone(), mux.clone(), answered.clone(), i));
    }

    if serve_on.is_some() {
        println!("ONC RPC NULL on {local}: {} workers ({:?}), {tasks} tasks", mux.workers(), mux.driver());
        std::future::pending::<()>().await;
    }

    let started = Instant::now();
    let clients: Vec<_> = (0..CONNS).map(|c| tokio::spawn(client(local, c))).collect();
    for c in clients {
        c.await??;
    }
    let elapsed = started.elapsed();
    let per: Vec<u64> = answered.iter().map(|a| a.load(Ordering::Relaxed)).collect();
    println!(
        "mux: {} workers, {:?} driver; {tasks} tokio tasks, each on its own cloned socket",
        mux.workers(),
        mux.driver()
    );
    println!(
        "{CONNS} connections x {CALLS} NULL calls: every call answered once with SUCCESS, in {:.1} ms",
        elapsed.as_secs_f64() * 1e3
    );
    println!("calls answered per task: {per:?}");
    assert_eq!(per.iter().sum::<u64>(), u64::from(CONNS * CALLS));
    Ok(())
}

/// Answer the calls this socket receives, each on its own connection.
async fn serve(sock: AsyncKcmSocket, registry: Arc<Registry>, mux: Mux, answered: Arc<Vec<AtomicU64>>, i: usize) {
    let mut out = Vec::with_capacity(64);
    loop {
        let msg = match sock.recv_msg().await {
            Ok(msg) => msg,
            Err(e) => {
                eprintln!("task {i}: recv: {e}");
                return;
            }
        };
        out.clear();
        match registry.handle_marked(&msg.data, &mut out) {
            Outcome::Replied { .. } => {
                // A connection that failed meanwhile refuses the reply; the
                // others go on.
                if sock.send_to(&out, msg.psock).await.is_ok() {
                    answered[i].fetch_add(1, Ordering::Relaxed);
                }
            }
            // Not an RPC call at all: the connection goes.
            Outcome::CloseConnection(why) => {
                eprintln!("task {i}: closing {:?}: {why:?}", msg.psock);
                let _ = mux.abort(msg.psock);
            }
        }
    }
}

/// One connection's calls, `IN_FLIGHT` at a time: each xid answered once,
/// with SUCCESS.
async fn client(addr: std::net::SocketAddr, c: u32) -> Result<(), Error> {
    let mut conn = tokio::net::TcpStream::connect(addr).await?;
    conn.set_nodelay(true)?;
    let (mut rd, mut wr) = conn.split();
    let mut answered = vec![false; CALLS as usize];
    let (mut sent, mut got) = (0u32, 0u32);
    let mut call = Vec::new();
    // Bounded: each turn sends up to IN_FLIGHT and reads one reply.
    while got < CALLS {
        call.clear();
        while sent < CALLS && sent - got < IN_FLIGHT {
            let xid = (c << 24) | sent;
            connmux_oncrpc::encode_null_call(xid, 100_003, 3, 1, &mut call);
            sent += 1;
        }
        wr.write_all(&call).await?;
        let mut mark = [0u8; 4];
        rd.read_exact(&mut mark).await?;
        let mut reply = vec![0u8; RecordMark::from_bytes(mark).len as usize];
        rd.read_exact(&mut reply).await?;
        let xid = connmux_oncrpc::check_reply(&reply, None)?;
        let n = (xid & 0xff_ffff) as usize;
        if xid >> 24 != c || n >= sent as usize || std::mem::replace(&mut answered[n], true) {
            return Err(format!("connection {c}: reply {xid:#x} unexpected or twice").into());
        }
        got += 1;
    }
    Ok(())
}
