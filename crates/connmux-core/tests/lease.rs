//! `Mux::lease`: a psock lent to the worker that reads it. What the worker
//! does on the lease (framing, answering, writing) must come out as the same
//! messages, counters and errors as the ordinary path, and anything else
//! that involves the psock must get the lease back first.

mod common;

use std::ops::Range;

use connmux_core::run::ranges;

use common::*;
use connmux_core::mux::{
    Direct, Event, Lease, LeaseRead, Mux, MuxConfig, PsockConfig, PsockId, SendFlags, SockId, SockType, Steering,
};
use connmux_core::parser::{Parse, Parser};
use connmux_core::{Bytes, Timestamp};

const T0: Timestamp = Timestamp::ZERO;

/// L4 that says it delivers its messages whole (as the ONC RPC parser does).
struct Whole(L4);

impl Parser for Whole {
    fn parse(&mut self, buf: &[u8]) -> Parse {
        self.0.parse(buf)
    }
    fn frames_in_place(&self) -> bool {
        true
    }
    fn delivers_whole(&self) -> bool {
        true
    }
    fn name(&self) -> &str {
        "l4whole"
    }
}

/// A worker's socket (tag 0) and a psock steered to it, with `max` as its
/// message size limit.
fn served(max: usize) -> (Mux, SockId, PsockId) {
    served_with(max, Box::new(Whole(L4::new())))
}

fn served_with(max: usize, parser: Box<dyn Parser>) -> (Mux, SockId, PsockId) {
    served_in(MuxConfig::default(), max, parser)
}

/// [`served_with`] in a mux of `cfg` (its steering made affinity).
fn served_in(cfg: MuxConfig, max: usize, parser: Box<dyn Parser>) -> (Mux, SockId, PsockId) {
    let mut m = Mux::new(MuxConfig { steering: Steering::Affinity, ..cfg });
    let s = m.socket(SockType::Dgram);
    m.set_affinity(s, Some(0)).unwrap();
    m.set_holds(s, true).unwrap();
    let cfg = PsockConfig { max_msg_size: Some(max), ..PsockConfig::default() };
    let p = m.attach(parser, cfg);
    m.set_psock_affinity(p, Some(0)).unwrap();
    events(&mut m);
    (m, s, p)
}

fn frame(lease: &mut Lease, data: &[u8]) -> (usize, Vec<Range<usize>>) {
    let mut out = Vec::new();
    let taken = lease.frame(data, &mut out);
    (taken, ranges(&out))
}

fn revoked(evs: &[Event], p: PsockId) -> usize {
    evs.iter().filter(|e| **e == Event::PsockLeaseRevoked(p)).count()
}

#[test]
fn what_a_lease_frames_and_writes_is_counted_as_the_ordinary_path_counts_it() {
    let wire: Vec<u8> = [l4(b"one"), l4(b"three"), l4(b"")].concat();
    let replies: Vec<u8> = [l4(b"r1"), l4(b"r2"), l4(b"r3")].concat();

    // The ordinary path: framed in place, answered with one addressed send.
    let (mut m, s, p) = served(1024);
    let mut out = Vec::new();
    let mut direct = Vec::new();
    m.feed_in_place(p, &wire, T0, &mut Direct { sock: s, out: &mut direct, limit: 8 }, 8, &mut out).unwrap();
    m.send_msgs_to(s, p, Bytes::from(replies.clone()), 3).unwrap();
    m.rx_settle(p, 3);
    assert_eq!(flush(&mut m, p), replies);
    let want = (m.psock_stats(p).unwrap(), m.sock_stats(s).unwrap(), ranges(&out));

    // On a lease.
    let (mut m, s, p) = served(1024);
    let mut lease = m.lease(p, s).expect("a quiet psock steered to s is lent");
    assert_eq!(lease.psock(), p);
    let (taken, ranges) = frame(&mut lease, &wire);
    assert_eq!(taken, wire.len());
    assert_eq!(ranges, want.2);
    lease.wrote(3, replies.len());
    // Nothing reaches the statistics before the sync ...
    assert_eq!(m.psock_stats(p).unwrap().rx_msgs, 0);
    assert!(m.lease_sync(&mut lease, T0));
    // ... and then all of it, as the ordinary path counted it.
    assert_eq!(m.psock_stats(p).unwrap(), want.0);
    let got = m.sock_stats(s).unwrap();
    let counted = (3, wire.len() as u64, 3, replies.len() as u64);
    assert_eq!((got.rx_msgs, got.rx_bytes, got.tx_msgs, got.tx_bytes), counted);
    assert_eq!((want.1.rx_msgs, want.1.rx_bytes, want.1.tx_msgs, want.1.tx_bytes), counted);
    // A second sync adds nothing.
    assert!(m.lease_sync(&mut lease, T0));
    assert_eq!(m.psock_stats(p).unwrap(), want.0);
    m.unlease(lease, T0);
    assert!(!m.leased(p));
    // The psock is the mux's again: the ordinary path frames it.
    let mut out = Vec::new();
    m.feed_in_place(p, &l4(b"x"), T0, &mut Direct { sock: s, out: &mut direct, limit: 8 }, 8, &mut out).unwrap();
    assert_eq!(connmux_core::run::count(&out), 1);
    assert_eq!(m.psock_stats(p).unwrap().rx_msgs, 4);
}

