//! What every countersign binary sets up the same way: its connections to PostgreSQL and
//! RabbitMQ, logging, metrics, the HTTP surfaces `/metrics` (Prometheus), `/healthz` (the
//! process answers) and `/readyz` (its dependencies answer), the shutdown signal, and the
//! [`relay`] that publishes the events the store wrote to its outbox.
//!
//! Logs go to stderr, filtered by `RUST_LOG` (default `warn`, or `debug` when asked for),
//! as JSON lines when `RUST_LOG_FORMAT=json` so that a log shipper can read `run.id` and the
//! error codes as fields. This crate must never decide what a binary logs or counts: that
//! stays with the code that knows the event. Nothing it serves carries content.

use std::future::Future;
use std::sync::Arc;

use async_trait::async_trait;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

mod connections;
pub mod relay;

pub use connections::{Connections, QueueArguments, Ready};

/// Installs the global log subscriber. Call once, first thing in `main`.
pub fn init_tracing(verbose: bool) {
    let default = if verbose { "debug" } else { "warn" };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if std::env::var("RUST_LOG_FORMAT").is_ok_and(|f| f == "json") {
        builder.json().init();
    } else {
        builder.init();
    }
}

/// Installs the global metrics recorder and returns the handle `/metrics` renders. Call once
/// per process; the `metrics` macros record into it from then on.
pub fn install_metrics() -> Result<PrometheusHandle, String> {
    PrometheusBuilder::new()
        .install_recorder()
        .map_err(|e| e.to_string())
}

/// Whether a process can do its work: its database and broker answer.
#[async_trait]
pub trait Readiness: Send + Sync + 'static {
    async fn ready(&self) -> bool;
}

#[derive(Clone)]
struct Surfaces {
    metrics: PrometheusHandle,
    readiness: Arc<dyn Readiness>,
}

/// The router of the three surfaces.
pub fn router(metrics: PrometheusHandle, readiness: Arc<dyn Readiness>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(render))
        .with_state(Surfaces { metrics, readiness })
}

async fn readyz(State(s): State<Surfaces>) -> (StatusCode, &'static str) {
    if s.readiness.ready().await {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
    }
}

async fn render(State(s): State<Surfaces>) -> String {
    s.metrics.render()
}

/// Serves the surfaces on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    metrics: PrometheusHandle,
    readiness: Arc<dyn Readiness>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(metrics, readiness))
        .with_graceful_shutdown(shutdown)
        .await
}

/// Resolves on SIGINT or SIGTERM: the shutdown future a binary passes to its `run`.
pub async fn shutdown_signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = terminate => {}
    }
}

/// Starts the surfaces on `addr` in the background, when an address is configured.
pub async fn spawn_surfaces(
    addr: Option<std::net::SocketAddr>,
    readiness: Arc<dyn Readiness>,
) -> std::io::Result<()> {
    let Some(addr) = addr else { return Ok(()) };
    let metrics = install_metrics().map_err(std::io::Error::other)?;
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(%addr, "serving /metrics, /healthz, /readyz");
    tokio::spawn(async move {
        if let Err(e) = serve(listener, metrics, readiness, std::future::pending()).await {
            tracing::error!(error = %e, "the HTTP surfaces stopped");
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    struct Flag(AtomicBool);

    #[async_trait]
    impl Readiness for Flag {
        async fn ready(&self) -> bool {
            self.0.load(Ordering::SeqCst)
        }
    }

    async fn get(addr: std::net::SocketAddr, path: &str) -> String {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        response
    }

    #[tokio::test]
    async fn the_surfaces_answer_health_readiness_and_metrics() {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            metrics::counter!("countersign_test_total", "outcome" => "accepted").increment(2);
        });
        let flag = Arc::new(Flag(AtomicBool::new(false)));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(listener, handle, flag.clone(), async {
            let _ = stopped.await;
        }));

        assert!(get(addr, "/healthz").await.starts_with("HTTP/1.1 200"));
        assert!(get(addr, "/readyz").await.starts_with("HTTP/1.1 503"));
        flag.0.store(true, Ordering::SeqCst);
        assert!(get(addr, "/readyz").await.starts_with("HTTP/1.1 200"));
        let metrics = get(addr, "/metrics").await;
        assert!(
            metrics.contains("countersign_test_total{outcome=\"accepted\"} 2"),
            "{metrics}"
        );

        stop.send(()).unwrap();
        server.await.unwrap().unwrap();
    }
}
