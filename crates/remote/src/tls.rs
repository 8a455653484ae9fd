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

    /// The rustls configuration that verifies against these roots, for a client of its own.
    pub fn client_config(&self) -> ClientConfig {
        ClientConfig::clone(&self.config)
    }
}

/// Whether `error`, or an error it was caused by, is a TLS failure (the handshake, the
/// certificate, a peer that does not speak TLS).
pub(crate) fn is_tls_failure(error: &(dyn std::error::Error + 'static)) -> bool {
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