#[test]
fn no_lease_while_anything_else_involves_the_psock() {
    // A partial message buffered.
    let (mut m, s, p) = served(1024);
    m.feed(p, &l4(b"hello")[..3], T0).unwrap();
    assert!(m.lease(p, s).is_none());

    // A reply waiting to be written.
    let (mut m, s, p) = served(1024);
    m.send_msg(s, Some(p), Bytes::from(l4(b"r")), false).unwrap();
    assert!(m.lease(p, s).is_none());
    flush(&mut m, p);
    assert!(m.lease(p, s).is_some(), "written: nothing involves it any more");

    // A request taken by the reader and not settled.
    let (mut m, s, p) = served(1024);
    m.feed(p, &l4(b"req"), T0).unwrap();
    assert_eq!(recv_all(&mut m, s).len(), 1);
    assert!(m.lease(p, s).is_none());
    m.rx_settle(p, 1);
    assert!(m.lease(p, s).is_some());

    // Steered elsewhere: another tag, or round robin.
    let (mut m, s, p) = served(1024);
    m.set_psock_affinity(p, Some(1)).unwrap();
    assert!(m.lease(p, s).is_none());
    let mut m = Mux::new(rr_config());
    let s = m.socket(SockType::Dgram);
    let p = m.attach(Box::new(Whole(L4::new())), PsockConfig::default());
    assert!(m.lease(p, s).is_none());

    // A parser that does not frame in place (it may keep state).
    let (mut m, s, _) = served(1024);
    let q = m.attach(Box::new(L4 { in_place: false, ..L4::new() }), PsockConfig::default());
    m.set_psock_affinity(q, Some(0)).unwrap();
    assert!(m.lease(q, s).is_none());

    // Lent already.
    let (mut m, s, p) = served(1024);
    let _lease = m.lease(p, s).unwrap();
    assert!(m.lease(p, s).is_none());
}

#[test]
fn a_read_that_is_not_all_whole_messages_counts_nothing_and_the_mux_decides() {
    // A partial message after a whole one: not taken on the lease.
    let (mut m, s, p) = served(16);
    let mut lease = m.lease(p, s).unwrap();
    let wire: Vec<u8> = [l4(b"ok"), l4(b"partial")[..5].to_vec()].concat();
    let (taken, ranges) = frame(&mut lease, &wire);
    assert!(taken < wire.len());
    assert!(ranges.is_empty(), "nothing is handed out of a read not all whole");
    m.unlease(lease, T0);
    assert_eq!(m.psock_stats(p).unwrap().rx_msgs, 0);
    // Fed as usual: the whole message is delivered, the partial one kept.
    m.feed(p, &wire, T0).unwrap();
    assert_eq!(recv_all(&mut m, s), vec![l4(b"ok")]);

    // Too large for the psock's limit: the mux aborts it, as always.
    let (mut m, s, p) = served(16);
    let mut lease = m.lease(p, s).unwrap();
    let big = l4(&[7u8; 40]);
    assert_eq!(frame(&mut lease, &big).0, 0);
    m.unlease(lease, T0);
    m.feed(p, &big, T0).unwrap();
    let evs = events(&mut m);
    assert!(evs.iter().any(|e| matches!(e, Event::PsockFailed(q, _) if *q == p)), "{evs:?}");
    assert_eq!(m.psock_stats(p).unwrap().rx_msg_too_big, 1);
}

