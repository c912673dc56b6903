//! connmux-sys: the system layer, and the only `unsafe` in connmux.
//!
//! Each module wraps one family of Linux system calls in safe functions that return
//! [`std::io::Result`]. Every `unsafe` block is a single call (or a single
//! pointer/layout fact) with a `// SAFETY:` line saying why it is sound.
//!
//! Map of the crate:
//! - [`epoll`]: readiness notification (`epoll_create1`/`epoll_ctl`/`epoll_wait`);
//! - [`eventfd`]: a counter fd used to wake a thread blocked in `epoll_wait`;
//! - [`poll`]: wait for one fd to become readable, with a timeout; whether a pipe's reader left;
//! - [`signal`]: block signals and take them synchronously (`sigtimedwait`), `kill`,
//!   dying of a signal's default action, reaping a child with its peak RSS (`wait4`);
//! - [`affinity`]: pin the calling thread to a CPU, list the CPUs we may run on
//!   and how long one has been idle;
//! - [`socket`]: reads, vectored non-blocking sends without `SIGPIPE`, socket options,
//!   the checks AF_KCM makes before attaching a TCP socket, aborting a connection;
//! - [`clock`]: `CLOCK_MONOTONIC` in nanoseconds;
//! - [`kcm`]: the kernel's AF_KCM (socket, attach/unattach/clone ioctls, `KCM_RECV_DISABLE`)
//!   and the message calls (`sendmsg`, `recvmsg`, `sendmmsg`, `recvmmsg`);
//! - [`udp`]: datagrams in batches on a UDP socket (`recvmmsg` with each source
//!   address, `sendmmsg` with each destination);
//! - [`uring`]: io_uring with a provided-buffer ring: multishot receives, sends, polls,
//!   cancellation, completions as a safe enum;
//! - [`bpf`]: the bpf(2) system call (program load, test run);
//! - `async_fd` (feature `tokio`): tokio's `AsyncFd` over an owned descriptor
//!   (its constructor is `unsafe`);
//! - [`malloc`]: glibc's `mallopt` thresholds and `malloc_trim`, and a global
//!   allocator counting large blocks in use, so freed buffers go back to the system;
//! - [`fileserver`]: what a file server needs: the descriptor limit raised, a thread's
//!   own file-system identity (`setfsuid`/`setfsgid`/per-thread groups), the user
//!   database, open-file-description byte-range locks.
//!
//! What it does **not** do: own any policy. It does not decide what to read, when to
//! retry or how to react to an error (beyond retrying `EINTR` where a call says so);
//! it keeps no state besides the fds it owns; it never spawns threads. It only
//! targets Linux.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod affinity;
#[cfg(feature = "tokio")]
pub mod async_fd;
pub mod bpf;
pub mod clock;
pub mod epoll;
pub mod eventfd;
pub mod fileserver;
pub mod kcm;
pub mod malloc;
pub mod poll;
pub mod signal;
pub mod socket;
pub mod udp;
pub mod uring;

mod util;
