//! `--tls` for the servers and the load generators: certificates from PEM
//! files, or generated for a loopback demo; client trust from a CA file, or
//! none at all with `--tls-insecure` (loopback demos and benchmarks only);
//! mutual TLS with `--tls-client-ca` (a server asks every client for a
//! certificate that CA signed) and `--tls-client-cert`/`--tls-client-key`
//! (a load generator presents one).
//!
//! The servers run TLS in the connmux runtime (`Service::start_tls`, TLS
//! psocks); the load generators use rustls over their own blocking sockets
//! (`loadgen::conn`). Both use the rustls that connmux re-exports, so there is
//! one version in the build.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context};
use connmux::tls::rustls;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, UnixTime};

/// `--tls` options of a server.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ServerTls {
    /// Speak TLS (rustls, TLS 1.2/1.3) on every connection; framing applies to
    /// the decrypted stream. Without --tls-cert/--tls-key a CA and a
    /// certificate for localhost, 127.0.0.1 and the listen address are
    /// generated, and the CA is written to --tls-ca-out for clients to trust.
    #[arg(long)]
    pub tls: bool,
    /// Certificate chain (PEM), leaf first.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// Private key (PEM: PKCS#8, PKCS#1 or SEC1).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Where to write the generated CA certificate (PEM) [default:
    /// <server>-<pid>-ca.pem in $XDG_RUNTIME_DIR/connmux or /tmp/connmux-<uid>,
    /// removed when the server stops: the CA is made anew each run]. A file
    /// named here is left in place.
    #[arg(long, value_name = "FILE", conflicts_with = "tls_cert")]
    pub tls_ca_out: Option<PathBuf>,
    /// Mutual TLS: ask every client for a certificate and accept only one
    /// this CA (PEM) signed. A client with none, or with another CA's,
    /// fails the handshake and its connection is closed (counted in
    /// tls_handshake_failures). Needs --tls.
    #[arg(long, value_name = "FILE")]
    pub tls_client_ca: Option<PathBuf>,
}

impl ServerTls {
    /// Whether TLS was asked for.
    pub fn wanted(&self) -> bool {
        self.tls || self.tls_cert.is_some()
    }

    /// The server configuration `--tls` asks for (None without --tls): see
    /// [`ServerTlsSetup`].
    pub fn config(&self, listen: SocketAddr, what: &str) -> anyhow::Result<Option<ServerTlsSetup>> {
        if !self.wanted() {
            if self.tls_client_ca.is_some() {
                bail!("--tls-client-ca asks clients for certificates over TLS: add --tls");
            }
            return Ok(None);
        }
        let (chain, key, mut note, ca_file) = match (&self.tls_cert, &self.tls_key) {
            (Some(c), Some(k)) => {
                let chain = read_certs(c)?;
                let key =
                    PrivateKeyDer::from_pem_file(k).with_context(|| format!("reading the key {}", k.display()))?;
                (chain, key, format!("TLS certificate {}", c.display()), None)
            }
            _ => {
                let mut names = vec!["localhost".to_string(), "127.0.0.1".to_string(), "::1".to_string()];
                if !listen.ip().is_unspecified() && !names.contains(&listen.ip().to_string()) {
                    names.push(listen.ip().to_string());
                }
                let g = generate(&names)?;
                let (out, ours) = match &self.tls_ca_out {
                    Some(p) => (p.clone(), false),
                    None => {
                        (crate::cmd::stat::default_dir().join(format!("{what}-{}-ca.pem", std::process::id())), true)
                    }
                };
                if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
                    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
                }
                std::fs::write(&out, &g.ca_pem).with_context(|| format!("writing {}", out.display()))?;
                let note = format!(
                    "TLS certificate generated for {}; clients trust it with --tls-ca {}",
                    names.join(", "),
                    out.display()
                );
                let ca_file = ours.then(|| RemovedOnDrop(out));
                (vec![g.cert], PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(g.key)), note, ca_file)
            }
        };
        let builder = rustls::ServerConfig::builder_with_provider(provider()).with_safe_default_protocol_versions()?;
        let builder = match &self.tls_client_ca {
            None => builder.with_no_client_auth(),
            Some(ca) => {
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(roots(ca)?, provider())
                    .build()
                    .with_context(|| format!("{}: cannot check client certificates with it", ca.display()))?;
                note.push_str(&format!("; clients must present a certificate signed by {}", ca.display()));
                builder.with_client_cert_verifier(verifier)
            }
        };
        let cfg = builder.with_single_cert(chain, key).context("the certificate and key do not go together")?;
        Ok(Some(ServerTlsSetup { config: Arc::new(cfg), note, _ca_file: ca_file }))
    }
}

/// What a server's `--tls` set up: the rustls configuration, a line saying
/// where the certificate comes from, and the generated CA's file when it
/// lies at the default place (removed when this is dropped, as the server
/// stops: the CA is only good for this run).
pub struct ServerTlsSetup {
    pub config: Arc<rustls::ServerConfig>,
    pub note: String,
    _ca_file: Option<RemovedOnDrop>,
}

/// A file removed when this is dropped.
struct RemovedOnDrop(PathBuf);

