//! The transmit policy of plain sends: KCM's rotation (`TxPolicy::RoundRobin`)
//! against `TxPolicy::LeastOutstanding`, driven deterministically: a client
//! socket over three psocks, each leading to a simulated server that answers
//! every request with one reply, one of them slowly.

mod common;

use common::*;
use connmux_core::mux::{Event, Mux, MuxConfig, PsockError, PsockId, SendFlags, SockId, SockType, TxPolicy};
use connmux_core::Timestamp;

const EOR: SendFlags = SendFlags { more: false, eor: true, batch: false };

fn config(tx_policy: TxPolicy) -> MuxConfig {
    MuxConfig { tx_policy, ..rr_config() }
}

fn client(tx_policy: TxPolicy, psocks: usize) -> (Mux, SockId, Vec<PsockId>) {
    let mut m = Mux::new(config(tx_policy));
    let s = m.socket(SockType::SeqPacket);
    let ps = (0..psocks).map(|_| attach_l4(&mut m)).collect();
    events(&mut m);
    (m, s, ps)
}

/// Write what every psock has queued; the messages each one wrote.
fn write_all(m: &mut Mux, ps: &[PsockId]) -> Vec<Vec<Vec<u8>>> {
    ps.iter().map(|&p| split_l4(&flush(m, p))).collect()
}

/// Calls answered by each of three servers when a client keeps `window` calls
/// in flight until `calls` are answered; server 2 answers one pending call
/// every `slow_every` rounds, the others all of theirs each round.
fn run(tx_policy: TxPolicy, calls: usize, window: usize, slow_every: usize) -> [usize; 3] {
    let (mut m, s, ps) = client(tx_policy, 3);
    let mut pending: [Vec<Vec<u8>>; 3] = Default::default();
    let mut answered = [0usize; 3];
    let (mut sent, mut done) = (0usize, 0usize);
    for round in 0..100_000 {
        if done == calls {
            return answered;
        }
        while sent < calls && sent - done < window {
            m.send(s, &l4(&(sent as u32).to_be_bytes()), EOR).unwrap();
            // The driver writes each send at once, as the runtime does.
            for (i, wrote) in write_all(&mut m, &ps).into_iter().enumerate() {
                pending[i].extend(wrote);
            }
            sent += 1;
        }
        for (i, q) in pending.iter_mut().enumerate() {
            let slow = i == 2 && slow_every > 1;
            let n = if slow { usize::from(round % slow_every == 0).min(q.len()) } else { q.len() };
            for req in q.drain(..n) {
                m.feed(ps[i], &req, Timestamp::ZERO).unwrap();
                answered[i] += 1;
            }
        }
        done += recv_all(&mut m, s).len();
        events(&mut m);
    }
    panic!("calls never all answered: {answered:?}");
}

#[test]
fn rotation_sends_a_slow_server_a_third_of_the_calls() {
    let answered = run(TxPolicy::RoundRobin, 600, 12, 8);
    assert_eq!(answered, [200, 200, 200], "KCM's rotation ignores how each server keeps up");
}

#[test]
fn least_outstanding_sends_a_slow_server_at_most_a_sixth() {
    let answered = run(TxPolicy::LeastOutstanding, 600, 12, 8);
    assert_eq!(answered.iter().sum::<usize>(), 600);
    assert!(answered[2] * 6 <= 600, "slow server got {} of 600: {answered:?}", answered[2]);
    assert!(answered[2] > 0, "the slow server still gets work: {answered:?}");
    // The fast two share the rest evenly (ties rotate).
    assert!(answered[0].abs_diff(answered[1]) <= 12, "{answered:?}");
}

#[test]
fn least_outstanding_with_equal_servers_rotates() {
    let answered = run(TxPolicy::LeastOutstanding, 600, 12, 1);
    assert_eq!(answered, [200, 200, 200]);
}

#[test]
fn outstanding_is_sent_minus_received() {
    let (mut m, s, ps) = client(TxPolicy::LeastOutstanding, 2);
    for i in 0..5u8 {
        m.send(s, &l4(&[i]), EOR).unwrap();
    }
    // Placed before anything is written: 3 and 2 (ties rotate).
    assert_eq!(ps.iter().map(|&p| m.psock_outstanding(p).unwrap()).sum::<u64>(), 5);
    let wrote = write_all(&mut m, &ps);
    assert_eq!((wrote[0].len(), wrote[1].len()), (3, 2));
    m.feed(ps[0], &l4(b"r0"), Timestamp::ZERO).unwrap();
    m.feed(ps[0], &l4(b"r1"), Timestamp::ZERO).unwrap();
    assert_eq!(m.psock_outstanding(ps[0]), Ok(1));
    assert_eq!(m.psock_outstanding(ps[1]), Ok(2));
    // A peer that sends more than it was asked never goes below zero.
    for _ in 0..3 {
        m.feed(ps[0], &l4(b"extra"), Timestamp::ZERO).unwrap();
    }
    assert_eq!(m.psock_outstanding(ps[0]), Ok(0));
    // The next send goes to the least outstanding one.
    m.send(s, &l4(b"next"), EOR).unwrap();
    let wrote = write_all(&mut m, &ps);
    assert_eq!((wrote[0].len(), wrote[1].len()), (1, 0));
}

