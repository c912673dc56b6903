//! A closed standard output (`connmux stat | head -1`) ends the command
//! quietly, as it ends `cat`: by `SIGPIPE`'s default action (a shell shows
//! status 141), with nothing on standard error.
//!
//! Rust's runtime ignores `SIGPIPE`, so a write to a pipe whose reader left
//! fails with `EPIPE`: `println!` panics, a `writeln!` returns the error.
//! Restoring `SIGPIPE`'s default for the whole process is not an option: the
//! servers and load generators write to sockets, where a reset peer must be
//! an error of that connection, not the end of the process. So both paths
//! check whether standard output (or error) really lost its reader, and only
//! then end the process by `SIGPIPE`.

use std::os::fd::AsRawFd;

/// Whether standard output or standard error lost its reader.
pub fn closed() -> bool {
    [std::io::stdout().as_raw_fd(), std::io::stderr().as_raw_fd()]
        .into_iter()
        .any(|fd| connmux_sys::poll::write_end_closed(fd).unwrap_or(false))
}

/// End the process as `SIGPIPE` would have.
pub fn die() -> ! {
    connmux_sys::signal::die_of(libc::SIGPIPE)
}

/// Whether `e` (or what caused it) is a broken pipe.
pub fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe))
}

/// Install a panic hook that ends the process quietly when a print to a
/// closed standard output (or error) panicked; any other panic is reported as
/// before. On the main thread the panic unwinds first, silently, so that
/// what the command started is stopped on the way out (a bench's servers
/// are child processes, killed when their handles drop; dying at once left
/// them running after `connmux bench uneven | head -1`): `main` then ends
/// the process ([`unwound`]).
pub fn install() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if printed_to_closed(info.payload()) {
            if std::thread::current().name() == Some("main") {
                return;
            }
            die();
        }
        default(info);
    }));
}

/// Whether a panic (its payload) is a print to a standard output (or error)
/// that lost its reader.
fn printed_to_closed(payload: &(dyn std::any::Any + Send)) -> bool {
    let msg = payload
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| payload.downcast_ref::<&str>().copied())
        .unwrap_or("");
    let printing = msg.starts_with("failed printing to stdout") || msg.starts_with("failed printing to stderr");
    printing && closed()
}

/// `main`, after the command panicked and unwound: a print to a closed
/// standard output ends the process as `SIGPIPE` would have; any other
/// panic goes on (already reported by the hook).
pub fn unwound(payload: Box<dyn std::any::Any + Send>) -> ! {
    if printed_to_closed(&*payload) {
        die();
    }
    std::panic::resume_unwind(payload)
}
