//! The one configuration struct: every limit with its default and the AF_KCM knob
//! it stands for lives in [`connmux_core::mux::MuxConfig`]; this adds the threads
//! and the runtime's tuning ([`Tuning`]).
//!
//! A leaf: names no other module of the runtime.

use std::time::Duration;

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

impl Placement {
    /// The CPU of each of `workers` threads placed this way (`None`: not
    /// pinned): `Pinned` takes the CPUs this process may use, in order,
    /// wrapping; `Cpus` its list, wrapping. The workers' own rule, for
    /// threads that run beside them (`crate::udp`).
    pub fn cpus(&self, workers: usize) -> Vec<Option<usize>> {
        match self {
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
}

/// The I/O driver of the worker threads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Driver {
    /// Each worker decides at its first use: asked to serve ([`crate::Mux::serve`],
    /// a `Service`) before any connection is attached to it, io_uring
    /// where it works here (`connmux_sys::uring::supported()` and the
    /// worker's ring can be created: the served path is faster on a ring);
    /// a connection attached first, epoll (threads receiving on clones
    /// then read the connections themselves, leading the worker's pass:
    /// `docs/architecture.md`, "Receiving threads lead the workers").
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
/// | `recv_msg`, `recv_from`, `recv_batch`, `send_to`, `send_msg` or `send_batch_to` to a psock | refused (`BackendError::Unsupported`): AF_KCM does not say which connection a message came from, nor take one to send on; `send_msg(msg, None)` is a send |
/// | `set_nonblocking`, `set_read_timeout`, `set_write_timeout`, `set_recv_disable`, `recv_disabled`, `set_rcvbuf`, `set_sndbuf` | same (`MSG_DONTWAIT`, `SO_RCVTIMEO`, `SO_SNDTIMEO`, `KCM_RECV_DISABLE`, `SO_RCVBUF`, `SO_SNDBUF`: the kernel doubles the buffer sizes) |
/// | `set_affinity` | refused (`BackendError::Unsupported`): the kernel steers messages itself |
/// | `KcmSocket::stand_alone` | refused (`Unsupported`): the kernel reads its connections itself |
/// | `KcmSocket::stats`, `queued` | same (the socket's `/proc/net/kcm` line) |
/// | `KcmSocket::as_raw_fd` | the AF_KCM socket itself (readable while a message is queued) |
///
/// `Config` on the kernel backend: `core.max_msg_size` and
/// `core.assembly_timeout` apply (the parser program refuses longer messages
/// with EMSGSIZE; the timeout becomes the TCP socket's SO_RCVTIMEO, strparser's
/// timer); the kernel also refuses a message above the TCP socket's SO_RCVBUF.
/// The other core limits, steering, workers, stand-alone slots, placement,
/// read chunk and driver belong to the userspace runtime and are not used.
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

/// The default [`MuxConfig::assembly_timeout`] of a [`Config`]: 10 s from a
/// message's first byte. A peer that sends the start of a message and then
/// nothing (slowloris) would otherwise hold its connection and its assembly
/// buffer forever. The servers' `--assembly-timeout-ms` default.
pub const DEFAULT_ASSEMBLY_TIMEOUT: Duration = Duration::from_secs(10);

/// The default [`MuxConfig::mem_limit`] of a [`Config`]: 256 MiB for all
/// connections together (assembly buffers, queued requests and replies).
/// The servers' `--mem-limit` default.
pub const DEFAULT_MEM_LIMIT: usize = 256 << 20;

/// The default [`Config::max_conns`]: 10,000 connections attached at once
/// by a [`crate::service::Service`]. The servers' `--max-conns` default.
pub const DEFAULT_MAX_CONNS: usize = 10_000;

/// One worker per CPU this process may run on
/// ([`std::thread::available_parallelism`], which follows the affinity mask
/// and a cgroup's CPU quota); 1 where that cannot be told.
pub fn default_workers() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Mux configuration.
///
/// `Config::default()` is what the servers (`connmux rpc-server`,
/// `echo-server`) run with when given no flags: a worker per CPU, and an
/// assembly timeout, a memory budget and a connection cap
/// ([`DEFAULT_ASSEMBLY_TIMEOUT`], [`DEFAULT_MEM_LIMIT`],
/// [`DEFAULT_MAX_CONNS`]); each field can be set after it.
#[derive(Clone, Debug)]
pub struct Config {
    /// Limits and steering of the core (sizes, deadlines, queue bounds):
    /// [`MuxConfig::default`] except for two values, which here are the
    /// servers' defaults:
    ///
    /// - `core.assembly_timeout`: `Some(`[`DEFAULT_ASSEMBLY_TIMEOUT`]`)`
    ///   (10 s; the core's own default, AF_KCM's, waits forever). `None`
    ///   waits forever.
    /// - `core.mem_limit`: [`DEFAULT_MEM_LIMIT`] (256 MiB; the core's own
    ///   is 1 GiB).
    pub core: MuxConfig,
    /// I/O worker threads (each owns the psocks attached to it). Default
    /// [`default_workers`]: one per CPU this process may run on, so that the
    /// messages of one heavy connection are answered on every CPU (by the
    /// workers' heavy lanes and helpers under [`crate::Mux::serve`], or by
    /// application threads on cloned sockets). Set 1 for a mux that should
    /// hold one thread only (a client's, a test's).
    pub workers: usize,
    /// Stand-alone sockets the mux can make ([`crate::KcmSocket::stand_alone`]):
    /// KCM sockets whose own application thread reads the connections
    /// attached to them, in its `recv`, with no worker thread between the
    /// connection and the thread that receives. Each is a slot made at
    /// start (an epoll and an eventfd). Userspace backend only. Default 0.
    pub stand_alone: usize,
    /// Most connections a [`crate::service::Service`] on this mux keeps
    /// attached at once: past it a new connection is reset as soon as it is
    /// accepted (counted in `refused`). `None`: no cap.
    /// [`crate::service::Service::set_max_conns`] changes it while running.
    /// [`crate::Mux::attach`] itself is not capped: the application chose
    /// that connection. Default `Some(`[`DEFAULT_MAX_CONNS`]`)`.
    pub max_conns: Option<usize>,
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
    /// on the socket's readiness, where it does not lead a worker's pass
    /// instead (an epoll worker's pass free or held by its own thread: the
    /// receive then sleeps in the worker's epoll, `docs/architecture.md`,
    /// "Receiving threads lead the workers"). A message that arrives meanwhile is taken
    /// without a wake-up, which on a virtual machine costs more than a short
    /// request when it crosses CPUs (`docs/performance.md`); on the worker's own CPU the yield lets the worker run.
    /// Costs at most this much CPU per receive that finds nothing. A
    /// socket whose receives found a backlog (more messages queued behind
    /// the one taken) since it last waited sleeps at once: spinning takes
    /// messages one by one as they come, where a sleep lets them batch
    /// (`bench kcm`, 2 threads at 8 × 16: 0.87–0.93× of one thread with
    /// every wait spinning, 1.06–1.47× with none).
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
    /// The scheduler slice a worker asks for while its heavy lane has work
    /// (`sched_setattr`: an EEVDF thread's own slice, Linux 6.12 and later;
    /// older kernels ignore it, and the kernel clamps it to 0.1–100 ms).
    /// Longer than the kernel's default for any thread (0.7 ms times 1 +
    /// log2 of the CPUs, at most 2.8 ms): the lane's heavy handlers then
    /// cut the worker's passes less often. It changes how the CPU is cut
    /// up, not the worker's share of it. With 1 heavy and 7 light
    /// connections on 2 CPUs the light calls' p99 went from 101–127 µs to
    /// 64–81 µs (those of the light connections beside the heavy one from
    /// 313–489 µs to 75–140), the heavy connection's rate down 7–10% (its
    /// lane shares the CPU in longer turns). Only while the lane has work:
    /// asked of every worker, it cost 7% of the NULL calls at `-j8 -a128`
    /// on one CPU (eight clients waiting longer behind the worker). The
    /// worker asks when a request goes to its lane and gives it back once
    /// its lane took none for 4,096 passes (`docs/performance.md`, "A
    /// worker's own slice beside its lane"). `Duration::ZERO`: never
    /// asked. Default 4 ms.
    pub lane_worker_slice: Duration,
    /// The scheduler slice a lane's home thread asks for (`sched_setattr`,
    /// as `lane_worker_slice`; older kernels ignore it). Short: a lane runs
    /// handlers of hundreds of microseconds and more, and a worker woken for
    /// light requests on its CPU may cut in only once the lane's slice is
    /// used up, or at the scheduler's next tick (4 ms at `HZ=250`). It
    /// changes how often the lane gives way, not its share of the CPU.
    /// With 1 heavy and 7 light connections on 2 CPUs whose light calls
    /// fill the lane's CPU, the light calls' p99 went from 722–779 µs to
    /// 340–369 µs, the heavy connection's rate unchanged (884–976/s against
    /// 889–982); one heavy connection alone, and one beside one light
    /// connection, unchanged (`docs/performance.md`, "A lane's own short
    /// slice"). `Duration::ZERO`: the kernel's default. Default 100 µs (the
    /// shortest the kernel takes).
    pub lane_slice: Duration,
    /// Whether a heavy connection's replies keep its requests' order.
    /// `false` (the default) starts a helper on every worker's CPU, which
    /// runs only in that CPU's spare time (`SCHED_IDLE`) and takes
    /// messages from the other workers' heavy lanes, so the requests of one
    /// heavy connection are answered on every CPU at once, and its replies
    /// may leave in another order than its requests came (as under KCM;
    /// protocols that match replies by tag or xid, such as ONC RPC and 9P,
    /// need no order). `true` starts no helpers: each lane has one thread,
    /// which answers its heavy connections in order, so a heavy connection
    /// is answered on one CPU. The order holds while the lane has room
    /// (`lane_queue`, `lane_bytes`): a request that finds it full is run by
    /// the worker at once, possibly before older ones still in the lane.
    pub lane_in_order: bool,
    /// Messages a worker's heavy lane holds waiting for a thread to take
    /// them; a message of a heavy connection that finds its lane full is run
    /// by the worker itself (it waits for a read the worker makes anyway,
    /// rather than in memory nobody bounds). Default 256.
    pub lane_queue: usize,
    /// Bytes of requests a worker's heavy lane holds (taken or waiting,
    /// until their verdicts come back), beside `lane_queue`: requests taken
    /// out of the core no longer count in `core.mem_limit`, so this bounds
    /// them per worker. Default 16 MiB.
    pub lane_bytes: usize,
    /// The runtime's tuning (the heavy-request thresholds, ring buffers);
    /// the defaults are the values its figures were taken with.
    pub tuning: Tuning,
}

/// The userspace runtime's tuning: what a user of the library may want to
/// set for their own handlers and memory. None of it changes what is
/// delivered, only how the work is cut up. The runtime's other thresholds
/// (batch sizes, the lane's hysteresis) are constants
/// next to the code that uses them, each with the figure behind it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tuning {
    /// A handler run at least this long on one message counts as slow, and
    /// three slow runs in a row make its connection heavy: its messages
    /// then go to the worker's heavy lane, so light requests are not read
    /// behind heavy work. Well above a light request's handler (a NULL call
    /// or an echo is a few hundred nanoseconds), well below what a waiting
    /// light request notices. `Duration::MAX`: no connection is ever found
    /// heavy (with `busy_handler` at `Duration::MAX` too). Default 50 µs.
    pub slow_handler: Duration,
    /// A run of one connection's requests that keeps its worker
    /// `slow_handler` or longer in all, at this much each or more, counts
    /// as slow too: a connection with many such requests in flight (a busy
    /// one, not only one with long requests) holds its worker as long as
    /// one heavy request does, and its messages are worth spreading over
    /// the CPUs once each costs well more than crossing to a lane (a copy,
    /// two queue operations, the verdict's post and often a wake-up). A
    /// heavy connection whose requests run at least this long stays heavy;
    /// 64 shorter ones in a row send it back to its worker. At
    /// `slow_handler` or above only long requests make a connection heavy.
    /// Default 10 µs (`docs/history/performance-log.md`, "Busy
    /// connections: many medium requests").
    pub busy_handler: Duration,
    /// Provided buffers in an io_uring worker's ring (a power of two, at most
    /// 32768: the ring refuses other counts with `EINVAL`, so `Mux::new` fails
    /// on the io_uring driver and `Auto`'s workers take epoll). With `ring_buf_size`
    /// this is a worker's receive memory (256 × 16 KiB = 4 MiB), and it bounds
    /// what a paused psock can have spilled: at most what one wait delivered,
    /// at most the ring. Default 256.
    pub ring_buf_count: u16,
    /// Bytes of one provided buffer: a multishot receive completes into one
    /// buffer, so this is the largest piece of the stream one completion
    /// hands over. Default 16 KiB.
    pub ring_buf_size: u32,
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning {
            slow_handler: Duration::from_micros(50),
            busy_handler: Duration::from_micros(10),
            ring_buf_count: 256,
            ring_buf_size: 16 << 10,
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            core: MuxConfig {
                assembly_timeout: Some(DEFAULT_ASSEMBLY_TIMEOUT),
                mem_limit: DEFAULT_MEM_LIMIT,
                ..MuxConfig::default()
            },
            workers: default_workers(),
            stand_alone: 0,
            max_conns: Some(DEFAULT_MAX_CONNS),
            placement: Placement::Pinned,
            read_chunk: 64 << 10,
            event_queue: 4096,
            driver: Driver::Auto,
            backend: Backend::Userspace,
            incoming_cpu: true,
            recv_spin: std::time::Duration::from_micros(50),
            lane_nice: 3,
            lane_worker_slice: Duration::from_millis(4),
            lane_slice: Duration::from_micros(100),
            lane_in_order: false,
            lane_queue: 256,
            lane_bytes: 16 << 20,
            tuning: Tuning::default(),
        }
    }
}
