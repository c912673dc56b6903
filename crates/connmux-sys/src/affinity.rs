//! CPU affinity: pin the calling thread to one CPU, and list the CPUs this process
//! may run on (which can be fewer than the machine has, under taskset or cgroups).

use std::io;

use crate::util::cvt;

/// CPUs that fit in a `cpu_set_t` (glibc's fixed 1024); higher numbers are refused.
const SET_SIZE: usize = libc::CPU_SETSIZE as usize;

/// Pins the calling thread to `cpu` (`sched_setaffinity(0, …)`). Fails with `EINVAL`
/// when `cpu` is not one this thread may use (see [`available_cpus`]).
pub fn pin_current_thread(cpu: usize) -> io::Result<()> {
    if cpu >= SET_SIZE {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: cpu_set_t is a plain bit array; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `cpu < CPU_SETSIZE` was checked above; CPU_SET only sets a bit in `set`.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: passes a live cpu_set_t and its exact size; pid 0 is the calling thread.
    cvt(unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) })?;
    Ok(())
}

/// Raises the calling thread's nice value by `delta` (lowers its priority),
/// up to 19: `setpriority(PRIO_PROCESS, tid, …)`, which on Linux sets one
/// thread. Returns the new value. A negative `delta` needs `CAP_SYS_NICE`.
pub fn renice_current_thread(delta: i32) -> io::Result<i32> {
    // SAFETY: gettid has no arguments and cannot fail.
    let tid = unsafe { libc::gettid() } as libc::id_t;
    // getpriority returns the nice value, and -1 both as a value and on error.
    crate::util::clear_errno();
    // SAFETY: plain integer arguments; `tid` is this thread's id.
    let now = unsafe { libc::getpriority(libc::PRIO_PROCESS, tid) };
    if now == -1 && crate::util::errno() != 0 {
        return Err(io::Error::last_os_error());
    }
    let nice = (now + delta).clamp(-20, 19);
    // SAFETY: plain integer arguments; `tid` is this thread's id.
    cvt(unsafe { libc::setpriority(libc::PRIO_PROCESS, tid, nice) })?;
    Ok(nice)
}

/// Moves the calling thread to `SCHED_IDLE` (`sched_setscheduler(0, …)`, one
/// thread on Linux): it runs only when its CPU has nothing else to run, and
/// any other thread that wakes there preempts it at once. Needs no privilege.
pub fn idle_current_thread() -> io::Result<()> {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: pid 0 is the calling thread; `param` is a live sched_param.
    cvt(unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) })?;
    Ok(())
}

/// `struct sched_attr` of `sched_setattr(2)` (the 56 bytes of its
/// `SCHED_ATTR_SIZE_VER1`; the kernel takes any size it knows).
#[repr(C)]
#[derive(Default)]
struct SchedAttr {
    size: u32,
    policy: u32,
    flags: u64,
    nice: i32,
    priority: u32,
    /// For `SCHED_OTHER` since Linux 6.12: the thread's own slice
    /// (clamped to 0.1–100 ms); 0: the kernel's default.
    runtime: u64,
    deadline: u64,
    period: u64,
    util_min: u32,
    util_max: u32,
}

/// The scheduling attributes of thread `tid` (0: the calling thread).
fn sched_attr(tid: libc::pid_t) -> io::Result<SchedAttr> {
    let mut attr = SchedAttr::default();
    let size = std::mem::size_of::<SchedAttr>() as libc::c_uint;
    // SAFETY: the kernel writes at most `size` bytes into `attr`, a live
    // `repr(C)` struct of that size.
    cvt(unsafe { libc::syscall(libc::SYS_sched_getattr, tid, &mut attr as *mut SchedAttr, size, 0) } as i32)?;
    Ok(attr)
}

/// The slice the scheduler gives thread `tid` (0: the calling thread): its
/// own ([`set_current_thread_slice`]) or the kernel's default (0.7 ms times
/// 1 + log2 of the CPUs, up to 8 of them); `None` where the kernel does not
/// say (before Linux 6.12, or a policy other than `SCHED_OTHER`/`SCHED_BATCH`).
pub fn thread_slice(tid: libc::pid_t) -> io::Result<Option<std::time::Duration>> {
    let attr = sched_attr(tid)?;
    let fair = attr.policy == libc::SCHED_OTHER as u32 || attr.policy == libc::SCHED_BATCH as u32;
    Ok((fair && attr.runtime > 0).then(|| std::time::Duration::from_nanos(attr.runtime)))
}

