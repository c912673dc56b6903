//! Torture: 64 connections, 100,000+ messages of random sizes (1 B to 64 KiB of
//! payload) written by raw peers at random split points (often many messages per
//! write), received by several threads on cloned sockets, each answered on the
//! connection it came from. Checked: nothing lost, duplicated, corrupted or
//! interleaved (checksums on both sides), and on each receiving thread every
//! connection's sequence numbers rise. Bounded: every read has a timeout and the
//! whole run a deadline. The seed and the figures are printed; set
//! `CONNMUX_TORTURE_SEED` to replay a seed.

#[macro_use]
mod common;

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use connmux::{Bytes, SockType};
use rand::{Rng, SeedableRng};

const CONNS: usize = 64;
const MESSAGES: usize = 100_032; // 1,563 per connection
const WRITERS: usize = 8;
const RECEIVERS: usize = 4;
const MAX_PAYLOAD: usize = 64 << 10;
/// Header after the length: connection (2), sequence (4), checksum (4).
const HDR: usize = 4 + 10;
const DEADLINE: Duration = Duration::from_secs(50);
const READ_TIMEOUT: Duration = Duration::from_secs(20);

fn fnv(data: &[u8]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for &b in data {
        h = (h ^ b as u32).wrapping_mul(0x0100_0193);
    }
    h
}

/// The payload of message `seq` on connection `conn`: its size is log-uniform in
/// 1 B..=64 KiB (most small, some large), its bytes follow from a per-message seed.
fn payload(seed: u64, conn: u16, seq: u32) -> Vec<u8> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ ((conn as u64) << 40) ^ seq as u64);
    let bits = rng.gen_range(0.0f64..=16.0);
    let len = (2f64.powf(bits) as usize).clamp(1, MAX_PAYLOAD);
    let mut v = vec![0u8; len];
    rng.fill(&mut v[..]);
    v
}

/// A whole framed message: length, connection, sequence, checksum, payload.
fn message(conn: u16, seq: u32, body: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(HDR + body.len());
    m.extend_from_slice(&((10 + body.len()) as u32).to_be_bytes());
    m.extend_from_slice(&conn.to_be_bytes());
    m.extend_from_slice(&seq.to_be_bytes());
    m.extend_from_slice(&fnv(body).to_be_bytes());
    m.extend_from_slice(body);
    m
}

/// Parse and check a whole message; (connection, sequence).
fn check(m: &[u8], what: &str) -> (u16, u32) {
    assert!(m.len() >= HDR, "{what}: {} bytes, shorter than a header", m.len());
    assert_eq!(u32::from_be_bytes(m[..4].try_into().unwrap()) as usize, m.len() - 4, "{what}: length field");
    let conn = u16::from_be_bytes(m[4..6].try_into().unwrap());
    let seq = u32::from_be_bytes(m[6..10].try_into().unwrap());
    let sum = u32::from_be_bytes(m[10..14].try_into().unwrap());
    assert_eq!(fnv(&m[HDR..]), sum, "{what}: checksum of conn {conn} seq {seq} (corrupt or interleaved)");
    (conn, seq)
}

/// A reply to (conn, seq): a short payload derived from the request.
fn reply(conn: u16, seq: u32) -> Vec<u8> {
    let body: Vec<u8> = (0..(seq as usize * 7 % 200)).map(|i| (i as u32 ^ seq) as u8).collect();
    message(conn, seq, &body)
}

fn read_one(peer: &mut TcpStream, what: &str) -> Vec<u8> {
    let mut hdr = [0u8; 4];
    peer.read_exact(&mut hdr).unwrap_or_else(|e| panic!("{what}: reading a reply header: {e}"));
    let len = u32::from_be_bytes(hdr) as usize;
    assert!((10..=10 + 200).contains(&len), "{what}: reply length {len}");
    let mut m = vec![0u8; 4 + len];
    m[..4].copy_from_slice(&hdr);
    peer.read_exact(&mut m[4..]).unwrap_or_else(|e| panic!("{what}: reading a reply body: {e}"));
    m
}

