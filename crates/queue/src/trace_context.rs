//! What a message carries about its own journey: the W3C trace context of whoever published
//! it, and when it was published.
//!
//! A producer that traces its work puts `traceparent` (and `tracestate`) into the message's
//! AMQP headers, as the W3C Trace Context format says for any carrier. Every publish of this
//! crate does the same with the context of the current span, so one trace goes on from a
//! producer through the coordinator's gates, the segment wake-up it dispatches and the worker
//! that runs the segment: a consumer takes [`Delivery::trace_context`] as the parent of its
//! span. Without a tracer installed the current context is empty, and nothing is added.
//!
//! Every publish also stamps [`PUBLISHED_AT_HEADER`] (milliseconds since the Unix epoch, by
//! the publisher's clock), from which the consumer measures how long the message waited in
//! its queue (`countersign_queue_wait_seconds`). For a foreign producer's message, which does
//! not carry it, the wait is taken from RabbitMQ's own stamp (the `timestamp_in_ms` header its
//! `set_header_timestamp` message interceptor adds, when the broker is configured so) or else
//! from the AMQP `timestamp` property (whole seconds); a message with none is not measured.
//!
//! [`Delivery::trace_context`]: crate::Delivery::trace_context

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{SpanContext, TraceContextExt};
use opentelemetry::Context;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// Header with the publish time, milliseconds since the Unix epoch.
pub const PUBLISHED_AT_HEADER: &str = "x-countersign-published-ms";

/// Adds the current span's trace context (when there is one) and the publish time.
pub(crate) fn stamp(headers: &mut FieldTable) {
    inject(&tracing::Span::current().context(), headers);
    let now = i64::try_from(millis_since_epoch(SystemTime::now())).unwrap_or(i64::MAX);
    headers.insert(PUBLISHED_AT_HEADER.into(), AMQPValue::LongLongInt(now));
}

/// Writes `cx` as `traceparent` / `tracestate`; nothing when `cx` holds no valid span.
pub fn inject(cx: &Context, headers: &mut FieldTable) {
    TraceContextPropagator::new().inject_context(cx, &mut Headers(headers));
}

/// The trace context `headers` carry; an empty context when they carry none (or a malformed
/// one, which the W3C format says to ignore).
pub fn extract(headers: Option<&FieldTable>) -> Context {
    let empty = FieldTable::default();
    let headers = headers.unwrap_or(&empty);
    TraceContextPropagator::new().extract_with_context(&Context::new(), &Reader(headers))
}

/// `cx` as a W3C `traceparent` value (ids and flags only, no `tracestate`): what a run keeps of
/// the span that created it. `None` when `cx` holds no valid span (no tracer installed).
pub fn traceparent(cx: &Context) -> Option<String> {
    let mut fields = std::collections::HashMap::new();
    TraceContextPropagator::new().inject_context(cx, &mut fields);
    fields.remove(TRACEPARENT)
}

/// The span a kept [`traceparent`] names, to link another span to; `None` for a malformed one.
pub fn span_context(traceparent: &str) -> Option<SpanContext> {
    let fields =
        std::collections::HashMap::from([(TRACEPARENT.to_owned(), traceparent.to_owned())]);
    let cx = TraceContextPropagator::new().extract_with_context(&Context::new(), &fields);
    let span = cx.span().span_context().clone();
    span.is_valid().then_some(span)
}

const TRACEPARENT: &str = "traceparent";

/// RabbitMQ's stamp of when it received a message (`set_header_timestamp` interceptor).
const BROKER_STAMP_HEADER: &str = "timestamp_in_ms";

/// How long ago the message was published: by [`PUBLISHED_AT_HEADER`], the broker's stamp, or
/// the AMQP `timestamp` property (seconds), in that order; `None` with none of them. A clock
/// ahead of this one's gives zero, not a negative wait.
pub(crate) fn waited(
    headers: Option<&FieldTable>,
    timestamp_secs: Option<u64>,
    now: SystemTime,
) -> Option<Duration> {
    let stamped = |name: &str| match headers?.inner().get(name)? {
        AMQPValue::LongLongInt(ms) => u64::try_from(*ms).ok(),
        AMQPValue::LongUInt(ms) => Some(u64::from(*ms)),
        AMQPValue::Timestamp(ms) => Some(*ms),
        _ => None,
    };
    let published = stamped(PUBLISHED_AT_HEADER)
        .or_else(|| stamped(BROKER_STAMP_HEADER))
        .or_else(|| timestamp_secs?.checked_mul(1000))?;
    Some(Duration::from_millis(
        millis_since_epoch(now).saturating_sub(published),
    ))
}

