//! What a handler is and what crosses between a worker and the threads that
//! run its handler: the [`Handler`] trait and its [`Verdict`]s, the service's
//! counters, and the heavy lanes' queues ([`Lanes`]: a worker offers a
//! [`Job`], a lane thread posts back a [`Done`]).
//!
//! Owns no thread and no socket. Must not name the runtime's other modules
//! but `sync` and `config`: every layer above it (the core's runtime side, the
//! drivers, `service`) uses these types, and `service` re-exports the public
//! ones under their public paths.

use std::sync::atomic::AtomicU64;

use bytes::BytesMut;
use connmux_core::mux::PsockId;
use connmux_core::run::Messages;
use connmux_core::Bytes;

use crate::sync::crew::Crew;
use crate::sync::inbox::Inbox;

/// Replies are cut out of `scratch` in chunks of this size: a handler's small
/// `extend_from_slice` would otherwise allocate a fresh buffer (and a shared
/// header on `split`) for every reply, two allocations per message.
pub(crate) const SCRATCH_CHUNK: usize = 64 * 1024;
/// Below this much spare room a new chunk is started before a handler runs.
pub(crate) const SCRATCH_LOW: usize = 4 * 1024;

/// Nanoseconds since `t0`, a `connmux_sys::clock::now_nanos` reading (handler
/// times, here and in the lanes: cheaper than an `Instant` and a `Duration`
/// per reading).
#[inline]
pub(crate) fn since(t0: u64) -> u64 {
    connmux_sys::clock::now_nanos().saturating_sub(t0)
}

/// What a handler decided for one request.
#[derive(Debug)]
pub enum Verdict {
    /// Send this message back on the connection the request came from.
    Reply(Bytes),
    /// Nothing to send.
    NoReply,
    /// The peer misbehaved: reset and unattach its connection (after the
    /// replies already produced for it are written).
    Close,
    /// The reply, one whole message, was appended to the `out` buffer of
    /// [`Handler::handle_in_place`] (only that method may answer this).
    Appended,
}

/// Turns a request into a verdict. Runs on I/O workers: keep it short and
/// never block. `scratch` is a per-worker buffer to build replies in
/// (`scratch.split().freeze()` hands one out without a copy).
/// Replies up to this size returned by [`Handler::handle_in_place`] in a run
/// are appended to the run's output by the default
/// [`Handler::handle_run_in_place`].
const RUN_APPEND_MAX: usize = 512;

///
/// The same handler can answer UDP datagrams ([`crate::udp::UdpService`]):
/// there one datagram is one request, `from` is
/// [`crate::udp::udp_psock`]`(worker)` (tell it with
/// [`crate::udp::is_udp`]; it names no connection), `Close` drops the
/// datagram, and only `handle_in_place` is called.
pub trait Handler: Send + Sync + 'static {
    fn handle(&self, request: Bytes, from: PsockId, scratch: &mut BytesMut) -> Verdict;

    /// [`Handler::handle`] for a request that still lies in the worker's
    /// receive buffer, valid only during the call (a read's whole messages
    /// are served where they lie: nothing is cut or copied for them). `out`
    /// holds the replies to the same connection built so far: a handler that
    /// writes its reply there (exactly one whole message, appended) returns
    /// [`Verdict::Appended`], and the replies of one read leave in one write
    /// without another copy. A handler that answers anything else must leave
    /// `out` as it found it. The default copies the request and calls `handle`.
    fn handle_in_place(&self, request: &[u8], from: PsockId, scratch: &mut BytesMut, out: &mut BytesMut) -> Verdict {
        let _ = out;
        self.handle(Bytes::copy_from_slice(request), from, scratch)
    }

    /// [`Handler::handle_in_place`] over the requests of one read:
    /// `requests` are whole messages of connection `from`, in order, where
    /// they lie (run by run: [`Messages`]). Replies answered by appending go
    /// to `out`, back to back; at the first request answered any other way
    /// (a `Reply` of its own buffer, or `Close`) the call stops and that
    /// verdict is returned with it.
    ///
    /// Why one call for them all: a handler with a common case (a NULL
    /// call, an echo) answers it in a tight loop, without a dynamic call and
    /// the worker's bookkeeping per message, and steps through a run of
    /// equal messages by their length (nothing to look up per message).
    /// The default calls `handle_in_place` for each request and appends a
    /// `Reply` of at most 512 bytes to `out` itself (the bytes sent are the
    /// same as for the `Reply`, in one queue entry); an override must
    /// answer exactly as that would.
    fn handle_run_in_place(
        &self,
        requests: Messages<'_>,
        from: PsockId,
        scratch: &mut BytesMut,
        out: &mut BytesMut,
    ) -> RunServed {
        let mut served = RunServed { handled: 0, appended: 0, stop: None };
        // Room in `scratch` before the requests and after each reply that
        // may have been cut from it (not before every request: an echo
        // never touches it).
        if scratch.capacity() - scratch.len() < SCRATCH_LOW {
            scratch.reserve(SCRATCH_CHUNK);
        }
        let mut rest = requests;
        // Requests answered with no reply appended (`appended` is the rest).
        let mut silent = 0;
        // Bounded: each turn takes a run.
        while let Some(run) = rest.next_run() {
            // Messages received as they are on the wire (nearly always):
            // each is the next `stride` bytes, nothing to cut.
            let stop = match run.is_whole() {
                true => answer_each(self, run.wire.chunks_exact(run.stride), from, scratch, out, &mut silent),
                false => answer_each(self, run.messages(), from, scratch, out, &mut silent),
            };
            match stop {
                None => served.handled += run.count,
                Some((left, v)) => {
                    served.handled += run.count - left;
                    served.stop = Some(v);
                    break;
                }
            }
        }
        // Every request handled appended one reply, but the silent ones and
        // the one that stopped the run.
        served.appended = (served.handled - silent - usize::from(served.stop.is_some())) as u32;
        served
    }
}

