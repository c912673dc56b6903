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
}

impl Default for Config {
    fn default() -> Self {
        Config {
            core: MuxConfig::default(),
            workers: 1,
            placement: Placement::Pinned,
            read_chunk: 64 << 10,
            event_queue: 4096,
        }
    }
}
