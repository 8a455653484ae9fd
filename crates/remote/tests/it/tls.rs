//! The client over `https://`: the canned server behind TLS with the test certificate
//! (`tls/`, signed by the test CA for 127.0.0.1 and localhost; `tls/make-certificates.sh`
//! makes them again). The client trusts the test CA only when told to through the CA file,
//! and never accepts a certificate it cannot verify.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use countersign_core::Principal;
use countersign_remote::{RemoteToolServer, Trust};
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use secrecy::SecretString;
use serde_json::json;

use crate::client::{canned, serve, tight, tool, Canned};

pub(crate) fn tls_file(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/it/tls")
        .join(name)
}

/// The trust of a deployment whose CA file names the test CA.
pub(crate) fn test_ca() -> Trust {
    Trust::new(Some(&tls_file("ca.pem"))).expect("the test CA file is usable")
}

struct TlsServer {
    url: String,
    canned: Arc<Canned>,
    /// Connections whose TLS handshake completed.
    handshakes: Arc<AtomicUsize>,
}

/// The canned server (200 with `body`) over TLS on `ip`, with the test certificate.
async fn serve_tls(ip: &str, body: &str) -> TlsServer {
    let certificates = CertificateDer::pem_file_iter(tls_file("server.pem"))
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_file(tls_file("server.key")).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(certificates, key)
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let (app, canned) = canned(200, body, Duration::ZERO);
    let listener = tokio::net::TcpListener::bind((ip, 0)).await.unwrap();
    let address = listener.local_addr().unwrap();
    let handshakes = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&handshakes);
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let (acceptor, app, counted) = (acceptor.clone(), app.clone(), Arc::clone(&counted));
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(stream).await else {
                    return;
                };
                counted.fetch_add(1, Ordering::SeqCst);
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), TowerToHyperService::new(app))
                    .await;
            });
        }
    });
    TlsServer {
        url: format!("https://{address}"),
        canned,
        handshakes,
    }
}

fn server(url: &str, trust: &Trust) -> RemoteToolServer {
    RemoteToolServer::with_trust("canned", url, &SecretString::from("s"), tight(), trust).unwrap()
}

#[tokio::test]
async fn a_tool_server_over_https_whose_certificate_chains_to_the_ca_file_is_discovered_and_previewed(
) {
    let tls = serve_tls("127.0.0.1", r#"{"lines":["page \"home\""]}"#).await;
    let trust = test_ca();
    assert_eq!(trust.extra_roots(), 1);
    let tools = server(&tls.url, &trust).discover_tools().await.unwrap();
    let lines = tool(&tools, "absolute")
        .previewer()
        .unwrap()
        .preview(&Principal::new("editor", false), &json!({"page": "home"}))
        .await
        .unwrap();
    assert_eq!(lines, vec!["page \"home\""]);
    assert_eq!(tls.canned.posts.load(Ordering::SeqCst), 1);

    // localhost is named by the certificate too.
    let port = tls.url.rsplit(':').next().unwrap();
    let by_name = server(&format!("https://localhost:{port}"), &trust);
    assert_eq!(by_name.discover_tools().await.unwrap().len(), 2);
}

#[tokio::test]
async fn a_certificate_no_trusted_root_signed_fails_the_handshake_as_remote_tls_and_nothing_is_sent(
) {
    let tls = serve_tls("127.0.0.1", r#"{"lines":["x"]}"#).await;
    // The Mozilla roots only: the test CA is not among them.
    let public = Trust::new(None).unwrap();
    let e = server(&tls.url, &public)
        .discover_tools()
        .await
        .unwrap_err();
    assert_eq!(e.code(), "remote_tls");
    assert_eq!(tls.handshakes.load(Ordering::SeqCst), 0);
    assert_eq!(tls.canned.posts.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_certificate_for_another_address_fails_the_handshake_as_remote_tls() {
    // 127.0.0.2 is loopback on Linux, but the certificate names 127.0.0.1 and localhost only.
    let tls = serve_tls("127.0.0.2", r#"{"lines":["x"]}"#).await;
    let e = server(&tls.url, &test_ca())
        .discover_tools()
        .await
        .unwrap_err();
    assert_eq!(e.code(), "remote_tls");
    assert_eq!(tls.handshakes.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_plain_http_server_named_by_an_https_url_fails_as_remote_tls() {
    let (url, canned) = serve(200, r#"{"lines":["x"]}"#, Duration::ZERO).await;
    let https = url.replacen("http://", "https://", 1);
    let e = server(&https, &test_ca())
        .discover_tools()
        .await
        .unwrap_err();
    assert_eq!(e.code(), "remote_tls");
    assert_eq!(canned.posts.load(Ordering::SeqCst), 0);
}

#[test]
fn a_ca_file_that_is_missing_or_holds_no_certificate_is_refused() {
    for file in ["no-such-file.pem", "server.key"] {
        let e = Trust::new(Some(&tls_file(file))).unwrap_err();
        assert_eq!(e.code(), "ca_file_unusable", "{file}");
    }
}