impl Drop for RemovedOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// `--tls` options of a load generator.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ClientTls {
    /// Speak TLS to the server (the handshake is done before the round's
    /// clock starts). Needs --tls-ca or --tls-insecure.
    #[arg(long)]
    pub tls: bool,
    /// Trust the server certificates this CA (PEM) signed, e.g. the one a
    /// server with a generated certificate wrote.
    #[arg(long, value_name = "FILE", requires = "tls")]
    pub tls_ca: Option<PathBuf>,
    /// Do not check the server's certificate at all (a loopback demo or a
    /// benchmark; never across a network).
    #[arg(long, requires = "tls", conflicts_with = "tls_ca")]
    pub tls_insecure: bool,
    /// Name to check the server's certificate against [default: the target's
    /// host as given, or its address].
    #[arg(long, value_name = "NAME", requires = "tls")]
    pub tls_name: Option<String>,
    /// Mutual TLS: the certificate chain (PEM, leaf first) to present to a
    /// server that asks for one (`--tls-client-ca` there).
    #[arg(long, value_name = "FILE", requires_all = ["tls", "tls_client_key"])]
    pub tls_client_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-client-cert.
    #[arg(long, value_name = "FILE", requires = "tls_client_cert")]
    pub tls_client_key: Option<PathBuf>,
}

/// A client's TLS: configuration and the name the certificate must carry.
#[derive(Clone, Debug)]
pub struct ClientSetup {
    pub config: Arc<rustls::ClientConfig>,
    pub name: ServerName<'static>,
}

impl ClientTls {
    /// The client setup `--tls` asks for (None without --tls); `host` is the
    /// target's host as the user wrote it, `addr` the address it resolved to.
    pub fn setup(&self, host: Option<&str>, addr: Option<IpAddr>) -> anyhow::Result<Option<ClientSetup>> {
        if !self.tls {
            return Ok(None);
        }
        let builder = rustls::ClientConfig::builder_with_provider(provider()).with_safe_default_protocol_versions()?;
        let builder = if self.tls_insecure {
            builder.dangerous().with_custom_certificate_verifier(Arc::new(NoCheck(provider())))
        } else {
            let Some(ca) = &self.tls_ca else {
                bail!("--tls needs --tls-ca FILE (the server's CA) or --tls-insecure");
            };
            builder.with_root_certificates(roots(ca)?)
        };
        let config = match (&self.tls_client_cert, &self.tls_client_key) {
            (Some(c), Some(k)) => {
                let key =
                    PrivateKeyDer::from_pem_file(k).with_context(|| format!("reading the key {}", k.display()))?;
                builder.with_client_auth_cert(read_certs(c)?, key).with_context(|| {
                    format!("{} with {}: not a usable client certificate and key", c.display(), k.display())
                })?
            }
            _ => builder.with_no_client_auth(),
        };
        let name = match (&self.tls_name, host) {
            (Some(n), _) => n.clone(),
            (None, Some(h)) => h.to_string(),
            (None, None) => addr.map(|a| a.to_string()).unwrap_or_else(|| "localhost".into()),
        };
        let name = ServerName::try_from(name.clone())
            .map_err(|_| anyhow::anyhow!("{name:?} is not a valid TLS server name"))?;
        Ok(Some(ClientSetup { config: Arc::new(config), name }))
    }
}

/// The crypto of every configuration here: ring, the one provider built.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The CA certificates of a PEM file, as trust anchors.
fn roots(ca: &Path) -> anyhow::Result<Arc<rustls::RootCertStore>> {
    let mut roots = rustls::RootCertStore::empty();
    for c in read_certs(ca)? {
        roots.add(c).with_context(|| format!("{}: not a usable CA certificate", ca.display()))?;
    }
    Ok(Arc::new(roots))
}

fn read_certs(path: &Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(path)
        .with_context(|| format!("reading {}", path.display()))?
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("parsing {}", path.display()))?;
    if certs.is_empty() {
        bail!("{}: no certificate in it", path.display());
    }
    Ok(certs)
}

/// A generated CA and a certificate it signed.
pub struct Generated {
    pub ca_pem: String,
    pub cert: CertificateDer<'static>,
    /// PKCS#8 DER.
    pub key: Vec<u8>,
}

/// A CA and a server certificate for `names` (DNS names or IP addresses).
/// A CA rather than one self-signed certificate: WebPKI verifiers (rustls's,
/// and Python's and OpenSSL's with default settings) do not accept an end
/// certificate as its own trust anchor.
pub fn generate(names: &[String]) -> anyhow::Result<Generated> {
    let ca_key = rcgen::KeyPair::generate()?;
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(rcgen::DnType::CommonName, "connmux generated CA");
    ca_params.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign, rcgen::KeyUsagePurpose::DigitalSignature];
    let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key)?;
    let key = rcgen::KeyPair::generate()?;
    let mut params = rcgen::CertificateParams::new(names.to_vec())?;
    params.distinguished_name.push(rcgen::DnType::CommonName, names.first().map(String::as_str).unwrap_or("connmux"));
    let cert = params.signed_by(&key, &ca)?;
    Ok(Generated { ca_pem: ca.pem(), cert: cert.der().clone(), key: key.serialize_der() })
}

/// `--tls-insecure`: accepts any certificate, still checks the handshake's
/// signatures (so the peer does hold the key of the certificate it sent).
#[derive(Debug)]
struct NoCheck(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for NoCheck {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
