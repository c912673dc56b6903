//! connmux-oncrpc: ONC RPC version 2 (RFC 5531) wire formats as checked views,
//! record marking, and the NULL-call service logic — all pure functions over
//! byte slices, writing into buffers the caller owns.
//!
//! From the bottom up:
//! - [`xdr`]: big-endian words and padded opaques with bounds checks;
//! - [`msg`]: message constants as open newtypes ([`Program`], [`AuthFlavor`],
//!   [`AcceptStat`], …): an unknown number is a value, not a parse failure;
//! - [`record`]: record marking (last-fragment bit + 31-bit length), encoding
//!   into fragments, and [`RecordReader`] for clients;
//! - [`call`]: [`CallHeader`] (checked view, named offsets), AUTH_SYS bodies,
//!   and the call encoder ([`encode_null_call`], [`Call`]);
//! - [`reply`]: [`encode_reply`] for servers, [`check_reply`] / [`decode_reply`]
//!   for clients;
//! - [`service`]: [`Registry::handle`], a NULL-only server's answer to one call.
//!
//! Over UDP a call is one datagram with no record mark:
//! [`Registry::handle_datagram`] answers one.
//!
//! What it does **not** do: any I/O, threads or clocks; XDR for
//! procedure arguments or results (only the headers and AUTH_SYS); RPCSEC_GSS,
//! AUTH_DH or any verifier other than AUTH_NONE; rpcbind registration;
//! procedures other than NULL.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod call;
pub mod msg;
pub mod record;
pub mod reply;
pub mod service;
pub mod xdr;

pub use call::{encode_null_call, AuthSysParams, Call, CallHeader, Credential, HeaderError, OpaqueAuth};
pub use msg::{AcceptStat, AuthFlavor, AuthStat, MsgType, Program, RejectStat, ReplyStat};
pub use record::{encode_record, RecordError, RecordLimits, RecordMark, RecordReader};
pub use reply::{check_reply, decode_reply, encode_reply, DecodedReply, Reply, ReplyError};
pub use service::{CloseReason, Outcome, Registry};
