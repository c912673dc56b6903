//! The multiplexor driven by any sequence of operations: sockets created,
//! cloned and closed, psocks attached and unattached, bytes fed (whole
//! messages in any split, or garbage), reads, sends, addressed sends, receive
//! disables, buffer sizes, transmit progress and failures, peer closes, time.
//!
//! Checked after every step:
//! - `memory_used() <= memory_bound()`;
//! - after `handle_timeout(now)`, `poll_timeout()` is not in the past;
//! - every message received from a psock fed only well-formed messages is
//!   one of them, whole, and (while no socket was disabled or closed, which
//!   requeue messages at another socket's tail) a psock's messages arrive in
//!   order on each socket;
//! - every whole message a psock writes is one an application sent, whole,
//!   and no message is written whole twice;
//! - nothing panics.
#![no_main]

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use arbitrary::Arbitrary;
use connmux_core::mux::{
    Event, Mux, MuxConfig, PsockConfig, PsockId, RecvFlags, SendFlags, SockId, SockType, Steering, TxPolicy,
};
use connmux_core::parsers::from_spec;
use connmux_core::Timestamp;
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Config {
    max_msg: u16,
    timeout_ms: Option<u16>,
    rcvbuf: u16,
    sndbuf: u16,
    rx_buf: u16,
    steering: u8,
    imbalance: u8,
}

#[derive(Arbitrary, Debug)]
enum Op {
    Socket {
        seqpacket: bool,
    },
    Clone {
        s: u8,
    },
    Close {
        s: u8,
    },
    /// A length-prefixed (l4) psock, or (other) one with another parser.
    Attach {
        other: Option<u8>,
        max_msg: Option<u16>,
        timeout_ms: Option<Option<u16>>,
        affinity: Option<u8>,
    },
    Unattach {
        p: u8,
    },
    /// Queue `count` well-formed messages of `len` payload bytes on the psock's wire.
    Queue {
        p: u8,
        count: u8,
        len: u16,
    },
    /// Queue arbitrary bytes (the psock's content is then no longer checked).
    Garbage {
        p: u8,
        bytes: Vec<u8>,
    },
    /// Read up to `n` queued wire bytes into the psock (at most its capacity).
    Feed {
        p: u8,
        n: u16,
    },
    /// Feed ignoring the capacity (the mux refuses what is over its hard cap).
    Overfeed {
        p: u8,
        n: u16,
    },
    RxClosed {
        p: u8,
    },
    Recv {
        s: u8,
        len: u16,
        peek: bool,
    },
    RecvMsg {
        s: u8,
    },
    Send {
        s: u8,
        len: u16,
        more: bool,
        eor: bool,
        batch: bool,
    },
    SendTo {
        s: u8,
        p: u8,
        len: u16,
        batch: bool,
    },
    SendAbort {
        s: u8,
    },
    Disable {
        s: u8,
        on: bool,
    },
    Rcvbuf {
        s: u8,
        v: u16,
    },
    Sndbuf {
        s: u8,
        v: u16,
    },
    Affinity {
        s: u8,
        tag: Option<u8>,
    },
    TxBegin {
        p: u8,
    },
    TxComplete {
        p: u8,
        n: u16,
    },
    TxFailed {
        p: u8,
    },
    Advance {
        ms: u16,
    },
}

#[derive(Arbitrary, Debug)]
struct Input {
    config: Config,
    ops: Vec<Op>,
}

const HDR: usize = 4;

/// A message body: [tag, origin (4 bytes), seq (4 bytes), filler…].
fn body(tag: u8, origin: u32, seq: u32, len: usize) -> Vec<u8> {
    let mut b = vec![tag];
    b.extend(origin.to_be_bytes());
    b.extend(seq.to_be_bytes());
    b.resize(len.max(9), seq as u8);
    b
}

fn l4(b: &[u8]) -> Vec<u8> {
    let mut v = (b.len() as u32).to_be_bytes().to_vec();
    v.extend_from_slice(b);
    v
}

struct PsockModel {
    id: PsockId,
    /// Wire bytes not yet fed.
    wire: Vec<u8>,
    next_seq: u32,
    /// Only well-formed l4 messages were queued.
    clean: bool,
    /// The chunk handed out by tx_begin, not yet completed.
    chunk: Option<Vec<u8>>,
    /// Bytes this psock wrote (confirmed by tx_complete).
    written: Vec<u8>,
}

fn pick<T>(v: &[T], i: u8) -> Option<&T> {
    (!v.is_empty()).then(|| &v[i as usize % v.len()])
}

