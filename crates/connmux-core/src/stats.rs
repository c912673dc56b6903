//! Statistics named as in `/proc/net/kcm` and `/proc/net/kcm_stats`.
//! (Being filled in with the mux; field names follow the kernel's.)

/// Per-mux counters (`/proc/net/kcm_stats` MUX table) plus folded psock totals.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MuxStats {
    pub rx_msgs: u64,
    pub rx_bytes: u64,
    pub tx_msgs: u64,
    pub tx_bytes: u64,
    pub tx_retries: u64,
    pub psock_attach: u64,
    pub psock_unattach: u64,
    pub psock_unattach_rsvd: u64,
    pub rx_ready_drops: u64,
    pub kcms: usize,
    pub psocks: usize,
    /// Aggregate psock counters (live + unattached).
    pub psock: PsockStats,
}

/// Per-KCM-socket counters (`/proc/net/kcm` kcm-N lines).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SockStats {
    pub rx_msgs: u64,
    pub rx_bytes: u64,
    pub tx_msgs: u64,
    pub tx_bytes: u64,
    pub rx_queued: usize,
    pub rx_mem: usize,
    pub tx_queued: usize,
}

/// Per-psock counters (`/proc/net/kcm_stats` Psock table).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PsockStats {
    pub rx_msgs: u64,
    pub rx_bytes: u64,
    pub tx_msgs: u64,
    pub tx_bytes: u64,
    pub reserved: u64,
    pub unreserved: u64,
    pub rx_aborts: u64,
    pub rx_interrupted: u64,
    pub rx_unrecov_intr: u64,
    pub rx_mem_fail: u64,
    pub rx_need_more_hdr: u64,
    pub rx_bad_hdr_len: u64,
    pub rx_msg_too_big: u64,
    pub rx_msg_timeouts: u64,
    pub tx_aborts: u64,
}