/// Asks the scheduler to run the calling thread in slices of `slice` (an
/// EEVDF thread's own slice, `sched_attr.sched_runtime` under
/// `SCHED_OTHER`: Linux 6.12 and later; the kernel clamps it to 0.1–100 ms).
/// Its policy and nice value stay; `Duration::ZERO` goes back to the
/// kernel's default. Returns the slice the kernel took ([`thread_slice`]):
/// `None` on a kernel that takes the call and ignores the value (older
/// ones). Needs no privilege.
pub fn set_current_thread_slice(slice: std::time::Duration) -> io::Result<Option<std::time::Duration>> {
    let mut attr = sched_attr(0)?;
    attr.size = std::mem::size_of::<SchedAttr>() as u32;
    attr.flags = 0;
    attr.runtime = u64::try_from(slice.as_nanos()).unwrap_or(u64::MAX);
    // SAFETY: `attr` is a live `repr(C)` sched_attr whose `size` says how
    // many bytes the kernel may read; tid 0 is the calling thread.
    cvt(unsafe { libc::syscall(libc::SYS_sched_setattr, 0, &attr as *const SchedAttr, 0) } as i32)?;
    thread_slice(0)
}

/// The CPU the calling thread runs on now (`sched_getcpu`); `None` where
/// the kernel cannot tell.
pub fn current_cpu() -> Option<usize> {
    // SAFETY: sched_getcpu takes no arguments; it returns -1 on failure.
    let cpu = unsafe { libc::sched_getcpu() };
    usize::try_from(cpu).ok()
}

/// The CPUs the calling thread may run on (`sched_getaffinity(0, …)`), ascending.
/// Call it before pinning anything: a pinned thread sees only its own CPU.
pub fn available_cpus() -> io::Result<Vec<usize>> {
    // SAFETY: cpu_set_t is a plain bit array; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: the kernel writes at most size_of::<cpu_set_t>() bytes into `set`.
    cvt(unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) })?;
    Ok((0..SET_SIZE)
        // SAFETY: `cpu < CPU_SETSIZE`; CPU_ISSET only reads a bit of `set`.
        .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
        .collect())
}

/// Time each of `cpus` has spent idle since boot (idle and waiting for
/// I/O, from one read of `/proc/stat`, in its `USER_HZ` ticks: 10 ms
/// steps), in nanoseconds; `None` for a CPU `/proc/stat` has no line for
/// (offline, or not in this machine).
pub fn cpus_idle_nanos(cpus: &[usize]) -> io::Result<Vec<Option<u64>>> {
    let stat = std::fs::read_to_string("/proc/stat")?;
    // SAFETY: sysconf takes a constant name and returns -1 when it has no value.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let hz = u64::try_from(hz).ok().filter(|&h| h > 0).unwrap_or(100);
    Ok(cpus.iter().map(|&c| parse_cpu_idle(&stat, c, hz)).collect())
}

