//! `AsyncKcmSocket` (feature `tokio`) on both drivers, real TCP on loopback:
//! a receive waits without a thread and wakes when a message comes, a send
//! waits for room and completes when the peer reads, cloned sockets serve one
//! connection from concurrent tasks, the socket is a `Stream`, and
//! `into_inner` gives the blocking socket back.
#![cfg(feature = "tokio")]

#[macro_use]
mod common;

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use connmux::{AsyncKcmSocket, SockType};

/// How long a call must stay pending to count as waiting (a negative check:
/// nothing is there to take, so any wait shows it).
const PENDING: Duration = Duration::from_millis(50);

fn runtime(threads: usize) -> tokio::runtime::Runtime {
    let mut b = if threads > 1 {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(threads);
        b
    } else {
        tokio::runtime::Builder::new_current_thread()
    };
    b.enable_all().build().unwrap()
}

on_both_drivers!(
    recv_waits_for_a_message_and_send_to_answers_it,
    send_waits_for_room_and_completes_when_the_peer_reads,
    cloned_sockets_serve_one_connection_from_concurrent_tasks,
    the_socket_is_a_stream_of_messages,
    into_inner_gives_the_blocking_socket_back,
);

fn recv_waits_for_a_message_and_send_to_answers_it() {
    let mux = mux_with(|_| {});
    let (ours, mut peer) = pair();
    mux.attach(&ours, l4()).unwrap();
    runtime(1).block_on(async {
        let sock = AsyncKcmSocket::new(mux.socket(SockType::Dgram).unwrap()).unwrap();
        // Nothing queued: the receive waits (and its task's thread is free:
        // the timer below runs on the same one).
        assert!(tokio::time::timeout(PENDING, sock.recv_msg()).await.is_err(), "a receive returned with nothing sent");
        write_all(&mut peer, &framed(b"ping"));
        let m = tokio::time::timeout(WAIT, sock.recv_msg()).await.expect("no message within WAIT").unwrap();
        assert_eq!(&m.data[..], &framed(b"ping")[..]);
        sock.send_to(&framed(b"pong"), m.psock).await.unwrap();
        // recv_from copies, and says where the message came from.
        write_all(&mut peer, &framed(b"again"));
        let mut buf = [0u8; 64];
        let info = tokio::time::timeout(WAIT, sock.recv_from(&mut buf)).await.expect("no message within WAIT").unwrap();
        assert_eq!((&buf[..info.len], info.psock), (&framed(b"again")[..], m.psock));
        let n = sock.send(&framed(b"plain")).await.unwrap();
        assert_eq!(n, framed(b"plain").len());
    });
    assert_eq!(read_framed(&mut peer), b"pong");
    assert_eq!(read_framed(&mut peer), b"plain");
}

fn send_waits_for_room_and_completes_when_the_peer_reads() {
    // A small send buffer, so that a peer that does not read fills it soon.
    let mux = mux_with(|c| c.core.sock_sndbuf = 64 << 10);
    let (ours, mut peer) = pair();
    socket2::SockRef::from(&ours).set_send_buffer_size(16 << 10).unwrap();
    socket2::SockRef::from(&peer).set_recv_buffer_size(16 << 10).unwrap();
    mux.attach(&ours, l4()).unwrap();
    let msg = framed(&[7u8; 16 << 10]);
    runtime(1).block_on(async {
        let sock = AsyncKcmSocket::new(mux.socket(SockType::Dgram).unwrap()).unwrap();
        // Send until a send waits: the peer reads nothing, so the kernel's
        // buffers and then the socket's fill. Bounded: 64 MiB at most.
        let mut sent = 0;
        let mut waited = false;
        for _ in 0..4096 {
            match tokio::time::timeout(PENDING, sock.send(&msg)).await {
                Ok(r) => {
                    r.unwrap();
                    sent += 1;
                }
                Err(_) => {
                    waited = true;
                    break;
                }
            }
        }
        assert!(waited, "{sent} sends of 16 KiB never waited for room");
        // The peer reads now (what was sent, and one more): the waiting
        // send completes. Each read is bounded by the peer's timeout (WAIT).
        let total = sent + 1;
        let reader = std::thread::spawn(move || {
            for _ in 0..total {
                assert_eq!(read_framed(&mut peer).len(), 16 << 10, "a message arrived whole");
            }
        });
        tokio::time::timeout(WAIT, sock.send(&msg)).await.expect("the send did not complete within WAIT").unwrap();
        sock.get_ref().flush(WAIT).unwrap();
        reader.join().expect("every message sent arrived");
    });
}

