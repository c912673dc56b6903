//! Small helpers shared by the wrappers: turning C return values into `io::Result`.

use std::io;

/// Maps a `-1` return of a libc call to the thread's `errno`.
#[inline]
pub(crate) fn cvt(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// Like [`cvt`] for calls returning `ssize_t`; a successful value is never negative.
#[inline]
pub(crate) fn cvt_size(ret: libc::ssize_t) -> io::Result<usize> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret as usize)
    }
}

/// How many times a call interrupted by a signal is retried before `EINTR` is
/// returned: a signal storm must not pin a thread in a loop forever.
pub(crate) const EINTR_RETRIES: usize = 64;

/// Runs `f` again while it fails with `EINTR`, at most [`EINTR_RETRIES`] times.
#[inline]
pub(crate) fn retry_eintr<T>(mut f: impl FnMut() -> io::Result<T>) -> io::Result<T> {
    let mut tries = 0;
    loop {
        match f() {
            Err(e) if e.kind() == io::ErrorKind::Interrupted && tries < EINTR_RETRIES => {
                tries += 1;
            }
            other => return other,
        }
    }
}

/// Converts a timeout to whole milliseconds for `epoll_wait`, rounding up so that a
/// short non-zero timeout does not become a busy poll; `None` means wait forever (-1).
#[inline]
pub(crate) fn timeout_ms(timeout: Option<std::time::Duration>) -> libc::c_int {
    match timeout {
        None => -1,
        Some(d) => {
            // In u64 (`as_nanos` is a u128, and its division a library call
            // on every wait with a deadline).
            let ms = d.as_secs().saturating_mul(1000).saturating_add(u64::from(d.subsec_nanos().div_ceil(1_000_000)));
            ms.min(libc::c_int::MAX as u64) as libc::c_int
        }
    }
}

/// Sets this thread's `errno` to 0 (before a call whose error return is also
/// a valid value, such as `getpriority`).
pub(crate) fn clear_errno() {
    // SAFETY: __errno_location returns this thread's errno slot (glibc and musl).
    unsafe { *libc::__errno_location() = 0 };
}

/// This thread's `errno`.
pub(crate) fn errno() -> i32 {
    // SAFETY: __errno_location returns this thread's errno slot (glibc and musl).
    unsafe { *libc::__errno_location() }
}

#[cfg(test)]
mod tests {
    use super::timeout_ms;
    use std::time::Duration;

    #[test]
    fn timeouts_round_up_to_whole_milliseconds_and_saturate() {
        assert_eq!(timeout_ms(None), -1);
        assert_eq!(timeout_ms(Some(Duration::ZERO)), 0);
        assert_eq!(timeout_ms(Some(Duration::from_nanos(1))), 1);
        assert_eq!(timeout_ms(Some(Duration::from_millis(1))), 1);
        assert_eq!(timeout_ms(Some(Duration::from_nanos(1_000_001))), 2);
        assert_eq!(timeout_ms(Some(Duration::new(1, 999_999_999))), 2000);
        assert_eq!(timeout_ms(Some(Duration::from_secs(3_000_000))), libc::c_int::MAX);
        assert_eq!(timeout_ms(Some(Duration::MAX)), libc::c_int::MAX);
    }
}
