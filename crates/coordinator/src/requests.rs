//! Run requests: the gates before a run is created.
//!
//! The design authenticates only decision producers; run-request producers are authenticated
//! here too, because a producer that may put any `acting_user` into a request could run agents
//! as an administrator — every tool checks its permissions against that user.

use countersign_core::{MessageError, RunRequest};
use countersign_store::StoreError;

use crate::producers::ProducerKind;
use crate::{Coordinator, CoordinatorError, RequestOutcome, RequestVerdict};

impl Coordinator {
    /// Gates a run request and creates its run, in this order:
    ///
    /// 1. the body is a version-1 run request → else `malformed` (dead-letter it);
    /// 2. `producer` (the transport-authenticated user) is present and allowed to assert the
    ///    request's acting user → else `unauthenticated_producer`;
    /// 3. the acting user is a user the directory knows and has not disabled → else
    ///    `unknown_acting_user`;
    /// 4. the agent configuration exists and is active → else `configuration_gone`;
    /// 5. the run is created `queued`/`start`, and `run.accepted` announced, in one
    ///    transaction; a duplicate `request_id` of the same producer with the same request
    ///    returns the run created for it before (`created == false`), creates, announces and
    ///    dispatches nothing; the same id with another request is `idempotency_conflict`. A
    ///    request id is the producer's own: another producer's same id is another request.
    ///
    /// A refused request creates nothing; its `run.refused` is written to the outbox before the
    /// verdict is returned (unless the producer was not authenticated: then nothing is). A duplicate is gated like its first copy, so one
    /// arriving after its configuration was deactivated is refused although its run exists.
    pub(crate) async fn gate_run_request(
        &self,
        message: Result<RunRequest, MessageError>,
        producer: Option<&str>,
    ) -> Result<RequestVerdict, CoordinatorError> {
        let request = match message {
            Ok(request) => request,
            Err(e) => {
                tracing::warn!(reason = %e.reason(), "malformed run request");
                return Ok(RequestVerdict::malformed(e.reason()));
            }
        };
        let request_id = request.request_id;
        let refuse = |outcome: RequestOutcome| async move {
            tracing::info!(
                request.id = %request_id,
                outcome = outcome.code(),
                "run request refused"
            );
            let verdict = RequestVerdict::refused(request_id, outcome);
            if let Some(event) = &verdict.event {
                self.store.announce(None, event).await?;
            }
            Ok(verdict)
        };

        // The producer's grant and the agent's state, by one statement; consulted in order.
        let producer = producer.filter(|p| !p.is_empty());
        let facts = self
            .store
            .request_facts(
                producer.unwrap_or_default(),
                ProducerKind::ActingUser.as_str(),
                &request.acting_user,
                &request.agent,
            )
            .await?;
        if producer.is_none() || !facts.producer_granted {
            return refuse(RequestOutcome::UnauthenticatedProducer).await;
        }
        if self.users.principal(&request.acting_user).await?.is_none() {
            return refuse(RequestOutcome::UnknownActingUser).await;
        }
        if !facts.agent_active {
            return refuse(RequestOutcome::ConfigurationGone).await;
        }

        // Gate 2 passed, so `producer` is present.
        let producer = producer.unwrap_or_default();
        let traceparent = crate::spans::current_traceparent();
        let run = match self
            .store
            .create_run_for(producer, &request, traceparent.as_deref())
            .await
        {
            Ok(run) => run,
            Err(StoreError::IdempotencyConflict) => {
                return refuse(RequestOutcome::IdempotencyConflict).await;
            }
            Err(e) => return Err(e.into()),
        };
        tracing::info!(
            run.id = %run.run_id,
            request.id = %request.request_id,
            created = run.created,
            "run request accepted"
        );
        Ok(RequestVerdict::accepted(
            request.request_id,
            run.run_id,
            run.created,
        ))
    }
}
