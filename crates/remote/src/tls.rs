//! Which certificates a tool server reached over `https://` may present.
//!
//! rustls on `ring` with the Mozilla roots of `webpki-roots` — the same stack the model crate's
//! OpenAI client uses, so TLS adds no crate to the build — and, when the deployment names one,
//! the certificate authorities of a PEM file (`COUNTERSIGN_TOOL_SERVERS_CA_FILE`): tool servers
//! usually live on an internal network under an internal CA. Verification is never switched
//! off; a server whose certificate does not chain to a trusted root, or does not name the host
//! of its URL, fails the handshake (`remote_tls`) and is sent nothing.

use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::header::HeaderValue;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use rustls::{ClientConfig, RootCertStore};

use crate::RemoteError;

/// The roots a tool server's certificate is verified against.
#[derive(Clone)]
pub struct Trust {
    config: Arc<ClientConfig>,
    extra_roots: usize,
}

impl fmt::Debug for Trust {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Trust")
            .field("extra_roots", &self.extra_roots)
            .finish_non_exhaustive()
    }
}

impl Trust {
    /// The Mozilla roots, and every certificate of the PEM file `ca_file` when given. A file
    /// that cannot be read, holds something that is not a certificate, or holds none, is
    /// refused ([`RemoteError::CaFile`]).
    pub fn new(ca_file: Option<&Path>) -> Result<Trust, RemoteError> {
        let mut roots = RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        };
        let mut extra_roots = 0;
        if let Some(path) = ca_file {
            let unusable = |reason: String| RemoteError::CaFile {
                path: path.display().to_string(),
                reason,
            };
            let certificates = CertificateDer::pem_file_iter(path)
                .map_err(|e| unusable(e.to_string()))?
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| unusable(e.to_string()))?;
            if certificates.is_empty() {
                return Err(unusable("it holds no PEM certificate".to_owned()));
            }
            for certificate in certificates {
                roots
                    .add(certificate)
                    .map_err(|e| unusable(e.to_string()))?;
                extra_roots += 1;
            }
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| RemoteError::BadConfiguration(format!("TLS: {e}")))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(Trust {
            config: Arc::new(config),
            extra_roots,
        })
    }

    /// How many roots the CA file added.
    pub fn extra_roots(&self) -> usize {
        self.extra_roots
    }

    /// The rustls configuration that verifies against these roots.
    pub(crate) fn client_config(&self) -> ClientConfig {
        ClientConfig::clone(&self.config)
    }

    /// A pooled HTTP/1 client for a tool server, `http://` or `https://` with its certificate
    /// verified against these roots: the one client the remote tools and the MCP servers
    /// reached over the network use.
    pub fn https_client(
        &self,
        connect_timeout: Option<Duration>,
        pool_idle_timeout: Duration,
    ) -> Client<HttpsConnector<HttpConnector>, Full<Bytes>> {
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_connect_timeout(connect_timeout);
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(self.client_config())
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(pool_idle_timeout)
            .build(connector)
    }
}

/// The `Authorization: Bearer` header of `secret`, marked sensitive so that it is never
/// printed; `None` when the secret cannot be sent in a header.
pub fn bearer(secret: &str) -> Option<HeaderValue> {
    let mut value = HeaderValue::from_str(&format!("Bearer {secret}")).ok()?;
    value.set_sensitive(true);
    Some(value)
}

/// Whether `error`, or an error it was caused by, is a TLS failure (the handshake, the
/// certificate, a peer that does not speak TLS).
pub fn is_tls_failure(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(error);
    while let Some(e) = next {
        if e.is::<rustls::Error>() {
            return true;
        }
        // An I/O error holds the error it wraps without naming it as its source (hyper-rustls
        // wraps tokio-rustls's I/O error, which wraps the rustls error).
        next = match e.downcast_ref::<std::io::Error>() {
            Some(io) => io
                .get_ref()
                .map(|inner| inner as &(dyn std::error::Error + 'static)),
            None => e.source(),
        };
    }
    false
}
