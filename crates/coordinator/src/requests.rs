//! Run requests: the gates before a run is created.
//!
//! The design authenticates only decision producers; run-request producers are authenticated
//! here too, because a producer that may put any `acting_user` into a request could run agents
//! as an administrator — every tool checks its permissions against that user.

use countersign_core::{MessageError, RunRequest};
use countersign_store::StoreError;
use uuid::Uuid;

use crate::producers::ProducerKind;
use crate::{Coordinator, CoordinatorError, RequestOutcome, RequestVerdict};

impl Coordinator {
    /// Gates a run request and creates its run; a refusal is the first refusing gate's, in this
    /// order:
    ///
    /// 1. the body is a version-1 run request → else `malformed` (dead-letter it);
    /// 2. `producer` (the transport-authenticated user) is present and allowed to assert the
    ///    request's acting user → else `unauthenticated_producer`;
    /// 3. the acting user is a user the directory knows and has not disabled → else
    ///    `unknown_acting_user`;
    /// 4. the agent configuration exists and is active → else `configuration_gone`;
    /// 5. the run is created `queued`/`start`, and `run.accepted` announced, by the statement
    ///    that reads the facts of gates 2 and 4; a duplicate `request_id` of the same producer
    ///    with the same request returns the run created for it before (`created == false`),
    ///    creates, announces and dispatches nothing; the same id with another request is
    ///    `idempotency_conflict`. A request id is the producer's own: another producer's same
    ///    id is another request.
    ///
    /// The directory is asked before the facts are read, so gate 3's read happens first: a
    /// request the directory refuses reads the facts on its own to tell gate 2's refusal from
    /// gate 3's. A refused request creates nothing; its `run.refused` is written to the outbox
    /// before the verdict is returned (unless the producer was not authenticated: then nothing
    /// is). A duplicate is gated like its first copy, so one arriving after its configuration
    /// was deactivated is refused although its run exists.
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
        let refuse = |outcome: RequestOutcome| self.refuse_request(request.request_id, outcome);

        let Some(producer) = producer.filter(|p| !p.is_empty()) else {
            return refuse(RequestOutcome::UnauthenticatedProducer).await;
        };
        // The directory is asked first; the producer's grant and the agent's state are read by
        // the statement that creates the run. When a gate refuses, the verdict is the first
        // refusing gate's, in the order above.
        let kind = ProducerKind::ActingUser.as_str();
        if self.users.principal(&request.acting_user).await?.is_none() {
            let outcome = self.unknown_user_outcome(producer, &request).await?;
            return refuse(outcome).await;
        }
        let traceparent = crate::spans::current_traceparent();
        let created = self
            .store
            .create_gated_run(producer, kind, &request, traceparent.as_deref())
            .await;
        let run = match created {
            Ok(Ok(run)) => run,
            Ok(Err(facts)) => {
                return refuse(if facts.producer_granted {
                    RequestOutcome::ConfigurationGone
                } else {
                    RequestOutcome::UnauthenticatedProducer
                })
                .await;
            }
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

    /// Refuses the run request `request_id` with `outcome`: logged, and its `run.refused`
    /// written to the outbox when it has one.
    async fn refuse_request(
        &self,
        request_id: Uuid,
        outcome: RequestOutcome,
    ) -> Result<RequestVerdict, CoordinatorError> {
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
    }

    /// The refusal of a request whose acting user the directory does not know: gate 3's,
    /// unless the facts show `producer` may not assert that user at all (gate 2's).
    async fn unknown_user_outcome(
        &self,
        producer: &str,
        request: &RunRequest,
    ) -> Result<RequestOutcome, CoordinatorError> {
        let kind = ProducerKind::ActingUser.as_str();
        let facts = self
            .store
            .request_facts(producer, kind, &request.acting_user, &request.agent)
            .await?;
        Ok(if facts.producer_granted {
            RequestOutcome::UnknownActingUser
        } else {
            RequestOutcome::UnauthenticatedProducer
        })
    }
}
