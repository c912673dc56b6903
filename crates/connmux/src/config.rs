//! The one configuration struct: every limit with its default and the AF_KCM knob
//! it stands for lives in [`connmux_core::mux::MuxConfig`]; this adds the threads.

use connmux_core::mux::MuxConfig;

/// Where worker threads run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Worker `i` is pinned to the `i`-th CPU this process may use (wrapping).
    Pinned,
    /// Worker `i` is pinned to `cpus[i % cpus.len()]`.
    Cpus(Vec<usize>),
    /// No pinning: the scheduler decides.
    Unpinned,
}

/// The I/O driver of the worker threads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Driver {
    /// io_uring where it works here (`connmux_sys::uring::supported()` and a
    /// worker's ring can be created), else epoll.
    #[default]
    Auto,
    /// Readiness with epoll, `read`/`writev` per connection.
    Epoll,
    /// io_uring: multishot receives into provided buffers, one `sendmsg` per
    /// connection per pass; `Mux::new` fails if io_uring is unavailable.
    Uring,
}

/// Which implementation of KCM a [`crate::Mux`] runs on.
///
/// - **`Userspace`** (the default): connmux's own runtime: worker threads read
///   the attached connections, the core parses from each message's start.
///   Works on any Linux.
/// - **`Kernel`**: Linux's AF_KCM (`connmux-kernel`): a [`crate::KcmSocket`] is
///   an AF_KCM socket, an attach loads a BPF parser program into the kernel and
///   calls `SIOCKCMATTACH`; no worker threads. [`crate::Mux::new`] fails with
///   an [`std::io::ErrorKind::Unsupported`] error holding
///   [`crate::BackendError::KernelUnavailable`] where AF_KCM cannot be created.
/// - **`Auto`**: `Kernel` where an AF_KCM socket can be created, else
///   `Userspace`; [`crate::Mux::backend`] says which was chosen.
///   It does not check that this process may load BPF programs (`CAP_BPF`,
///   or `CAP_SYS_ADMIN`); without that, an attach on the kernel backend
///   fails with `EPERM`.
///
/// The default is `Userspace`, not `Auto`: the userspace backend does every
/// call below, so a program written against it behaves the same on every
/// kernel. With `Auto` the same program would lose the addressed calls where
/// the kernel has AF_KCM and keep them where it has not. Choose `Auto` (or
/// `Kernel`) knowing the table.
///
/// # What each call does on the kernel backend
///
/// "same": the call has the same meaning on both backends (the kernel's own
/// behaviour, as `docs/kcm-compat.md` records it, applies). A refusal is an
/// `io::Error` of kind `Unsupported` holding a [`crate::BackendError`]
/// ([`crate::BackendError::of`] gets it back).
///
/// | call | kernel backend |
/// |---|---|
/// | `Mux::new`, `socket`, `KcmSocket::try_clone` | same (`socket(AF_KCM)`, `SIOCKCMCLONE`); one kernel mux has one socket type: asking for the other is `InvalidInput` |
/// | `Mux::attach`, `attach_on`, `KcmSocket::attach` | same for the length-field parsers (`l4`, `len:…`, `9p`, `thrift`, `kafka`): an offset-correct BPF program is generated; others are refused, naming the parser (`BackendError::Parser`); the worker of `attach_on` is ignored |
/// | `Mux::attach_bpf` | same: the program is rewritten to read from the message start, or refused (`BackendError::Parser`) when that cannot be done |
/// | `Mux::attach_with` | as `attach`, with `AttachOptions::parser`; options that set a per-connection size limit or assembly timeout are refused (`BackendError::Unsupported`): the mux's apply |
/// | `unattach`, `unattach_id`, `abort` | same (`SIOCKCMUNATTACH`; abort also resets the connection) |
/// | `events`, `psock_error`, `events_dropped` | same: the error the kernel posts on the TCP socket, as the same [`crate::PsockError`] kinds (values the kernel does not report, such as a refused length, are 0) |
/// | `psocks`, `psock_stats` | same (`/proc/net/kcm`; the receive-abort counters come from the error posted) |
/// | `stats` | the network namespace's totals (`/proc/net/kcm_stats`: the kernel keeps no per-mux counters), with this mux's socket and psock counts |
/// | `proc_kcm` | the kernel's `/proc/net/kcm` |
/// | `workers` | 0 (no worker threads); `driver` is `Driver::Auto` |
/// | `serve` | refused (`BackendError::Unsupported`): no workers to serve on |
/// | `recv`, `recv_flags` (PEEK), `send`, `send_flags` (MORE, EOR, BATCH), `send_batch` | same (`recvmsg`, `sendmsg`, `sendmmsg`); `RecvInfo::psock` is [`crate::UNKNOWN_PSOCK`] |
/// | `recv_msg`, `recv_from`, `recv_batch`, `send_to`, `send_msg` to a psock | refused (`BackendError::Unsupported`): AF_KCM does not say which connection a message came from, nor take one to send on; `send_msg(msg, None)` is a send |
/// | `set_nonblocking`, `set_read_timeout`, `set_write_timeout`, `set_recv_disable`, `recv_disabled`, `set_rcvbuf`, `set_sndbuf` | same (`MSG_DONTWAIT`, `SO_RCVTIMEO`, `SO_SNDTIMEO`, `KCM_RECV_DISABLE`, `SO_RCVBUF`, `SO_SNDBUF`: the kernel doubles the buffer sizes) |
/// | `set_affinity` | refused (`BackendError::Unsupported`): the kernel steers messages itself |
/// | `KcmSocket::stats`, `queued` | same (the socket's `/proc/net/kcm` line) |
/// | `KcmSocket::as_raw_fd` | the AF_KCM socket itself (readable while a message is queued) |
///
/// `Config` on the kernel backend: `core.max_msg_size` and
/// `core.assembly_timeout` apply (the parser program refuses longer messages
/// with EMSGSIZE; the timeout becomes the TCP socket's SO_RCVTIMEO, strparser's
/// timer); the kernel also refuses a message above the TCP socket's SO_RCVBUF.
/// The other core limits, steering, workers, placement, read chunk and driver
/// belong to the userspace runtime and are not used.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Backend {
    /// connmux's own runtime (any Linux).
    #[default]
    Userspace,
    /// Linux's AF_KCM; [`crate::Mux::new`] fails where it cannot be created.
    Kernel,
    /// `Kernel` where AF_KCM can be created, else `Userspace`.
    Auto,
}

