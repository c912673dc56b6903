//! TLS on attached connections from C: a configuration made from PEM files
//! (a server's, with mutual TLS when it names a client CA, or a client's),
//! `connmux_attach_tls`, the peer's certificate and the TLS counters. The
//! record work is the `connmux` crate's (`Mux::attach_tls`), as for Rust
//! callers.

use std::ffi::{c_char, c_int, c_void};
use std::sync::Arc;

use connmux_rs::tls::rustls;
use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

use crate::error::{guard, guard_int, Fail};
use crate::{borrow_fd, bytes_mut, c_str, connmux_mux, connmux_parser, connmux_psock_id, error, mux_ref, ok, out};
use crate::{parser_ref, psock_required, put_psock};

const TLS_MAGIC: u64 = 0x636f_6e6e_746c_7331; // "conntls1"

/// A TLS configuration for `connmux_attach_tls`: a server's (its certificate
/// and key, and with mutual TLS the CA whose client certificates it
/// accepts) or a client's (the CA it trusts, the name the server's
/// certificate must carry, and optionally its own certificate). Immutable
/// and thread-safe: one serves any number of connections. Created by
/// `connmux_tls_server_new`/`connmux_tls_client_new`, released by
/// `connmux_tls_free` (connections attached with it go on).
pub struct connmux_tls {
    magic: u64,
    side: Side,
}

enum Side {
    Server(Arc<rustls::ServerConfig>),
    Client(Arc<rustls::ClientConfig>, ServerName<'static>),
}

/// TLS counters of a mux (`connmux_tls_get_stats`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct connmux_tls_stats {
    /// Connections attached with TLS.
    pub attached: u64,
    /// Handshakes completed.
    pub handshakes: u64,
    /// Handshakes that failed (not TLS, a refused certificate, an alert, a
    /// close during the handshake).
    pub handshake_failures: u64,
    /// Errors after the handshake (an alert, a forged record, a close in
    /// the middle of a message).
    pub errors: u64,
}

/// # Safety
/// `p` is null or a pointer from `connmux_tls_*_new` not yet freed.
unsafe fn tls_ref<'a>(p: *const connmux_tls) -> Result<&'a connmux_tls, Fail> {
    // SAFETY: by the header's contract `p` is null or a live handle.
    let t = unsafe { p.as_ref() }.ok_or_else(|| Fail::null("tls"))?;
    if t.magic != TLS_MAGIC {
        return Err(Fail::new(libc::EBADF, "not a live connmux_tls handle"));
    }
    Ok(t)
}

impl crate::Handle for connmux_tls {
    fn magic(&mut self) -> &mut u64 {
        &mut self.magic
    }
}

/// A server's configuration, for a service's connections
/// (`connmux_service_start_tls`); -EINVAL for a client's.
///
/// # Safety
/// `p` is null or a pointer from `connmux_tls_*_new` not yet freed.
pub(crate) unsafe fn server_config(p: *const connmux_tls) -> Result<Arc<rustls::ServerConfig>, Fail> {
    // SAFETY: forwarded contract of this function.
    match &unsafe { tls_ref(p) }?.side {
        Side::Server(c) => Ok(c.clone()),
        Side::Client(..) => Err(Fail::inval("a service needs a server's TLS configuration (connmux_tls_server_new)")),
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A PEM file that could not be read (its errno) or parsed (EINVAL).
fn pem_fail(path: &str, e: pem::Error) -> Fail {
    match e {
        pem::Error::Io(io) => Fail::new(error::errno_of(&io), format!("{path}: {io}")),
        other => Fail::inval(format!("{path}: not usable PEM ({other:?})")),
    }
}

fn read_certs(path: &str) -> Result<Vec<CertificateDer<'static>>, Fail> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| pem_fail(path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_fail(path, e))?;
    if certs.is_empty() {
        return Err(Fail::inval(format!("{path}: no certificate in it")));
    }
    Ok(certs)
}

fn read_key(path: &str) -> Result<PrivateKeyDer<'static>, Fail> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| pem_fail(path, e))
}

fn roots(path: &str) -> Result<Arc<rustls::RootCertStore>, Fail> {
    let mut roots = rustls::RootCertStore::empty();
    for c in read_certs(path)? {
        roots.add(c).map_err(|e| Fail::inval(format!("{path}: not a usable CA certificate: {e}")))?;
    }
    Ok(Arc::new(roots))
}

fn new_tls(side: Side, slot: &mut *mut connmux_tls) {
    *slot = Box::into_raw(Box::new(connmux_tls { magic: TLS_MAGIC, side }));
}