#[test]
fn messages_wait_for_a_psock_then_are_placed() {
    let (mut m, s, _) = client(TxPolicy::LeastOutstanding, 0);
    for i in 0..4u8 {
        m.send(s, &l4(&[i]), EOR).unwrap();
    }
    let a = attach_l4(&mut m);
    let b = attach_l4(&mut m);
    let wrote = write_all(&mut m, &[a, b]);
    assert_eq!(wrote[0].len() + wrote[1].len(), 4, "{wrote:?}");
    assert_eq!(m.sock_stats(s).unwrap().tx_msgs, 4);
}

/// A server that closes its connection (dies) with requests still queued on
/// it: those not started go to the other psock whole and in order; the one
/// being written when the write fails is retried there too.
#[test]
fn a_closed_psocks_unsent_messages_go_to_the_others() {
    let (mut m, s, ps) = client(TxPolicy::LeastOutstanding, 2);
    let (a, b) = (ps[0], ps[1]);
    m.send(s, &l4(&[0; 3]), EOR).unwrap();
    // a's write of message 0 is out and has written 2 bytes.
    let chunk = m.tx_begin(a).unwrap();
    assert_eq!(chunk.slices.len(), 1);
    m.tx_complete(a, 2);
    let chunk = m.tx_begin(a).unwrap();
    assert_eq!(chunk.slices[0].len(), 5);
    // Ties rotate: a holds 0, 2, 4 and b 1, 3, 5.
    for i in 1..6u8 {
        m.send(s, &l4(&[i; 3]), EOR).unwrap();
    }
    // The peer closes: a can answer nothing more.
    m.rx_closed(a, None).unwrap();
    let ev = events(&mut m);
    assert!(ev.contains(&Event::PsockFailed(a, PsockError::Closed)), "{ev:?}");
    // 2 and 4 moved to b at once, after b's own (1, 3, 5 were queued first).
    let wrote_b = split_l4(&flush(&mut m, b));
    assert_eq!(wrote_b, vec![l4(&[1; 3]), l4(&[3; 3]), l4(&[5; 3]), l4(&[2; 3]), l4(&[4; 3])]);
    // The write in progress fails: message 0 is resent whole on b.
    m.tx_failed(a, 104);
    assert_eq!(split_l4(&flush(&mut m, b)), vec![l4(&[0; 3])]);
    assert_eq!(m.stats().tx_retries, 1);
    // New sends go to b only.
    m.send(s, &l4(b"new"), EOR).unwrap();
    assert_eq!(flush(&mut m, a), b"");
    assert_eq!(split_l4(&flush(&mut m, b)), vec![l4(b"new")]);
    assert_eq!(m.sock_stats(s).unwrap().tx_msgs, 7);
    m.unattach(a).unwrap();
    assert!(m.writable(s).unwrap());
}

#[test]
fn an_unattached_psocks_messages_go_to_the_others() {
    let (mut m, s, ps) = client(TxPolicy::LeastOutstanding, 3);
    for i in 0..9u8 {
        m.send(s, &l4(&[i]), EOR).unwrap();
    }
    m.unattach(ps[1]).unwrap();
    let wrote = write_all(&mut m, &[ps[0], ps[2]]);
    let mut all: Vec<Vec<u8>> = wrote.into_iter().flatten().collect();
    all.sort();
    assert_eq!(all, (0..9u8).map(|i| l4(&[i])).collect::<Vec<_>>());
    assert_eq!(m.memory_used(), 0);
}

#[test]
fn a_psock_with_a_framing_error_is_passed_over() {
    let mut m = Mux::new(MuxConfig { max_msg_size: 16, ..config(TxPolicy::LeastOutstanding) });
    let s = m.socket(SockType::SeqPacket);
    let (a, b) = (attach_l4(&mut m), attach_l4(&mut m));
    // a's peer sends a message over the limit: a's receive stops.
    m.feed(a, &l4(&[0; 40]), Timestamp::ZERO).unwrap();
    assert!(events(&mut m).iter().any(|e| matches!(e, Event::PsockFailed(p, PsockError::Rx(_)) if *p == a)));
    for i in 0..4u8 {
        m.send(s, &l4(&[i]), EOR).unwrap();
    }
    assert_eq!(flush(&mut m, a), b"");
    assert_eq!(split_l4(&flush(&mut m, b)).len(), 4);
}
