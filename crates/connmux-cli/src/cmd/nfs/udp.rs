//! NFS and MOUNT over UDP: one call per datagram, no record mark (RFC 5531
//! §11), answered on the UDP thread that took it (`connmux::udp`).
//!
//! Over TCP every procedure but NULL goes to the file-system threads, which
//! send the reply on the connection themselves; a datagram has no
//! connection to send on, so over UDP the call is run where it was taken,
//! on the UDP thread of its worker's CPU. UDP is there for small clients
//! and checks (`rpcinfo -T udp`, a mount with `proto=udp`); the load goes
//! over TCP.
//!
//! Replies must fit in a datagram. RFC 1813 lets the server return less
//! than a READ's `count` and bounds READDIR and READDIRPLUS replies by the
//! client's `count`/`maxcount`; over UDP those counts (the call's last
//! word) are cut to [`UdpConfig::max_datagram`](connmux::udp::UdpConfig)
//! less [`REPLY_ROOM`] bytes before the call runs, so a READ comes back
//! short (not at its end: the client reads on) and a directory comes back
//! in more replies. A reply that is still too long (none of the
//! procedures' replies are, but for those three) is refused by the UDP
//! service and counted in `udp_refused_too_large`: the client retries and
//! then gives up with a timeout.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use bytes::BytesMut;
use connmux::service::{Handler, Verdict};
use connmux::{Bytes, PsockId};
use connmux_nfs::NFS_PROGRAM;
use connmux_oncrpc::reply::Reply;
use connmux_oncrpc::{CallHeader, Outcome, Registry};

use super::serve::NfsHandler;

/// Bytes kept for the RPC and NFS headers and attributes of a READ or
/// READDIR reply, beside its data.
pub const REPLY_ROOM: usize = 1024;

/// NFSv3 procedures whose reply is bounded by their last argument.
const READ: u32 = 6;
const READDIR: u32 = 16;
const READDIRPLUS: u32 = 17;

/// The NFS and MOUNT service for datagrams.
pub struct NfsUdp {
    registry: Registry,
    nfs: Arc<NfsHandler>,
    /// Largest count a READ or READDIR may ask for over UDP.
    max_count: u32,
}

impl NfsUdp {
    /// `max_datagram`: the UDP service's (replies longer are refused).
    /// Over the TCP handler's file-system side (its export and counters).
    pub fn new(nfs: Arc<NfsHandler>, max_datagram: usize) -> NfsUdp {
        let max_count = max_datagram.saturating_sub(REPLY_ROOM).max(512) as u32;
        NfsUdp { registry: super::serve::registry(), nfs, max_count }
    }

    fn answer(&self, dgram: &[u8], out: &mut BytesMut) -> bool {
        self.nfs.stats.calls.fetch_add(1, Relaxed);
        if let Some(r) = self.registry.null_fast_datagram(dgram) {
            out.extend_from_slice(&r);
            return true;
        }
        let decided = CallHeader::new_checked(dgram).ok().map(|c| {
            let served = matches!(self.registry.decide(&c, c.args().len()), Reply::ProcUnavail);
            (served, c.program().0 == NFS_PROGRAM && matches!(c.procedure(), READ | READDIR | READDIRPLUS))
        });
        match decided {
            // A procedure of a program and version served: run it here, as
            // a record (the pool's form), its count cut to fit.
            Some((true, bounded)) => {
                let mut record = Vec::with_capacity(4 + dgram.len());
                record.extend_from_slice(&(0x8000_0000u32 | dgram.len() as u32).to_be_bytes());
                record.extend_from_slice(dgram);
                if bounded && record.len() >= 8 {
                    let at = record.len() - 4;
                    let count = u32::from_be_bytes(record[at..].try_into().expect("4 bytes"));
                    record[at..].copy_from_slice(&count.min(self.max_count).to_be_bytes());
                }
                let reply = self.nfs.pool().server().answer(&record);
                if reply.len() < 4 {
                    self.nfs.stats.bad_calls.fetch_add(1, Relaxed);
                    return false;
                }
                out.extend_from_slice(&reply[4..]);
                true
            }
            // NULL, a refusal, or no call at all: the registry answers or
            // drops it (a record mark in a datagram is dropped).
            _ => {
                let mut v = Vec::new();
                match self.registry.handle_datagram(dgram, &mut v) {
                    Outcome::Replied { .. } => {
                        out.extend_from_slice(&v);
                        true
                    }
                    Outcome::CloseConnection(_) => {
                        self.nfs.stats.bad_calls.fetch_add(1, Relaxed);
                        false
                    }
                }
            }
        }
    }
}

impl Handler for NfsUdp {
    fn handle(&self, request: Bytes, _from: PsockId, scratch: &mut BytesMut) -> Verdict {
        match self.answer(&request, scratch) {
            true => Verdict::Reply(scratch.split().freeze()),
            false => Verdict::Close,
        }
    }
    fn handle_in_place(&self, request: &[u8], _from: PsockId, _scratch: &mut BytesMut, out: &mut BytesMut) -> Verdict {
        match self.answer(request, out) {
            true => Verdict::Appended,
            false => Verdict::Close,
        }
    }
}