fn torture() {
    let d = driver();
    let seed: u64 = std::env::var("CONNMUX_TORTURE_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
    });
    println!("[torture {d:?}] seed {seed} (CONNMUX_TORTURE_SEED={seed} replays it)");
    let start = Instant::now();
    let deadline = start + DEADLINE;
    let per_conn = MESSAGES / CONNS;
    let mux = mux_with(|c| {
        c.workers = 2;
        c.core.max_msg_size = HDR + MAX_PAYLOAD;
    });
    let sock = mux.socket(SockType::Dgram).unwrap();
    // This one only makes the clones (and keeps the mux's sockets alive): it
    // must not take messages nobody reads.
    sock.set_recv_disable(true).unwrap();

    let mut peers = Vec::new();
    let mut ours_keep = Vec::new();
    let mut psock_conn = HashMap::new();
    for c in 0..CONNS {
        let (ours, peer) = pair();
        peer.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
        peer.set_write_timeout(Some(READ_TIMEOUT)).unwrap();
        let p = mux.attach(&ours, l4()).unwrap();
        psock_conn.insert(p, c as u16);
        ours_keep.push(ours);
        peers.push(peer);
    }
    let psock_conn = Arc::new(psock_conn);

    // Receivers: cloned sockets; check per-connection order and integrity; reply.
    let received = Arc::new(AtomicU64::new(0));
    let bytes_in = Arc::new(AtomicU64::new(0));
    let mut receivers = Vec::new();
    for r in 0..RECEIVERS {
        let s = sock.try_clone().unwrap();
        s.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
        s.set_write_timeout(Some(READ_TIMEOUT)).unwrap();
        let (received, bytes_in, psock_conn) = (received.clone(), bytes_in.clone(), psock_conn.clone());
        receivers.push(std::thread::spawn(move || {
            let mut last: Vec<Option<u32>> = vec![None; CONNS];
            let mut seen: Vec<Vec<u32>> = vec![Vec::new(); CONNS];
            let mut batch = Vec::new();
            while received.load(Ordering::Acquire) < MESSAGES as u64 {
                assert!(
                    Instant::now() < deadline,
                    "[{d:?}] receiver {r}: deadline with {} received",
                    received.load(Ordering::Relaxed)
                );
                batch.clear();
                match s.recv_batch(&mut batch, 64) {
                    Ok(_) => {}
                    Err(e) if e.kind() == ErrorKind::WouldBlock => continue,
                    Err(e) => panic!("[{d:?}] receiver {r}: {e}"),
                }
                for m in &batch {
                    let (conn, seq) = check(&m.data, &format!("[{d:?}] receiver {r}"));
                    assert_eq!(
                        psock_conn.get(&m.psock),
                        Some(&conn),
                        "[{d:?}] message of conn {conn} from another psock"
                    );
                    if let Some(prev) = last[conn as usize] {
                        assert!(
                            seq > prev,
                            "[{d:?}] receiver {r}: conn {conn} seq {seq} after {prev} (reordered or duplicated)"
                        );
                    }
                    last[conn as usize] = Some(seq);
                    seen[conn as usize].push(seq);
                    bytes_in.fetch_add(m.data.len() as u64, Ordering::Relaxed);
                    s.send_msg(Bytes::from(reply(conn, seq)), Some(m.psock))
                        .unwrap_or_else(|e| panic!("[{d:?}] reply to conn {conn} seq {seq}: {e}"));
                }
                received.fetch_add(batch.len() as u64, Ordering::AcqRel);
            }
            // Keep the socket open until the replies are delivered (closing drops
            // unsent messages): hand it back.
            (s, seen)
        }));
    }

    // Peer readers: one per connection, every reply parsed and checked, once.
    let mut readers = Vec::new();
    for (c, peer) in peers.iter().enumerate() {
        let mut rd = peer.try_clone().unwrap();
        readers.push(std::thread::spawn(move || {
            let mut got = vec![false; per_conn];
            for _ in 0..per_conn {
                assert!(Instant::now() < deadline, "[{d:?}] peer {c}: deadline");
                let m = read_one(&mut rd, &format!("[{d:?}] peer {c}"));
                let (conn, seq) = check(&m, &format!("[{d:?}] reply on peer {c}"));
                assert_eq!(conn as usize, c, "[{d:?}] reply for conn {conn} arrived on conn {c}");
                assert!((seq as usize) < per_conn, "[{d:?}] reply seq {seq} never sent");
                assert!(!std::mem::replace(&mut got[seq as usize], true), "[{d:?}] conn {c}: reply {seq} twice");
                assert_eq!(m, reply(conn, seq), "[{d:?}] reply bytes");
            }
            got.iter().filter(|&&g| g).count()
        }));
    }

    // Writers: each drives CONNS / WRITERS connections, a random run of messages
    // at a time, written at random split points.
    let writes = Arc::new(AtomicU64::new(0));
    let bytes_out = Arc::new(AtomicU64::new(0));
    let mut writers = Vec::new();
    let mut conns_of: Vec<Vec<(usize, TcpStream)>> = (0..WRITERS).map(|_| Vec::new()).collect();
    for (c, peer) in peers.iter().enumerate() {
        conns_of[c % WRITERS].push((c, peer.try_clone().unwrap()));
    }
    for (w, mut mine) in conns_of.into_iter().enumerate() {
        let (writes, bytes_out) = (writes.clone(), bytes_out.clone());
        writers.push(std::thread::spawn(move || {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed.wrapping_add(w as u64 * 7919));
            let mut next = vec![0u32; mine.len()];
            let mut buf = Vec::new();
            // Bounded: each round sends at least one message.
            for _ in 0..MESSAGES {
                let open: Vec<usize> = (0..mine.len()).filter(|&i| (next[i] as usize) < per_conn).collect();
                if open.is_empty() {
                    break;
                }
                assert!(Instant::now() < deadline, "[{d:?}] writer {w}: deadline");
                let i = open[rng.gen_range(0..open.len())];
                let (c, ref mut peer) = mine[i];
                let k = if rng.gen_bool(0.3) { rng.gen_range(2..=40) } else { 1 };
                buf.clear();
                for _ in 0..k {
                    if next[i] as usize == per_conn {
                        break;
                    }
                    buf.extend_from_slice(&message(c as u16, next[i], &payload(seed, c as u16, next[i])));
                    next[i] += 1;
                }
                // Random split points: 1 to 4 writes for the run.
                let mut at = 0;
                while at < buf.len() {
                    let left = buf.len() - at;
                    let n = if rng.gen_bool(0.5) { left } else { rng.gen_range(1..=left) };
                    peer.write_all(&buf[at..at + n]).unwrap_or_else(|e| panic!("[{d:?}] writer {w} conn {c}: {e}"));
                    writes.fetch_add(1, Ordering::Relaxed);
                    at += n;
                }
                bytes_out.fetch_add(buf.len() as u64, Ordering::Relaxed);
            }
        }));
    }

    // On a stall (no progress for 4 s), print where the messages are.
    let monitor = {
        let (mux, received) = (mux.clone(), received.clone());
        std::thread::spawn(move || {
            let mut last = u64::MAX;
            for _ in 0..(DEADLINE.as_secs() / 4) {
                std::thread::sleep(Duration::from_secs(4));
                let now = received.load(Ordering::Relaxed);
                if now >= MESSAGES as u64 {
                    break;
                }
                if now == last {
                    eprintln!("[torture {d:?}] stalled at {now} received: {:?}\n{}", mux.stats(), mux.proc_kcm());
                }
                last = now;
            }
        })
    };
    for w in writers {
        w.join().unwrap();
    }
    let replies: usize = readers.into_iter().map(|r| r.join().unwrap()).sum();
    let mut sockets = Vec::new();
    let mut seen: Vec<Vec<u32>> = vec![Vec::new(); CONNS];
    for r in receivers {
        let (s, got) = r.join().unwrap();
        sockets.push(s);
        for (c, v) in got.into_iter().enumerate() {
            seen[c].extend(v);
        }
    }
    let took = start.elapsed();
    // The multiset of what was received is exactly what was sent.
    for (c, v) in seen.iter_mut().enumerate() {
        v.sort_unstable();
        assert_eq!(v.len(), per_conn, "[{d:?}] conn {c}: {} messages received of {per_conn}", v.len());
        assert!(
            v.iter().enumerate().all(|(i, &s)| s as usize == i),
            "[{d:?}] conn {c}: a message lost and another duplicated"
        );
    }
    assert_eq!(replies, per_conn * CONNS, "[{d:?}] replies");
    let st = mux.stats();
    assert_eq!(st.rx_msgs as usize, per_conn * CONNS, "[{d:?}] {st:?}");
    assert_eq!(mux.events().try_recv().ok(), None, "[{d:?}] no psock failed");
    let mb = bytes_in.load(Ordering::Relaxed) as f64 / 1e6;
    println!(
        "[torture {d:?}] {CONNS} connections, {} messages ({mb:.1} MB) in {} peer writes, {replies} replies checked, \
         {RECEIVERS} receiving threads, 2 workers: {:.2} s, {:.0} msg/s, {:.1} MB/s in",
        per_conn * CONNS,
        writes.load(Ordering::Relaxed),
        took.as_secs_f64(),
        (per_conn * CONNS) as f64 / took.as_secs_f64(),
        mb / took.as_secs_f64(),
    );
    assert_eq!(bytes_out.load(Ordering::Relaxed), bytes_in.load(Ordering::Relaxed), "[{d:?}] bytes in == bytes out");
    drop(sockets);
    drop(sock);
    drop(ours_keep);
    monitor.join().unwrap();
}

on_both_drivers!(torture);
