//! TLS to the server, as the ledger URL asks: `sslmode`, `sslrootcert`,
//! `sslcert`, `sslkey` and `sslsni`, with libpq's meanings (below), done
//! by rustls with the ring provider.
//!
//! | `sslmode` | TLS | the server's certificate |
//! |---|---|---|
//! | `disable` | never | - |
//! | `prefer` (the default) | if the server offers it, else plain text | checked against `sslrootcert` if given |
//! | `require` | always | checked against `sslrootcert` if given |
//! | `verify-ca` | always | signed by a CA in `sslrootcert` |
//! | `verify-full` | always | signed by a CA in `sslrootcert`, for the URL's host name |
//!
//! `allow` (plain text unless the server insists) is refused. Unlike
//! libpq, `prefer` does not try plain text again after a failed handshake,
//! and no file is read unless the URL names it (libpq's `~/.postgresql/`
//! defaults are not). `sslrootcert=system` is the machine's trusted roots,
//! with `verify-full` alone (as libpq 16). Files are read when the ledger
//! is opened.

use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::ParsedCertificate;
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use sha2::Digest;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::Socket;
use tokio_postgres::config::SslMode;
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect};

/// The URL's query keys this module takes (and removes before the driver
/// parses the rest).
const KEYS: [&str; 5] = ["sslmode", "sslrootcert", "sslcert", "sslkey", "sslsni"];

/// The `ssl` keys the driver itself reads.
const DRIVER_KEYS: [&str; 1] = ["sslnegotiation"];

/// The ALPN protocol PostgreSQL 17 names (a direct TLS connection,
/// `sslnegotiation=direct`, needs it; older servers ignore it).
const ALPN: &[u8] = b"postgresql";

/// How much TLS the URL asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl Mode {
    fn parse(value: &str) -> Result<Mode, String> {
        Ok(match value {
            "disable" => Mode::Disable,
            "prefer" => Mode::Prefer,
            "require" => Mode::Require,
            "verify-ca" => Mode::VerifyCa,
            "verify-full" => Mode::VerifyFull,
            "allow" => {
                return Err(
                    "sslmode=allow (plain text unless the server insists on TLS) is \
                            not supported; use sslmode=prefer, or require, verify-ca or \
                            verify-full to insist on TLS"
                        .into(),
                );
            }
            other => {
                return Err(format!(
                    "sslmode={other} is not a mode; use disable, prefer, require, verify-ca \
                     or verify-full"
                ));
            }
        })
    }

    fn name(self) -> &'static str {
        match self {
            Mode::Disable => "disable",
            Mode::Prefer => "prefer",
            Mode::Require => "require",
            Mode::VerifyCa => "verify-ca",
            Mode::VerifyFull => "verify-full",
        }
    }

    /// Whether a connection without TLS is refused.
    pub fn insists(self) -> bool {
        matches!(self, Mode::Require | Mode::VerifyCa | Mode::VerifyFull)
    }

    /// The driver's mode: it negotiates, this module verifies.
    pub fn driver(self) -> SslMode {
        match self {
            Mode::Disable => SslMode::Disable,
            Mode::Prefer => SslMode::Prefer,
            Mode::Require | Mode::VerifyCa | Mode::VerifyFull => SslMode::Require,
        }
    }
}

/// Where the CAs that sign the server's certificate come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RootCert {
    /// A PEM file of one or more certificates.
    File(PathBuf),
    /// The machine's trusted roots (`sslrootcert=system`).
    System,
}

impl RootCert {
    fn describe(&self) -> String {
        match self {
            RootCert::File(path) => format!("sslrootcert {}", path.display()),
            RootCert::System => "this machine's trusted roots (sslrootcert=system)".into(),
        }
    }
}

/// What the URL asks of TLS.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    /// `None` when the URL says nothing (the driver's parse decides:
    /// `prefer`, or what a `key=value` string said).
    pub mode: Option<Mode>,
    pub root_cert: Option<RootCert>,
    /// A client certificate (PEM, its chain) and its key (PEM).
    pub client: Option<(PathBuf, PathBuf)>,
    /// Whether the host name is sent (SNI); `sslsni=0` turns it off.
    pub sni: bool,
}