fn cloned_sockets_serve_one_connection_from_concurrent_tasks() {
    const CALLS: u32 = 2000;
    const TASKS: usize = 4;
    let mux = mux_with(|_| {});
    let (ours, mut peer) = pair();
    mux.attach(&ours, l4()).unwrap();
    let served: Arc<Vec<AtomicUsize>> = Arc::new((0..TASKS).map(|_| AtomicUsize::new(0)).collect());
    let rt = runtime(2);
    let servers = rt.block_on(async {
        let first = AsyncKcmSocket::new(mux.socket(SockType::Dgram).unwrap()).unwrap();
        let mut socks: Vec<AsyncKcmSocket> = (1..TASKS).map(|_| first.try_clone().unwrap()).collect();
        socks.push(first);
        let mut tasks = Vec::new();
        for (i, s) in socks.into_iter().enumerate() {
            let served = served.clone();
            tasks.push(tokio::spawn(async move {
                // Ends when the test drops the runtime (or on an error).
                while let Ok(m) = s.recv_msg().await {
                    served[i].fetch_add(1, Ordering::Relaxed);
                    if s.send_to(&m.data, m.psock).await.is_err() {
                        break;
                    }
                }
            }));
        }
        tasks
    });
    // The client, on this thread: 32 calls in flight, a new one written as
    // each reply comes (so that reads bring a few calls each: one read's
    // messages all go to one socket, as on AF_KCM).
    let mut seen = HashSet::new();
    let mut sent: u32 = 0;
    while sent < 32 {
        write_all(&mut peer, &framed(&sent.to_be_bytes()));
        sent += 1;
    }
    for _ in 0..CALLS {
        let body = read_framed(&mut peer);
        let id = u32::from_be_bytes(body[..4].try_into().unwrap());
        assert!(id < sent && seen.insert(id), "reply {id} unexpected or twice");
        if sent < CALLS {
            write_all(&mut peer, &framed(&sent.to_be_bytes()));
            sent += 1;
        }
    }
    assert_eq!(seen.len(), CALLS as usize);
    let per: Vec<usize> = served.iter().map(|c| c.load(Ordering::Relaxed)).collect();
    assert_eq!(per.iter().sum::<usize>(), CALLS as usize, "served per socket: {per:?}");
    assert!(per.iter().filter(|&&n| n > 0).count() >= 2, "one connection served by one socket only: {per:?}");
    eprintln!("served per socket: {per:?}");
    for t in servers {
        t.abort();
    }
    drop(rt);
}

fn the_socket_is_a_stream_of_messages() {
    let mux = mux_with(|_| {});
    let (ours, mut peer) = pair();
    mux.attach(&ours, l4()).unwrap();
    runtime(1).block_on(async {
        let mut sock = AsyncKcmSocket::new(mux.socket(SockType::Dgram).unwrap()).unwrap();
        let pending = tokio::time::timeout(PENDING, next(&mut sock)).await;
        assert!(pending.is_err(), "the stream yielded with nothing sent");
        let mut wire = framed(b"one");
        wire.extend_from_slice(&framed(b"two"));
        write_all(&mut peer, &wire);
        for want in [&b"one"[..], b"two"] {
            let m = tokio::time::timeout(WAIT, next(&mut sock))
                .await
                .expect("no item within WAIT")
                .expect("the stream ended");
            assert_eq!(&m.unwrap().data[..], &framed(want)[..]);
        }
    });
}

/// The stream's next item (what `StreamExt::next` does).
async fn next<S: futures_core::Stream + Unpin>(s: &mut S) -> Option<S::Item> {
    std::future::poll_fn(|cx| std::pin::Pin::new(&mut *s).poll_next(cx)).await
}

fn into_inner_gives_the_blocking_socket_back() {
    let mux = mux_with(|_| {});
    let (ours, mut peer) = pair();
    mux.attach(&ours, l4()).unwrap();
    let sock = mux.socket(SockType::Dgram).unwrap();
    assert!(!sock.nonblocking());
    let sock = runtime(1).block_on(async {
        let a = AsyncKcmSocket::new(sock).unwrap();
        assert!(a.get_ref().nonblocking(), "the wrapped socket does not block");
        a.into_inner().unwrap()
    });
    assert!(!sock.nonblocking(), "blocking again");
    sock.set_read_timeout(Some(WAIT)).unwrap();
    write_all(&mut peer, &framed(b"blocking"));
    let mut buf = [0u8; 64];
    let n = sock.recv(&mut buf).unwrap();
    assert_eq!(&buf[..n], &framed(b"blocking")[..]);
    // Outside a runtime the wrapper is refused, not a panic.
    let e = AsyncKcmSocket::new(sock).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::Other, "{e}");
}