#[test]
fn a_send_to_a_leased_psock_waits_whole_and_asks_for_the_lease_back() {
    let (mut m, s, p) = served(1024);
    let other = m.socket(SockType::Dgram);
    let mut lease = m.lease(p, s).unwrap();
    m.send(other, &l4(b"from another thread"), SendFlags::default()).unwrap_or(0);
    m.send_msg(other, Some(p), Bytes::from(l4(b"addressed")), false).unwrap();
    m.send_msg(other, Some(p), Bytes::from(l4(b"again")), false).unwrap();
    let evs = events(&mut m);
    assert_eq!(revoked(&evs, p), 1, "asked once: {evs:?}");
    // Only the lease's holder writes meanwhile.
    assert!(m.tx_begin(p).is_none());
    assert!(!m.lease_sync(&mut lease, T0), "the holder learns it at its sync");
    m.unlease(lease, T0);
    let evs = events(&mut m);
    assert!(evs.contains(&Event::PsockTransmit(p)), "{evs:?}");
    let wire = flush(&mut m, p);
    let msgs = split_l4(&wire);
    assert!(msgs.contains(&l4(b"addressed")) && msgs.contains(&l4(b"again")), "{msgs:?}");
}

#[test]
fn a_short_write_on_a_lease_puts_the_rest_first_and_counts_it_once() {
    let (mut m, s, p) = served(1024);
    let mut lease = m.lease(p, s).unwrap();
    let replies: Vec<u8> = [l4(b"first reply"), l4(b"second")].concat();
    // 5 bytes went out; a send from elsewhere comes after the rest.
    lease.wrote(0, 5);
    m.unlease_queued(lease, vec![(Bytes::from(replies[5..].to_vec()), 2)], T0);
    m.send_msg(s, Some(p), Bytes::from(l4(b"later")), false).unwrap();
    let wire = flush(&mut m, p);
    assert_eq!(wire, [&replies[5..], &l4(b"later")[..]].concat());
    let st = m.psock_stats(p).unwrap();
    assert_eq!((st.tx_msgs, st.tx_bytes), (3, (replies.len() + l4(b"later").len()) as u64));
    assert_eq!(m.sock_stats(s).unwrap().tx_queued, 0);
}

#[test]
fn chunks_a_lease_gives_back_unwritten_go_first_in_order_and_are_counted_once() {
    // A backlog of three chunks: 5 bytes of the first went out while lent
    // (the lease's), a message sent from elsewhere meanwhile waits.
    let chunks = [[l4(b"first reply"), l4(b"second")].concat(), l4(b"third"), l4(b"fourth")];
    let (mut m, s, p) = served(1024);
    let mut lease = m.lease(p, s).unwrap();
    lease.wrote(0, 5);
    m.send_msg(s, Some(p), Bytes::from(l4(b"later")), false).unwrap();
    let unsent = vec![
        (Bytes::from(chunks[0][5..].to_vec()), 2),
        (Bytes::from(chunks[1].clone()), 1),
        (Bytes::new(), 0),
        (Bytes::from(chunks[2].clone()), 1),
    ];
    m.unlease_queued(lease, unsent, T0);
    let wire = flush(&mut m, p);
    let all = chunks.concat();
    assert_eq!(wire, [&all[5..], &l4(b"later")[..]].concat());
    let st = m.psock_stats(p).unwrap();
    assert_eq!((st.tx_msgs, st.tx_bytes), (5, (all.len() + l4(b"later").len()) as u64));
    let sock = m.sock_stats(s).unwrap();
    assert_eq!((sock.tx_msgs, sock.tx_queued, sock.tx_mem), (5, 0, 0));
}

