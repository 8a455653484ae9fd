//! Logs and traces: one `tracing` subscriber per process, with the log lines on stderr and,
//! when an OTLP endpoint is configured, every span sent to an OpenTelemetry collector.
//!
//! Traces are off unless `--otlp-endpoint` / `OTEL_EXPORTER_OTLP_ENDPOINT` names a collector
//! (OTLP over HTTP with protobuf bodies, `http://collector:4318`; `/v1/traces` is appended).
//! The spans are the ones the code already opens — `segment`, `model_call`, `preview`,
//! `tool_call`, `decision`, `run_request`, `wake_up` — and they are exported at `info` for
//! countersign's own crates whatever `RUST_LOG` says, so that a quiet log does not mean an
//! empty trace. A trace goes on across RabbitMQ through the W3C `traceparent` header (see
//! `countersign_queue::trace_context`).
//!
//! The SDK exports from a thread of its own in batches; the HTTP requests themselves run on
//! the process's Tokio runtime through the hyper client the workspace already has, so no
//! second HTTP stack (reqwest, tonic) is linked. Export failures are the SDK's to log and
//! never reach a run.

use std::time::Duration;

use async_trait::async_trait;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry::KeyValue;
use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// What the spans exported to the collector are filtered by.
const TRACE_FILTER: &str = "warn,countersign=info";
/// How long one export may take.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long shutdown waits for the last batch: short, so that an unreachable collector does
/// not eat into the grace a stopping service is given (the worker's hand-back comes first).
const FLUSH_TIMEOUT: Duration = Duration::from_secs(3);

/// The process's telemetry; [`shutdown`](Self::shutdown) it last, so that the spans of the
/// final seconds reach the collector.
#[derive(Debug)]
#[must_use = "shut telemetry down at exit, or the last spans are lost"]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

/// Why traces could not be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TelemetryError {
    #[error("the OTLP exporter could not be built: {0}")]
    Exporter(#[from] opentelemetry_otlp::ExporterBuildError),
    #[error("traces need a Tokio runtime to send their batches on")]
    NoRuntime,
}

impl Telemetry {
    /// Whether spans are exported.
    pub fn traces_enabled(&self) -> bool {
        self.provider.is_some()
    }

    /// Sends what is still batched and stops the exporter.
    pub async fn shutdown(self) {
        let Some(provider) = self.provider else {
            return;
        };
        // Shutting down blocks until the exporter thread has sent the last batch, whose
        // request runs on this runtime: block a thread of the blocking pool, not a worker.
        let stopped =
            tokio::task::spawn_blocking(move || provider.shutdown_with_timeout(FLUSH_TIMEOUT))
                .await;
        if let Ok(Err(e)) = stopped {
            tracing::warn!(error = %e, "traces not flushed at shutdown");
        }
    }
}

/// Installs the global subscriber: logs as [`crate::init_tracing`] writes them, and spans to
/// `otlp_endpoint` when one is given, as the service `service_name` (the binary's name).
/// Call once, first thing in `main`, inside the Tokio runtime.
pub fn init_telemetry(
    service_name: &'static str,
    logging: &Logging,
    otlp_endpoint: Option<&str>,
) -> Result<Telemetry, TelemetryError> {
    let provider = otlp_endpoint
        .filter(|e| !e.trim().is_empty())
        .map(|endpoint| tracer_provider(service_name, endpoint))
        .transpose()?;
    let traces = provider.as_ref().map(|p| {
        tracing_opentelemetry::layer()
            .with_tracer(p.tracer(service_name))
            .with_filter(EnvFilter::new(TRACE_FILTER))
    });
    tracing_subscriber::registry()
        .with(log_layer(logging))
        .with(traces)
        .init();
    if let Some(endpoint) = otlp_endpoint.filter(|_| provider.is_some()) {
        tracing::info!(endpoint, "exporting traces over OTLP/HTTP");
    }
    Ok(Telemetry { provider })
}

/// The W3C trace context (`traceparent`, `tracestate`) an HTTP request carries: the parent of
/// the span that serves it. An empty context when it carries none, or a malformed one (which the
/// W3C format says to ignore).
pub fn http_parent(headers: &axum::http::HeaderMap) -> opentelemetry::Context {
    use opentelemetry::propagation::TextMapPropagator;
    opentelemetry_sdk::propagation::TraceContextPropagator::new().extract_with_context(
        &opentelemetry::Context::new(),
        &opentelemetry_http::HeaderExtractor(headers),
    )
}

/// How a process logs: `--log-filter` (`RUST_LOG`) and `--log-format` (`RUST_LOG_FORMAT`).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct Logging {
    /// The log filter (e.g. `info,countersign_worker=debug`); `warn` when unset. lapin's
    /// channel-close lines stay off unless it names `lapin`.
    #[arg(long, env = "RUST_LOG", global = true)]
    pub log_filter: Option<String>,
    /// `json` for JSON log lines a log shipper can read fields from.
    #[arg(long, env = "RUST_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text, global = true)]
    pub log_format: LogFormat,
    /// Log at `debug` when no filter is given.
    #[arg(skip)]
    pub verbose: bool,
}

/// The shape of a log line.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// The log filter: the one `logging` asks for (default `warn`, `debug` when verbose), with
/// lapin's channel-close lines off unless it names lapin. Checking whether a queue or an
/// exchange exists is a passive declare, and one that finds nothing closes its channel, which
/// lapin logs as an `ERROR` — on every first start against a fresh vhost. The closes that
/// matter fail an operation, and countersign logs those with their code.
pub fn log_filter(logging: &Logging) -> EnvFilter {
    filter_of(logging.log_filter.as_deref(), logging.verbose)
}

