//! Side by side: one receive workload through the userspace engine and
//! through the kernel's KCM, alternated in one run, medians and ratios.
//!
//! Workload: a peer thread writes N messages of 64 bytes (4-byte length + a
//! 60-byte body carrying a sequence number), 64 messages per write; the
//! endpoint receives them one `recv` at a time and checks the sequence.
//! Figures are messages per second; under an emulated VM only the ratio
//! means anything.

use std::io::Write;
use std::os::fd::{AsFd, AsRawFd};
use std::time::{Duration, Instant};

use connmux::SockType;

use crate::backend::{new_mux, tcp_pair, Kind, Opts};

const MSG: usize = 64;
const PER_WRITE: usize = 64;

fn one(kind: Kind, n: usize) -> Result<f64, String> {
    let m = new_mux(kind, Opts::default()).map_err(|e| e.to_string())?;
    let s = m.socket(SockType::Dgram).map_err(|e| e.to_string())?;
    s.set_timeout(Some(Duration::from_secs(5))).map_err(|e| e.to_string())?;
    if let Some(fd) = s.raw() {
        // A KCM message is charged a whole skb (docs/kcmvm.md, "Receive buffers"): a big buffer.
        let _ = connmux_sys::socket::setsockopt_int(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, 64 << 20);
    }
    let (mut peer, low) = tcp_pair().map_err(|e| e.to_string())?;
    m.attach(low.as_fd(), "l4").map_err(|e| e.to_string())?;
    let writer = std::thread::spawn(move || {
        let mut buf = vec![0u8; MSG * PER_WRITE];
        let mut seq = 0u64;
        while (seq as usize) < n {
            let k = PER_WRITE.min(n - seq as usize);
            for i in 0..k {
                let at = i * MSG;
                buf[at..at + 4].copy_from_slice(&((MSG - 4) as u32).to_be_bytes());
                buf[at + 4..at + 12].copy_from_slice(&(seq + i as u64).to_le_bytes());
            }
            if peer.write_all(&buf[..k * MSG]).is_err() {
                break;
            }
            seq += k as u64;
        }
        peer
    });
    let t = Instant::now();
    let mut buf = [0u8; 256];
    let mut bad = 0;
    for i in 0..n {
        let g = s.recv(&mut buf, false).map_err(|e| format!("recv {i}: {e}"))?;
        if g.len != MSG || buf[4..12] != (i as u64).to_le_bytes() {
            bad += 1;
        }
    }
    let secs = t.elapsed().as_secs_f64();
    let _peer = writer.join().map_err(|_| "writer panicked")?;
    if bad > 0 {
        return Err(format!("{bad} messages out of sequence"));
    }
    Ok(n as f64 / secs)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Returns the exit status.
pub fn run(n: usize, reps: usize) -> i32 {
    let kernel = connmux_kernel::KernelMux::supported();
    println!("BENCH n={n} msg={MSG}B per_write={PER_WRITE} reps={reps} kernel_kcm={kernel}");
    let kinds: Vec<Kind> = if kernel { vec![Kind::User, Kind::Kernel] } else { vec![Kind::User] };
    let mut res: Vec<Vec<f64>> = vec![Vec::new(); kinds.len()];
    for r in 0..reps.max(1) {
        for (i, k) in kinds.iter().enumerate() {
            match one(*k, n) {
                Ok(rate) => {
                    println!("BENCH rep={} backend={:<9} rate={:.0} msg/s", r + 1, k.name(), rate);
                    res[i].push(rate);
                }
                Err(e) => {
                    println!("BENCH rep={} backend={} FAILED: {e}", r + 1, k.name());
                    return 1;
                }
            }
        }
    }
    let meds: Vec<f64> = res.iter_mut().map(|v| median(v)).collect();
    for (k, m) in kinds.iter().zip(&meds) {
        println!("BENCH median backend={:<9} {:.0} msg/s", k.name(), m);
    }
    if meds.len() == 2 {
        println!("BENCH ratio userspace/kernel = {:.2}", meds[0] / meds[1]);
    }
    0
}