#[test]
fn replies_queued_are_taken_with_the_lease_within_the_room_and_counted_once() {
    // Two sends of replies; a write took all of the first and 5 bytes of
    // the rest, and the connection would block (no chunk out now).
    let first = l4(b"first reply");
    let rest: Vec<u8> = [l4(b"second"), l4(b"third")].concat();
    let sent = 5;
    let queue = |m: &mut Mux, s: SockId, p: PsockId| {
        m.send_msgs_to(s, p, Bytes::from(first.clone()), 1).unwrap();
        m.send_msgs_to(s, p, Bytes::from(rest.clone()), 2).unwrap();
        assert_eq!(m.tx_begin(p).unwrap().len(), first.len() + rest.len());
        m.tx_complete(p, first.len() + sent);
    };

    // The ordinary path: the rest written by the mux's writer.
    let (mut m, s, p) = served(1024);
    queue(&mut m, s, p);
    assert_eq!(flush(&mut m, p), rest[sent..]);
    let want = (m.psock_stats(p).unwrap(), m.sock_stats(s).unwrap());

    // Lent with them: only within the room given, and only with room.
    let (mut m, s, p) = served(1024);
    queue(&mut m, s, p);
    assert!(m.lease(p, s).is_none(), "a lease that takes nothing queued");
    assert!(m.lease_taking(p, s, 0, rest.len() - sent - 1, 0).is_none(), "one byte short");
    let mut lease = m.lease_taking(p, s, 0, rest.len() - sent, 0).expect("lent with the rest");
    assert_eq!(lease.take_unsent(), vec![(Bytes::from(rest[sent..].to_vec()), 2)]);
    let sock = m.sock_stats(s).unwrap();
    assert_eq!((sock.tx_queued, sock.tx_mem), (0, 0), "out of the socket's send buffer");
    assert!(m.tx_begin(p).is_none(), "its holder writes them");
    // The holder writes them, in two parts told apart (the first part is
    // bytes of no whole message), then gives the lease back: counted once.
    lease.wrote(0, 3);
    assert!(m.lease_sync(&mut lease, T0));
    assert_eq!(m.psock_stats(p).unwrap().tx_bytes, want.0.tx_bytes - (rest.len() - sent - 3) as u64);
    lease.wrote(2, rest.len() - sent - 3);
    m.unlease(lease, T0);
    assert!(m.tx_begin(p).is_none(), "nothing left to write");
    assert_eq!(m.psock_stats(p).unwrap(), want.0);
    assert_eq!(m.sock_stats(s).unwrap(), want.1);

    // Given back before its holder took them: first on the queue again,
    // and written then as if never lent.
    let (mut m, s, p) = served(1024);
    queue(&mut m, s, p);
    let lease = m.lease_taking(p, s, 0, 1 << 10, 0).unwrap();
    m.send_msg(s, Some(p), Bytes::from(l4(b"later")), false).unwrap();
    m.unlease(lease, T0);
    assert_eq!(flush(&mut m, p), [&rest[sent..], &l4(b"later")[..]].concat());
    let st = m.psock_stats(p).unwrap();
    assert_eq!((st.tx_msgs, st.tx_bytes), (want.0.tx_msgs + 1, want.0.tx_bytes + l4(b"later").len() as u64));
    let sock = m.sock_stats(s).unwrap();
    assert_eq!((sock.tx_msgs, sock.tx_queued, sock.tx_mem), (want.1.tx_msgs + 1, 0, 0));

    // A queued message of another socket: not lent.
    let (mut m, s, p) = served(1024);
    let other = m.socket(SockType::Dgram);
    m.send_msg(other, Some(p), Bytes::from(l4(b"theirs")), false).unwrap();
    assert!(m.lease_taking(p, s, 0, 1 << 10, 0).is_none());
}

#[test]
fn bytes_of_a_reply_written_in_parts_on_a_lease_are_counted_at_each_sync() {
    // A reply whose connection takes it in parts (a backlog written as the
    // connection takes more): the syncs between the parts hold bytes of no
    // whole message.
    let (mut m, s, p) = served(1024);
    let mut lease = m.lease(p, s).unwrap();
    let reply = l4(&[7u8; 100]);
    lease.wrote(0, 30);
    assert!(m.lease_sync(&mut lease, T0));
    assert_eq!(m.psock_stats(p).unwrap().tx_bytes, 30, "the first part, at its sync");
    lease.wrote(1, reply.len() - 30);
    assert!(m.lease_sync(&mut lease, T0));
    let st = m.psock_stats(p).unwrap();
    assert_eq!((st.tx_msgs, st.tx_bytes), (1, reply.len() as u64));
    let sock = m.sock_stats(s).unwrap();
    assert_eq!((sock.tx_msgs, sock.tx_bytes), (1, reply.len() as u64));
    m.unlease(lease, T0);
}

#[test]
fn a_queue_taken_by_a_lease_after_its_kick_leaves_the_next_send_kicked() {
    // A reply queued asks for its writer (`PsockTransmit`); before the
    // writer comes, a lease takes the queue, so the writer finds nothing to
    // begin. A message sent after the lease goes back must ask again.
    let (mut m, s, p) = served(1024);
    let reply = l4(b"queued");
    m.send_msg(s, Some(p), Bytes::from(reply.clone()), false).unwrap();
    assert!(events(&mut m).contains(&Event::PsockTransmit(p)));
    let mut lease = m.lease_taking(p, s, 0, 1 << 10, 0).expect("lent with the reply");
    assert_eq!(lease.take_unsent(), vec![(Bytes::from(reply.clone()), 1)]);
    assert!(m.tx_begin(p).is_none(), "the lease writes it");
    lease.wrote(1, reply.len());
    m.unlease(lease, T0);
    events(&mut m);
    let other = m.socket(SockType::Dgram);
    m.send_msg(other, Some(p), Bytes::from(l4(b"theirs")), false).unwrap();
    assert!(events(&mut m).contains(&Event::PsockTransmit(p)), "no writer asked for");
    assert_eq!(flush(&mut m, p), l4(b"theirs"));
}