fn filter_of(asked: Option<&str>, verbose: bool) -> EnvFilter {
    let default = if verbose { "debug" } else { "warn" };
    let filter = asked
        .and_then(|a| EnvFilter::try_new(a).ok())
        .unwrap_or_else(|| EnvFilter::new(default));
    if asked.is_some_and(|a| a.contains("lapin")) {
        return filter;
    }
    match "lapin::channel=off".parse() {
        Ok(quiet) => filter.add_directive(quiet),
        Err(_) => filter,
    }
}

/// Log lines to stderr, filtered by [`log_filter`], in the format `logging` names.
pub(crate) fn log_layer<S>(logging: &Logging) -> impl Layer<S> + Send + Sync
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    let filter = log_filter(logging);
    // Colour only for a person at a terminal: a file, a pipe or a journal gets plain text.
    let colour = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let lines = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(colour);
    let lines = if logging.log_format == LogFormat::Json {
        lines.json().boxed()
    } else {
        lines.boxed()
    };
    lines.with_filter(filter)
}

fn tracer_provider(
    service_name: &'static str,
    endpoint: &str,
) -> Result<SdkTracerProvider, TelemetryError> {
    let runtime = tokio::runtime::Handle::try_current().map_err(|_| TelemetryError::NoRuntime)?;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(traces_url(endpoint))
        .with_timeout(EXPORT_TIMEOUT)
        .with_http_client(OnRuntime::new(runtime))
        .build()?;
    let resource = Resource::builder()
        .with_service_name(service_name)
        .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
        .build();
    Ok(SdkTracerProvider::builder()
        .with_resource(resource)
        .with_batch_exporter(exporter)
        .build())
}

/// The collector's base URL with the traces path, as the OTLP/HTTP convention has it for
/// `OTEL_EXPORTER_OTLP_ENDPOINT`.
fn traces_url(endpoint: &str) -> String {
    let base = endpoint.trim().trim_end_matches('/');
    if base.ends_with("/v1/traces") {
        base.to_owned()
    } else {
        format!("{base}/v1/traces")
    }
}

type Connector = hyper_rustls::HttpsConnector<HttpConnector>;

/// The exporter's HTTP client: the workspace's hyper client (http:// and https://), each
/// request sent on the Tokio runtime, since the SDK calls it from its own export thread.
#[derive(Debug, Clone)]
struct OnRuntime {
    client: Client<Connector, Full<Bytes>>,
    runtime: tokio::runtime::Handle,
}

impl OnRuntime {
    fn new(runtime: tokio::runtime::Handle) -> Self {
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_webpki_roots()
            .https_or_http()
            .enable_http1()
            .build();
        OnRuntime {
            client: Client::builder(TokioExecutor::new()).build(connector),
            runtime,
        }
    }
}

#[async_trait]
impl HttpClient for OnRuntime {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let client = self.client.clone();
        let sent = self.runtime.spawn(async move {
            let (parts, body) = request.into_parts();
            let request = Request::from_parts(parts, Full::new(body));
            tokio::time::timeout(EXPORT_TIMEOUT, async move {
                let (parts, body) = client.request(request).await?.into_parts();
                let body = body.collect().await?.to_bytes();
                Ok::<_, HttpError>(Response::from_parts(parts, body))
            })
            .await?
        });
        sent.await?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lapins_channel_close_lines_are_off_unless_rust_log_names_lapin() {
        for asked in [
            None,
            Some("info"),
            Some("warn,countersign=debug"),
            Some("not a filter"),
        ] {
            let filter = filter_of(asked, false).to_string();
            assert!(filter.contains("lapin::channel=off"), "{asked:?}: {filter}");
        }
        assert!(filter_of(None, false).to_string().contains("warn"));
        assert!(filter_of(None, true).to_string().contains("debug"));
        let own = filter_of(Some("info,lapin=debug"), false).to_string();
        assert!(!own.contains("lapin::channel=off"), "{own}");
        assert!(own.contains("lapin=debug"), "{own}");
    }

    #[test]
    fn an_http_requests_traceparent_is_its_spans_parent_and_a_malformed_one_is_ignored() {
        use opentelemetry::trace::TraceContextExt;
        let mut headers = axum::http::HeaderMap::new();
        headers.insert(
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
                .parse()
                .unwrap(),
        );
        let cx = http_parent(&headers);
        let parent = cx.span().span_context().clone();
        assert!(parent.is_remote() && parent.is_sampled());
        assert_eq!(
            parent.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        headers.insert("traceparent", "00-nope-01".parse().unwrap());
        assert!(!http_parent(&headers).span().span_context().is_valid());
        assert!(!http_parent(&axum::http::HeaderMap::new())
            .span()
            .span_context()
            .is_valid());
    }

    #[test]
    fn the_traces_path_is_appended_to_the_collectors_base_url_once() {
        assert_eq!(
            traces_url("http://collector:4318"),
            "http://collector:4318/v1/traces"
        );
        assert_eq!(
            traces_url("http://collector:4318/"),
            "http://collector:4318/v1/traces"
        );
        assert_eq!(
            traces_url("https://c.example/otlp/v1/traces"),
            "https://c.example/otlp/v1/traces"
        );
    }
}