fn pick_mut<T>(v: &mut [T], i: u8) -> Option<&mut T> {
    let n = v.len();
    (n > 0).then(move || &mut v[i as usize % n])
}

fuzz_target!(|input: Input| {
    let c = &input.config;
    let max_msg = 16 + (c.max_msg % 4096) as usize;
    let cfg = MuxConfig {
        max_msg_size: max_msg,
        assembly_timeout: c.timeout_ms.map(|t| Duration::from_millis(u64::from(t))),
        sock_rcvbuf: 1 + c.rcvbuf as usize,
        sock_sndbuf: 1 + c.sndbuf as usize,
        psock_rx_buf: c.rx_buf as usize % 8192,
        steering: [Steering::RoundRobin, Steering::Affinity, Steering::Key][c.steering as usize % 3],
        imbalance: c.imbalance as usize % 8,
        psock_sndbuf: 4 << 20,
        tx_policy: [TxPolicy::RoundRobin, TxPolicy::LeastOutstanding][(c.steering / 3) as usize % 2],
        ..MuxConfig::default()
    };
    let mut m = Mux::new(cfg);
    let mut socks: Vec<(SockId, SockType)> = Vec::new();
    let mut psocks: Vec<PsockModel> = Vec::new();
    let mut now = 0u64;
    let mut requeued = false;
    // A SEQPACKET message read part-way moved to another socket with its
    // rest: what the model assembles per socket is then no longer whole.
    let mut moved_mid_message = false;
    // Last seq received per (socket, psock), for psocks fed only whole messages.
    let mut last_seq: HashMap<(SockId, PsockId), u32> = HashMap::new();
    // Messages the application sent, by (origin socket index, seq).
    let mut sent: HashMap<(u32, u32), Vec<u8>> = HashMap::new();
    let mut send_seq = 0u32;
    let mut written_whole: HashSet<(u32, u32)> = HashSet::new();
    let mut partial_read: HashMap<SockId, Vec<u8>> = HashMap::new();

    for op in input.ops.iter().take(512) {
        now += 1;
        let t = Timestamp::from_nanos(now * 1_000_000);
        match *op {
            Op::Socket { seqpacket } => {
                let ty = if seqpacket { SockType::SeqPacket } else { SockType::Dgram };
                socks.push((m.socket(ty), ty));
            }
            Op::Clone { s } => {
                if let Some(&(s, ty)) = pick(&socks, s) {
                    if let Ok(n) = m.clone_sock(s) {
                        socks.push((n, ty));
                    }
                }
            }
            Op::Close { s } => {
                if let Some(&(s, _)) = pick(&socks, s) {
                    if partial_read.get(&s).is_some_and(|v| !v.is_empty()) {
                        moved_mid_message = true;
                    }
                    if m.close(s).is_ok() {
                        requeued = true;
                    }
                }
            }
            Op::Attach { other, max_msg, timeout_ms, affinity } => {
                let spec = match other {
                    None => "l4",
                    Some(k) => ["oncrpc", "9p", "http2", "len:width=2,endian=le,includes_header=true"][k as usize % 4],
                };
                let pc = PsockConfig {
                    max_msg_size: max_msg.map(|v| 16 + v as usize % 4096),
                    assembly_timeout: timeout_ms.map(|t| t.map(|ms| Duration::from_millis(u64::from(ms)))),
                    affinity: affinity.map(u32::from),
                    handshake_timeout: None,
                };
                let id = m.attach(from_spec(spec).unwrap(), pc);
                psocks.push(PsockModel {
                    id,
                    wire: Vec::new(),
                    next_seq: 0,
                    clean: other.is_none(),
                    chunk: None,
                    written: Vec::new(),
                });
            }
            Op::Unattach { p } => {
                if let Some(ps) = pick_mut(&mut psocks, p) {
                    if m.unattach(ps.id).is_ok() {
                        // The outstanding chunk is no longer the driver's to write.
                        ps.chunk = None;
                    }
                }
            }
            Op::Queue { p, count, len } => {
                if let Some(ps) = pick_mut(&mut psocks, p) {
                    for _ in 0..count % 8 {
                        let b = body(1, ps.id.index, ps.next_seq, (len as usize) % 600);
                        ps.next_seq += 1;
                        ps.wire.extend(l4(&b));
                    }
                }
            }
            Op::Garbage { p, ref bytes } => {
                if let Some(ps) = pick_mut(&mut psocks, p) {
                    ps.clean = false;
                    ps.wire.extend_from_slice(&bytes[..bytes.len().min(2048)]);
                }
            }
            Op::Feed { p, n } | Op::Overfeed { p, n } => {
                let over = matches!(op, Op::Overfeed { .. });
                if let Some(ps) = pick_mut(&mut psocks, p) {
                    let cap = if over { usize::MAX } else { m.rx_capacity(ps.id) };
                    let k = (n as usize).min(cap).min(ps.wire.len());
                    match m.feed(ps.id, &ps.wire[..k], t) {
                        Ok(()) => {
                            ps.wire.drain(..k);
                        }
                        Err(_) => assert!(over || k == 0, "feed within rx_capacity refused"),
                    }
                }
            }
            Op::RxClosed { p } => {
                if let Some(ps) = pick(&psocks, p) {
                    let _ = m.rx_closed(ps.id, None);
                }
            }
            Op::Recv { s, len, peek } => {
                if let Some(&(s, ty)) = pick(&socks, s) {
                    let mut buf = vec![0u8; len as usize % 700];
                    if let Ok(info) = m.recv(s, &mut buf, RecvFlags { peek }) {
                        assert!(info.len <= buf.len());
                        if !peek {
                            let acc = partial_read.entry(s).or_default();
                            acc.extend_from_slice(&buf[..info.len]);
                            if info.eor {
                                let msg = std::mem::take(acc);
                                if !info.trunc && !moved_mid_message {
                                    received(&psocks, &mut last_seq, requeued, s, info.psock, &msg);
                                }
                            } else {
                                assert_eq!(ty, SockType::SeqPacket, "a DGRAM read always ends the message");
                            }
                        }
                    }
                }
            }
            Op::RecvMsg { s } => {
                if let Some(&(s, _)) = pick(&socks, s) {
                    if let Ok((b, p)) = m.recv_msg(s) {
                        let mut msg = partial_read.remove(&s).unwrap_or_default();
                        msg.extend_from_slice(&b);
                        if !moved_mid_message {
                            received(&psocks, &mut last_seq, requeued, s, p, &msg);
                        }
                    }
                }
            }
            Op::Send { s, len, more, eor, batch } => {
                if let Some(&(s, ty)) = pick(&socks, s) {
                    // Only whole messages in one send are tracked (more/eor
                    // choices that do not end the message leave it open).
                    let ends = match ty {
                        SockType::Dgram => !more,
                        SockType::SeqPacket => eor,
                    };
                    let b = body(2, s.index, send_seq, len as usize % 1000);
                    let msg = l4(&b);
                    if let Ok(n) = m.send(s, &msg, SendFlags { more, eor, batch }) {
                        assert_eq!(n, msg.len());
                        if ends {
                            sent.insert((s.index, send_seq), msg);
                        }
                        send_seq += 1;
                    }
                }
            }
            Op::SendTo { s, p, len, batch } => {
                if let (Some(&(s, _)), Some(ps)) = (pick(&socks, s), pick(&psocks, p)) {
                    let b = body(2, s.index, send_seq, len as usize % 1000);
                    let msg = l4(&b);
                    if m.send_to(s, ps.id, &msg, SendFlags { batch, ..SendFlags::default() }).is_ok() {
                        sent.insert((s.index, send_seq), msg);
                        send_seq += 1;
                    }
                }
            }
            Op::SendAbort { s } => {
                if let Some(&(s, _)) = pick(&socks, s) {
                    let _ = m.send_abort(s);
                }
            }
            Op::Disable { s, on } => {
                if let Some(&(s, _)) = pick(&socks, s) {
                    if on && partial_read.get(&s).is_some_and(|v| !v.is_empty()) {
                        moved_mid_message = true;
                    }
                    if m.set_recv_disable(s, on).is_ok() && on {
                        requeued = true;
                    }
                }
            }
            Op::Rcvbuf { s, v } => {
                if let Some(&(s, _)) = pick(&socks, s) {
                    let _ = m.set_rcvbuf(s, v as usize);
                }
            }
            Op::Sndbuf { s, v } => {
                if let Some(&(s, _)) = pick(&socks, s) {
                    let _ = m.set_sndbuf(s, v as usize);
                }
            }
            Op::Affinity { s, tag } => {
                if let Some(&(s, _)) = pick(&socks, s) {
                    let _ = m.set_affinity(s, tag.map(u32::from));
                }
            }
            Op::TxBegin { p } => {
                if let Some(ps) = pick_mut(&mut psocks, p) {
                    if ps.chunk.is_none() {
                        if let Some(chunk) = m.tx_begin(ps.id) {
                            let bytes: Vec<u8> = chunk.slices.iter().flat_map(|b| b.iter().copied()).collect();
                            assert_eq!(bytes.len(), chunk.len());
                            if !bytes.is_empty() {
                                ps.chunk = Some(bytes);
                            }
                        }
                    }
                }
            }
            Op::TxComplete { p, n } => {
                if let Some(ps) = pick_mut(&mut psocks, p) {
                    if let Some(chunk) = ps.chunk.take() {
                        let k = (n as usize % (chunk.len() + 1)).max(1).min(chunk.len());
                        ps.written.extend_from_slice(&chunk[..k]);
                        m.tx_complete(ps.id, k);
                        written(ps, &sent, &mut written_whole);
                    }
                }
            }
            Op::TxFailed { p } => {
                if let Some(ps) = pick_mut(&mut psocks, p) {
                    if ps.chunk.take().is_some() {
                        m.tx_failed(ps.id, 32);
                        // Nothing more goes on this connection: forget a partial message.
                        ps.written.clear();
                    }
                }
            }
            Op::Advance { ms } => {
                now += u64::from(ms);
                let t = Timestamp::from_nanos(now * 1_000_000);
                m.handle_timeout(t);
                if let Some(d) = m.poll_timeout() {
                    assert!(d > t, "deadline {d:?} still due after handle_timeout({t:?})");
                }
            }
        }
        // Drain events (bounded: each call can raise only so many).
        for _ in 0..100_000 {
            match m.poll_event() {
                Some(Event::PsockReleased(p)) => {
                    if let Some(ps) = psocks.iter_mut().find(|ps| ps.id == p) {
                        ps.chunk = None;
                    }
                }
                Some(_) => {}
                None => break,
            }
        }
        assert!(m.poll_event().is_none(), "event queue never drains");
        assert!(m.memory_used() <= m.memory_bound(), "memory_used {} > bound {}", m.memory_used(), m.memory_bound());
        assert_eq!(m.psocks().len(), m.psock_count());
        assert_eq!(m.socks().len(), m.sock_count());
    }
});

