//! What an operator sees of one approved run: the latency histograms and backlog gauges on the
//! binaries' `/metrics`, and one trace — started by a producer's `traceparent`, over the queues
//! or over HTTP — that goes on through the gates and the worker's segments, the approval's
//! linked to the request's, exported over OTLP/HTTP to a collector (here a small receiver in the
//! test that decodes the protobuf export). Every binary serves the families the catalogue lists
//! for it from its start, and `promtool` accepts every `/metrics` page and the alert rules.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

use countersign_e2e::{
    amqp_addr, demo_agent, demo_script, free_port, http_get, metrics, secs, wait_for_sql,
    wait_for_status, wait_until, Installation,
};
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Connection, ConnectionProperties};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value;
use prost::Message;
use sqlx::{Connection as _, PgConnection};
use uuid::Uuid;

use countersign_e2e::Database;

const PROMPT: &str = "Tighten the description of page 12 and add bicycle.png to its teaser.";
/// The producer's trace, and the spans it sent the request and the decision from.
const TRACE: &str = "5b8efff798038103d269b633813fc60c";
const REQUEST_SPAN: &str = "eee19b7ec3c1b174";
const DECISION_SPAN: &str = "eee19b7ec3c1b175";

/// One exported span, with the service that exported it.
#[derive(Debug, Clone)]
struct Exported {
    service: String,
    name: String,
    trace_id: String,
    span_id: String,
    parent_span_id: String,
    /// String and integer attributes, as text.
    attributes: BTreeMap<String, String>,
    /// The spans it links to: (trace id, span id).
    links: Vec<(String, String)>,
}

/// An OTLP/HTTP collector on the loopback: every `POST /v1/traces` body decoded and kept.
struct Collector {
    port: u16,
    spans: Arc<Mutex<Vec<Exported>>>,
}

impl Collector {
    fn start() -> Collector {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
        let port = listener.local_addr().unwrap().port();
        let spans = Arc::new(Mutex::new(Vec::new()));
        let kept = spans.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                let kept = kept.clone();
                std::thread::spawn(move || receive(stream, &kept));
            }
        });
        Collector { port, spans }
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn spans(&self) -> Vec<Exported> {
        self.spans.lock().unwrap().clone()
    }
}

/// One connection: requests answered `200` one after another until the client closes it.
fn receive(mut stream: std::net::TcpStream, kept: &Mutex<Vec<Exported>>) {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 16384];
    loop {
        let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") else {
            match stream.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => buffer.extend_from_slice(&chunk[..n]),
            }
            continue;
        };
        let head = String::from_utf8_lossy(&buffer[..end]).to_ascii_lowercase();
        let length = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse::<usize>().ok())
            .unwrap_or(0);
        while buffer.len() < end + 4 + length {
            match stream.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => buffer.extend_from_slice(&chunk[..n]),
            }
        }
        let body: Vec<u8> = buffer.drain(..end + 4 + length).skip(end + 4).collect();
        if head.starts_with("post /v1/traces") {
            let export = ExportTraceServiceRequest::decode(body.as_slice())
                .expect("an OTLP/protobuf trace export");
            kept.lock().unwrap().extend(flatten(export));
        }
        let _ = stream.write_all(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\n\r\n",
        );
    }
}

fn flatten(export: ExportTraceServiceRequest) -> Vec<Exported> {
    let mut spans = Vec::new();
    for resource_spans in export.resource_spans {
        let service = resource_spans
            .resource
            .iter()
            .flat_map(|r| &r.attributes)
            .find(|kv| kv.key == "service.name")
            .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
                any_value::Value::StringValue(s) => Some(s.clone()),
                _ => None,
            })
            .unwrap_or_default();
        for scope in resource_spans.scope_spans {
            for span in scope.spans {
                let attributes = span
                    .attributes
                    .iter()
                    .filter_map(|kv| {
                        let value = match kv.value.as_ref()?.value.as_ref()? {
                            any_value::Value::StringValue(s) => s.clone(),
                            any_value::Value::IntValue(n) => n.to_string(),
                            _ => return None,
                        };
                        Some((kv.key.clone(), value))
                    })
                    .collect();
                spans.push(Exported {
                    service: service.clone(),
                    name: span.name,
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent_span_id: hex(&span.parent_span_id),
                    attributes,
                    links: span
                        .links
                        .iter()
                        .map(|l| (hex(&l.trace_id), hex(&l.span_id)))
                        .collect(),
                });
            }
        }
    }
    spans
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The span of `service` named `name` whose parent is `parent`; fails the test without one.
fn one(spans: &[Exported], service: &str, name: &str, parent: &str) -> Exported {
    spans
        .iter()
        .find(|s| s.service == service && s.name == name && s.parent_span_id == parent)
        .cloned()
        .unwrap_or_else(|| {
            panic!("no {service} span {name:?} under {parent} in the trace: {spans:#?}")
        })
}