#[test]
fn a_write_that_fails_midway_on_a_lease_counts_what_went_out_and_drops_only_the_rest() {
    const EPIPE: i32 = 32;
    // The first reply went out whole, then 5 bytes of the next two, then
    // the connection failed.
    let first = l4(b"first reply");
    let rest: Vec<u8> = [l4(b"second"), l4(b"third")].concat();
    let sent = 5;

    // The ordinary path: the same replies queued, the same bytes written.
    let (mut m, s, p) = served(1024);
    m.send_msgs_to(s, p, Bytes::from(first.clone()), 1).unwrap();
    m.send_msgs_to(s, p, Bytes::from(rest.clone()), 2).unwrap();
    assert_eq!(m.tx_begin(p).unwrap().len(), first.len() + rest.len());
    m.tx_complete(p, first.len() + sent);
    assert!(m.tx_begin(p).is_some());
    m.tx_complete(p, 0);
    m.tx_failed(p, EPIPE);
    let want = (m.psock_stats(p).unwrap(), m.sock_stats(s).unwrap());

    // On a lease: what went out whole is counted as written, the rest goes
    // back with its written part, then the failure.
    let (mut m, s, p) = served(1024);
    let mut lease = m.lease(p, s).unwrap();
    lease.wrote(1, first.len());
    lease.wrote(0, sent);
    m.unlease_queued(lease, vec![(Bytes::from(rest[sent..].to_vec()), 2)], T0);
    m.tx_failed(p, EPIPE);
    let evs = events(&mut m);
    let failed = Event::PsockFailed(p, connmux_core::mux::PsockError::Tx(EPIPE));
    assert_eq!(evs.iter().filter(|e| **e == failed).count(), 1, "{evs:?}");
    assert!(!m.leased(p));
    assert!(m.tx_begin(p).is_none(), "the rest is dropped, not written");
    let st = m.psock_stats(p).unwrap();
    let counted = (1, (first.len() + sent) as u64, 2, 1);
    assert_eq!((st.tx_msgs, st.tx_bytes, st.tx_addressed_drops, st.tx_aborts), counted);
    assert_eq!(st, want.0);
    let sock = m.sock_stats(s).unwrap();
    assert_eq!((sock.tx_msgs, sock.tx_bytes), (3, (first.len() + rest.len()) as u64));
    assert_eq!((sock.tx_queued, sock.tx_mem), (0, 0), "nothing charged is left");
    assert_eq!(sock, want.1);
}

#[test]
fn unattach_aborts_and_steering_changes_take_the_lease_back() {
    // Unattach: revoked, and the lease is of a psock that is gone.
    let (mut m, s, p) = served(1024);
    let mut lease = m.lease(p, s).unwrap();
    m.unattach(p).unwrap();
    let evs = events(&mut m);
    assert_eq!(revoked(&evs, p), 1);
    assert!(evs.contains(&Event::PsockReleased(p)));
    assert!(!m.lease_sync(&mut lease, T0));
    m.unlease(lease, T0);

    // An abort from elsewhere (a limit, a layer below the parser).
    let (mut m, s, p) = served(1024);
    let lease = m.lease(p, s).unwrap();
    m.rx_abort(p, connmux_core::mux::RxError::IdleTimeout).unwrap();
    assert_eq!(revoked(&events(&mut m), p), 1);
    m.unlease(lease, T0);

    // The worker's socket stops taking messages, or the psock's tag moves.
    let (mut m, s, p) = served(1024);
    let lease = m.lease(p, s).unwrap();
    m.set_recv_disable(s, true).unwrap();
    assert_eq!(revoked(&events(&mut m), p), 1);
    m.unlease(lease, T0);
    let (mut m, s, p) = served(1024);
    let lease = m.lease(p, s).unwrap();
    m.set_psock_affinity(p, Some(3)).unwrap();
    assert_eq!(revoked(&events(&mut m), p), 1);
    m.unlease(lease, T0);
    // Closing the worker's socket.
    let (mut m, s, p) = served(1024);
    let _lease = m.lease(p, s).unwrap();
    m.close(s).unwrap();
    assert_eq!(revoked(&events(&mut m), p), 1);
}

