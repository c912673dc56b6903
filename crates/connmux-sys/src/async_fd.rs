//! tokio's readiness wrapper (`tokio::io::unix::AsyncFd`) over a descriptor
//! this process owns (feature `tokio`): its constructor is `unsafe` (the
//! descriptor must stay open and the same for the wrapper's life), which an
//! [`OwnedFd`] guarantees by its type.

use std::io;
use std::os::fd::OwnedFd;

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// Register `fd` with the current tokio runtime's reactor for `interest`.
/// Fails (rather than panics) outside a runtime, and when the reactor
/// refuses the descriptor (then `fd` is closed).
pub fn register(fd: OwnedFd, interest: Interest) -> io::Result<AsyncFd<OwnedFd>> {
    let handle = tokio::runtime::Handle::try_current().map_err(io::Error::other)?;
    let _enter = handle.enter();
    // SAFETY: an `OwnedFd` is an open descriptor that nothing else closes:
    // moved into the `AsyncFd`, it stays open and refers to the same file
    // description until the `AsyncFd` drops it or gives it back
    // (`into_inner`), and its `as_raw_fd` always returns that same number.
    let registered = unsafe { AsyncFd::register_with_interest(fd, interest) };
    registered.map_err(io::Error::from)
}
