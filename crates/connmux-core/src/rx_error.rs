//! Why a psock stops receiving: the error the stream parser and the mux
//! report, with the errno KCM would post. Its own module so that the stream
//! parser (below the mux) and the mux both use it without depending on each
//! other.

/// Why a psock stopped receiving (the errno KCM posts on the TCP socket).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RxError {
    #[error("message of {len} bytes exceeds the limit of {max} (EMSGSIZE)")]
    TooBig { len: usize, max: usize },
    #[error("length {len} does not reach past the {gathered} bytes already gathered (EPROTO)")]
    BadLength { len: usize, gathered: usize },
    #[error("parser refused the stream: {0}")]
    Parser(crate::parser::ParseError),
    #[error("message not complete within the assembly timeout (ETIMEDOUT)")]
    Timeout,
    /// The TLS layer below the parser failed (bad record, alert, handshake
    /// failure, close in the middle of a message); the text is the TLS
    /// library's. kTLS reports a record that fails to authenticate as EBADMSG.
    #[error("TLS: {0} (EBADMSG)")]
    Tls(String),
    /// The mux was over its memory budget (`MuxConfig::mem_limit`) and this
    /// psock, among the largest holders, stayed paused holding `held` bytes
    /// past `mem_grace`.
    #[error("memory budget of {limit} bytes exceeded; this connection held {held} (ENOBUFS)")]
    MemLimit { held: usize, limit: usize },
    /// No bytes received or written for `MuxConfig::idle_timeout`.
    #[error("idle for longer than the idle timeout (ETIMEDOUT)")]
    IdleTimeout,
    /// The layer below the parser did not finish its handshake by the
    /// deadline (`MuxConfig::handshake_timeout`).
    #[error("handshake not finished within the handshake timeout (ETIMEDOUT)")]
    HandshakeTimeout,
}

/// EBADMSG: what kTLS returns for a record that fails to authenticate.
pub const EBADMSG: i32 = 74;
/// ENOBUFS: a psock aborted by the memory budget.
pub const ENOBUFS: i32 = 105;

impl RxError {
    pub fn errno(&self) -> i32 {
        match self {
            RxError::TooBig { .. } => crate::parser::EMSGSIZE,
            RxError::BadLength { .. } => crate::parser::EPROTO,
            RxError::Parser(e) => e.errno(),
            RxError::Timeout => crate::parser::ETIMEDOUT,
            RxError::Tls(_) => EBADMSG,
            RxError::MemLimit { .. } => ENOBUFS,
            RxError::IdleTimeout | RxError::HandshakeTimeout => crate::parser::ETIMEDOUT,
        }
    }
}