/// The default [`Handler::handle_run_in_place`]'s loop over one run's
/// `requests`: `None` when all were answered by appending or not at all
/// (those counted in `silent`), else the verdict that stopped it and how
/// many requests were left after that one. No count per request: the
/// iterator knows how many it has left.
#[inline(always)]
fn answer_each<'a, H: Handler + ?Sized>(
    h: &H,
    mut requests: impl ExactSizeIterator<Item = &'a [u8]>,
    from: PsockId,
    scratch: &mut BytesMut,
    out: &mut BytesMut,
    silent: &mut usize,
) -> Option<(usize, Verdict)> {
    // Bounded: the iterator's length.
    while let Some(request) = requests.next() {
        let mark = out.len();
        match h.handle_in_place(request, from, scratch, out) {
            Verdict::Appended if out.len() > mark => {}
            // Appended with nothing appended is no reply.
            Verdict::Appended | Verdict::NoReply => {
                out.truncate(mark);
                *silent += 1;
            }
            // A small reply of its own buffer is appended here, as the
            // worker would copy it next to the others anyway: the run goes
            // on, with no per-request bookkeeping in the worker.
            Verdict::Reply(b) if b.len() <= RUN_APPEND_MAX && out.len() == mark => {
                out.extend_from_slice(&b);
                if scratch.capacity() - scratch.len() < SCRATCH_LOW {
                    scratch.reserve(SCRATCH_CHUNK);
                }
            }
            v => {
                // Only an appended reply may stay in `out`.
                out.truncate(mark);
                return Some((requests.len(), v));
            }
        }
    }
    None
}

/// What [`Handler::handle_run_in_place`] did with a run of requests.
#[derive(Debug)]
pub struct RunServed {
    /// Requests handled, from the start of the run.
    pub handled: usize,
    /// Replies appended to `out` for them, each one whole message.
    pub appended: u32,
    /// The verdict of the last request handled when it was not answered by
    /// appending (`Reply` or `Close`): the run stopped there. `None` when
    /// every request handled was answered by appending or not at all.
    pub stop: Option<Verdict>,
}

impl<F> Handler for F
where
    F: Fn(Bytes, PsockId, &mut BytesMut) -> Verdict + Send + Sync + 'static,
{
    fn handle(&self, request: Bytes, from: PsockId, scratch: &mut BytesMut) -> Verdict {
        self(request, from, scratch)
    }
}

/// Per-service counters.
#[derive(Debug, Default)]
pub struct ServiceStats {
    pub accepted: AtomicU64,
    pub attach_errors: AtomicU64,
    /// Connections closed because the peer failed (framing error, reset, FIN)
    /// or because the handler answered [`Verdict::Close`].
    pub closed: AtomicU64,
    /// Connections refused at accept (closed with a reset at once) because
    /// the service already had [`Service::set_max_conns`](crate::service::Service::set_max_conns) attached.
    pub refused: AtomicU64,
    /// Connections reset at the cap to make room for a new one, because
    /// they had been idle for [`EVICT_IDLE`](crate::service::EVICT_IDLE)
    /// or longer, the longest idle first (not counted in `closed`: the
    /// service aborts them itself).
    pub evicted: AtomicU64,
}

/// A heavy connection's message, offered by its worker.
pub(crate) struct Job {
    pub data: Bytes,
    pub psock: PsockId,
}

