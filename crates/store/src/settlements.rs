//! Settlements: how a segment ends its run, alone or in a batch with others.

use countersign_core::{Event, EventName, RunId};
use countersign_crypto::Purpose;
use serde_json::json;
use uuid::Uuid;

use crate::runs::{Lease, RunCounters, RunStatus, TerminationReason};
use crate::{outbox, Store, StoreError};

/// How a segment ends its run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settlement {
    /// `Completed` or `Failed`; [`Store::settle`] refuses any other status (returns `false`).
    pub status: RunStatus,
    pub reason: TerminationReason,
    /// A stable code such as `provider_timeout`. A `&'static str` so that a formatted message
    /// cannot be passed by accident; the schema also rejects anything that is not a code.
    pub error_code: Option<&'static str>,
    /// `None` keeps the counters stored at the last suspension.
    pub counters: Option<RunCounters>,
    /// The run's final answer, sealed into the audit row of `run.completed`; never published.
    pub answer: Option<String>,
}

impl Settlement {
    /// Whether it ends the run: only `Completed` and `Failed` do.
    fn settles(&self) -> bool {
        matches!(self.status, RunStatus::Completed | RunStatus::Failed)
    }

    pub fn completed(reason: TerminationReason, counters: RunCounters) -> Self {
        Settlement {
            status: RunStatus::Completed,
            reason,
            error_code: None,
            counters: Some(counters),
            answer: None,
        }
    }

    /// The same settlement, with the final answer to seal into the run's audit trail.
    pub fn with_answer(self, answer: impl Into<String>) -> Self {
        Settlement {
            answer: Some(answer.into()),
            ..self
        }
    }

    pub fn failed(
        reason: TerminationReason,
        error_code: Option<&'static str>,
        counters: Option<RunCounters>,
    ) -> Self {
        Settlement {
            status: RunStatus::Failed,
            reason,
            error_code,
            counters,
            answer: None,
        }
    }
}

/// Many settlements as the columns of [`Store::settle_many`]'s statement.
#[derive(Default)]
struct SettlementColumns {
    ids: Vec<Uuid>,
    owners: Vec<String>,
    epochs: Vec<i64>,
    statuses: Vec<String>,
    reasons: Vec<String>,
    error_codes: Vec<Option<String>>,
    iterations: Vec<Option<i32>>,
    prompt_tokens: Vec<Option<i64>>,
    completion_tokens: Vec<Option<i64>>,
    kinds: Vec<String>,
    payloads: Vec<serde_json::Value>,
    sealed: Vec<Option<Vec<u8>>>,
    event_ids: Vec<Uuid>,
    bodies: Vec<serde_json::Value>,
}

impl SettlementColumns {
    fn push(&mut self, store: &Store, lease: &Lease, s: &Settlement) -> Result<(), StoreError> {
        let event = settlement_event(lease.run_id, s);
        let counters = s.counters.map(RunCounters::columns);
        self.sealed.push(
            s.answer
                .as_deref()
                .map(|a| {
                    store
                        .keyring
                        .seal(Purpose::Event, lease.run_id, a.as_bytes())
                })
                .transpose()?,
        );
        self.ids.push(lease.run_id.as_uuid());
        self.owners.push(lease.owner.clone());
        self.epochs.push(lease.epoch.get());
        self.statuses.push(s.status.as_str().to_owned());
        self.reasons.push(s.reason.as_str().to_owned());
        self.error_codes.push(s.error_code.map(str::to_owned));
        self.iterations.push(counters.map(|c| c.0));
        self.prompt_tokens.push(counters.map(|c| c.1));
        self.completion_tokens.push(counters.map(|c| c.2));
        self.kinds.push(event.name.as_str().to_owned());
        self.payloads.push(outbox::audit_payload(&event));
        self.event_ids.push(Uuid::now_v7());
        self.bodies.push(outbox::stored_body(&event));
        Ok(())
    }
}

/// `run.completed` or `run.failed`, as a worker settles.
pub(crate) fn settlement_event(run_id: RunId, settlement: &Settlement) -> Event {
    let mut fields = json!({"run_id": run_id, "termination_reason": settlement.reason.as_str()});
    if let Some(code) = settlement.error_code {
        fields["error_code"] = json!(code);
    }
    let name = if settlement.status == RunStatus::Completed {
        EventName::RunCompleted
    } else {
        EventName::RunFailed
    };
    Event::new(name, fields)
}

impl Store {
    /// `running` → `completed` | `failed`, guarded by owner and epoch; clears the lease. In the
    /// same transaction it announces `run.completed` (the answer sealed into its audit row) or
    /// `run.failed` (with the error code). Nothing is written when the guard loses.
    pub async fn settle(&self, lease: &Lease, settlement: &Settlement) -> Result<bool, StoreError> {
        let written = self.settle_many(&[(lease, settlement)]).await?;
        Ok(written == [true])
    }

    /// [`Store::settle`] for many leases in one statement: each settlement is guarded by its
    /// own lease, and its transition, its audit row (numbered from the run's counter) and its
    /// outbox row are written as one; the answer says, in order, which were written. The rows
    /// are locked in id order, so two batches never deadlock each other. If the statement
    /// fails, none is written.
    pub async fn settle_many(
        &self,
        settlements: &[(&Lease, &Settlement)],
    ) -> Result<Vec<bool>, StoreError> {
        let mut given = SettlementColumns::default();
        for (lease, settlement) in settlements.iter().filter(|(_, s)| s.settles()) {
            given.push(self, lease, settlement)?;
        }
        if given.ids.is_empty() {
            return Ok(vec![false; settlements.len()]);
        }
        let rows = sqlx::query_file_as!(
            outbox::Row,
            "sql/settle_many.sql",
            &given.ids,
            &given.owners,
            &given.epochs,
            &given.statuses,
            &given.reasons,
            &given.error_codes as &[Option<String>],
            &given.iterations as &[Option<i32>],
            &given.prompt_tokens as &[Option<i64>],
            &given.completion_tokens as &[Option<i64>],
            &given.kinds,
            &given.payloads,
            &given.sealed as &[Option<Vec<u8>>],
            &given.event_ids,
            &given.bodies,
        )
        .fetch_all(&self.pool)
        .await?;
        let written: Vec<Option<Uuid>> = rows.iter().map(|r| r.run_id).collect();
        self.hand_off(rows.into_iter().map(Into::into).collect());
        Ok(settlements
            .iter()
            .map(|(lease, s)| s.settles() && written.contains(&Some(lease.run_id.as_uuid())))
            .collect())
    }
}