/// Takes the TLS keys out of a `postgres://` URL's query: the URL left for
/// the driver, and what they asked. A `key=value` string is left as it is.
pub fn split(url: &str) -> Result<(String, Settings), String> {
    let mut settings = Settings {
        mode: None,
        root_cert: None,
        client: None,
        sni: true,
    };
    let is_url = url.starts_with("postgres://") || url.starts_with("postgresql://");
    let Some((base, query)) = url.split_once('?').filter(|_| is_url) else {
        return Ok((url.to_string(), settings));
    };
    let (mut cert, mut key) = (None, None);
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let name = decode(name)?;
        if !KEYS.contains(&name.as_str()) {
            if name.starts_with("ssl") && !DRIVER_KEYS.contains(&name.as_str()) {
                return Err(format!(
                    "{name} is not supported; stephost reads sslmode, sslrootcert, sslcert, \
                     sslkey, sslsni and sslnegotiation (an encrypted key must be decrypted: \
                     openssl pkey -in KEY -out PLAIN)"
                ));
            }
            kept.push(pair);
            continue;
        }
        let value = decode(value)?;
        match name.as_str() {
            "sslmode" => settings.mode = Some(Mode::parse(&value)?),
            "sslrootcert" if value == "system" => settings.root_cert = Some(RootCert::System),
            "sslrootcert" => settings.root_cert = Some(RootCert::File(path(&name, &value)?)),
            "sslcert" => cert = Some(path(&name, &value)?),
            "sslkey" => key = Some(path(&name, &value)?),
            "sslsni" => {
                settings.sni = match value.as_str() {
                    "1" => true,
                    "0" => false,
                    other => return Err(format!("sslsni={other}: use 1 (the default) or 0")),
                }
            }
            _ => unreachable!("KEYS are matched above"),
        }
    }
    settings.client = match (cert, key) {
        (Some(cert), Some(key)) => Some((cert, key)),
        (None, None) => None,
        (Some(_), None) => {
            return Err(
                "sslcert names a client certificate but sslkey names no key for it; \
                        give both"
                    .into(),
            );
        }
        (None, Some(_)) => {
            return Err(
                "sslkey names a client key but sslcert names no certificate for it; \
                        give both"
                    .into(),
            );
        }
    };
    check(&mut settings)?;
    let rest = if kept.is_empty() {
        base.to_string()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    Ok((rest, settings))
}

/// Refuses what cannot be honoured, and makes `sslrootcert=system` alone
/// mean `verify-full`.
fn check(settings: &mut Settings) -> Result<(), String> {
    if settings.root_cert == Some(RootCert::System) {
        match settings.mode {
            None => settings.mode = Some(Mode::VerifyFull),
            Some(Mode::VerifyFull) => {}
            Some(mode) => {
                return Err(format!(
                    "sslrootcert=system trusts every CA of this machine, so the host name must \
                     be checked too: use sslmode=verify-full, not {}",
                    mode.name()
                ));
            }
        }
    }
    match settings.mode {
        Some(Mode::Disable) if settings.root_cert.is_some() || settings.client.is_some() => Err(
            "sslmode=disable uses no certificate, yet the URL names one (sslrootcert, \
                 sslcert or sslkey): drop them, or choose a mode that uses TLS"
                .into(),
        ),
        Some(mode @ (Mode::VerifyCa | Mode::VerifyFull)) if settings.root_cert.is_none() => {
            Err(format!(
                "sslmode={} checks the server's certificate against a CA, and the URL names \
                 none: add sslrootcert=PATH (the CA's certificate, PEM){}",
                mode.name(),
                if mode == Mode::VerifyFull {
                    ", or sslrootcert=system for this machine's trusted roots"
                } else {
                    ""
                }
            ))
        }
        _ => Ok(()),
    }
}