/// A message a socket delivered whole (`msg` as the application got it).
fn received(
    psocks: &[PsockModel],
    last_seq: &mut HashMap<(SockId, PsockId), u32>,
    requeued: bool,
    s: SockId,
    p: PsockId,
    msg: &[u8],
) {
    let Some(ps) = psocks.iter().find(|ps| ps.id == p) else { return };
    if !ps.clean {
        return;
    }
    assert!(msg.len() >= HDR + 9, "a whole l4 message of ours: {msg:?}");
    let b = &msg[HDR..];
    assert_eq!(u32::from_be_bytes(msg[..4].try_into().unwrap()) as usize, b.len());
    assert_eq!(b[0], 1);
    assert_eq!(u32::from_be_bytes(b[1..5].try_into().unwrap()), p.index, "message from another psock");
    let seq = u32::from_be_bytes(b[5..9].try_into().unwrap());
    assert_eq!(b, &body(1, p.index, seq, b.len())[..], "message content");
    if !requeued {
        if let Some(&prev) = last_seq.get(&(s, p)) {
            assert!(seq > prev, "psock {p:?} on socket {s:?}: seq {seq} after {prev}");
        }
        last_seq.insert((s, p), seq);
    }
}

/// Check the whole messages at the start of what a psock wrote, and drop them.
fn written(ps: &mut PsockModel, sent: &HashMap<(u32, u32), Vec<u8>>, whole: &mut HashSet<(u32, u32)>) {
    loop {
        let w = &ps.written;
        if w.len() < HDR {
            return;
        }
        let len = HDR + u32::from_be_bytes(w[..4].try_into().unwrap()) as usize;
        if w.len() < len {
            return;
        }
        let msg = &w[..len];
        assert!(len >= HDR + 9 && msg[HDR] == 2, "psock wrote bytes that are no message of ours: {msg:?}");
        let origin = u32::from_be_bytes(msg[HDR + 1..HDR + 5].try_into().unwrap());
        let seq = u32::from_be_bytes(msg[HDR + 5..HDR + 9].try_into().unwrap());
        if let Some(orig) = sent.get(&(origin, seq)) {
            assert_eq!(orig, msg, "message ({origin}, {seq}) written altered");
        }
        assert!(whole.insert((origin, seq)), "message ({origin}, {seq}) written whole twice");
        ps.written.drain(..len);
    }
}
