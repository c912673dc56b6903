//! `/proc/net/kcm` (live muxes, sockets, psocks) and `/proc/net/kcm_stats`
//! (namespace totals), parsed into the core's statistics types.
//!
//! The kernel prints the MUX table's last three unattach values in the order
//! `psock_attach, psock_unattach_rsvd, psock_unattach` under the labels
//! `Attach Unattach UnattchRsvd` (kcm-semantics 4.2); [`parse_kcm_stats`] reads
//! them by position, so the fields come out right. `RX-Aborts` is always 0 there.

use connmux_core::stats::{MuxStats, PsockStats, SockStats};

/// One mux block of `/proc/net/kcm`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcMux {
    /// The mux line's counters (the kernel updates them lazily).
    pub rx_msgs: u64,
    pub rx_bytes: u64,
    pub tx_msgs: u64,
    pub tx_bytes: u64,
    pub kcms: usize,
    pub psocks: usize,
    /// `kcm-<index>` lines: index, counters, status words.
    pub socks: Vec<(u32, SockStats, String)>,
    /// `psock-<index>` lines: index, counters (rx/tx msgs and bytes), status words.
    pub psock_lines: Vec<(u32, PsockStats, String)>,
}

fn nums(fields: &[&str]) -> Vec<u64> {
    fields.iter().map(|f| f.parse().unwrap_or(0)).collect()
}

/// Parse `/proc/net/kcm`.
pub fn parse_kcm(text: &str) -> Vec<ProcMux> {
    let mut out: Vec<ProcMux> = Vec::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let Some(first) = f.first() else { continue };
        if *first == "mux" && f.len() >= 9 {
            let n = nums(&f[1..5]);
            // ... - - - - KCMs: N, Psocks M
            let rest = f[9..].join(" ");
            let grab = |key: &str| -> usize {
                rest.split(key)
                    .nth(1)
                    .and_then(|r| r.trim().split(|c: char| !c.is_ascii_digit()).next())
                    .and_then(|d| d.parse().ok())
                    .unwrap_or(0)
            };
            out.push(ProcMux {
                rx_msgs: n[0],
                rx_bytes: n[1],
                tx_msgs: n[2],
                tx_bytes: n[3],
                kcms: grab("KCMs:"),
                psocks: grab("Psocks"),
                ..Default::default()
            });
        } else if let (Some(idx), Some(m)) = (first.strip_prefix("kcm-"), out.last_mut()) {
            if f.len() < 9 {
                continue;
            }
            let n = nums(&f[1..8]);
            let s = SockStats {
                rx_msgs: n[0],
                rx_bytes: n[1],
                tx_msgs: n[2],
                tx_bytes: n[3],
                rx_queued: n[4] as usize,
                rx_mem: n[5] as usize,
                tx_queued: n[6] as usize,
                tx_mem: 0,
            };
            m.socks.push((idx.parse().unwrap_or(u32::MAX), s, f[9..].join(" ")));
        } else if let (Some(idx), Some(m)) = (first.strip_prefix("psock-"), out.last_mut()) {
            if f.len() < 9 {
                continue;
            }
            let n = nums(&f[1..5]);
            let p = PsockStats { rx_msgs: n[0], rx_bytes: n[1], tx_msgs: n[2], tx_bytes: n[3], ..Default::default() };
            m.psock_lines.push((idx.parse().unwrap_or(u32::MAX), p, f[9..].join(" ")));
        }
    }
    out
}

/// Parse `/proc/net/kcm_stats` into namespace-wide totals.
pub fn parse_kcm_stats(text: &str) -> Option<MuxStats> {
    let lines: Vec<&str> = text.lines().collect();
    let mux_at = lines.iter().position(|l| l.split_whitespace().next() == Some("MUX"))?;
    let psock_at = lines.iter().position(|l| l.split_whitespace().next() == Some("Psock"))?;
    let m = nums(&lines.get(mux_at + 1)?.split_whitespace().collect::<Vec<_>>());
    let p = nums(&lines.get(psock_at + 1)?.split_whitespace().collect::<Vec<_>>());
    if m.len() < 9 || p.len() < 15 {
        return None;
    }
    let psock = PsockStats {
        rx_msgs: p[0],
        rx_bytes: p[1],
        tx_msgs: p[2],
        tx_bytes: p[3],
        reserved: p[4],
        unreserved: p[5],
        rx_aborts: p[6],
        rx_interrupted: p[7],
        rx_unrecov_intr: p[8],
        rx_mem_fail: p[9],
        rx_need_more_hdr: p[10],
        rx_bad_hdr_len: p[11],
        rx_msg_too_big: p[12],
        rx_msg_timeouts: p[13],
        tx_aborts: p[14],
        tx_addressed_drops: 0,
        tx_backlog_refusals: 0,
    };
    Some(MuxStats {
        rx_msgs: m[0],
        rx_bytes: m[1],
        tx_msgs: m[2],
        tx_bytes: m[3],
        tx_retries: m[4],
        psock_attach: m[5],
        // Printed in this order under swapped labels.
        psock_unattach_rsvd: m[6],
        psock_unattach: m[7],
        rx_ready_drops: m[8],
        kcms: 0,
        psocks: 0,
        psock,
        // The kernel has no mux-wide budget, idle or handshake limits.
        ..MuxStats::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_kernel_layout() {
        let kcm = "*** KCM statistics (1 MUX) ****\n\
Object         RX-Msgs    RX-Bytes         TX-Msgs    TX-Bytes         Recv-Q   Rmem     Send-Q   Smem     Status\n\
mux            3          30               2          20               -        -        -        -        KCMs: 2, Psocks 1\n   \
kcm-0       3          30               1          10               0        0        0        -        RxWait \n   \
kcm-1       0          0                1          10               1        768      0        -        RxWait \n   \
psock-0     3          30               2          20               0        0        0        1        \n";
        let m = parse_kcm(kcm);
        assert_eq!(m.len(), 1);
        assert_eq!((m[0].kcms, m[0].psocks, m[0].rx_msgs, m[0].tx_bytes), (2, 1, 3, 20));
        assert_eq!(m[0].socks.len(), 2);
        assert_eq!(m[0].socks[1].0, 1);
        assert_eq!((m[0].socks[1].1.rx_queued, m[0].socks[1].1.rx_mem), (1, 768));
        assert_eq!(m[0].socks[0].2, "RxWait");
        assert_eq!(m[0].psock_lines[0].1.tx_msgs, 2);
        let stats = "MUX      RX-Msgs    RX-Bytes         TX-Msgs    TX-Bytes         TX-Retries Attach     Unattach   UnattchRsvd RX-RdyDrops\n\
         5          50               6          60               0          4          1          3          0         \n\
Psock    RX-Msgs    RX-Bytes         TX-Msgs    TX-Bytes         Reserved   Unreserved RX-Aborts  RX-Intr    RX-Unrecov RX-MemFail RX-NeedMor RX-BadLen  RX-TooBig  RX-Timeout TX-Aborts \n\
         5          50               6          60               6          6          0          1          0          0          2          0          1          0          0         \n";
        let s = parse_kcm_stats(stats).unwrap();
        assert_eq!((s.psock_attach, s.psock_unattach_rsvd, s.psock_unattach), (4, 1, 3));
        assert_eq!((s.psock.rx_interrupted, s.psock.rx_need_more_hdr, s.psock.rx_msg_too_big), (1, 2, 1));
    }
}