fn path(name: &str, value: &str) -> Result<PathBuf, String> {
    if value.is_empty() {
        return Err(format!("{name} is empty; name a file (PEM)"));
    }
    Ok(PathBuf::from(value))
}

/// A query component, percent-decoded (`+` is a `+`, as libpq reads it).
fn decode(text: &str) -> Result<String, String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        if bytes[at] == b'%' {
            let hex = bytes
                .get(at + 1..at + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| format!("{text} has a bad percent escape"))?;
            out.push(hex);
            at += 3;
        } else {
            out.push(bytes[at]);
            at += 1;
        }
    }
    String::from_utf8(out).map_err(|_| format!("{text} is not UTF-8 once decoded"))
}

/// rustls connections as [`Settings`] ask, for the driver.
#[derive(Clone)]
pub struct MakeTls {
    config: Arc<ClientConfig>,
    roots: Option<Arc<str>>,
}

impl MakeTls {
    /// Reads the files `settings` name and makes the rustls configuration
    /// (`mode` is what the connection will use).
    pub fn new(settings: &Settings, mode: Mode) -> Result<MakeTls, String> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let roots = match (&settings.root_cert, mode) {
            (_, Mode::Disable) | (None, _) => None,
            (Some(root_cert), _) => Some(Arc::new(load_roots(root_cert)?)),
        };
        let verifier = Verifier {
            roots,
            check_name: mode == Mode::VerifyFull,
            provider: provider.clone(),
        };
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("cannot set up TLS: {e}"))?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(verifier));
        let mut config = match (&settings.client, mode) {
            (Some((cert, key)), mode) if mode != Mode::Disable => {
                let (chain, private) = load_client(cert, key)?;
                builder.with_client_auth_cert(chain, private).map_err(|e| {
                    format!(
                        "the client certificate {} and key {} cannot be used together: {e}",
                        cert.display(),
                        key.display()
                    )
                })?
            }
            _ => builder.with_no_client_auth(),
        };
        config.alpn_protocols = vec![ALPN.to_vec()];
        config.enable_sni = settings.sni;
        Ok(MakeTls {
            config: Arc::new(config),
            roots: settings
                .root_cert
                .as_ref()
                .map(|r| Arc::from(r.describe().as_str())),
        })
    }
}

fn load_roots(root_cert: &RootCert) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    match root_cert {
        RootCert::File(path) => {
            for cert in read_certs(path, "sslrootcert")? {
                roots.add(cert).map_err(|e| {
                    format!(
                        "sslrootcert {} holds a certificate that cannot be a CA: {e}",
                        path.display()
                    )
                })?;
            }
        }
        RootCert::System => {
            let found = rustls_native_certs::load_native_certs();
            let (added, _) = roots.add_parsable_certificates(found.certs);
            if added == 0 {
                let errors: Vec<String> = found.errors.iter().map(|e| e.to_string()).collect();
                return Err(format!(
                    "sslrootcert=system: this machine has no trusted root certificates{}; \
                     install them (Debian's ca-certificates), set SSL_CERT_FILE, or name the \
                     CA's certificate with sslrootcert=PATH",
                    if errors.is_empty() {
                        String::new()
                    } else {
                        format!(" ({})", errors.join("; "))
                    }
                ));
            }
        }
    }
    Ok(roots)
}

fn read_certs(path: &Path, name: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let bytes =
        std::fs::read(path).map_err(|e| format!("cannot read {name} {}: {e}", path.display()))?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{name} {} is not PEM: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "{name} {} holds no certificate (PEM, -----BEGIN CERTIFICATE-----)",
            path.display()
        ));
    }
    Ok(certs)
}

fn load_client(
    cert: &Path,
    key: &Path,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), String> {
    let chain = read_certs(cert, "sslcert")?;
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(key)
        .map_err(|e| format!("cannot read sslkey {}: {e}", key.display()))?
        .permissions()
        .mode();
    if mode & 0o077 != 0 {
        return Err(format!(
            "sslkey {} is readable by others (mode {:o}); make it its owner's only: chmod 600 {}",
            key.display(),
            mode & 0o777,
            key.display()
        ));
    }
    let bytes =
        std::fs::read(key).map_err(|e| format!("cannot read sslkey {}: {e}", key.display()))?;
    let private = PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| {
        format!(
            "sslkey {} holds no private key that can be used ({e}): PEM, PKCS#8, PKCS#1 or \
             SEC1, not encrypted (openssl pkey -in KEY -out PLAIN decrypts one)",
            key.display()
        )
    })?;
    Ok((chain, private))
}