/// Asserts that the worker took a wake-up published from the span `parent` and ran its
/// segment, with a model call, under it.
fn assert_segment_under(spans: &[Exported], parent: &str, segment_kind: &str) {
    let woken = one(spans, "countersign-worker", "wake_up", parent);
    let segment = one(spans, "countersign-worker", "segment", &woken.span_id);
    assert!(
        spans.iter().any(|s| s.name == "model_call"
            && s.service == "countersign-worker"
            && s.parent_span_id == segment.span_id),
        "no model call in the {segment_kind} segment: {spans:#?}"
    );
}

/// Runs `promtool ARGS` in `deploy/prometheus` with `stdin`: `None` where promtool is not
/// installed, outside CI. Under
/// `CI=true` a missing promtool fails the test (`.ci/run` installs Debian's `prometheus`).
fn promtool(args: &[&str], stdin: &str) -> Option<std::process::Output> {
    let child = Command::new("promtool")
        .args(args)
        .current_dir(countersign_e2e::workspace_file("deploy/prometheus"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(child) => child,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "promtool is not installed (Debian's prometheus package ships it; .ci/run installs it)"
            );
            eprintln!(
                "promtool is not installed: `promtool {}` not run",
                args.join(" ")
            );
            return None;
        }
        Err(e) => panic!("promtool did not start: {e}"),
    };
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    Some(child.wait_with_output().expect("promtool ran"))
}