#[test]
fn a_parser_that_cuts_its_messages_is_counted_as_delivered() {
    // L4 that strips its header: the reader gets less than the wire carried.
    let strip = || Box::new(L4 { strip: true, ..L4::new() }) as Box<dyn Parser>;
    let wire: Vec<u8> = [l4(b"abc"), l4(b"defgh")].concat();
    let (mut m, s, p) = served_with(1024, strip());
    let mut out = Vec::new();
    let mut direct = Vec::new();
    m.feed_in_place(p, &wire, T0, &mut Direct { sock: s, out: &mut direct, limit: 8 }, 8, &mut out).unwrap();
    m.rx_settle(p, 2);
    let want = (m.psock_stats(p).unwrap(), m.sock_stats(s).unwrap().rx_bytes, ranges(&out));

    let (mut m, s, p) = served_with(1024, strip());
    let mut lease = m.lease(p, s).unwrap();
    let (taken, ranges) = frame(&mut lease, &wire);
    assert_eq!((taken, &ranges), (wire.len(), &want.2));
    m.unlease(lease, T0);
    assert_eq!(m.psock_stats(p).unwrap(), want.0);
    assert_eq!(m.sock_stats(s).unwrap().rx_bytes, want.1);
    assert_eq!(want.1, 8);
}

/// What a worker serves of one read on the lease: the kept message made
/// whole (as the parser delivers it), then the read's own whole messages;
/// `None` when the lease must go back (with the offset the mux takes over).
fn serve_read(lease: &mut Lease, data: &[u8], now: Timestamp, room: usize) -> Result<Vec<Vec<u8>>, usize> {
    let mut out = Vec::new();
    match lease.frame_read(data, now, room, &mut out) {
        LeaseRead::GiveBack { from } => Err(from),
        LeaseRead::Kept => Ok(Vec::new()),
        LeaseRead::Serve { done, from } => {
            let mut msgs = Vec::new();
            if let Some(r) = done {
                msgs.push(lease.take_done()[r].to_vec());
            }
            msgs.extend(ranges(&out).into_iter().map(|r| data[from..][r].to_vec()));
            Ok(msgs)
        }
    }
}

#[test]
fn a_message_split_between_reads_at_any_byte_is_completed_on_the_lease_and_counted_once() {
    let msgs: Vec<Vec<u8>> = vec![l4(b"one"), l4(b"a longer second message"), l4(b""), l4(&[9u8; 300])];
    let wire = msgs.concat();
    // The ordinary path, for the counts.
    let (mut m, s, p) = served(1024);
    m.feed(p, &wire, T0).unwrap();
    assert_eq!(recv_all(&mut m, s).len(), msgs.len());
    m.rx_settle(p, msgs.len() as u64);
    let want = m.psock_stats(p).unwrap();
    // Every way of cutting the stream in three reads.
    for a in 0..=wire.len() {
        for b in (a..=wire.len()).step_by(7) {
            let (mut m, s, p) = served(1024);
            let mut lease = m.lease(p, s).unwrap();
            let mut got = Vec::new();
            for read in [&wire[..a], &wire[a..b], &wire[b..]] {
                got.extend(serve_read(&mut lease, read, T0, 1024).expect("kept within room"));
            }
            assert_eq!(got, msgs, "cut at {a}, {b}");
            assert!(!lease.keeps());
            assert!(m.lease_sync(&mut lease, T0));
            let st = m.psock_stats(p).unwrap();
            assert_eq!((st.rx_msgs, st.rx_bytes), (want.rx_msgs, want.rx_bytes), "cut at {a}, {b}");
        }
    }
}