impl MakeTlsConnect<Socket> for MakeTls {
    type Stream = Stream;
    type TlsConnect = Connect;
    type Error = io::Error;

    fn make_tls_connect(&mut self, domain: &str) -> io::Result<Connect> {
        // A Unix socket has no name; the driver does not ask it for TLS.
        Ok(Connect {
            config: self.config.clone(),
            name: ServerName::try_from(domain.to_string()).ok(),
            domain: domain.into(),
            roots: self.roots.clone(),
        })
    }
}

/// One handshake, with the server `domain`.
pub struct Connect {
    config: Arc<ClientConfig>,
    name: Option<ServerName<'static>>,
    domain: Box<str>,
    roots: Option<Arc<str>>,
}

impl TlsConnect<Socket> for Connect {
    type Stream = Stream;
    type Error = Refused;
    type Future = Pin<Box<dyn Future<Output = Result<Stream, Refused>> + Send>>;

    fn connect(self, socket: Socket) -> Self::Future {
        Box::pin(async move {
            let Some(name) = self.name else {
                return Err(Refused(format!(
                    "{:?} is not a host name TLS can check",
                    self.domain
                )));
            };
            tokio_rustls::TlsConnector::from(self.config)
                .connect(name, socket)
                .await
                .map(Stream)
                .map_err(|e| Refused(explain(&e, &self.domain, self.roots.as_deref())))
        })
    }
}

/// A failed handshake, said with what to change.
#[derive(Debug)]
pub struct Refused(String);

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Refused {}

fn explain(e: &io::Error, domain: &str, roots: Option<&str>) -> String {
    let Some(tls) = e.get_ref().and_then(|e| e.downcast_ref::<rustls::Error>()) else {
        return e.to_string();
    };
    let roots = roots.unwrap_or("sslrootcert");
    match tls {
        rustls::Error::InvalidCertificate(
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
        ) => format!(
            "the server's certificate is not for {domain:?} ({tls}): sslmode=verify-full \
             checks the URL's host name against it; connect by a name it holds, or use \
             sslmode=verify-ca to check the CA alone"
        ),
        rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer) => format!(
            "the server's certificate is not signed by a CA in {roots} ({tls}); name the \
             CA that signed it"
        ),
        rustls::Error::InvalidCertificate(_) => {
            format!("the server's certificate was refused: {tls}")
        }
        rustls::Error::AlertReceived(
            rustls::AlertDescription::CertificateRequired
            | rustls::AlertDescription::HandshakeFailure,
        ) => format!(
            "the server ended the handshake ({tls}); if it wants a client certificate, \
             name one with sslcert and sslkey"
        ),
        other => format!("the TLS handshake failed: {other}"),
    }
}