/// Asserts that `promtool check metrics` finds nothing wrong with `body` (a `/metrics` page).
fn promtool_check_metrics(binary: &str, body: &str) {
    if let Some(out) = promtool(&["check", "metrics"], body) {
        assert!(
            out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(),
            "promtool check metrics on {binary}'s /metrics: {}{}\n{body}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
    }
}

/// Publishes `body` to the public queue `queue` (through its exchange) as the broker user
/// `guest`, with the W3C `traceparent` of the producer's span `parent` and the AMQP
/// `timestamp`: what any traced producer does, with nothing of countersign's.
async fn publish_traced(queue: &str, body: &serde_json::Value, parent: &str) {
    let connection = Connection::connect(&amqp_addr(), ConnectionProperties::default())
        .await
        .expect("RabbitMQ answers");
    let channel = connection.create_channel().await.unwrap();
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let mut headers = FieldTable::default();
    headers.insert(
        "traceparent".into(),
        AMQPValue::LongString(LongString::from(format!("00-{TRACE}-{parent}-01"))),
    );
    let sent_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let properties = BasicProperties::default()
        .with_content_type("application/json".into())
        .with_delivery_mode(2)
        .with_user_id("guest".into())
        .with_timestamp(sent_at)
        .with_headers(headers);
    let confirm = channel
        .basic_publish(
            queue.into(),
            "".into(),
            BasicPublishOptions {
                mandatory: true,
                ..BasicPublishOptions::default()
            },
            body.to_string().as_bytes(),
            properties,
        )
        .await
        .expect("the message is handed to the broker")
        .await
        .expect("the broker confirms it");
    assert!(confirm.is_ack(), "{confirm:?}");
    let _ = connection.close(200, "done".into()).await;
}

/// Waits until `/metrics` on `port` has a line starting with `line`.
async fn wait_for_metric(port: u16, line: &str) -> String {
    wait_until(&format!("{line} on {port}"), secs(60), async || {
        let body = http_get(port, "/metrics")?.1;
        body.lines().any(|l| l.starts_with(line)).then_some(body)
    })
    .await
}

fn assert_line(metrics: &str, line: &str) {
    assert!(
        metrics.lines().any(|l| l.starts_with(line)),
        "no line starting with {line:?} in\n{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approved_run_shows_in_the_latency_histograms_and_continues_its_producers_trace() {
    let db = Database::create("observability").await;
    let install = Installation {
        database_url: db.url(),
        queue_prefix: format!("e2e-{}", Uuid::now_v7()),
    };
    install.configure(&demo_agent());
    let collector = Collector::start();
    let endpoint = collector.endpoint();
    let traced = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        ("OTEL_BSP_SCHEDULE_DELAY", "100"),
    ];
    let (coordinator_port, worker_port) = (free_port(), free_port());
    let script = demo_script();
    let mut coordinator = install.spawn_env(
        "countersign-coordinator",
        &["--http-addr", &format!("127.0.0.1:{coordinator_port}")],
        &traced,
    );
    // No polling: the run is claimed from the wake-up the coordinator published, whose
    // headers carry the trace on.
    let mut worker = install.spawn_env(
        "countersign-worker",
        &[
            "--model-script",
            &script,
            "--http-addr",
            &format!("127.0.0.1:{worker_port}"),
            "--poll-interval-secs",
            "3600",
        ],
        &traced,
    );
    for port in [coordinator_port, worker_port] {
        wait_until("the service is ready", secs(60), async || {
            http_get(port, "/readyz").filter(|(status, _)| status.contains("200"))
        })
        .await;
    }
    // Recorded from the start, before anything happened, by every binary.
    for port in [coordinator_port, worker_port] {
        assert_line(
            &metrics(port).await,
            &format!(
                "countersign_build_info{{version=\"{}\"}} 1",
                env!("CARGO_PKG_VERSION")
            ),
        );
    }

    // A traced producer asks for a run.
    let request_id = Uuid::now_v7();
    let request = serde_json::json!({
        "type": "countersign.run_request", "version": 1, "request_id": request_id,
        "agent": "seo-assistant", "acting_user": "editor", "prompt": PROMPT,
    });
    let topology = countersign_queue::Topology::new(&install.queue_prefix);
    publish_traced(&topology.run_requests(), &request, REQUEST_SPAN).await;
    let mut conn = PgConnection::connect(&db.url()).await.unwrap();
    wait_for_sql(
        &mut conn,
        "the run waits for approval",
        secs(60),
        &format!(
            "SELECT coalesce((SELECT status = 'waiting_for_approval' FROM runs
                              WHERE request_id = '{request_id}'), false)"
        ),
    )
    .await;
    let (run_id, seq, digest): (Uuid, i32, String) =
        sqlx::query_as("SELECT id, suspension_seq, turn_digest FROM runs WHERE request_id = $1")
            .bind(request_id)
            .fetch_one(&mut conn)
            .await
            .unwrap();
    // The coordinator's backlog gauges see it waiting.
    wait_for_metric(coordinator_port, "countersign_runs_waiting_for_approval 1").await;

    // The producer approves it, from another span of its trace.
    let decision = serde_json::json!({
        "type": "countersign.decision", "version": 1, "decision_id": Uuid::now_v7(),
        "run_id": run_id, "suspension_seq": seq, "turn_digest": digest,
        "approved": true, "approver": "approver",
    });
    publish_traced(&topology.decisions(), &decision, DECISION_SPAN).await;
    wait_for_status(&mut conn, &run_id.to_string(), "completed", secs(60)).await;

    let worker_metrics =
        wait_for_metric(worker_port, "countersign_decision_to_write_seconds_count 1").await;
    for line in [
        "countersign_segment_duration_seconds_bucket{segment=\"start\",end=\"suspended\",le=",
        "countersign_segment_duration_seconds_count{segment=\"resume\",end=\"completed\"} 1",
        "countersign_model_call_duration_seconds_bucket{provider=\"scripted\",outcome=\"ok\",le=",
        "countersign_queue_wait_seconds_count{queue=\"segments\"} 2",
        "countersign_decision_to_write_seconds_bucket{le=\"0.001\"}",
    ] {
        assert_line(&worker_metrics, line);
    }
    promtool_check_metrics("countersign-worker", &worker_metrics);
    let coordinator_metrics = metrics(coordinator_port).await;
    promtool_check_metrics("countersign-coordinator", &coordinator_metrics);
    for line in [
        "countersign_queue_wait_seconds_count{queue=\"run-requests\"} 1",
        "countersign_queue_wait_seconds_count{queue=\"decisions\"} 1",
        "countersign_approval_wait_seconds_count 1",
        "countersign_approval_wait_seconds_bucket{le=\"604800\"} 1",
        "countersign_approvals_expiring_soon ",
        "countersign_expired_leases 0",
        "countersign_dead_letter_messages 0",
    ] {
        assert_line(&coordinator_metrics, line);
    }

    // An orderly stop sends the last batches of spans.
    coordinator.sigterm();
    worker.sigterm();
    for running in [&mut coordinator, &mut worker] {
        assert!(
            running.exit_within(secs(60)).await.is_some(),
            "a service did not stop on SIGTERM"
        );
    }
    let spans: Vec<Exported> = collector
        .spans()
        .into_iter()
        .filter(|s| s.trace_id == TRACE)
        .collect();
    let one = |service: &str, name: &str, parent: &str| one(&spans, service, name, parent);
    const COORDINATOR: &str = "countersign-coordinator";
    let gated = one(COORDINATOR, "run_request", REQUEST_SPAN);
    let decided = one(COORDINATOR, "decision", DECISION_SPAN);
    // Every coordinator span names the run; the gates run in a child of the consumer's span,
    // and the decision's gates link to the span that created the run.
    let request_gates = one(COORDINATOR, "run_request_gates", &gated.span_id);
    let decision_gates = one(COORDINATOR, "decision_gates", &decided.span_id);
    for span in [&gated, &decided, &request_gates, &decision_gates] {
        assert_eq!(
            span.attributes.get("run.id"),
            Some(&run_id.to_string()),
            "{span:#?}"
        );
    }
    assert_eq!(
        decision_gates.links,
        [(TRACE.to_owned(), request_gates.span_id.clone())],
        "{decision_gates:#?}"
    );
    // The event the gates committed is the wake-up: the relay publishes it inside their span.
    for (gates, segment_kind) in [(&request_gates, "start"), (&decision_gates, "resume")] {
        assert_segment_under(&spans, &gates.span_id, segment_kind);
    }
    for name in ["preview", "tool_call"] {
        assert!(
            spans
                .iter()
                .any(|s| s.name == name && s.service == "countersign-worker"),
            "no {name} span in the trace: {spans:#?}"
        );
    }

    drop(conn);
    countersign_e2e::delete_topology(&install.queue_prefix).await;
    db.remove().await.unwrap();
}

