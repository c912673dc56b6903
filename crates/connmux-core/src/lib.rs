//! connmux-core: the Kernel Connection Multiplexor's semantics as a sans-IO engine.
//!
//! Bytes and the time go in; whole messages, bytes to write, deadlines and events
//! come out. This crate makes no syscalls, reads no clock, starts no threads and
//! contains no `unsafe`: the runtime (`connmux`) moves the bytes, tests drive it
//! deterministically.
//!
//! What it does **not** do: own file descriptors, block, wake threads, or know
//! about TCP beyond "a byte stream that can fail".
//!
//! Map of the crate (dependencies point down):
//! - [`run`]: whole messages framed where they lie, run by run (what a
//!   parser's batch framing yields and a handler is given);
//! - [`parser`]: the parser trait (need more / length / invalid) and its error type;
//! - [`parsers`]: built-in parsers (length field, ONC RPC record marking, 9P, Thrift,
//!   HTTP/2, Kafka, memcached binary);
//! - [`stream`]: the per-psock stream parser (assembly from the message start,
//!   size limit, assembly deadline, need-bytes hint, counters);
//! - [`mux`]: the multiplexor (KCM sockets, psocks, steering, transmit reservation,
//!   retry, requeue, addressed mode), in two halves: an owner's psocks
//!   (`Owned`) and the hub they share (`Hub`), joined per call by `MuxRef`
//!   (`Mux` holds one of each);
//! - [`stats`]: counters named as in `/proc/net/kcm` and `/proc/net/kcm_stats`.
#![forbid(unsafe_code)]

mod copied;
pub mod mux;
pub mod parser;
pub mod parsers;
pub mod run;
mod rx_error;
pub mod stats;
pub mod stream;
pub mod time;

pub use bytes::Bytes;
pub use copied::copied;
pub use parser::{Parse, ParseError, Parser};
pub use time::Timestamp;