fn millis_since_epoch(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

struct Headers<'a>(&'a mut FieldTable);

impl Injector for Headers<'_> {
    fn set(&mut self, key: &str, value: String) {
        self.0.insert(
            ShortString::from(key),
            AMQPValue::LongString(LongString::from(value)),
        );
    }
}

struct Reader<'a>(&'a FieldTable);

impl Extractor for Reader<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        match self.0.inner().get(key)? {
            AMQPValue::LongString(s) => std::str::from_utf8(s.as_bytes()).ok(),
            AMQPValue::ShortString(s) => Some(s.as_str()),
            _ => None,
        }
    }

    fn keys(&self) -> Vec<&str> {
        self.0.inner().keys().map(ShortString::as_str).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    fn with_traceparent(value: AMQPValue) -> FieldTable {
        let mut headers = FieldTable::default();
        headers.insert("traceparent".into(), value);
        headers
    }

    #[test]
    fn a_producers_traceparent_is_read_back_as_the_parent_context() {
        let headers = with_traceparent(AMQPValue::LongString(PARENT.into()));
        let cx = extract(Some(&headers));
        let span = cx.span();
        let parent = span.span_context();
        assert!(parent.is_valid() && parent.is_remote() && parent.is_sampled());
        assert_eq!(
            parent.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(parent.span_id().to_string(), "00f067aa0ba902b7");

        let mut forwarded = FieldTable::default();
        inject(&cx, &mut forwarded);
        assert_eq!(Reader(&forwarded).get("traceparent"), Some(PARENT));
    }

    #[test]
    fn a_kept_traceparent_names_the_span_it_was_taken_from_and_a_malformed_one_nothing() {
        let headers = with_traceparent(AMQPValue::LongString(PARENT.into()));
        let kept = traceparent(&extract(Some(&headers))).expect("a valid context is kept");
        assert_eq!(kept, PARENT);
        let linked = span_context(&kept).expect("the kept context is read back");
        assert_eq!(
            linked.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(linked.span_id().to_string(), "00f067aa0ba902b7");
        assert_eq!(traceparent(&Context::new()), None);
        for malformed in ["", "00-not-a-trace-01", &PARENT.replace("4bf9", "zzzz")] {
            assert!(span_context(malformed).is_none(), "{malformed}");
        }
    }

    #[test]
    fn a_missing_or_malformed_traceparent_gives_no_parent() {
        for headers in [
            None,
            Some(FieldTable::default()),
            Some(with_traceparent(AMQPValue::LongString(
                "00-not-a-trace-01".into(),
            ))),
            Some(with_traceparent(AMQPValue::LongLongInt(1))),
        ] {
            let cx = extract(headers.as_ref());
            assert!(!cx.span().span_context().is_valid(), "{headers:?}");
        }
    }

    #[test]
    fn without_a_tracer_a_publish_stamps_the_time_and_no_trace_context() {
        let mut headers = FieldTable::default();
        stamp(&mut headers);
        assert!(!headers.inner().contains_key("traceparent"));
        let later = SystemTime::now() + Duration::from_secs(2);
        let waited = waited(Some(&headers), None, later).expect("the publish time is stamped");
        assert!(waited >= Duration::from_secs(1), "{waited:?}");
    }

    #[test]
    fn a_publish_time_in_the_future_is_no_wait_and_a_missing_one_is_none() {
        let mut headers = FieldTable::default();
        headers.insert(PUBLISHED_AT_HEADER.into(), AMQPValue::LongLongInt(i64::MAX));
        let now = SystemTime::now();
        assert_eq!(waited(Some(&headers), None, now), Some(Duration::ZERO));
        assert_eq!(waited(Some(&FieldTable::default()), None, now), None);
        assert_eq!(waited(None, None, now), None);
    }

    #[test]
    fn a_foreign_message_is_measured_by_the_brokers_stamp_or_else_its_timestamp() {
        let now = UNIX_EPOCH + Duration::from_millis(10_000_500);
        let mut broker = FieldTable::default();
        broker.insert(BROKER_STAMP_HEADER.into(), AMQPValue::Timestamp(10_000_000));
        assert_eq!(
            waited(Some(&broker), Some(9_000), now),
            Some(Duration::from_millis(500))
        );
        assert_eq!(
            waited(None, Some(9_999), now),
            Some(Duration::from_millis(1_500))
        );
    }
}
