//! connmux: KCM's message interface over TCP, in userspace, on any Linux.
//!
//! A [`Mux`] joins attached TCP connections (psocks) to KCM sockets
//! ([`KcmSocket`]): a parser finds message boundaries in each byte stream, a
//! `recv` returns exactly one whole message, a `send` writes one message
//! atomically on one connection, and whole messages are balanced across the
//! sockets that wait. The semantics are those of Linux's AF_KCM
//! (`docs/kcm-compat.md` lists every call and every departure); the decisions
//! are made by the pure core (`connmux-core`), this crate moves the bytes.
//!
//! ```no_run
//! use connmux::{Config, Mux, SockType};
//! use std::net::TcpStream;
//! let mux = Mux::new(Config::default())?;
//! let sock = mux.socket(SockType::Dgram)?;
//! let conn = TcpStream::connect("127.0.0.1:62049")?;
//! mux.attach(&conn, connmux::parsers::from_spec("l4").unwrap())?;
//! sock.send(b"\0\0\0\x05hello")?;            // one whole message
//! let mut buf = [0u8; 1024];
//! let got = sock.recv(&mut buf)?;             // one whole message back
//! # Ok::<(), std::io::Error>(())
//! ```
//!
//! Threads: `Config::workers` I/O worker threads, each pinned to a CPU, own the
//! attached connections (read, parse, write). They run on io_uring (multishot
//! receives into provided buffers, one `sendmsg` per connection per pass) where
//! it works, else on epoll; `Config::driver` chooses and [`Mux::driver`] tells.
//! Application threads call `recv`/`send` on cloned sockets; [`Mux::serve`] instead runs a handler in
//! place on the workers (see `docs/architecture.md`, "who owns what").
//!
//! Backends: [`Config::backend`] chooses connmux's userspace runtime (the
//! default, any Linux) or the kernel's own AF_KCM (`connmux-kernel`: KCM
//! sockets are AF_KCM sockets, parsers are offset-correct BPF programs), or
//! `Auto`, the kernel where AF_KCM exists. The same [`Mux`] and [`KcmSocket`]
//! calls work on both; the few that AF_KCM cannot do with the same meaning
//! (addressed receive and send, serving in place, affinity) return an
//! `Unsupported` error holding a [`BackendError`]. [`Backend`] has the table.
//!
//! # Async use (cargo feature `tokio`)
//!
//! A [`KcmSocket`] waits by blocking its thread; with the `tokio` feature,
//! `AsyncKcmSocket` wraps one for a tokio runtime: `recv`, `recv_from`,
//! `recv_msg`, `recv_batch`, `send`, `send_to`, `send_msg` are `async fn`s
//! that wait on the socket's readiness descriptor (the eventfd its `AsFd`
//! gives, readable while messages are queued) through
//! `tokio::io::unix::AsyncFd`, and it is a `futures_core::Stream` of
//! received messages. The mux's workers still read and write the
//! connections; the tasks only take whole messages and hand back whole
//! replies, so one socket per task, cloned (`AsyncKcmSocket::try_clone`,
//! AF_KCM's `SIOCKCMCLONE`), spreads a connection's requests over the
//! runtime's threads.
//!
//! ```ignore
//! // connmux = { features = ["tokio"] }
//! let mux = Mux::new(Config::default())?;
//! let first = AsyncKcmSocket::new(mux.socket(SockType::Dgram)?)?;
//! let mut socks = vec![];
//! for _ in 1..4 {
//!     socks.push(first.try_clone()?);
//! }
//! socks.push(first); // every socket receives: none holds messages unread
//! for s in socks {
//!     tokio::spawn(async move {
//!         while let Ok(m) = s.recv_msg().await {
//!             let _ = s.send_to(&m.data, m.psock).await; // echo
//!         }
//!     });
//! }
//! ```
//!
//! `examples/tokio_rpc_null.rs` serves ONC RPC NULL this way.
//!
//! UDP: [`udp::UdpService`] answers datagrams with the same [`service::Handler`]
//! (one datagram one message), on a socket and a pinned thread per worker.
//!
//! What this crate does **not** do: it has no `unsafe` of its own (that is in
//! `connmux-sys`), and it does not listen or accept (see [`service`]).
#![forbid(unsafe_code)]

// The runtime's modules, bottom layer first: each names only modules listed
// before it (`tests/layers.rs` checks it; `docs/architecture.md`,
// "Layers", says what each owns).
mod config;
mod sync;

mod handler;

mod shared;

mod events;

mod kernel;

mod lane;

mod serve;

mod driver;

// Epoll workers' threads, and receiving threads leading their passes.
mod lead;

mod mux;
// Stand-alone sockets' slots: below `socket`, which stands on them.
mod alone;

mod socket;

#[cfg(feature = "tokio")]
mod async_socket;

pub mod tls;

pub mod service;

pub mod udp;

pub use config::{
    default_workers, Backend, Config, Driver, Placement, Tuning, DEFAULT_ASSEMBLY_TIMEOUT, DEFAULT_MAX_CONNS,
    DEFAULT_MEM_LIMIT,
};
pub use connmux_core::mux::{
    Event as CoreEvent, MuxConfig, PsockError, PsockId, RecvFlags, RecvInfo, RxError, SendFlags, SockId, SockType,
    Steering, TxPolicy,
};
pub use connmux_core::parser::{Parse, ParseError, Parser};
pub use connmux_core::parsers;
pub use connmux_core::stats::{MuxStats, PsockStats, SockStats};
pub use connmux_core::Bytes;
pub use connmux_kernel::{KernelError, KernelMux, KernelSocket};
pub use events::Events;
pub use kernel::{BackendError, UNKNOWN_PSOCK};
pub use mux::{AttachOptions, BpfProgram, Mux};
pub use shared::PsockEvent;
pub use socket::{KcmSocket, Message};

#[cfg(feature = "tokio")]
pub use async_socket::AsyncKcmSocket;