#[test]
fn what_a_lease_kept_goes_back_to_the_mux_whole_and_in_order() {
    // Kept, then given back (a send from elsewhere, say): the mux frames
    // the kept start with what comes next.
    let (mut m, s, p) = served(1024);
    let mut lease = m.lease(p, s).unwrap();
    let msg = l4(b"in two parts");
    let first: Vec<u8> = [l4(b"whole"), msg[..7].to_vec()].concat();
    assert_eq!(serve_read(&mut lease, &first, T0, 1024), Ok(vec![l4(b"whole")]));
    assert_eq!(lease.kept(), 7);
    m.unlease(lease, T0);
    assert_eq!(m.stats().lease_returns, 1);
    m.feed(p, &msg[7..], T0).unwrap();
    assert_eq!(recv_all(&mut m, s), vec![msg.clone()]);
    // Counted once each: one on the lease, one by the mux.
    assert_eq!(m.psock_stats(p).unwrap().rx_msgs, 2);

    // More than the room given: back, with what it kept; the caller feeds
    // the read from `from` on.
    let (mut m, s, p) = served(1024);
    let mut lease = m.lease(p, s).unwrap();
    let big = l4(&[5u8; 100]);
    assert_eq!(serve_read(&mut lease, &big[..10], T0, 64), Err(0), "announces 104 bytes, room 64");
    let (mut m2, s2, p2) = served(1024);
    let mut lease2 = m2.lease(p2, s2).unwrap();
    assert_eq!(serve_read(&mut lease2, &big[..2], T0, 64), Ok(vec![]), "a header begun is kept");
    // The read's first two bytes complete the header (kept): the mux
    // takes the rest of the read after them.
    assert_eq!(serve_read(&mut lease2, &big[2..10], T0, 64), Err(2), "its length is known now: too long");
    m2.unlease(lease2, T0);
    m2.feed(p2, &big[4..], T0).unwrap();
    assert_eq!(recv_all(&mut m2, s2), vec![big.clone()]);
    m.unlease(lease, T0);
    m.feed(p, &big, T0).unwrap();
    assert_eq!(recv_all(&mut m, s), vec![big]);

    // A message made whole, then a bad one: nothing served on the lease;
    // the mux gets the whole message and the rest, delivers the one and
    // aborts on the other.
    let (mut m, s, p) = served(16);
    let mut lease = m.lease(p, s).unwrap();
    let ok = l4(b"ok!");
    assert_eq!(serve_read(&mut lease, &ok[..5], T0, 1024), Ok(vec![]));
    let rest: Vec<u8> = [ok[5..].to_vec(), l4(&[1u8; 40])].concat();
    let from = serve_read(&mut lease, &rest, T0, 1024).expect_err("too large for the psock");
    assert_eq!(from, ok.len() - 5);
    m.unlease(lease, T0);
    m.feed(p, &rest[from..], T0).unwrap();
    assert_eq!(recv_all(&mut m, s), vec![ok]);
    assert_eq!(m.psock_stats(p).unwrap().rx_msg_too_big, 1);
}

#[test]
fn a_kept_message_times_out_from_its_first_byte_as_the_mux_would() {
    let t = std::time::Duration::from_millis(100);
    let cfg = MuxConfig { assembly_timeout: Some(t), ..MuxConfig::default() };
    let (mut m, s, p) = served_in(cfg, 1024, Box::new(Whole(L4::new())));
    let mut lease = m.lease(p, s).unwrap();
    let at = |ms: u64| Timestamp::from_nanos(ms * 1_000_000);
    let msg = l4(b"slow loris");
    assert_eq!(serve_read(&mut lease, &msg[..3], at(10), 1024), Ok(vec![]));
    assert_eq!(lease.kept_due(), Some(at(110)), "from the first byte");
    // More of it later does not move the deadline.
    assert_eq!(serve_read(&mut lease, &msg[3..6], at(60), 1024), Ok(vec![]));
    assert_eq!(lease.kept_due(), Some(at(110)));
    // The worker gives it back at the deadline: the mux times it out then.
    m.unlease(lease, at(110));
    assert_eq!(m.poll_timeout(), Some(at(110)));
    m.handle_timeout(at(110));
    let evs = events(&mut m);
    assert!(evs.iter().any(|e| matches!(e, Event::PsockFailed(q, _) if *q == p)), "{evs:?}");
    let st = m.psock_stats(p).unwrap();
    assert_eq!((st.rx_msg_timeouts, st.rx_msgs), (1, 0));
}

#[test]
fn bytes_a_lease_kept_do_not_make_the_psock_look_idle_when_given_back() {
    let ms = std::time::Duration::from_millis;
    let cfg = MuxConfig { idle_timeout: Some(ms(100)), assembly_timeout: Some(ms(10_000)), ..MuxConfig::default() };
    let (mut m, s, p) = served_in(cfg, 1024, Box::new(Whole(L4::new())));
    let at = |n: u64| Timestamp::from_nanos(n * 1_000_000);
    let mut lease = m.lease(p, s).unwrap();
    let msg = l4(b"a slow but steady sender");
    // Its first byte at 10 ms, more at 90 ms (told to the mux then).
    assert_eq!(serve_read(&mut lease, &msg[..3], at(10), 1024), Ok(vec![]));
    assert_eq!(serve_read(&mut lease, &msg[3..9], at(90), 1024), Ok(vec![]));
    assert!(m.lease_sync(&mut lease, at(90)));
    // Back with the mux at 150 ms: last active at 90, not at 10.
    m.unlease(lease, at(150));
    m.handle_timeout(at(170));
    assert!(events(&mut m).iter().all(|e| !matches!(e, Event::PsockFailed(q, _) if *q == p)));
    assert_eq!(m.stats().idle_timeouts, 0);
    // The rest of it is framed whole by the mux.
    m.feed(p, &msg[9..], at(171)).unwrap();
    assert_eq!(recv_all(&mut m, s), vec![msg]);
}

