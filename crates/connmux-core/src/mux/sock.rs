//! A KCM socket's state: its receive queue, its send side (the message being
//! built, complete messages not yet placed, the reservation), its options and
//! counters. Shared by every psock of the mux: the steering and placement that
//! move messages between sockets and psocks are the mux's (`super`).

use std::collections::VecDeque;

use bytes::{Bytes, BytesMut};

use super::{MuxConfig, PsockId, RxMsg, SockType};
use crate::stats::SockStats;

/// A KCM socket.
#[derive(Debug)]
pub(super) struct Sock {
    pub(super) ty: SockType,
    pub(super) rx_disabled: bool,
    pub(super) rcvbuf: usize,
    pub(super) sndbuf: usize,
    pub(super) rcvbuf_peak: usize,
    pub(super) sndbuf_peak: usize,
    pub(super) affinity: Option<u32>,
    /// Takes only the messages of psocks with its affinity tag: never chosen
    /// by round robin, spill-over or key hashing (`Mux::set_tag_only`).
    pub(super) tag_only: bool,
    /// Messages its reader takes are held until settled (`Mux::set_holds`).
    pub(super) holds: bool,
    // ---- receive ----
    pub(super) rx_queue: VecDeque<RxMsg>,
    /// Bytes of the receive queue not yet read (`sk_rmem_alloc`).
    pub(super) rx_mem: usize,
    /// On the mux's receive-waiter list (KCM `rx_wait`): able to take messages.
    pub(super) on_waiters: bool,
    // ---- transmit ----
    /// The message being built (DGRAM MORE / SEQPACKET without EOR: `seq_skb`).
    pub(super) open: Option<BytesMut>,
    /// Complete messages not yet handed to a psock (no psock, or MSG_BATCH).
    pub(super) tx_queue: VecDeque<Bytes>,
    /// Bytes charged to SO_SNDBUF: the open message plus every complete message
    /// not fully written (`sk_wmem_queued`).
    pub(super) tx_mem: usize,
    /// Complete messages not fully written (Send-Q).
    pub(super) tx_msgs: usize,
    /// The reserved psock (`tx_psock`).
    pub(super) tx_psock: Option<PsockId>,
    /// On the mux's transmit-waiter list (`tx_wait`).
    pub(super) tx_waiting: bool,
    /// A MSG_BATCH send is holding transmission (`tx_wait_more`).
    pub(super) wait_more: bool,
    /// A send got WouldBlock: raise SockWritable when space returns.
    pub(super) want_writable: bool,
    /// Largest message this socket has built (memory bound term).
    pub(super) tx_msg_peak: usize,
    /// Psocks whose PsockTransmit a MSG_BATCH addressed send deferred.
    pub(super) held_psocks: Vec<PsockId>,
    pub(super) stats: SockStats,
}

impl Sock {
    pub(super) fn new(ty: SockType, cfg: &MuxConfig) -> Sock {
        let rcvbuf = cfg.sock_rcvbuf.max(1);
        let sndbuf = cfg.sock_sndbuf.max(1);
        Sock {
            ty,
            rx_disabled: false,
            rcvbuf,
            sndbuf,
            rcvbuf_peak: rcvbuf,
            sndbuf_peak: sndbuf,
            affinity: None,
            tag_only: false,
            holds: false,
            rx_queue: VecDeque::new(),
            rx_mem: 0,
            on_waiters: false,
            open: None,
            tx_queue: VecDeque::new(),
            tx_mem: 0,
            tx_msgs: 0,
            tx_psock: None,
            tx_waiting: false,
            wait_more: false,
            want_writable: false,
            tx_msg_peak: 0,
            held_psocks: Vec::new(),
            stats: SockStats::default(),
        }
    }

    #[inline]
    pub(super) fn able(&self) -> bool {
        !self.rx_disabled && self.rx_mem < self.rcvbuf
    }

    /// `msgs` whole messages of `len` bytes in all taken from this socket
    /// for one psock: charged to its send buffer and counted as sent.
    #[inline]
    pub(super) fn charge(&mut self, len: usize, msgs: u32) {
        self.tx_mem += len;
        self.tx_msgs += msgs as usize;
        self.tx_msg_peak = self.tx_msg_peak.max(len);
        self.stats.tx_msgs += u64::from(msgs);
        self.stats.tx_bytes += len as u64;
    }
}
