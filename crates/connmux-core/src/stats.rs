//! Statistics named as in `/proc/net/kcm` and `/proc/net/kcm_stats`.
//!
//! Departures from the kernel's counters, on purpose: received bytes are
//! counted once (strparser can count a chunk twice); `tx_retries` survives
//! unattach and release (the kernel drops it when aggregating); `rx_aborts`
//! is set for a psock whose receive an error stopped (the kernel prints 0);
//! `tx_addressed_drops` is new (addressed messages dropped with their psock).
//! Mux totals are live sums, not the kernel's lagging copies.

/// Per-mux counters (`/proc/net/kcm_stats` MUX table) plus folded psock totals.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MuxStats {
    /// Messages completed by the psocks' stream parsers.
    pub rx_msgs: u64,
    /// Wire bytes of those messages, counted once.
    pub rx_bytes: u64,
    /// Messages fully handed to the connections.
    pub tx_msgs: u64,
    /// Bytes handed to the connections (including parts of aborted messages).
    pub tx_bytes: u64,
    /// Messages restarted whole on another psock after an abort.
    pub tx_retries: u64,
    pub psock_attach: u64,
    pub psock_unattach: u64,
    /// Unattaches of a psock reserved for transmit.
    pub psock_unattach_rsvd: u64,
    /// Parsed messages dropped at unattach (`ready_rx_msg`).
    pub rx_ready_drops: u64,
    /// Bytes the core holds now (`Mux::memory_used`), against `mem_limit`.
    pub mem_used: usize,
    /// The most the budget counted at any read so far (`mem_used` then;
    /// new): how far past `mem_limit` the readers still read took it (less
    /// than two reads of `MEM_FLOOR`, 16 KiB, a psock still read, in their
    /// allocation, plus what a driver holds below the parser).
    pub mem_peak: usize,
    /// Psocks paused because the mux was over its memory budget (new).
    pub mem_pauses: u64,
    /// Psocks aborted by the memory budget (`RxError::MemLimit`, new).
    pub mem_aborts: u64,
    /// Psocks closed by the idle timeout (new).
    pub idle_timeouts: u64,
    /// Psocks whose TLS handshake did not finish in time (new).
    pub handshake_timeouts: u64,
    /// Live KCM sockets.
    pub kcms: usize,
    /// Live psocks.
    pub psocks: usize,
    /// Aggregate psock counters (live + unattached).
    pub psock: PsockStats,
}

/// Per-KCM-socket counters (`/proc/net/kcm` kcm-N lines).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SockStats {
    /// Messages fully read (truncated DGRAM reads included).
    pub rx_msgs: u64,
    /// Bytes copied to the application.
    pub rx_bytes: u64,
    /// Messages completed (queued).
    pub tx_msgs: u64,
    /// Bytes taken from the application.
    pub tx_bytes: u64,
    /// Messages in the receive queue (Recv-Q).
    pub rx_queued: usize,
    /// Bytes in the receive queue (Rmem).
    pub rx_mem: usize,
    /// Complete messages not yet fully written (Send-Q).
    pub tx_queued: usize,
    /// Bytes charged to SO_SNDBUF: open message + unwritten messages.
    pub tx_mem: usize,
}

/// Per-psock counters (`/proc/net/kcm_stats` Psock table).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PsockStats {
    /// Complete messages (strparser `msgs`).
    pub rx_msgs: u64,
    /// Wire bytes of complete messages (strparser `bytes`, counted once).
    pub rx_bytes: u64,
    /// Messages fully written.
    pub tx_msgs: u64,
    /// Bytes written, including parts of messages later aborted.
    pub tx_bytes: u64,
    /// Times reserved for transmit by a socket.
    pub reserved: u64,
    /// Times released by a socket.
    pub unreserved: u64,
    /// 1 once an error stopped receive (RX-Aborts).
    pub rx_aborts: u64,
    /// Parser refusals (RX-Intr).
    pub rx_interrupted: u64,
    /// ESTRPIPE mid-message (RX-Unrecov).
    pub rx_unrecov_intr: u64,
    /// Allocation failures (RX-MemFail): always 0, allocation does not fail here.
    pub rx_mem_fail: u64,
    /// Parser "need more" answers (RX-NeedMor).
    pub rx_need_more_hdr: u64,
    /// EPROTO aborts (RX-BadLen).
    pub rx_bad_hdr_len: u64,
    /// EMSGSIZE aborts (RX-TooBig).
    pub rx_msg_too_big: u64,
    /// ETIMEDOUT aborts (RX-Timeout).
    pub rx_msg_timeouts: u64,
    /// Transmit aborts (TX-Aborts).
    pub tx_aborts: u64,
    /// Addressed messages dropped because their psock failed or was unattached.
    pub tx_addressed_drops: u64,
    /// Addressed sends refused because the psock's reply backlog was full
    /// (`MuxConfig::psock_sndbuf`): its peer does not read.
    pub tx_backlog_refusals: u64,
}