#[test]
fn a_psock_holding_a_message_begun_is_lent_with_it_within_the_room_given() {
    let t = std::time::Duration::from_millis(100);
    let at = |ms: u64| Timestamp::from_nanos(ms * 1_000_000);
    let cfg = MuxConfig { assembly_timeout: Some(t), ..MuxConfig::default() };
    let msg = l4(b"a message that reads cut");
    // Whole messages and the start of one, read at 10 ms: the start stays
    // in the stream, its deadline running.
    let (mut m, s, p) = served_in(cfg.clone(), 1024, Box::new(Whole(L4::new())));
    let first: Vec<u8> = [l4(b"whole"), msg[..9].to_vec()].concat();
    m.feed(p, &first, at(10)).unwrap();
    assert_eq!(recv_all(&mut m, s), vec![l4(b"whole")]);
    m.rx_settle(p, 1);
    assert_eq!(m.poll_timeout(), Some(at(110)));
    assert!(m.lease(p, s).is_none(), "not without room for what it holds");
    assert!(m.lease_keeping(p, s, 8).is_none(), "nor with less room than that");
    let mut lease = m.lease_keeping(p, s, 9).expect("lent with its 9 bytes");
    assert_eq!((lease.kept(), lease.kept_due()), (9, Some(at(110))), "the deadline from its first byte");
    assert_eq!(m.poll_timeout(), None, "the mux's deadline went with the bytes");
    assert_eq!(m.memory_used(), 0, "and the mux holds nothing");
    // The next read completes it on the lease, with one more whole.
    let rest: Vec<u8> = [msg[9..].to_vec(), l4(b"next")].concat();
    assert_eq!(serve_read(&mut lease, &rest, at(20), 1024), Ok(vec![msg.clone(), l4(b"next")]));
    assert!(m.lease_sync(&mut lease, at(20)));
    let st = m.psock_stats(p).unwrap();
    assert_eq!((st.rx_msgs, st.rx_bytes), (3, (l4(b"whole").len() + msg.len() + l4(b"next").len()) as u64));

    // Given back before it is whole: the mux has it again as read at its
    // first byte, and times it out then.
    let (mut m, s, p) = served_in(cfg, 1024, Box::new(Whole(L4::new())));
    m.feed(p, &msg[..9], at(10)).unwrap();
    let lease = m.lease_keeping(p, s, 64).unwrap();
    m.unlease(lease, at(50));
    assert_eq!(m.poll_timeout(), Some(at(110)));
    m.feed(p, &msg[9..], at(60)).unwrap();
    assert_eq!(recv_all(&mut m, s), vec![msg]);
    assert_eq!(m.psock_stats(p).unwrap().rx_msgs, 1, "counted once");
}

#[test]
fn a_psock_of_large_messages_is_not_lent_while_they_are_read_into_their_buffers() {
    let big = l4(&vec![b'x'; 64 << 10]);
    let (mut m, s, p) = served(1 << 20);
    let lease = m.lease(p, s).expect("lent before any message");
    m.unlease(lease, T0);
    // One large message, whole: the next is predicted as large and read
    // straight into its assembly buffer, which a lease would not do.
    m.feed(p, &big, T0).unwrap();
    assert_eq!(recv_all(&mut m, s), vec![big.clone()]);
    m.rx_settle(p, 1);
    assert!(m.rx_would_lend(p), "the next read goes into a loan");
    assert!(m.lease(p, s).is_none(), "not lent while its messages are large");
    assert!(m.lease_keeping(p, s, 1 << 20).is_none(), "whatever room a lease would keep");
    // A small message again: lent again.
    let mut loan = m.rx_lend(p).expect("a loan for the predicted message");
    loan.buf().extend_from_slice(&l4(b"small"));
    m.rx_commit(loan, T0).unwrap();
    assert_eq!(recv_all(&mut m, s), vec![l4(b"small")]);
    m.rx_settle(p, 1);
    assert!(!m.rx_would_lend(p));
    let mut lease = m.lease(p, s).expect("lent once its messages are small");

    // A large message framed whole on the lease counts as the last one:
    // once told and given back, the psock is not lent again.
    let (taken, ranges) = frame(&mut lease, &big);
    assert_eq!((taken, ranges.len()), (big.len(), 1));
    assert!(m.lease_sync(&mut lease, T0));
    m.unlease(lease, T0);
    assert!(m.rx_would_lend(p));
    assert!(m.lease(p, s).is_none());
}