/// `METHOD path` on the API at `port` as the bearer of `token`, sent from the client span
/// `parent` of `trace`, with a JSON `body` when given: (status, JSON body).
fn http_call(
    port: u16,
    method: &str,
    path: &str,
    token: &str,
    (trace, parent): (&str, &str),
    body: Option<&serde_json::Value>,
) -> (u16, serde_json::Value) {
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("the API listens");
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {token}\r\n\
         traceparent: 00-{trace}-{parent}-01\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").expect("a response");
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    (status, serde_json::from_str(body).unwrap_or_default())
}

/// The client's traces over HTTP: one for the request, another for the approval, as a browser
/// and a script would start them.
const HTTP_REQUEST_TRACE: &str = "6c0a1f52e1b34a0c9f7d2e8b4a6c1d30";
const HTTP_APPROVAL_TRACE: &str = "7d1b2063f2c45b1d0a8e3f9c5b7d2e41";
const CLIENT_SPAN: &str = "a1b2c3d4e5f60718";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_submitted_and_approved_over_http_is_one_trace_linked_to_its_approval() {
    let db = Database::create("observability_http").await;
    let install = Installation {
        database_url: db.url(),
        queue_prefix: format!("e2e-{}", Uuid::now_v7()),
    };
    install.configure(&demo_agent());
    let token = |user: &str| {
        let out = install.countersign_ok(&["tokens", "create", "--for", user, "--label", "e2e"]);
        out.trim().to_owned()
    };
    let (editor, approver) = (token("editor"), token("approver"));
    let collector = Collector::start();
    let endpoint = collector.endpoint();
    let traced = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        ("OTEL_BSP_SCHEDULE_DELAY", "100"),
    ];
    let (api_port, api_metrics_port, worker_port) = (free_port(), free_port(), free_port());
    let script = demo_script();
    // No coordinator: the API gates what it is sent itself and publishes the wake-ups; the
    // worker takes them (no polling), so the trace must come through their headers.
    let mut api = install.spawn_env(
        "countersign-api",
        &[
            "--listen",
            &format!("127.0.0.1:{api_port}"),
            "--http-addr",
            &format!("127.0.0.1:{api_metrics_port}"),
        ],
        &traced,
    );
    let mut worker = install.spawn_env(
        "countersign-worker",
        &[
            "--model-script",
            &script,
            "--http-addr",
            &format!("127.0.0.1:{worker_port}"),
            "--poll-interval-secs",
            "3600",
        ],
        &traced,
    );
    for port in [api_metrics_port, worker_port] {
        wait_until("the service is ready", secs(60), async || {
            http_get(port, "/readyz").filter(|(status, _)| status.contains("200"))
        })
        .await;
    }
    wait_until("the API listens", secs(60), async || {
        std::net::TcpStream::connect(("127.0.0.1", api_port)).ok()
    })
    .await;

    let request = serde_json::json!({"agent": "seo-assistant", "prompt": PROMPT});
    let client = (HTTP_REQUEST_TRACE, CLIENT_SPAN);
    let (status, created) = http_call(
        api_port,
        "POST",
        "/v1/runs",
        &editor,
        client,
        Some(&request),
    );
    assert_eq!(status, 202, "{created}");
    let run_id = created["run_id"].as_str().expect("a run id").to_owned();
    let mut conn = PgConnection::connect(&db.url()).await.unwrap();
    wait_for_status(&mut conn, &run_id, "waiting_for_approval", secs(60)).await;
    let approval = (HTTP_APPROVAL_TRACE, CLIENT_SPAN);
    let card_path = format!("/v1/runs/{run_id}/card");
    let (status, card) = http_call(api_port, "GET", &card_path, &approver, approval, None);
    assert_eq!(status, 200, "{card}");
    let decision = serde_json::json!({
        "suspension_seq": card["suspension_seq"], "turn_digest": card["turn_digest"],
        "approved": true,
    });
    let decide_path = format!("/v1/runs/{run_id}/decisions");
    let (status, decided) = http_call(
        api_port,
        "POST",
        &decide_path,
        &approver,
        approval,
        Some(&decision),
    );
    assert_eq!(status, 202, "{decided}");
    wait_for_status(&mut conn, &run_id, "completed", secs(60)).await;

    let api_metrics = metrics(api_metrics_port).await;
    for line in [
        "countersign_http_requests_total{method=\"POST\",route=\"/v1/runs\",status=\"202\"} 1",
        "countersign_http_requests_total{method=\"POST\",route=\"/v1/runs/{run_id}/decisions\",status=\"202\"} 1",
        "countersign_http_request_duration_seconds_count{method=\"GET\",route=\"/v1/runs/{run_id}/card\"} 1",
        "countersign_run_requests_total{outcome=\"accepted\"} 1",
        "countersign_decisions_total{outcome=\"accepted\"} 1",
        "countersign_approval_wait_seconds_count 1",
    ] {
        assert_line(&api_metrics, line);
    }
    promtool_check_metrics("countersign-api", &api_metrics);

    api.sigterm();
    worker.sigterm();
    for running in [&mut api, &mut worker] {
        assert!(
            running.exit_within(secs(60)).await.is_some(),
            "a service did not stop on SIGTERM"
        );
    }
    let spans = collector.spans();
    let in_trace = |trace: &str| -> Vec<Exported> {
        spans
            .iter()
            .filter(|s| s.trace_id == trace)
            .cloned()
            .collect()
    };
    const API: &str = "countersign-api";

    // The request's trace: the client → the API's request span → the gates → the worker.
    let requested = in_trace(HTTP_REQUEST_TRACE);
    // A request's span is named by its method and route template.
    let submitted = one(&requested, API, "POST /v1/runs", CLIENT_SPAN);
    assert_eq!(
        submitted.attributes.get("http.route").map(String::as_str),
        Some("/v1/runs")
    );
    assert_eq!(
        submitted
            .attributes
            .get("http.response.status_code")
            .map(String::as_str),
        Some("202")
    );
    let request_gates = one(&requested, API, "run_request_gates", &submitted.span_id);
    assert_eq!(request_gates.attributes.get("run.id"), Some(&run_id));
    // The gates' event is the wake-up, published by the relay inside their span.
    assert_segment_under(&requested, &request_gates.span_id, "start");

    // The approval's trace: its own, from the approver's client, linked to the request's.
    let approved = in_trace(HTTP_APPROVAL_TRACE);
    one(&approved, API, "GET /v1/runs/{run_id}/card", CLIENT_SPAN);
    let decided = one(
        &approved,
        API,
        "POST /v1/runs/{run_id}/decisions",
        CLIENT_SPAN,
    );
    assert_eq!(
        decided.attributes.get("http.route").map(String::as_str),
        Some("/v1/runs/{run_id}/decisions")
    );
    let decision_gates = one(&approved, API, "decision_gates", &decided.span_id);
    assert_eq!(decision_gates.attributes.get("run.id"), Some(&run_id));
    assert_eq!(
        decision_gates.links,
        [(HTTP_REQUEST_TRACE.to_owned(), request_gates.span_id.clone())],
        "the approval links to the request's trace: {decision_gates:#?}"
    );
    assert_segment_under(&approved, &decision_gates.span_id, "resume");

    drop(conn);
    countersign_e2e::delete_topology(&install.queue_prefix).await;
    db.remove().await.unwrap();
}

