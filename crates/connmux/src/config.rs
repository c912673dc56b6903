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
        }
    }
}
