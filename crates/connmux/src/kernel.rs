//! The kernel backend behind [`crate::Mux`] and [`crate::KcmSocket`]: the calls
//! go to `connmux-kernel` (AF_KCM), and a small thread turns the errors the
//! kernel posts on attached TCP sockets into the same [`PsockEvent`]s the
//! userspace runtime sends. See [`crate::Backend`] for what each call does.
//!
//! Owns the AF_KCM mux and its event thread. Must not name the userspace
//! runtime (`shared` only for the `PsockEvent` both backends report), the
//! public `Mux` or `KcmSocket`: they choose the backend and call in here.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use connmux_core::mux::PsockId;
use connmux_kernel::{KernelError, KernelMux, KernelParser, Limits};

use crate::config::Config;
use crate::shared::PsockEvent;

/// What a receive on the kernel backend reports as the message's psock: the
/// kernel does not say which connection a message came from.
pub const UNKNOWN_PSOCK: PsockId = PsockId { index: u32::MAX, generation: u32::MAX };

/// How often the error thread looks at its stop flag while no error arrives.
const EVENT_POLL: Duration = Duration::from_millis(50);

/// Why a backend refused a call. It travels inside an `io::Error` (kind
/// `Unsupported`, or `InvalidInput` for a parser program that does not load);
/// [`BackendError::of`] gets it back.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// `Backend::Kernel` where an AF_KCM socket cannot be created.
    #[error("Backend::Kernel: AF_KCM is not available on this kernel ({0}); use Backend::Userspace or Backend::Auto")]
    KernelUnavailable(io::Error),
    /// A call the kernel backend cannot do with the same meaning.
    #[error("{call} is not supported on the kernel backend: {reason}")]
    Unsupported { call: &'static str, reason: &'static str },
    /// A parser the kernel backend cannot attach (no kernel form, or a
    /// program that is not offset-safe or does not load).
    #[error("cannot attach parser {parser:?} on the kernel backend: {}", parser_reason(source))]
    Parser {
        parser: String,
        #[source]
        source: KernelError,
    },
}

fn parser_reason(e: &KernelError) -> String {
    match e {
        KernelError::UnsupportedParser(_) => {
            "it has no kernel program: only the length-field parsers (l4, len:…, 9p, thrift, kafka) \
             and BPF programs (Mux::attach_bpf) do; use Backend::Userspace"
                .to_owned()
        }
        other => other.to_string(),
    }
}

impl BackendError {
    /// The `BackendError` inside an `io::Error` returned by connmux, if any.
    pub fn of(e: &io::Error) -> Option<&BackendError> {
        e.get_ref().and_then(|r| r.downcast_ref::<BackendError>())
    }
}

pub(crate) fn unsupported(call: &'static str, reason: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::Unsupported, BackendError::Unsupported { call, reason })
}

/// AF_KCM cannot say which connection a message came from, or send on one.
pub(crate) const NO_ADDRESS: &str =
    "AF_KCM does not say which connection a message came from, nor send on a chosen one (use recv/send, or Backend::Userspace)";

pub(crate) fn parser_error(parser: String, source: KernelError) -> io::Error {
    let kind = match source {
        KernelError::Program(_) | KernelError::Load(_) => io::ErrorKind::InvalidInput,
        _ => io::ErrorKind::Unsupported,
    };
    io::Error::new(kind, BackendError::Parser { parser, source })
}

/// The kernel form of a parser named `name` (a built-in spec), checked
/// before anything is created; a refusal names the parser.
pub(crate) fn kernel_parser_for(name: &str) -> io::Result<KernelParser> {
    match connmux_kernel::prog::FieldSpec::from_spec(name) {
        Ok(_) => Ok(KernelParser::spec(name)),
        Err(KernelError::Spec(_)) => {
            Err(parser_error(name.to_owned(), KernelError::UnsupportedParser(name.to_owned())))
        }
        Err(e) => Err(parser_error(name.to_owned(), e)),
    }
}

/// Check that a BPF program can be rewritten for the kernel (no map is
/// needed to find out: its fd is only an immediate in the code).
pub(crate) fn check_program(p: &KernelParser, name: &str) -> io::Result<()> {
    p.program(-1).map(drop).map_err(|e| parser_error(name.to_owned(), e))
}

/// A kernel mux and its error thread.
pub(crate) struct KMux {
    pub k: KernelMux,
    pub events_rx: crate::events::Events,
    pub dropped: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl KMux {
    /// `Ok(Err(why))` where AF_KCM cannot be created (the caller decides).
    pub fn new(config: &Config) -> io::Result<Result<KMux, io::Error>> {
        let limits =
            Limits { max_msg_size: Some(config.core.max_msg_size), assembly_timeout: config.core.assembly_timeout };
        let k = match KernelMux::with_limits(limits) {
            Ok(k) => k,
            Err(KernelError::Unsupported(e)) => return Ok(Err(e)),
            Err(e) => return Err(e.into()),
        };
        let (tx, events_rx) = crate::events::Events::bounded(config.event_queue);
        let stop = Arc::new(AtomicBool::new(false));
        let dropped = Arc::new(AtomicU64::new(0));
        let thread = {
            let (k, stop, dropped) = (k.clone(), stop.clone(), dropped.clone());
            std::thread::Builder::new().name("connmux-kerr".into()).spawn(move || {
                // Bounded by the stop flag, looked at every EVENT_POLL.
                while !stop.load(Ordering::Acquire) {
                    match k.wait_events(EVENT_POLL) {
                        Ok(evs) => {
                            for ev in evs {
                                if tx.try_send(PsockEvent { psock: ev.psock, error: ev.error }).is_err() {
                                    dropped.fetch_add(1, Ordering::Relaxed);
                                }
                            }
                        }
                        Err(_) => std::thread::sleep(EVENT_POLL),
                    }
                }
            })?
        };
        Ok(Ok(KMux { k, events_rx, dropped, stop, thread: Some(thread) }))
    }
}

impl Drop for KMux {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
