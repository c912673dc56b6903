//! connmux-nfs: NFS version 3 and MOUNT version 3 (RFC 1813) wire formats as
//! pure functions over byte slices: no I/O, no state.
//!
//! - [`xdr`]: a checked [`Reader`](xdr::Reader) (every failure a typed
//!   [`XdrError`], counts bounded by the input) and appending writers;
//! - [`types`]: status codes, attributes (`fattr3`, `sattr3`, `wcc_data`);
//! - [`args`]: [`NfsCall`], every NFSv3 procedure's arguments, decoded as
//!   views of the call and encoded back;
//! - [`res`]: result encoders (success and the `resfail` arms with their
//!   attributes) and decoders of the results a client reads;
//! - [`mount`]: [`MountCall`] and the MOUNT results.
//!
//! The RPC header before the arguments and the reply header before the
//! results are `connmux-oncrpc`'s.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod args;
pub mod mount;
pub mod res;
pub mod types;
pub mod xdr;

pub use args::{proc3, proc_name, CreateHow, DirOp, NfsCall};
pub use mount::{mproc, MountCall};
pub use types::{
    Fattr3, Ftype3, Nfsstat3, Nfstime3, Sattr3, SetTime, StableHow, Wcc, WccAttr, FATTR3_LEN, FHSIZE, MOUNT_PROGRAM,
    MOUNT_V3, NFS_PROGRAM, NFS_V3, VERFSIZE,
};
pub use xdr::XdrError;