/// Checks the server's certificate as the mode asks: its chain against the
/// roots if there are any (`verify-ca`, `verify-full`, or `sslrootcert`
/// given), and the host name too for `verify-full`. Whatever the mode,
/// the server must prove it holds the certificate's key.
#[derive(Debug)]
struct Verifier {
    roots: Option<Arc<RootCertStore>>,
    check_name: bool,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for Verifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if let Some(roots) = &self.roots {
            let cert = ParsedCertificate::try_from(end_entity)?;
            rustls::client::verify_server_cert_signed_by_trust_anchor(
                &cert,
                roots,
                intermediates,
                now,
                self.provider.signature_verification_algorithms.all,
            )?;
            if self.check_name {
                rustls::client::verify_server_name(&cert, server_name)?;
            }
        }
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// A TLS connection to the server.
pub struct Stream(tokio_rustls::client::TlsStream<Socket>);

impl tokio_postgres::tls::TlsStream for Stream {
    /// `tls-server-end-point` (RFC 5929): the server's certificate hashed,
    /// so that SCRAM authentication (SCRAM-SHA-256-PLUS) is bound to this
    /// TLS session and a man in the middle cannot relay it.
    fn channel_binding(&self) -> ChannelBinding {
        let (_, session) = self.0.get_ref();
        match session
            .peer_certificates()
            .and_then(|certs| certs.first())
            .and_then(|cert| end_point(cert))
        {
            Some(hash) => ChannelBinding::tls_server_end_point(hash),
            None => ChannelBinding::none(),
        }
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

/// The `tls-server-end-point` hash of a certificate (DER): by its
/// signature's hash, SHA-256 for MD5 and SHA-1 (RFC 5929 §4.1). `None`
/// for a signature with no single hash (Ed25519, RSA-PSS): SCRAM then
/// goes without channel binding, as the server allows.
fn end_point(cert: &[u8]) -> Option<Vec<u8>> {
    let (certificate, _) = der(cert, 0x30)?;
    let (_, after_tbs) = der(certificate, 0x30)?;
    let (algorithm, _) = der(after_tbs, 0x30)?;
    let (oid, _) = der(algorithm, 0x06)?;
    const RSA: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01];
    const ECDSA_SHA1: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x01];
    const ECDSA_SHA2: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03];
    let hash = match oid {
        [prefix @ .., last] if prefix == RSA => match last {
            // md5WithRSAEncryption, sha1WithRSAEncryption
            0x04 | 0x05 => 256,
            0x0b => 256,
            0x0c => 384,
            0x0d => 512,
            0x0e => 224,
            _ => return None,
        },
        _ if oid == ECDSA_SHA1 => 256,
        [prefix @ .., last] if prefix == ECDSA_SHA2 => match last {
            0x01 => 224,
            0x02 => 256,
            0x03 => 384,
            0x04 => 512,
            _ => return None,
        },
        _ => return None,
    };
    Some(match hash {
        224 => sha2::Sha224::digest(cert).to_vec(),
        256 => sha2::Sha256::digest(cert).to_vec(),
        384 => sha2::Sha384::digest(cert).to_vec(),
        _ => sha2::Sha512::digest(cert).to_vec(),
    })
}

