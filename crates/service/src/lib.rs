//! What every countersign binary sets up the same way: its connections to PostgreSQL and
//! RabbitMQ, logging, metrics, the HTTP surfaces `/metrics` (Prometheus), `/healthz` (the
//! process answers) and `/readyz` (its dependencies answer), the shutdown signal, and the
//! [`relay`] that publishes the events the store wrote to its outbox.
//!
//! Logs go to stderr, filtered by `--log-filter`/`RUST_LOG` (default `warn`, or `debug` when
//! asked for), as JSON lines with `--log-format json` so that a log shipper can read `run.id`
//! and the error codes as fields; spans go to an OpenTelemetry collector when one is configured
//! ([`telemetry`]). The metrics recorder is installed in every process that serves or might
//! serve `/metrics`, whether or not an address is given, with histogram buckets for every
//! `*_seconds` histogram, `countersign_build_info{version}`, the HELP text of every family
//! ([`catalogue`]) and the standard `process_*` families, sampled at each scrape. This crate
//! describes what the binaries count but never decides when they count it: that stays with the
//! code that knows the event. Nothing it serves carries content.

use std::future::Future;
use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

pub mod catalogue;
mod connections;
pub mod pool;
pub mod relay;
pub mod settings;
mod start;
pub mod telemetry;
pub mod tools;
pub mod webhooks;

pub use connections::{Connections, Endpoints, QueueArguments, Ready, READY_WITHIN};
pub use pool::{pool_options, SessionLimits};
pub use settings::{KeySettings, ToolSettings};
pub use start::{start, Pools, Service};
pub use telemetry::{init_telemetry, Logging, Telemetry, TelemetryError};

/// Installs the global log subscriber, without traces. Call once, first thing in `main`;
/// a service calls [`init_telemetry`] instead.
pub fn init_tracing(logging: &Logging) {
    tracing_subscriber::registry()
        .with(telemetry::log_layer(logging))
        .init();
}

/// Buckets of every `*_seconds` histogram: a millisecond to five minutes.
pub const SECONDS_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    120.0, 300.0,
];
/// Buckets of `countersign_approval_wait_seconds`: a second to a week, the longest default
/// approval deadline.
pub const APPROVAL_WAIT_BUCKETS: &[f64] = &[
    1.0, 10.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0, 14400.0, 28800.0, 86400.0, 172800.0,
    604800.0,
];

static METRICS: OnceLock<Result<PrometheusHandle, String>> = OnceLock::new();

/// The standard `process_*` families (CPU seconds, resident and virtual memory, open and
/// maximum file descriptors, threads, start time), read from `/proc` at each scrape.
fn process_metrics() -> &'static metrics_process::Collector {
    static PROCESS: OnceLock<metrics_process::Collector> = OnceLock::new();
    PROCESS.get_or_init(metrics_process::Collector::default)
}

/// Installs the global metrics recorder (once per process; later calls return the same
/// handle) and returns the handle `/metrics` renders; sets `countersign_build_info`, describes
/// every family ([`catalogue`]) and samples the `process_*` ones once. The `metrics` macros
/// record into it from then on. Histograms render as Prometheus histograms with
/// [`SECONDS_BUCKETS`] (or [`APPROVAL_WAIT_BUCKETS`]), so that quantiles can be aggregated
/// across instances.
pub fn install_metrics() -> Result<PrometheusHandle, String> {
    METRICS
        .get_or_init(|| {
            let handle = PrometheusBuilder::new()
                .set_buckets(SECONDS_BUCKETS)
                .and_then(|b| {
                    b.set_buckets_for_metric(
                        Matcher::Full("countersign_approval_wait_seconds".into()),
                        APPROVAL_WAIT_BUCKETS,
                    )
                })
                .map_err(|e| e.to_string())?
                .install_recorder()
                .map_err(|e| e.to_string())?;
            catalogue::describe();
            process_metrics().describe();
            process_metrics().collect();
            metrics::gauge!("countersign_build_info", "version" => env!("CARGO_PKG_VERSION"))
                .set(1.0);
            Ok(handle)
        })
        .clone()
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
    process_metrics().collect();
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

/// Resolves on SIGINT or SIGTERM: the shutdown future a binary passes to its `run`. Its
/// handlers are installed when it is called, so call it before anything reports ready.
pub fn shutdown_signal() -> impl Future<Output = ()> + Send + 'static {
    use tokio::signal::unix::{signal, Signal, SignalKind};
    // Registered now, not at the first poll: a SIGTERM that arrives between `/readyz` saying
    // ready and the first wait would otherwise kill the process instead of stopping it.
    let terminate = signal(SignalKind::terminate()).ok();
    let interrupt = signal(SignalKind::interrupt()).ok();
    async fn received(signal: Option<Signal>) {
        match signal {
            Some(mut signal) => {
                signal.recv().await;
            }
            None => std::future::pending::<()>().await,
        }
    }
    async move {
        tokio::select! {
            () = received(terminate) => {}
            () = received(interrupt) => {}
        }
    }
}

/// Installs the metrics recorder, and starts the surfaces on `addr` in the background when
/// an address is configured. Without one the metrics are still recorded (an embedding or a
/// later scrape sees them), only not served.
pub async fn spawn_surfaces(
    addr: Option<std::net::SocketAddr>,
    readiness: Arc<dyn Readiness>,
) -> std::io::Result<()> {
    let metrics = install_metrics().map_err(std::io::Error::other)?;
    // Every service runs on the pool: its discards are served from the start, at zero.
    pool::register_metrics();
    let Some(addr) = addr else { return Ok(()) };
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

    #[test]
    fn the_recorder_is_installed_once_with_build_info_and_seconds_as_histogram_buckets() {
        let first = install_metrics().unwrap();
        let again = install_metrics().expect("a second install returns the same recorder");
        metrics::histogram!("countersign_example_seconds").record(0.003);
        metrics::histogram!("countersign_approval_wait_seconds").record(120.0);
        let rendered = again.render();
        // The same recorder: the same lines (families come in no fixed order).
        let sorted = |text: &str| {
            let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
            lines.sort();
            lines
        };
        assert_eq!(sorted(&rendered), sorted(&first.render()));
        let version = env!("CARGO_PKG_VERSION");
        for line in [
            "# HELP countersign_build_info The version running, as its label; always 1.".to_owned(),
            format!("countersign_build_info{{version=\"{version}\"}} 1"),
            "countersign_example_seconds_bucket{le=\"0.005\"} 1".to_owned(),
            "countersign_approval_wait_seconds_bucket{le=\"300\"} 1".to_owned(),
            "countersign_approval_wait_seconds_bucket{le=\"60\"} 0".to_owned(),
        ] {
            assert!(rendered.lines().any(|l| l == line), "{line} in\n{rendered}");
        }
        for family in [
            "process_cpu_seconds_total",
            "process_resident_memory_bytes",
            "process_open_fds",
            "process_start_time_seconds",
        ] {
            assert!(
                rendered.contains(&format!("# HELP {family} ")),
                "{family} in\n{rendered}"
            );
        }
    }
}
