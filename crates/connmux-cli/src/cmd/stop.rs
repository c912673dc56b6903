//! Stopping a server: SIGTERM, SIGINT and SIGHUP end it gracefully.
//!
//! The servers block these signals in `main`, before any thread starts (every
//! thread inherits the mask), and the main thread takes them with
//! `sigtimedwait` while it waits for `--duration` or the next statistics line:
//! no handler runs in signal context.
//!
//! On the first signal the server stops accepting, then waits for what is in
//! flight: it goes on once every connection has closed, or once no byte has
//! moved for [`QUIET`] (every request received has been answered and written,
//! as far as the peers read), or when the grace time is nearly over (the last
//! tenth of `--grace-ms`, at most 250 ms, is kept for the rest). Then it
//! prints its totals, removes its statistics socket, closes the connections
//! left and exits with status 0, within `--grace-ms` of the signal. A second signal
//! during the wait stops it at once: totals, statistics socket removed, exit
//! status 128 + the signal's number.
//!
//! SIGHUP is a stop like SIGTERM: the servers read no configuration file to
//! reload, and a server whose terminal went away should still leave its
//! totals and remove its socket.
//!
//! ```text
//!   Serving ──signal──> Draining ──closed / quiet / grace over──> Stopped (exit 0)
//!      │                    │
//!  --duration            signal
//!      │                    v
//!      v                 Forced (exit 128+sig, at once)
//!   Stopped (exit 0)
//! ```

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use connmux_sys::signal::{self, SigSet};

/// The signals that stop a server.
pub const STOP_SIGNALS: [i32; 3] = [libc::SIGTERM, libc::SIGINT, libc::SIGHUP];

/// How long no byte may move before the drain counts as finished.
pub const QUIET: Duration = Duration::from_millis(100);

/// How often the drain looks at the counters (a second signal is taken at once).
const TICK: Duration = Duration::from_millis(20);

/// The blocked set, once [`block`] succeeded.
static BLOCKED: OnceLock<SigSet> = OnceLock::new();

/// The server flags of a graceful stop.
#[derive(clap::Args, Debug, Clone)]
pub struct StopArgs {
    /// On SIGTERM, SIGINT or SIGHUP: stop accepting, wait for the
    /// connections to close or go quiet (every request answered), close the
    /// rest, print the totals, remove the statistics socket and exit 0, all
    /// within this many milliseconds. A second signal stops at once (exit
    /// 128+signal).
    #[arg(long, value_name = "MS", default_value_t = 5000)]
    pub grace_ms: u64,
}

/// Block [`STOP_SIGNALS`] in this thread, and so in every thread it spawns
/// afterwards: call it in `main` before anything starts a thread.
pub fn block() -> anyhow::Result<()> {
    let set = SigSet::new(&STOP_SIGNALS)?;
    signal::block(&set)?;
    let _ = BLOCKED.set(set);
    Ok(())
}

/// Sleep for `d`, or less when a stop signal comes: `Some(signo)`. Without
/// [`block`], a plain sleep.
pub fn pause(d: Duration) -> Option<i32> {
    match BLOCKED.get() {
        Some(set) => match signal::wait(set, d) {
            Ok(sig) => sig,
            Err(_) => {
                std::thread::sleep(d);
                None
            }
        },
        None => {
            std::thread::sleep(d);
            None
        }
    }
}

/// Why the server's wait ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ending {
    /// `--duration` passed.
    Duration,
    /// A stop signal came.
    Signal(i32),
}

/// What the drain sees of the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Progress {
    /// Connections still open.
    pub open: u64,
    /// A count that moves whenever a byte is read or written.
    pub moved: u64,
}

/// How a drain ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Drained {
    /// No drain: `--duration` ended the run.
    NotNeeded,
    AllClosed,
    /// Connections left, but nothing moved for [`QUIET`].
    Quiet {
        open: u64,
    },
    GraceOver {
        open: u64,
    },
    /// A second signal.
    Forced(i32),
}

impl Drained {
    /// The process's exit status.
    pub fn exit_code(self) -> i32 {
        match self {
            Drained::Forced(sig) => 128 + sig,
            _ => 0,
        }
    }
}

/// A stop under way: how the drain ended, and since when.
#[derive(Debug)]
pub struct Stop {
    pub how: Drained,
    what: String,
    /// When the first signal was taken.
    signalled: Option<(i32, Instant)>,
}

impl Stop {
    pub fn forced(&self) -> bool {
        matches!(self.how, Drained::Forced(_))
    }

    /// Say how long the stop took (after a signal) and give the exit status.
    pub fn finish(self) -> i32 {
        let code = self.how.exit_code();
        if let Some((sig, at)) = self.signalled {
            println!("{}: exit {code}, {} ms after {}", self.what, at.elapsed().as_millis(), name(sig));
        }
        flush();
        code
    }
}

