//! The W3C trace context travels with a message: a publish made inside a traced span carries
//! it, and the consumer reads it back as the parent of its own span.

use countersign_core::RunId;
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing::instrument::WithSubscriber;
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;

use crate::support::{broker, cleaning_up, next};

#[tokio::test]
async fn a_publish_inside_a_traced_span_hands_its_trace_context_to_the_consumer() {
    let broker = broker().await;
    let b = broker.clone();
    cleaning_up(&broker, async move {
        // No exporter: the spans only need real ids.
        let provider = SdkTracerProvider::builder().build();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
        let sent = async {
            let span = tracing::info_span!("producer");
            let context = span.context().span().span_context().clone();
            b.publish_segment(RunId::new())
                .instrument(span)
                .await
                .unwrap();
            context
        }
        .with_subscriber(subscriber)
        .await;
        assert!(sent.is_valid());

        let mut consumer = b.consume(&b.topology().segments(), 1).await.unwrap();
        let delivery = next(&mut consumer).await;
        let parent = delivery.trace_context();
        let received = parent.span().span_context().clone();
        assert!(received.is_remote());
        assert_eq!(received.trace_id(), sent.trace_id());
        assert_eq!(received.span_id(), sent.span_id());
        assert!(delivery.header("traceparent").is_some());
        delivery.ack().await.unwrap();
    })
    .await;
}

#[tokio::test]
async fn a_publish_without_a_tracer_carries_no_trace_context() {
    let broker = broker().await;
    let b = broker.clone();
    cleaning_up(&broker, async move {
        b.publish_segment(RunId::new()).await.unwrap();
        let mut consumer = b.consume(&b.topology().segments(), 1).await.unwrap();
        let delivery = next(&mut consumer).await;
        assert!(!delivery.trace_context().span().span_context().is_valid());
        assert_eq!(delivery.header("traceparent"), None);
        delivery.ack().await.unwrap();
    })
    .await;
}