/// Mux configuration.
#[derive(Clone, Debug)]
pub struct Config {
    /// Limits and steering of the core (sizes, deadlines, queue bounds).
    pub core: MuxConfig,
    /// I/O worker threads (each owns the psocks attached to it). Default 1.
    pub workers: usize,
    /// CPU placement of the workers. Default `Pinned`.
    pub placement: Placement,
    /// Bytes read from a connection per read call (also the per-worker read
    /// buffer). Default 64 KiB.
    pub read_chunk: usize,
    /// Capacity of the psock error/event queue given by [`crate::Mux::events`];
    /// events beyond it are counted and dropped. Default 4096.
    pub event_queue: usize,
    /// The I/O driver. Default `Auto`; [`crate::Mux::driver`] says which one runs.
    pub driver: Driver,
    /// Userspace runtime or the kernel's AF_KCM. Default `Userspace`;
    /// [`crate::Mux::backend`] says which one runs.
    pub backend: Backend,
    /// [`crate::Mux::attach`] gives a connection to the worker pinned on the
    /// CPU where the kernel processes its packets (`SO_INCOMING_CPU`), so that
    /// reading a request and waking for the next one never cross CPUs (on a
    /// small virtual machine a cross-CPU wake-up costs more than a NULL RPC).
    /// That worker is passed over for the one with the fewest connections
    /// when it already holds more than twice as many plus 8 (all clients on
    /// one CPU still spread). With `false`, or when no worker is pinned on
    /// that CPU, connections go to the workers in turn. Default `true`.
    pub incoming_cpu: bool,
    /// How long a blocking receive on a [`crate::KcmSocket`] whose queue is
    /// empty keeps looking (yielding the CPU between looks) before it sleeps
    /// on the socket's readiness. A message that arrives meanwhile is taken
    /// without a wake-up, which on a virtual machine costs more than a short
    /// request when it crosses CPUs (`docs/performance.md`); on the worker's own CPU the yield lets the worker run.
    /// Costs at most this much CPU per receive that finds nothing.
    /// `Duration::ZERO` sleeps at once. Default 50 µs.
    pub recv_spin: std::time::Duration,
    /// How much lower than its worker a heavy lane's thread runs, in nice
    /// steps (see [`crate::Mux::serve`]): a connection whose requests run
    /// long is answered by its worker's lane, and when the lane and the
    /// worker both want the CPU the kernel gives the worker's light requests
    /// the larger share. At 3 the lane gets about a third of a contended CPU
    /// (all of an idle one); 0 shares it evenly. Raising a thread's nice
    /// value (lowering its priority) needs no privilege; a negative value
    /// needs `CAP_SYS_NICE` and is left at the worker's without it. Default 3.
    pub lane_nice: i32,
    /// Whether a heavy connection's replies keep its requests' order.
    /// `false` (the default) starts a helper on every worker's CPU, which
    /// runs only in that CPU's spare time (`SCHED_IDLE`) and takes
    /// messages from the other workers' heavy lanes, so the requests of one
    /// heavy connection are answered on every CPU at once, and its replies
    /// may leave in another order than its requests came (as under KCM;
    /// protocols that match replies by tag or xid, such as ONC RPC and 9P,
    /// need no order). `true` starts no helpers: each lane has one thread,
    /// which answers its heavy connections in order, so a heavy connection
    /// is answered on one CPU.
    pub lane_in_order: bool,
    /// Messages a worker's heavy lane holds waiting for a thread to take
    /// them; a message of a heavy connection that finds its lane full is run
    /// by the worker itself (it waits for a read the worker makes anyway,
    /// rather than in memory nobody bounds). Each message is at most
    /// `core.max_msg_size`. Default 256.
    pub lane_queue: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            core: MuxConfig::default(),
            workers: 1,
            placement: Placement::Pinned,
            read_chunk: 64 << 10,
            event_queue: 4096,
            driver: Driver::Auto,
            backend: Backend::Userspace,
            incoming_cpu: true,
            recv_spin: std::time::Duration::from_micros(50),
            lane_nice: 3,
            lane_in_order: false,
            lane_queue: 256,
        }
    }
}