/// The part of the grace time kept for closing, printing and removing the
/// socket after the drain.
fn reserve(grace: Duration) -> Duration {
    (grace / 10).min(Duration::from_millis(250))
}

/// The signal's name for messages.
pub fn name(sig: i32) -> &'static str {
    match sig {
        libc::SIGTERM => "SIGTERM",
        libc::SIGINT => "SIGINT",
        libc::SIGHUP => "SIGHUP",
        _ => "signal",
    }
}

/// After the wait ended with `ending`: for a signal, stop accepting and wait
/// (bounded by `args.grace_ms`) for what is in flight; says what it does on
/// standard output.
pub fn drain(
    what: &str,
    ending: Ending,
    args: &StopArgs,
    stop_accepting: impl FnOnce(),
    mut progress: impl FnMut() -> Progress,
) -> Stop {
    let Ending::Signal(sig) = ending else {
        return Stop { how: Drained::NotNeeded, what: what.into(), signalled: None };
    };
    let signalled = Some((sig, Instant::now()));
    let full = Duration::from_millis(args.grace_ms);
    let grace = full - reserve(full);
    println!(
        "{what}: {}: stopping (no new connections; up to {} ms for those open; a second signal stops at once)",
        name(sig),
        args.grace_ms
    );
    flush();
    stop_accepting();
    let start = Instant::now();
    let mut last = progress();
    let mut quiet_since = Instant::now();
    let end = loop {
        if last.open == 0 {
            break Drained::AllClosed;
        }
        if quiet_since.elapsed() >= QUIET {
            break Drained::Quiet { open: last.open };
        }
        let left = grace.saturating_sub(start.elapsed());
        if left.is_zero() {
            break Drained::GraceOver { open: last.open };
        }
        if let Some(sig) = pause(left.min(TICK)) {
            break Drained::Forced(sig);
        }
        let now = progress();
        if now.moved != last.moved {
            quiet_since = Instant::now();
        }
        last = now;
    };
    let how = match end {
        Drained::NotNeeded => String::new(),
        Drained::AllClosed => "every connection closed".into(),
        Drained::Quiet { open } => format!("quiet, {open} connection(s) left open are closed"),
        Drained::GraceOver { open } => {
            format!("grace time over, {open} connection(s) still busy are closed")
        }
        Drained::Forced(sig) => format!("{}: stopping at once", name(sig)),
    };
    println!("{what}: stopped after {} ms: {how}", start.elapsed().as_millis());
    Stop { how: end, what: what.into(), signalled }
}

/// Flush standard output (a script may wait for a line).
pub fn flush() {
    let _ = std::io::Write::flush(&mut std::io::stdout());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes() {
        assert_eq!(Drained::GraceOver { open: 3 }.exit_code(), 0);
        assert_eq!(Drained::Quiet { open: 1 }.exit_code(), 0);
        assert_eq!(Drained::Forced(libc::SIGTERM).exit_code(), 143);
    }

    #[test]
    fn no_drain_after_duration() {
        let args = StopArgs { grace_ms: 1000 };
        let mut stopped = false;
        let d = drain("t", Ending::Duration, &args, || stopped = true, || unreachable!());
        assert_eq!(d.how, Drained::NotNeeded);
        assert!(!stopped);
    }

    #[test]
    fn drain_ends_when_quiet_or_closed() {
        let args = StopArgs { grace_ms: 10_000 };
        let t = Instant::now();
        let d = drain("t", Ending::Signal(libc::SIGTERM), &args, || {}, || Progress { open: 2, moved: 7 });
        assert_eq!(d.how, Drained::Quiet { open: 2 });
        assert!(t.elapsed() < Duration::from_secs(5));
        let d = drain("t", Ending::Signal(libc::SIGTERM), &args, || {}, || Progress { open: 0, moved: 0 });
        assert_eq!(d.how, Drained::AllClosed);
    }

    #[test]
    fn drain_is_bounded_by_the_grace_time() {
        let args = StopArgs { grace_ms: 200 };
        let mut n = 0;
        let t = Instant::now();
        // Bytes keep moving: only the grace time ends it.
        let d = drain(
            "t",
            Ending::Signal(libc::SIGINT),
            &args,
            || {},
            || {
                n += 1;
                Progress { open: 1, moved: n }
            },
        );
        assert_eq!(d.how, Drained::GraceOver { open: 1 });
        // The last tenth is kept for what follows the drain.
        assert!(t.elapsed() >= Duration::from_millis(180), "{:?}", t.elapsed());
        assert_eq!(d.finish(), 0);
    }
}
