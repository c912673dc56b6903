//! TLS on attached connections (psocks), in userspace with rustls: the
//! public part ([`Mux::attach_tls`], [`TlsConn`], [`TlsStats`], the rustls
//! this crate is built with).
//!
//! The record work itself (rustls state per psock, ciphertext in, records
//! out, the bounds on what a psock buffers) is `shared::tls`, which both
//! drivers call; its module doc says where TLS sits and why in userspace.
//! This module must not be named by anything below `service`.

use std::io;
use std::net::TcpStream;
use std::sync::atomic::Ordering;

use connmux_core::mux::{Event, PsockId};
use connmux_core::parser::Parser;

use crate::mux::Mux;
use crate::shared::tls::PsockTls;
pub use crate::shared::tls::{TlsConn, TLS_BUFFER_LIMIT};
use crate::shared::Ctx;

/// The rustls this crate is built with: build configurations and connections
/// with it, so that they are the types [`TlsConn`] takes.
pub use rustls;

/// TLS counters of a mux ([`Mux::tls_stats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TlsStats {
    /// Connections attached with TLS.
    pub attached: u64,
    /// Handshakes completed.
    pub handshakes: u64,
    /// Handshakes that failed: not TLS, refused certificate or parameters,
    /// an alert, or the connection closed during the handshake.
    pub handshake_failures: u64,
    /// Errors after the handshake: an alert, a record that fails to
    /// authenticate, a close (close_notify or TCP) in the middle of a message.
    pub errors: u64,
}

impl Mux {
    /// Attach a connected TCP connection that speaks TLS, with the parser
    /// framing the decrypted stream. `tls` is a fresh rustls server or client
    /// connection (`connmux::tls::rustls`): the handshake runs on the psock's
    /// worker, without blocking this call; messages are framed once it has
    /// completed, and messages sent to the psock before then wait.
    ///
    /// Unlike [`Mux::attach`], the mux takes the connection: unattach, abort
    /// or release closes it (without a close_notify; abort resets it).
    /// A failed handshake or a TLS error is a psock error
    /// (`RxError::Tls`, on [`Mux::events`]) counted in [`Mux::tls_stats`].
    ///
    /// Errors as [`Mux::attach`]; the io_uring driver runs TLS psocks too.
    /// The kernel backend refuses it (`BackendError::Unsupported`): AF_KCM
    /// would need kTLS under it, which connmux does not set up.
    pub fn attach_tls(&self, conn: TcpStream, tls: impl Into<TlsConn>, parser: Box<dyn Parser>) -> io::Result<PsockId> {
        let Some(u) = self.user() else {
            return Err(refused());
        };
        // The same choice as a plain attach (`Config::incoming_cpu`).
        let w = u.pick_worker(std::os::fd::AsFd::as_fd(&conn));
        self.attach_tls_on(conn, tls, parser, w)
    }

    /// [`Mux::attach_tls`] on a chosen worker.
    pub fn attach_tls_on(
        &self,
        conn: TcpStream,
        tls: impl Into<TlsConn>,
        parser: Box<dyn Parser>,
        worker: usize,
    ) -> io::Result<PsockId> {
        if self.user().is_none() {
            return Err(refused());
        }
        let state = PsockTls::new(tls.into());
        let client = state.speaks_first();
        // The mux keeps its own descriptor; dropping `conn` leaves it the only one.
        let id = self.attach_inner(&conn, parser, worker % self.shared().workers.len(), Some(state))?;
        drop(conn);
        self.shared().tls.attached.fetch_add(1, Ordering::Relaxed);
        if client {
            // A client speaks first (ClientHello): a non-blocking write, here
            // with epoll, by the worker with io_uring.
            self.shared().dispatch(&mut vec![Event::PsockTransmit(id)], &mut Ctx::App);
        }
        Ok(id)
    }

    /// The certificate chain the TLS peer of psock `p` presented in its
    /// handshake, leaf first, as the connection's verifier accepted it: with
    /// mutual TLS (a `rustls::ServerConfig` built with a client certificate
    /// verifier, e.g. `rustls::server::WebPkiClientVerifier`) the client's
    /// certificate, from which a handler can tell who its peer is. `None`
    /// until the handshake has completed, for a peer that presented none,
    /// and for a psock not attached with TLS (or no longer attached). One
    /// look in the mux's psock table: meant once per connection, not per
    /// message.
    pub fn tls_peer_certificates(&self, p: PsockId) -> Option<Vec<rustls::pki_types::CertificateDer<'static>>> {
        self.user()?;
        self.shared().psock_rt(p)?.tls_peer.get().cloned()
    }

    /// TLS counters (handshakes, failures, errors).
    pub fn tls_stats(&self) -> TlsStats {
        if self.user().is_none() {
            return TlsStats::default();
        }
        let c = &self.shared().tls;
        TlsStats {
            attached: c.attached.load(Ordering::Relaxed),
            handshakes: c.handshakes.load(Ordering::Relaxed),
            handshake_failures: c.handshake_failures.load(Ordering::Relaxed),
            errors: c.errors.load(Ordering::Relaxed),
        }
    }
}

fn refused() -> io::Error {
    crate::kernel::unsupported(
        "attach_tls",
        "TLS runs in the userspace workers; AF_KCM would need kTLS, which connmux does not set up",
    )
}