/// A server's TLS configuration (TLS 1.2/1.3, rustls with ring) from PEM
/// files: `cert_pem` its certificate chain (leaf first) and `key_pem` its
/// private key (PKCS#8, PKCS#1 or SEC1). With `client_ca_pem` (NULL: none)
/// every client must present a certificate that CA signed (mutual TLS); a
/// client with none, or another CA's, fails its handshake, a psock failure
/// counted in `handshake_failures`. Returns 0 and the configuration in
/// `*out` (free it with `connmux_tls_free`); -ENOENT (or the file's errno)
/// for a file that cannot be read, -EINVAL for one that holds no usable
/// certificate or key, or a key that does not go with the certificate.
///
/// # Safety
/// `cert_pem` and `key_pem` are NUL-terminated paths, `client_ca_pem` is
/// NULL or one; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn connmux_tls_server_new(
    cert_pem: *const c_char,
    key_pem: *const c_char,
    client_ca_pem: *const c_char,
    out_tls: *mut *mut connmux_tls,
) -> c_int {
    guard_int(|| {
        // SAFETY: forwarded contract of this function.
        let slot = unsafe { out(out_tls, "out") }?;
        *slot = std::ptr::null_mut();
        // SAFETY: forwarded contract of this function.
        let (cert, key) = unsafe { (c_str(cert_pem, "cert_pem")?, c_str(key_pem, "key_pem")?) };
        let builder = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| Fail::inval(e.to_string()))?;
        let builder = if client_ca_pem.is_null() {
            builder.with_no_client_auth()
        } else {
            // SAFETY: non-null, so a NUL-terminated path by contract.
            let ca = unsafe { c_str(client_ca_pem, "client_ca_pem") }?;
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(roots(ca)?, provider())
                .build()
                .map_err(|e| Fail::inval(format!("{ca}: cannot check client certificates with it: {e}")))?;
            builder.with_client_cert_verifier(verifier)
        };
        let config = builder
            .with_single_cert(read_certs(cert)?, read_key(key)?)
            .map_err(|e| Fail::inval(format!("{cert} with {key}: {e}")))?;
        new_tls(Side::Server(Arc::new(config)), slot);
        Ok(0)
    })
}

/// A client's TLS configuration from PEM files: it trusts the server
/// certificates `ca_pem` signed and checks that they are for
/// `server_name` (a DNS name or an IP address). With `cert_pem` and
/// `key_pem` (both NULL: none) it presents that certificate to a server
/// that asks for one. Returns 0 and the configuration in `*out`; errors
/// as `connmux_tls_server_new`, and -EINVAL for a bad server name or only
/// one of `cert_pem` and `key_pem`.
///
/// # Safety
/// `ca_pem` and `server_name` are NUL-terminated strings, `cert_pem` and
/// `key_pem` NULL or such; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn connmux_tls_client_new(
    ca_pem: *const c_char,
    server_name: *const c_char,
    cert_pem: *const c_char,
    key_pem: *const c_char,
    out_tls: *mut *mut connmux_tls,
) -> c_int {
    guard_int(|| {
        // SAFETY: forwarded contract of this function.
        let slot = unsafe { out(out_tls, "out") }?;
        *slot = std::ptr::null_mut();
        // SAFETY: forwarded contract of this function.
        let (ca, name) = unsafe { (c_str(ca_pem, "ca_pem")?, c_str(server_name, "server_name")?) };
        let name = ServerName::try_from(name.to_owned())
            .map_err(|_| Fail::inval(format!("{name:?} is not a valid TLS server name")))?;
        let builder = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| Fail::inval(e.to_string()))?
            .with_root_certificates(roots(ca)?);
        let config = match (cert_pem.is_null(), key_pem.is_null()) {
            (true, true) => builder.with_no_client_auth(),
            (false, false) => {
                // SAFETY: both non-null, so NUL-terminated paths by contract.
                let (cert, key) = unsafe { (c_str(cert_pem, "cert_pem")?, c_str(key_pem, "key_pem")?) };
                builder
                    .with_client_auth_cert(read_certs(cert)?, read_key(key)?)
                    .map_err(|e| Fail::inval(format!("{cert} with {key}: {e}")))?
            }
            _ => return Err(Fail::inval("cert_pem and key_pem go together: both or neither")),
        };
        new_tls(Side::Client(Arc::new(config), name), slot);
        Ok(0)
    })
}

