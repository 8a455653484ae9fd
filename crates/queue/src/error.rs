//! What can go wrong talking to the broker, each with a stable code.
//!
//! The codes are what reaches a log field, a metric label or a `/readyz` answer; the
//! messages (and the wrapped `lapin` errors) go to the log only. None of them carries the
//! broker address, so a password in `AMQP_ADDR` never leaks through an error.

/// A failure of the transport. Every variant has a [`code`](QueueError::code).
#[derive(Debug, thiserror::Error, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
#[non_exhaustive]
pub enum QueueError {
    /// No connection could be (re-)established within the retry budget.
    #[error("the broker is unavailable")]
    BrokerUnavailable(#[source] lapin::Error),
    /// Declaring or deleting the topology failed, e.g. a queue already exists with other
    /// arguments.
    #[error("declaring or deleting the topology failed")]
    #[strum(serialize = "topology_failed")]
    Topology(#[source] lapin::Error),
    /// A process that declares nothing found a queue or exchange missing (named here):
    /// the broker's definitions were not imported, or the prefix or vhost is wrong.
    #[error("{0} does not exist; import the broker definitions or let this process declare the topology")]
    TopologyMissing(String),
    /// The broker refused the message and closed the publishing channel (for example a
    /// `user_id` that is not the connection's user). The next publish uses a new channel.
    #[error("the broker refused the message")]
    PublishRefused(#[source] lapin::Error),
    /// The channel or connection failed while the message was being published; whether
    /// the broker stored it is unknown, so the caller must treat it as not sent.
    #[error("publishing failed")]
    PublishFailed(#[source] lapin::Error),
    /// The broker answered the publish with a negative confirm: it did not take the
    /// message.
    #[error("the broker did not confirm the message")]
    PublishNacked,
    /// The broker neither confirmed nor refused the message within the publish timeout; the
    /// connection is replaced, and whether the broker stored the message is unknown, so the
    /// caller must treat it as not sent.
    #[error("the broker did not answer the publish in time")]
    PublishTimeout,
    /// The message was published as mandatory and no queue was bound to take it.
    #[error("no queue takes messages routed to {exchange:?} with key {routing_key:?}")]
    Unroutable {
        exchange: String,
        routing_key: String,
    },
    /// Opening a consumer (channel, qos or basic.consume) failed.
    #[error("consuming failed")]
    #[strum(serialize = "consume_failed")]
    Consume(#[source] lapin::Error),
    /// The delivery could not be settled; the broker redelivers it once its channel is
    /// gone.
    #[error("settling the delivery failed")]
    #[strum(serialize = "settle_failed")]
    Settle(#[source] lapin::Error),
    /// The channel the delivery came on is already closed; the broker redelivers it.
    #[error("the delivery's channel is closed")]
    ChannelClosed,
    /// A queue, exchange, routing key or property is longer than AMQP allows (255 bytes).
    #[error("a name or property is longer than 255 bytes")]
    NameTooLong,
    /// A body could not be serialised.
    #[error("the body could not be serialised")]
    #[strum(serialize = "encode_failed")]
    Encode(#[from] serde_json::Error),
}

impl QueueError {
    /// A stable, machine-readable code.
    pub fn code(&self) -> &'static str {
        self.into()
    }

    /// A publish error caused by the broker closing the channel over this message (a
    /// protocol error) is a refusal; anything else is a transport failure.
    pub(crate) fn publish(error: lapin::Error) -> Self {
        if matches!(error.kind(), lapin::ErrorKind::ProtocolError(_)) {
            QueueError::PublishRefused(error)
        } else {
            QueueError::PublishFailed(error)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_queue_error_has_the_code_it_always_had_and_no_two_share_one() {
        let lapin = || lapin::Error::from(std::io::Error::other("reset"));
        let errors = [
            (QueueError::BrokerUnavailable(lapin()), "broker_unavailable"),
            (QueueError::Topology(lapin()), "topology_failed"),
            (
                QueueError::TopologyMissing("queue q".into()),
                "topology_missing",
            ),
            (QueueError::PublishRefused(lapin()), "publish_refused"),
            (QueueError::PublishFailed(lapin()), "publish_failed"),
            (QueueError::PublishNacked, "publish_nacked"),
            (QueueError::PublishTimeout, "publish_timeout"),
            (
                QueueError::Unroutable {
                    exchange: String::new(),
                    routing_key: "q".into(),
                },
                "unroutable",
            ),
            (QueueError::Consume(lapin()), "consume_failed"),
            (QueueError::Settle(lapin()), "settle_failed"),
            (QueueError::ChannelClosed, "channel_closed"),
            (QueueError::NameTooLong, "name_too_long"),
            (
                QueueError::Encode(serde_json::from_str::<u8>("x").unwrap_err()),
                "encode_failed",
            ),
        ];
        for (error, code) in &errors {
            assert_eq!(error.code(), *code, "{error:?}");
        }
        let mut codes: Vec<_> = errors.iter().map(|(e, _)| e.code()).collect();
        codes.sort_unstable();
        codes.dedup();
        assert_eq!(codes.len(), errors.len());
    }
}