/// One DER element with tag `tag` at the start of `input`: its contents
/// and what follows it.
fn der(input: &[u8], tag: u8) -> Option<(&[u8], &[u8])> {
    let (&found, rest) = input.split_first()?;
    if found != tag {
        return None;
    }
    let (&first, mut rest) = rest.split_first()?;
    let length = if first < 0x80 {
        usize::from(first)
    } else {
        let count = usize::from(first & 0x7f);
        if count == 0 || count > 4 {
            return None;
        }
        let (bytes, after) = rest.split_at_checked(count)?;
        rest = after;
        bytes.iter().fold(0, |n, &b| n << 8 | usize::from(b))
    };
    rest.split_at_checked(length)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(url: &str) -> Result<(String, Settings), String> {
        split(url)
    }

    #[test]
    fn the_tls_keys_leave_the_url_and_the_rest_stays_as_written() {
        let (rest, s) = settings(
            "postgres://u@db:5432/x?options=-c%20search_path%3Ds&sslmode=verify-full\
             &sslrootcert=%2Fetc%2Fca.pem&sslcert=/c.pem&sslkey=/k.pem&application_name=a",
        )
        .unwrap();
        assert_eq!(
            rest,
            "postgres://u@db:5432/x?options=-c%20search_path%3Ds&application_name=a"
        );
        assert_eq!(s.mode, Some(Mode::VerifyFull));
        assert_eq!(s.root_cert, Some(RootCert::File("/etc/ca.pem".into())));
        assert_eq!(s.client, Some(("/c.pem".into(), "/k.pem".into())));
        assert!(s.sni);
        let (rest, s) = settings("postgres://u@db/x?sslmode=require&sslsni=0").unwrap();
        assert_eq!(rest, "postgres://u@db/x");
        assert_eq!((s.mode, s.sni), (Some(Mode::Require), false));
        // The driver reads sslnegotiation; a key=value string is its own.
        let (rest, _) = settings("postgres://db/x?sslnegotiation=direct").unwrap();
        assert_eq!(rest, "postgres://db/x?sslnegotiation=direct");
        let (rest, s) = settings("host=db sslmode=require").unwrap();
        assert_eq!((rest.as_str(), s.mode), ("host=db sslmode=require", None));
    }

    #[test]
    fn a_mode_that_cannot_be_honoured_is_refused_saying_what_to_do() {
        let refused = |url: &str, says: &str| {
            let e = settings(url).unwrap_err();
            assert!(e.contains(says), "{url}: {e}");
        };
        refused("postgres://db/x?sslmode=allow", "sslmode=prefer");
        refused("postgres://db/x?sslmode=verify-everything", "verify-full");
        refused("postgres://db/x?sslmode=verify-ca", "sslrootcert=PATH");
        refused("postgres://db/x?sslmode=verify-full", "sslrootcert=system");
        refused(
            "postgres://db/x?sslmode=require&sslrootcert=system",
            "sslmode=verify-full",
        );
        refused(
            "postgres://db/x?sslmode=disable&sslrootcert=/ca.pem",
            "drop them",
        );
        refused("postgres://db/x?sslcert=/c.pem", "give both");
        refused("postgres://db/x?sslkey=/k.pem", "give both");
        refused("postgres://db/x?sslpassword=x", "decrypt");
        refused("postgres://db/x?sslcrl=/crl.pem", "sslcrl is not supported");
        refused("postgres://db/x?sslrootcert=", "is empty");
        refused("postgres://db/x?sslrootcert=%zz", "percent");
        // The machine's roots alone mean verify-full.
        let (_, s) = settings("postgres://db/x?sslrootcert=system").unwrap();
        assert_eq!(s.mode, Some(Mode::VerifyFull));
    }

    #[test]
    fn a_certificate_file_that_cannot_be_used_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "not a certificate\n").unwrap();
        let settings = |root: &Path| Settings {
            mode: Some(Mode::VerifyCa),
            root_cert: Some(RootCert::File(root.to_path_buf())),
            client: None,
            sni: true,
        };
        let e = MakeTls::new(&settings(&junk), Mode::VerifyCa)
            .err()
            .unwrap();
        assert!(e.contains("holds no certificate"), "{e}");
        let missing = dir.path().join("missing.pem");
        let e = MakeTls::new(&settings(&missing), Mode::VerifyCa)
            .err()
            .unwrap();
        assert!(e.contains("cannot read sslrootcert"), "{e}");
    }

    #[test]
    fn the_end_point_hash_follows_the_certificates_signature() {
        // A certificate is SEQUENCE { tbs, SEQUENCE { OID, ... }, BIT STRING }.
        let with = |oid: &[u8]| {
            let mut algorithm = vec![0x06, oid.len() as u8];
            algorithm.extend_from_slice(oid);
            let mut body = vec![0x30, 0x02, 0x05, 0x00];
            body.extend([0x30, algorithm.len() as u8]);
            body.extend(algorithm);
            body.extend([0x03, 0x01, 0x00]);
            let mut cert = vec![0x30, body.len() as u8];
            cert.extend(body);
            cert
        };
        let ecdsa_sha384 = with(&[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x03]);
        assert_eq!(
            end_point(&ecdsa_sha384),
            Some(sha2::Sha384::digest(&ecdsa_sha384).to_vec())
        );
        let rsa_sha1 = with(&[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x05]);
        assert_eq!(
            end_point(&rsa_sha1),
            Some(sha2::Sha256::digest(&rsa_sha1).to_vec())
        );
        let ed25519 = with(&[0x2b, 0x65, 0x70]);
        assert_eq!(end_point(&ed25519), None);
        assert_eq!(end_point(&[0x30, 0x85, 0, 0, 0, 0, 1]), None);
    }
}