/// Release a TLS configuration (NULL is ignored). Connections attached
/// with it keep it.
///
/// # Safety
/// `tls` is NULL or a live configuration, not used again after this call.
#[no_mangle]
pub unsafe extern "C" fn connmux_tls_free(tls: *mut connmux_tls) {
    // SAFETY: forwarded contract of this function.
    unsafe { crate::release(tls, tls_ref) }
}

/// SIOCKCMATTACH for a connection that speaks TLS: as `connmux_attach`
/// (the mux takes its own duplicate of `fd`; the caller closes its own),
/// with the parser framing the decrypted stream and `tls` saying which side
/// this end is. The handshake runs on the mux's worker; messages are framed
/// once it has completed, and messages sent before then wait. A failed
/// handshake or a TLS error is a psock failure (`connmux_next_event`,
/// `CONNMUX_PSOCK_ERR_RX` with EBADMSG) counted in `connmux_tls_get_stats`.
/// Errors as `connmux_attach`; -EOPNOTSUPP on a mux running on the
/// kernel's AF_KCM.
///
/// # Safety
/// `mux`, `parser` and `tls` are live handles; `fd` stays open during the
/// call; `psock` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn connmux_attach_tls(
    mux: *const connmux_mux,
    fd: c_int,
    parser: *const connmux_parser,
    tls: *const connmux_tls,
    psock: *mut connmux_psock_id,
) -> c_int {
    guard_int(|| {
        // SAFETY: forwarded contract of this function.
        let m = unsafe { mux_ref(mux) }?;
        // SAFETY: forwarded contract of this function.
        let p = unsafe { parser_ref(parser) }?;
        // SAFETY: forwarded contract of this function.
        let t = unsafe { tls_ref(tls) }?;
        // SAFETY: forwarded contract of this function.
        let conn = std::net::TcpStream::from(unsafe { borrow_fd(fd) }?.try_clone_to_owned()?);
        let session: connmux_rs::tls::TlsConn = match &t.side {
            Side::Server(c) => rustls::ServerConnection::new(c.clone()).map_err(|e| Fail::inval(e.to_string()))?.into(),
            Side::Client(c, name) => {
                rustls::ClientConnection::new(c.clone(), name.clone()).map_err(|e| Fail::inval(e.to_string()))?.into()
            }
        };
        let id = m.mux.attach_tls(conn, session, p.kind.build()?)?;
        // SAFETY: forwarded contract of this function.
        unsafe { put_psock(psock, id) };
        Ok(0)
    })
}

/// The certificate the TLS peer of `psock` presented in its handshake (the
/// leaf, DER): with mutual TLS, the client's, from which a server tells who
/// its client is. Returns the certificate's length, and copies it into
/// `buf` when that is at most `len` (call with `len` 0 to learn the size);
/// -ENOENT while the handshake has not completed, for a peer that presented
/// none, and for a connection not attached with TLS.
///
/// # Safety
/// `mux` is a live handle; `buf` is valid for writing `len` bytes (or `len`
/// is 0).
#[no_mangle]
pub unsafe extern "C" fn connmux_tls_peer_certificate(
    mux: *const connmux_mux,
    psock: connmux_psock_id,
    buf: *mut c_void,
    len: usize,
) -> isize {
    guard(|| {
        // SAFETY: forwarded contract of this function.
        let m = unsafe { mux_ref(mux) }?;
        let p = psock_required(psock)?;
        let chain = m.mux.tls_peer_certificates(p).unwrap_or_default();
        let Some(leaf) = chain.first() else {
            return Err(Fail::new(libc::ENOENT, "no peer certificate (not TLS, not yet, or none presented)"));
        };
        let der = leaf.as_ref();
        if der.len() <= len {
            // SAFETY: forwarded contract of this function.
            unsafe { bytes_mut(buf, len, "buf") }?[..der.len()].copy_from_slice(der);
        }
        ok(der.len())
    })
}

/// The mux's TLS counters into `*st`. Returns 0.
///
/// # Safety
/// `mux` is a live handle; `st` is writable.
#[no_mangle]
pub unsafe extern "C" fn connmux_tls_get_stats(mux: *const connmux_mux, st: *mut connmux_tls_stats) -> c_int {
    guard_int(|| {
        // SAFETY: forwarded contract of this function.
        let m = unsafe { mux_ref(mux) }?;
        // SAFETY: forwarded contract of this function.
        let st = unsafe { out(st, "st") }?;
        let t = m.mux.tls_stats();
        *st = connmux_tls_stats {
            attached: t.attached,
            handshakes: t.handshakes,
            handshake_failures: t.handshake_failures,
            errors: t.errors,
        };
        Ok(0)
    })
}