/// The idle and I/O-wait ticks of `cpuN` in a `/proc/stat` text, in
/// nanoseconds at `hz` ticks a second.
fn parse_cpu_idle(stat: &str, cpu: usize, hz: u64) -> Option<u64> {
    let name = format!("cpu{cpu}");
    let line = stat.lines().find(|l| l.split_ascii_whitespace().next() == Some(name.as_str()))?;
    // Fields after the name: user nice system idle iowait irq softirq ...
    let mut f = line.split_ascii_whitespace().skip(1).map(|v| v.parse::<u64>().ok());
    let idle = f.nth(3)??;
    let iowait = f.next().flatten().unwrap_or(0);
    Some((idle + iowait).saturating_mul(1_000_000_000 / hz))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a kernel with slices of a thread's own, a thread gets the one it
    /// asks for (clamped), keeps its nice value, and another thread can
    /// read it; elsewhere the call is refused or ignored, never half done.
    #[test]
    fn a_thread_sets_its_own_slice() {
        let mine = thread_slice(0).unwrap();
        std::thread::spawn(move || {
            let _ = renice_current_thread(2);
            let nice = sched_attr(0).unwrap().nice;
            let tid = own_tid();
            match set_current_thread_slice(std::time::Duration::from_millis(7)) {
                Ok(Some(s)) => {
                    assert_eq!(s, std::time::Duration::from_millis(7));
                    assert_eq!(thread_slice(tid).unwrap(), Some(s), "read by its id");
                    // Clamped to at most 100 ms.
                    let s = set_current_thread_slice(std::time::Duration::from_secs(1)).unwrap();
                    assert_eq!(s, Some(std::time::Duration::from_millis(100)));
                    // Zero: the kernel's default again.
                    assert_eq!(set_current_thread_slice(std::time::Duration::ZERO).unwrap(), mine);
                }
                Ok(None) | Err(_) => assert_eq!(thread_slice(0).unwrap(), mine, "nothing taken"),
            }
            assert_eq!(sched_attr(0).unwrap().nice, nice, "the nice value stays");
        })
        .join()
        .unwrap();
        assert_eq!(thread_slice(0).unwrap(), mine, "another thread's slice is its own");
    }

    fn own_tid() -> libc::pid_t {
        std::fs::read_link("/proc/thread-self").unwrap().file_name().unwrap().to_str().unwrap().parse().unwrap()
    }

    #[test]
    fn reads_a_cpus_idle_time_from_proc_stat() {
        let stat = "cpu  10 0 20 900 5 0 0 0 0 0\ncpu0 4 0 8 450 2 0 0 0 0 0\ncpu1 6 0 12 450 3 0 0 0 0 0\nintr 1 2\n";
        assert_eq!(parse_cpu_idle(stat, 0, 100), Some(452 * 10_000_000));
        assert_eq!(parse_cpu_idle(stat, 1, 100), Some(453 * 10_000_000));
        assert_eq!(parse_cpu_idle(stat, 2, 100), None, "no such CPU");
        assert_eq!(parse_cpu_idle("cpu0 1 2\n", 0, 100), None, "a short line");
        // This machine's own: every CPU we may run on has a line, and its
        // idle time does not go back.
        let cpus = available_cpus().unwrap();
        let a = cpus_idle_nanos(&cpus).unwrap();
        let b = cpus_idle_nanos(&cpus).unwrap();
        assert!(a.iter().all(Option::is_some), "{a:?}");
        assert!(a.iter().zip(&b).all(|(a, b)| b >= a));
        assert_eq!(cpus_idle_nanos(&[SET_SIZE]).unwrap(), vec![None]);
    }

    #[test]
    fn pins_a_thread_to_each_available_cpu() {
        let cpus = available_cpus().unwrap();
        assert!(!cpus.is_empty());
        assert!(cpus.windows(2).all(|w| w[0] < w[1]));
        for &cpu in &cpus {
            // A fresh thread, so the test thread keeps its own affinity.
            let (mask, running_on) = std::thread::spawn(move || {
                pin_current_thread(cpu).unwrap();
                (available_cpus().unwrap(), current_cpu())
            })
            .join()
            .unwrap();
            assert_eq!(mask, vec![cpu]);
            assert_eq!(running_on, Some(cpu));
        }
    }

    #[test]
    fn refuses_cpus_out_of_range() {
        let err = pin_current_thread(SET_SIZE).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EINVAL));
        // A CPU number inside the set size that we may not use: the kernel says EINVAL
        // (and the thread keeps its old affinity).
        let last = SET_SIZE - 1;
        if !available_cpus().unwrap().contains(&last) {
            let (err, after) =
                std::thread::spawn(move || (pin_current_thread(last).unwrap_err(), available_cpus().unwrap()))
                    .join()
                    .unwrap();
            assert_eq!(err.raw_os_error(), Some(libc::EINVAL));
            assert_eq!(after, available_cpus().unwrap());
        }
    }

    /// The thread's own nice value, read from /proc (not through the call
    /// under test).
    fn proc_nice() -> i32 {
        // SAFETY: gettid has no arguments and cannot fail.
        let tid = unsafe { libc::gettid() };
        let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).unwrap();
        // Field 19 is the nice value; fields after the ")" of the name start at 3.
        let after = &stat[stat.rfind(')').unwrap() + 2..];
        after.split_whitespace().nth(16).unwrap().parse().unwrap()
    }

    #[test]
    fn renices_only_the_calling_thread() {
        let before = proc_nice();
        let (got, seen) = std::thread::spawn(move || {
            let got = renice_current_thread(3).unwrap();
            (got, proc_nice())
        })
        .join()
        .unwrap();
        assert_eq!(got, (before + 3).min(19));
        assert_eq!(seen, got);
        assert_eq!(proc_nice(), before, "the calling thread only");
        // Clamped at 19.
        let top = std::thread::spawn(|| renice_current_thread(100).unwrap()).join().unwrap();
        assert_eq!(top, 19);
    }

    #[test]
    fn idles_only_the_calling_thread() {
        // SAFETY: pid 0 is the calling thread.
        let policy = || unsafe { libc::sched_getscheduler(0) };
        let before = policy();
        let inside = std::thread::spawn(move || {
            idle_current_thread().unwrap();
            policy()
        })
        .join()
        .unwrap();
        assert_eq!(inside, libc::SCHED_IDLE);
        assert_eq!(policy(), before);
    }
}
