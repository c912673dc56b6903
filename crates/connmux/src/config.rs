//! The one configuration struct: every limit with its default and the AF_KCM knob
//! it stands for lives in [`connmux_core::mux::MuxConfig`]; this adds the threads
//! and the runtime's tuning constants ([`Tuning`]).
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
/// | `recv_msg`, `recv_from`, `recv_batch`, `send_to`, `send_msg` or `send_batch_to` to a psock | refused (`BackendError::Unsupported`): AF_KCM does not say which connection a message came from, nor take one to send on; `send_msg(msg, None)` is a send |
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
    /// on the socket's readiness. A message that arrives meanwhile is taken
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
    /// The runtime's tuning constants (batch sizes, thresholds, ring
    /// buffers); the defaults are the values its figures were taken with.
    pub tuning: Tuning,
}

/// The userspace runtime's tuning constants, each with why it has its
/// default. None of them changes what is delivered, only how the work is cut
/// up; a worker copies the ones it reads per message into its own state when
/// it starts. A zero where at least one is needed counts as one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tuning {
    /// Messages a serving worker takes from its socket per lock hold, and at
    /// most that many of one read framed to be served in place. Large enough
    /// that one lock hold pays for many messages, small enough that a worker
    /// gets back to its reads (and so to its other connections) soon; a pass
    /// serves at most 64 such batches. Default 256.
    pub serve_batch: usize,
    /// Replies up to this many bytes are copied into the worker's run buffer,
    /// so that consecutive replies to one connection enter its transmit
    /// queue as one entry (one queue operation instead of one per reply);
    /// larger ones are queued as they are, where the copy would cost more
    /// than the queue operation it saves. Default 512.
    pub coalesce_max: usize,
    /// A handler run at least this long on one message counts as slow, and
    /// `slow_hits` slow runs in a row make its connection heavy: its messages
    /// then go to the worker's heavy lane, so light requests are not read
    /// behind heavy work. Well above a light request's handler (a NULL call
    /// or an echo is a few hundred nanoseconds), well below what a waiting
    /// light request notices. Default 50 µs.
    pub slow_handler: Duration,
    /// A run of one connection's requests that keeps its worker
    /// `slow_handler` or longer in all, at this much each or more, counts
    /// as slow too: a connection with many such requests in flight (a busy
    /// one, not only one with long requests) holds its worker as long as
    /// one heavy request does, and its messages are worth spreading over
    /// the CPUs once each costs well more than crossing to a lane (a copy,
    /// two queue operations, the verdict's post and often a wake-up). A heavy connection whose requests run at least this long
    /// stays heavy. Default 10 µs (`docs/performance.md`, "Busy
    /// connections: many medium requests").
    pub busy_handler: Duration,
    /// Slow runs in a row (`slow_handler`, `busy_handler`) that make a connection heavy: one
    /// long run can be a preemption, several in a row are a heavy
    /// connection. Default 3.
    pub slow_hits: u32,
    /// Short handler runs in a row (under `busy_handler`) after which a heavy
    /// connection leaves its lane and is served by its worker again: many
    /// more than the slow runs that sent it there, so a connection mixing
    /// heavy and light requests does not go back and forth. Default 64.
    pub lane_return_after: u32,
    /// Messages a heavy lane must hold for a helper (on another CPU) to take
    /// one: a helper steals from a lane that is behind, not from one its home
    /// thread keeps up with. The head always stays for the home thread, so a
    /// connection's lone request never waits on a helper whose CPU has no
    /// time to spare. Default 2, so that a heavy connection with only a few
    /// requests in flight is still spread over every CPU. A higher value
    /// keeps a lane's few requests off the CPUs that serve light
    /// connections, at the price of answering such a connection on one CPU
    /// (`docs/performance.md`, "Uneven work", has the figures).
    pub lane_steal_from: usize,
    /// Messages a heavy lane must hold for its takers to post their
    /// replies quietly: the worker is then not woken for each reply, but
    /// takes them when it looks next (woken by anything else, or at the end
    /// of a sleep it bounds by `lane_reply_wait`), and writes them together
    /// (one wake-up and one write for several). With this many requests
    /// queued, the replies are not what the connection waits for. Woken
    /// once a reply, the worker of one heavy connection with 32 requests in
    /// flight spent about 15% of the CPU its requests were waiting for on
    /// wake-ups and writes (`docs/performance.md`, "Replies of a lane that
    /// is far behind"). Below it, each reply wakes the worker at once (a
    /// lane with a few requests, such as one beside light connections:
    /// there a worker's bounded sleeps would cost more, see
    /// `lane_reply_wait`). And only while the work queued ahead, at the
    /// cost of the request just answered, lasts `lane_reply_wait` or
    /// longer: a lane of short requests (a busy connection's, see
    /// `busy_handler`) drains before its quiet replies are taken, and its
    /// takers then wait for the client's next requests. 0: never quietly.
    /// Default 8.
    pub lane_quiet_from: usize,
    /// How long a worker whose lane posts quietly (`lane_quiet_from`) sleeps
    /// at most, and so how long such a reply may wait for it. Only then: a
    /// timer this near is reprogrammed on every sleep, which in a virtual
    /// machine is a trip to the hypervisor (with every sleep bounded while
    /// a lane held requests, light connections on the same worker lost 7%
    /// of their calls a second). A worker that also answers light
    /// connections sleeps with no bound all the same (their requests wake
    /// it often; with the bound they lost 15% of their calls beside a lane
    /// far behind), and a quiet post wakes it. Zero: every reply wakes its
    /// worker at once. Default 1 ms (the epoll driver's waits count in
    /// milliseconds).
    pub lane_reply_wait: Duration,
    /// Provided buffers in an io_uring worker's ring (a power of two, at most
    /// 32768: the ring refuses other counts with `EINVAL`, so `Mux::new` fails
    /// on the io_uring driver and `Auto` takes epoll). With `ring_buf_size`
    /// this is a worker's receive memory (256 × 16 KiB = 4 MiB), and it bounds
    /// what a paused psock can have spilled: at most what one wait delivered,
    /// at most the ring. Default 256.
    pub ring_buf_count: u16,
    /// Bytes of one provided buffer: a multishot receive completes into one
    /// buffer, so this is the largest piece of the stream one completion
    /// hands over. Default 16 KiB.
    pub ring_buf_size: u32,
    /// Free provided buffers kept in the kernel's ring at least (the rest
    /// wait on a stack, the most recently used given first; 0: all of them
    /// in the ring). The kernel takes buffers in the order they were given:
    /// with all 256 queued a receive lands in the buffer used 256 receives
    /// ago, and a read's bytes are no longer in the cache when the parser
    /// walks them. The ring deepens when a receive finds it empty (that
    /// receive is submitted again) and comes back down after a run of
    /// receives that used less than half of it. 4 gave NULL calls at
    /// `-j8 -a128`, one worker, 1.015× the calls/s of all 256 queued
    /// (`docs/performance.md`, "Framing without a chain through memory; hot
    /// receive buffers"). Default 4.
    pub ring_buf_hot: u16,
    /// Rounds of dispatch, serve and flush a worker runs per pass before it
    /// goes back to its epoll or ring: what one round's work makes ready
    /// (events, connections with bytes to write) is handled in the same
    /// pass, and the bound keeps a worker that always finds more from never
    /// reaping its completions (what remains goes to the next pass, whose
    /// wait does not sleep). Default 64.
    pub ring_rounds: usize,
    /// Slices written in one `writev`, and handed to rustls's writer at once
    /// for a TLS psock (one record takes up to 16 KiB): the core's chunk for
    /// one write is cut there. A few dozen replies per write is where
    /// batching stops paying. At most 1024 (`IOV_MAX`); larger values count
    /// as 1024. Default 64.
    pub max_iov: usize,
    /// Lend a served psock to the worker that reads it while nothing else
    /// involves it (`connmux_core::mux::Mux::lease`; either driver): its
    /// reads are then framed, answered and written by that worker with no
    /// hold of the core lock, which is told what happened within
    /// `lease_sync`.
    /// Off: every read goes through the core (four holds of its lock per
    /// served read).
    pub lease: bool,
    /// How long a busy worker may keep what its lent psocks did (messages,
    /// bytes, their idle clock) before telling the core, in a hold of the
    /// core lock. A worker that did nothing else in a pass skips that hold
    /// until then: at one request per pass the hold is a large share of the
    /// pass (`docs/performance.md`, "Leases"). A worker that goes to sleep
    /// keeps them too (a served request takes no hold of the core lock):
    /// a reader of the statistics (`Mux::stats`, `Mux::psock_stats`,
    /// `KcmSocket::stats`, the `/proc`-style views) asks every worker
    /// holding leases to tell them first, and so counts every reply
    /// written before it asked. With an idle timeout the worker tells
    /// before it sleeps instead, and an idle timeout shorter than 16 times
    /// this shortens it to a sixteenth of the timeout, so that untold
    /// activity never looks like idleness. Default 1 ms.
    pub lease_sync: Duration,
    /// Bytes of a message begun that a lent psock keeps when a read ends
    /// inside it (`connmux_core::mux::Lease::frame_read`): the next reads
    /// complete it on the lease. A larger message (or a longer start) gives
    /// the lease back and goes the core's way (a message of 16 KiB or more
    /// is read straight into its assembly buffer there, and a connection
    /// whose last message was that large is not lent until a smaller one
    /// comes: its reads then each bring one message, with no copy). 0: a
    /// read that ends inside a message always gives the lease back.
    /// Default 16 KiB.
    pub lease_keep: usize,
    /// Bytes all of one worker's leases keep together: a message begun is
    /// kept only while all of it fits beside what the others keep, else
    /// its lease goes back (the core's memory budget does
    /// not see kept bytes, so the most memory in all is `mem_limit` plus
    /// this per worker). A kept message's assembly deadline holds as in the
    /// core: when it passes, the worker gives the lease back and the core
    /// times the message out. Default 1 MiB.
    pub lease_keep_total: usize,
    /// Bytes of replies a lent psock holds when its connection takes less
    /// than was written: the lease stays, its worker writes them when the
    /// connection takes more (epoll: its writable event; io_uring: a
    /// `POLLOUT` poll), and the replies of its next reads go behind them.
    /// Past this (a peer that reads slowly or not at all) the lease goes
    /// back with all of it on the psock's queue, where the core's bounds on
    /// a connection's replies (`psock_sndbuf`) apply. For TLS psocks a
    /// short write gives the lease back (their records wait in their
    /// sessions). 0: a short write always gives the lease back. Default
    /// 256 KiB.
    pub lease_backlog: usize,
    /// Bytes of such replies all of one worker's leases hold together (the
    /// core's memory budget does not see them). Default 4 MiB.
    pub lease_backlog_total: usize,
    /// An epoll worker whose one connection is lent, busy and plain reads it
    /// the way a thread per connection would: a blocking `recv` in place of
    /// its wait and its read, one system call a batch fewer (one light
    /// connection at `-a32`, a hand-written epoll loop: 0.87–0.92× of the
    /// blocking thread's calls/s without it, 0.99–1.04× with;
    /// `docs/performance.md`, "A sole connection read blocking"). Busy:
    /// its last two reads came within `sole_gap`. Cost: while such a read
    /// waits, what other threads ask of the worker (a command, a message
    /// for its socket, a second connection) waits for the connection's
    /// next bytes or for `sole_timeout`, which the kernel counts in whole
    /// scheduler ticks (1–4 ms a tick; up to two ticks), after which the
    /// worker goes back to its epoll wait until the connection is busy
    /// again. Off: every wait is the epoll wait. Default on.
    pub sole_read: bool,
    /// Reads of a worker's one connection this close together make it busy
    /// (`sole_read`). Default 500 µs.
    pub sole_gap: Duration,
    /// How long a blocking read of a sole connection waits
    /// (`SO_RCVTIMEO`, rounded up by the kernel to a scheduler tick).
    /// Default 1 ms.
    pub sole_timeout: Duration,
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning {
            serve_batch: 256,
            coalesce_max: 512,
            slow_handler: Duration::from_micros(50),
            busy_handler: Duration::from_micros(10),
            slow_hits: 3,
            lane_return_after: 64,
            lane_steal_from: 2,
            lane_quiet_from: 8,
            lane_reply_wait: Duration::from_millis(1),
            ring_buf_count: 256,
            ring_buf_size: 16 << 10,
            ring_buf_hot: 4,
            ring_rounds: 64,
            max_iov: 64,
            lease: true,
            lease_sync: Duration::from_millis(1),
            lease_keep: 16 << 10,
            lease_keep_total: 1 << 20,
            lease_backlog: 256 << 10,
            lease_backlog_total: 4 << 20,
            sole_read: true,
            sole_gap: Duration::from_micros(500),
            sole_timeout: Duration::from_millis(1),
        }
    }
}

impl Tuning {
    /// These values with every count the runtime needs at least one of (or
    /// at most the kernel's limit of) brought into range.
    pub(crate) fn in_range(mut self) -> Tuning {
        self.serve_batch = self.serve_batch.max(1);
        self.slow_hits = self.slow_hits.max(1);
        self.lane_steal_from = self.lane_steal_from.max(1);
        self.ring_rounds = self.ring_rounds.max(1);
        self.max_iov = self.max_iov.clamp(1, 1024);
        self.ring_buf_hot = self.ring_buf_hot.min(self.ring_buf_count);
        self
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