/// The `countersign_…` families a `/metrics` page declares (`# TYPE` lines), with their kinds.
fn declared_families(body: &str) -> BTreeMap<String, String> {
    body.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .filter(|(name, _)| name.starts_with("countersign_"))
        .map(|(name, kind)| (name.to_owned(), kind.to_owned()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_service_serves_its_described_families_from_the_start_and_promtool_accepts_them() {
    use countersign_service::catalogue::{self, Binary, Kind};

    let db = Database::create("observability_start").await;
    let install = Installation {
        database_url: db.url(),
        queue_prefix: format!("e2e-{}", Uuid::now_v7()),
    };
    install.configure(&demo_agent());
    let mut running = Vec::new();
    for binary in Binary::ALL {
        let port = free_port();
        let addr = format!("127.0.0.1:{port}");
        let api_addr = format!("127.0.0.1:{}", free_port());
        let args: Vec<&str> = match binary {
            Binary::Reaper => vec!["--every", "3600", "--http-addr", &addr],
            Binary::Api => vec!["--listen", &api_addr, "--http-addr", &addr],
            Binary::Coordinator | Binary::Worker => vec!["--http-addr", &addr],
        };
        running.push((binary, port, install.spawn(binary.name(), &args)));
    }
    for (binary, port, _) in &running {
        wait_until(
            &format!("{} is ready", binary.name()),
            secs(60),
            async || http_get(*port, "/readyz").filter(|(status, _)| status.contains("200")),
        )
        .await;
        let body = metrics(*port).await;
        let expected: BTreeMap<String, String> = catalogue::served_by(*binary)
            .map(|f| {
                let kind = match f.kind {
                    Kind::Counter => "counter",
                    Kind::Gauge => "gauge",
                    Kind::Histogram => "histogram",
                };
                (f.name.to_owned(), kind.to_owned())
            })
            .collect();
        assert_eq!(
            declared_families(&body),
            expected,
            "{} serves every family listed for it, and only those, before anything happened:\n{body}",
            binary.name()
        );
        for family in [
            "process_cpu_seconds_total",
            "process_resident_memory_bytes",
            "process_open_fds",
            "process_start_time_seconds",
        ] {
            assert_line(&body, &format!("# HELP {family} "));
        }
        promtool_check_metrics(binary.name(), &body);
        // Series at zero, not missing, for what has not happened yet.
        let zero = match binary {
            Binary::Worker => "countersign_leases_held 0",
            Binary::Coordinator => "countersign_queue_messages{queue=\"segments\"} 0",
            Binary::Reaper => "countersign_reaper_actions_total{action=\"requeued\"} 0",
            Binary::Api => "countersign_decisions_total{outcome=\"stale_turn\"} 0",
        };
        assert_line(&body, zero);
    }
    drop(running);
    countersign_e2e::delete_topology(&install.queue_prefix).await;
    db.remove().await.unwrap();
}

/// The metric families `text` (a rule file, a dashboard) queries: `countersign_…` names, with
/// a histogram's `_bucket` / `_count` / `_sum` taken off.
fn metrics_named_in(text: &str) -> std::collections::BTreeSet<String> {
    let mut names = std::collections::BTreeSet::new();
    for (at, _) in text.match_indices("countersign_") {
        let name: String = text[at..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        let family = ["_bucket", "_count", "_sum"]
            .iter()
            .find_map(|suffix| name.strip_suffix(suffix))
            .unwrap_or(&name);
        names.insert(family.to_owned());
    }
    names
}

#[test]
fn the_alerts_and_the_dashboard_query_only_metrics_the_services_record_and_compose_loads_both() {
    use crate::deploy::{entries, scalar, strings, yaml};

    let prometheus = yaml("deploy/prometheus/prometheus.yml").remove(0);
    assert_eq!(
        strings(&prometheus["rule_files"]),
        ["alerts.yml"],
        "prometheus.yml loads the alert rules beside it"
    );
    let alerts = yaml("deploy/prometheus/alerts.yml").remove(0);
    let mut rules = 0;
    for group in alerts["groups"].as_vec().expect("groups") {
        for rule in group["rules"].as_vec().expect("rules") {
            let name = scalar(&rule["alert"]).expect("every rule is an alert");
            assert!(scalar(&rule["expr"]).is_some(), "{name}: no expr");
            assert!(
                matches!(
                    scalar(&rule["labels"]["severity"]).as_deref(),
                    Some("warning" | "critical")
                ),
                "{name}: severity"
            );
            assert!(
                scalar(&rule["annotations"]["summary"]).is_some(),
                "{name}: summary"
            );
            rules += 1;
        }
    }
    assert!(
        rules >= 3,
        "expired leases, dead letters, expiring approvals"
    );

    let compose = yaml("deploy/compose.yaml").remove(0);
    let services: std::collections::BTreeMap<String, _> =
        entries(&compose["services"]).into_iter().collect();
    let mounts = |service: &str| strings(&services[service]["volumes"]);
    assert!(mounts("prometheus")
        .contains(&"./prometheus/alerts.yml:/etc/prometheus/alerts.yml:ro".to_owned()));
    assert!(mounts("grafana")
        .iter()
        .any(|m| m.starts_with("./grafana/countersign.json:")));

    let rule_text = std::fs::read_to_string(countersign_e2e::workspace_file(
        "deploy/prometheus/alerts.yml",
    ))
    .unwrap();
    let dashboard_text = std::fs::read_to_string(countersign_e2e::workspace_file(
        "deploy/grafana/countersign.json",
    ))
    .unwrap();
    let dashboard: serde_json::Value =
        serde_json::from_str(&dashboard_text).expect("the dashboard is JSON");
    assert_eq!(dashboard["uid"], "countersign");
    // The catalogue is what the services serve (the start-up test above checks each binary's
    // /metrics against it).
    let described: std::collections::BTreeSet<&str> = countersign_service::catalogue::FAMILIES
        .iter()
        .map(|f| f.name)
        .collect();
    for (file, text) in [
        ("alerts.yml", &rule_text),
        ("countersign.json", &dashboard_text),
    ] {
        let named = metrics_named_in(text);
        assert!(!named.is_empty(), "{file} queries no countersign metric");
        for metric in named {
            assert!(
                described.contains(metric.as_str()),
                "{file} queries {metric}, which no service serves"
            );
        }
    }
    for new in [
        "countersign_expired_lease_claims_total",
        "countersign_queue_messages",
        "countersign_http_requests_total",
        "countersign_http_request_duration_seconds",
    ] {
        assert!(
            metrics_named_in(&dashboard_text).contains(new),
            "the dashboard shows {new}"
        );
    }
}

#[test]
fn promtool_accepts_the_alert_rules_and_their_unit_tests_pass() {
    for args in [
        ["check", "rules", "alerts.yml"],
        ["test", "rules", "alerts.test.yml"],
    ] {
        let Some(out) = promtool(&args, "") else {
            continue;
        };
        assert!(
            out.status.success(),
            "promtool {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
