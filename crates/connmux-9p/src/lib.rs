//! connmux-9p: the 9P2000.L wire formats as pure functions over byte slices.
//!
//! - [`header`]: the fixed header (`size[4] type[1] tag[2]`) as a checked view
//!   with named offsets, and the message type numbers ([`MsgType`]);
//! - [`wire`]: the little-endian cursor every decoder reads through; each read
//!   is bounds-checked and a short field is a typed [`WireError`];
//! - [`tmsg`]: [`Tmsg::decode`], a checked view of one request, borrowing its
//!   strings and data from the message;
//! - [`rmsg`]: [`Encoder`], which writes replies (and, for clients, requests)
//!   with the size patched in at the end; [`Rmsg`] decoding for clients;
//! - [`types`]: [`Qid`], [`Attr`] (getattr), [`StatFs`], [`SetAttr`], directory
//!   entries.
//!
//! What it does **not** do: any I/O or file-system logic, 9P2000 or 9P2000.u
//! stat structures, authentication.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod header;
pub mod rmsg;
pub mod tmsg;
pub mod types;
pub mod wire;

pub use header::{Header, MsgType, HEADER_LEN, NOFID, NOTAG};
pub use rmsg::{Encoder, Rmsg};
pub use tmsg::Tmsg;
pub use types::{Attr, Dirent, Qid, QidType, SetAttr, StatFs};
pub use wire::{Reader, WireError};

/// The protocol version this crate speaks.
pub const VERSION_L: &str = "9P2000.L";
/// Most names a Twalk may carry (MAXWELEM).
pub const MAX_WALK: usize = 16;
/// Bytes an Rread/Twrite header takes before its data (size, type, tag, count):
/// a read of `count` bytes needs an msize of at least `count + IO_HEADER`.
pub const IO_HEADER: usize = 4 + 1 + 2 + 4;
/// The header room Linux and diod keep free below msize for reads (P9_IOHDRSZ).
pub const IOHDRSZ: usize = 24;
