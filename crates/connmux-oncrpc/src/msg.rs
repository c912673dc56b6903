//! RPC message constants (RFC 5531 §9 and §8.2) as *open* newtypes: every
//! `u32` is representable, the known values are named constants. A peer that
//! sends a number we do not know gets the protocol's answer (PROG_UNAVAIL,
//! AUTH_ERROR, …), never a parse failure.

use core::fmt;

/// The RPC protocol version this crate speaks (`rpcvers` in a call).
pub const RPC_VERSION: u32 = 2;

/// Largest opaque body of a credential or verifier (RFC 5531 §8.2,
/// `opaque body<400>`); also `MAX_AUTH_BYTES` in the Sun/BSD sources.
pub const MAX_AUTH_BYTES: usize = 400;

/// Defines an open `u32` newtype with named constants and a Debug/Display
/// that prints the RFC's name when it knows one.
macro_rules! open_u32 {
    ($(#[$m:meta])* $name:ident { $($(#[$cm:meta])* $c:ident = $v:expr,)* }) => {
        $(#[$m])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(pub u32);

        impl $name {
            $($(#[$cm])* #[doc = concat!("`", stringify!($c), "` = ", stringify!($v))] pub const $c: $name = $name($v);)*

            /// The RFC's name for this value, if it is one we know.
            pub fn name(self) -> Option<&'static str> {
                match self.0 {
                    $($v => Some(stringify!($c)),)*
                    _ => None,
                }
            }
        }

        impl From<u32> for $name {
            fn from(v: u32) -> Self {
                $name(v)
            }
        }

        impl From<$name> for u32 {
            fn from(v: $name) -> u32 {
                v.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                match self.name() {
                    Some(n) => f.write_str(n),
                    None => write!(f, "{}({})", stringify!($name), self.0),
                }
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(self, f)
            }
        }
    };
}

open_u32! {
    /// `msg_type` (RFC 5531 §9).
    MsgType {
        CALL = 0,
        REPLY = 1,
    }
}

open_u32! {
    /// `reply_stat` (RFC 5531 §9).
    ReplyStat {
        MSG_ACCEPTED = 0,
        MSG_DENIED = 1,
    }
}

open_u32! {
    /// `accept_stat` (RFC 5531 §9).
    AcceptStat {
        SUCCESS = 0,
        PROG_UNAVAIL = 1,
        PROG_MISMATCH = 2,
        PROC_UNAVAIL = 3,
        GARBAGE_ARGS = 4,
        SYSTEM_ERR = 5,
    }
}

open_u32! {
    /// `reject_stat` (RFC 5531 §9).
    RejectStat {
        RPC_MISMATCH = 0,
        AUTH_ERROR = 1,
    }
}

open_u32! {
    /// `auth_stat` (RFC 5531 §9, plus the RPCSEC_GSS values of RFC 2203).
    AuthStat {
        AUTH_OK = 0,
        /// Bad credential (seal broken); also a malformed AUTH_SYS body.
        AUTH_BADCRED = 1,
        /// Client must begin a new session; the Sun/TI-RPC/FreeBSD answer to a
        /// credential flavour the server does not support.
        AUTH_REJECTEDCRED = 2,
        AUTH_BADVERF = 3,
        AUTH_REJECTEDVERF = 4,
        AUTH_TOOWEAK = 5,
        AUTH_INVALIDRESP = 6,
        AUTH_FAILED = 7,
        AUTH_KERB_GENERIC = 8,
        AUTH_TIMEEXPIRE = 9,
        AUTH_TKT_FILE = 10,
        AUTH_DECODE = 11,
        AUTH_NET_ADDR = 12,
        RPCSEC_GSS_CREDPROBLEM = 13,
        RPCSEC_GSS_CTXPROBLEM = 14,
    }
}

open_u32! {
    /// `auth_flavor` (RFC 5531 §8.2 and the IANA registry).
    AuthFlavor {
        AUTH_NONE = 0,
        AUTH_SYS = 1,
        AUTH_SHORT = 2,
        AUTH_DH = 3,
        RPCSEC_GSS = 6,
    }
}

open_u32! {
    /// An RPC program number. Only a few well-known ones are named; any other
    /// value is a program like these, just one this crate has no name for.
    Program {
        PORTMAP = 100000,
        NFS = 100003,
        MOUNT = 100005,
        NLM = 100021,
        NFS_ACL = 100227,
    }
}

/// Procedure 0 of every program: void arguments, void results, no
/// authentication required (RFC 5531 §12.1 convention).
pub const NULLPROC: u32 = 0;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_open_values() {
        assert_eq!(AcceptStat::PROG_MISMATCH.to_string(), "PROG_MISMATCH");
        assert_eq!(AcceptStat(77).to_string(), "AcceptStat(77)");
        assert_eq!(Program(100003), Program::NFS);
        assert_eq!(Program(4242).name(), None);
        assert_eq!(format!("{:?}", AuthStat::AUTH_REJECTEDCRED), "AUTH_REJECTEDCRED");
    }
}