/// What a taker made of a [`Job`], posted back to the worker that offered it.
pub(crate) struct Done {
    pub psock: PsockId,
    pub verdict: Verdict,
    /// The handler ran shorter than `Tuning::busy_handler` (its taker's CPU
    /// time since its last message).
    pub short: bool,
    /// The request's length (the offering worker counts what its lane holds).
    pub len: usize,
    /// Posted quietly (`Inbox::post_quiet`): the lane is behind.
    pub quiet: bool,
}

/// The lanes of one `Mux::serve`: one per worker, and each worker's inbox
/// for the verdicts.
pub(crate) struct Lanes {
    pub crew: Crew<Job>,
    /// Bytes of requests one lane may hold (`Config::lane_bytes`).
    pub bytes: usize,
    pub inboxes: Vec<Inbox<Done>>,
}

impl Lanes {
    /// `workers` lanes of `cap` messages; helpers unless `in_order`, which
    /// take from a lane holding at least `steal_from` (`lane::LANE_STEAL_FROM`).
    pub fn new(workers: usize, cap: usize, bytes: usize, in_order: bool, steal_from: usize) -> Lanes {
        let helpers = if in_order || workers < 2 { 0 } else { workers };
        Lanes {
            crew: Crew::new(workers, cap, helpers, steal_from),
            bytes,
            inboxes: (0..workers).map(|_| Inbox::default()).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use connmux_core::run::Run;

    /// Answers by a request's last byte: `a` echoes it appended, `n` no
    /// reply, `e` says appended but appends nothing, `s` a small reply of
    /// its own, `b` a reply too large to append, `c` close.
    struct ByLast;

    impl Handler for ByLast {
        fn handle(&self, _request: Bytes, _from: PsockId, _scratch: &mut BytesMut) -> Verdict {
            Verdict::NoReply
        }
        fn handle_in_place(&self, request: &[u8], _from: PsockId, _s: &mut BytesMut, out: &mut BytesMut) -> Verdict {
            match request.last() {
                Some(b'a') => {
                    out.extend_from_slice(request);
                    Verdict::Appended
                }
                Some(b'e') => Verdict::Appended,
                Some(b's') => Verdict::Reply(Bytes::from_static(b"small")),
                Some(b'b') => Verdict::Reply(Bytes::from(vec![b'b'; RUN_APPEND_MAX + 1])),
                Some(b'c') => Verdict::Close,
                _ => Verdict::NoReply,
            }
        }
    }

    const FROM: PsockId = PsockId { index: 1, generation: 1 };

    fn serve(data: &[u8], runs: &[Run], skip: usize) -> (usize, u32, Option<&'static str>, Vec<u8>) {
        let (mut scratch, mut out) = (BytesMut::new(), BytesMut::from(&b"<"[..]));
        let served = ByLast.handle_run_in_place(Messages::new(data, runs).after(skip), FROM, &mut scratch, &mut out);
        let stop = served.stop.map(|v| match v {
            Verdict::Close => "close",
            Verdict::Reply(_) => "reply",
            _ => "other",
        });
        (served.handled, served.appended, stop, out.to_vec())
    }

    #[test]
    fn the_default_run_answers_every_run_in_order_and_stops_where_a_verdict_is_not_appended() {
        // Two-byte messages "xa xs xn" (whole), then three-byte ones whose
        // last two bytes are received ("yya yye"), then "zc zza".
        let data = b"xaxsxnyyayyezczza";
        let runs = [
            Run::whole(0, 2, 3),
            Run { at: 6, stride: 3, count: 2, skip: 1, len: 2 },
            Run::whole(12, 2, 1),
            Run::whole(14, 3, 1),
        ];
        // Everything before the close: xa appended, xs appended here, xn and
        // yye silent, ya appended; the close stops it with its own verdict.
        assert_eq!(serve(data, &runs, 0), (6, 3, Some("close"), b"<xasmallya".to_vec()));
        // From the message after the close on: the rest is answered.
        assert_eq!(serve(data, &runs, 6), (1, 1, None, b"<zza".to_vec()));
        // From inside the cut run: its second message, then the close.
        assert_eq!(serve(data, &runs, 4), (2, 0, Some("close"), b"<".to_vec()));
    }

    #[test]
    fn a_reply_too_large_to_append_stops_the_run_and_leaves_out_as_it_was() {
        let data = b"1a2b3a";
        let runs = [Run::whole(0, 2, 3)];
        assert_eq!(serve(data, &runs, 0), (2, 1, Some("reply"), b"<1a".to_vec()));
        assert_eq!(serve(data, &runs, 2), (1, 1, None, b"<3a".to_vec()));
    }
}
