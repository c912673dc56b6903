//! The worker threads: one loop ([`worker`]), which owns the order of a
//! pass, over a small driver interface (`worker::Io`) that epoll ([`epoll`])
//! and io_uring ([`uring`]) implement; each worker owns the psocks attached
//! to it. This file holds what both use at start (where workers are pinned,
//! the waker's token).
//!
//! Must not name the public `Mux`, `KcmSocket`, `tls` or `service`: the mux
//! starts the drivers, not the other way round.

pub(crate) mod epoll;
pub(crate) mod uring;
pub(crate) mod worker;

use crate::config::Placement;

pub(crate) const WAKER_TOKEN: u64 = u64::MAX;
pub(crate) const SERVE_TOKEN: u64 = u64::MAX - 1;

/// The longest a worker sleeps while a readiness it must wake for (its
/// waker's, its serving socket's) could not be watched: workers with
/// nothing due sleep with no timer (`worker::wait_timeout`), so an unwatched
/// one would otherwise be slept through.
pub(crate) fn unwatched_wait(timeout: Option<std::time::Duration>) -> Option<std::time::Duration> {
    const UNWATCHED_WAIT: std::time::Duration = std::time::Duration::from_millis(1);
    Some(timeout.map_or(UNWATCHED_WAIT, |t| t.min(UNWATCHED_WAIT)))
}

pub(crate) fn cpus_for(placement: &Placement, workers: usize) -> Vec<Option<usize>> {
    match placement {
        Placement::Unpinned => vec![None; workers],
        Placement::Cpus(list) if !list.is_empty() => (0..workers).map(|i| Some(list[i % list.len()])).collect(),
        _ => {
            let avail = connmux_sys::affinity::available_cpus().unwrap_or_default();
            if avail.is_empty() {
                vec![None; workers]
            } else {
                (0..workers).map(|i| Some(avail[i % avail.len()])).collect()
            }
        }
    }
}
