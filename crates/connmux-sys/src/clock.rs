//! The monotonic clock, for the runtime's timestamps (the pure core never reads a
//! clock; the runtime reads this one and passes the time in).

/// `CLOCK_MONOTONIC` in nanoseconds: never goes backwards, not affected by changes of
/// the wall clock, counted from an unspecified start (boot), so only differences mean
/// something.
#[inline]
pub fn now_nanos() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: writes one timespec into a live local; CLOCK_MONOTONIC always exists on
    // Linux, so the call cannot fail (vDSO, no system call on the fast path).
    let r = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    debug_assert_eq!(r, 0);
    (ts.tv_sec as u64).wrapping_mul(1_000_000_000).wrapping_add(ts.tv_nsec as u64)
}

/// CPU time this thread has run, in nanoseconds (`CLOCK_THREAD_CPUTIME_ID`):
/// unlike [`now_nanos`], it does not advance while the thread is preempted
/// or asleep. A system call (no vDSO fast path): for occasional checks, not
/// per message.
pub fn thread_cpu_nanos() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: writes one timespec into a live local; the calling thread's CPU
    // clock always exists.
    let r = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    debug_assert_eq!(r, 0);
    (ts.tv_sec as u64).wrapping_mul(1_000_000_000).wrapping_add(ts.tv_nsec as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn thread_cpu_time_counts_running_not_sleeping() {
        let a = thread_cpu_nanos();
        std::thread::sleep(Duration::from_millis(30));
        let slept = thread_cpu_nanos() - a;
        assert!(slept < 10_000_000, "{slept} ns of CPU while asleep 30 ms");
        let b = thread_cpu_nanos();
        let t = Instant::now();
        while t.elapsed() < Duration::from_millis(30) {
            std::hint::spin_loop();
        }
        let spun = thread_cpu_nanos() - b;
        // At least part of 30 ms spinning is CPU time, even on a busy machine.
        assert!(spun > 1_000_000, "{spun} ns of CPU while spinning 30 ms");
    }

    #[test]
    fn advances_with_real_time_and_never_backwards() {
        let a = now_nanos();
        let t = Instant::now();
        std::thread::sleep(Duration::from_millis(20));
        let b = now_nanos();
        let real = t.elapsed().as_nanos() as u64;
        assert!(b >= a);
        // Both are CLOCK_MONOTONIC, so the differences agree closely.
        let diff = b - a;
        assert!(diff >= 20_000_000, "{diff}");
        assert!(diff.abs_diff(real) < 5_000_000, "clock {diff} vs Instant {real}");
        let mut last = now_nanos();
        for _ in 0..10_000 {
            let now = now_nanos();
            assert!(now >= last);
            last = now;
        }
    }
}
