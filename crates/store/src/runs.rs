//! Runs and the guarded transitions of their lifecycle.
//!
//! Every transition is one `UPDATE … WHERE status = … [AND lease guard]` whose
//! `rows_affected() == 1` is the only answer to "did I win". No transition reads the row first
//! and decides in Rust: between such a read and its write, a heartbeat, a reaper or a second
//! worker could have moved the run, and the write would undo their work. A caller that lost
//! must back off without side effects — the row already says what happened instead.
//!
//! The lease is `(lease_owner, lease_epoch, lease_expires_at)`. The epoch grows on every claim
//! (by one, and past the old timeline's after a promotion) and is never reset, so a [`Lease`]
//! taken before a requeue can never match again: that is what keeps a zombie segment from
//! suspending, settling, renewing or writing.

use std::time::Duration;

use chrono::{DateTime, Utc};
use countersign_core::{
    CallIndex, Effect, Event, EventName, FenceToken, LeaseEpoch, RunId, SuspendedRunState,
    SuspensionSeq, TurnDigest,
};
use countersign_crypto::Purpose;
use serde_json::json;
use sqlx::{Postgres, Transaction};
use uuid::Uuid;

use crate::{millis, outbox, Store, StoreError};

/// The producer of the runs this repository's own tools create through
/// [`Store::create_run`] (tests, benchmarks): no transport authenticated it.
pub const LOCAL_PRODUCER: &str = "countersign:local";

/// A run as requested by a producer: the run request message itself.
pub use countersign_core::RunRequest as NewRun;

/// What a run was asked to do, as its sealed `request` column holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredRequest {
    pub prompt: String,
    pub inputs: Option<serde_json::Map<String, serde_json::Value>>,
}

impl StoredRequest {
    /// The sealed form: `{"v": 1, "prompt": …, "inputs": …}`.
    fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "v": 1,
            "prompt": self.prompt,
            "inputs": self.inputs,
        }))
        .unwrap_or_default()
    }

    /// Reads the sealed form, or the bare UTF-8 prompt that runs created before inputs existed
    /// hold.
    fn from_bytes(bytes: &[u8]) -> Result<Self, StoreError> {
        let unreadable = || StoreError::unreadable("runs.request");
        if let Ok(serde_json::Value::Object(doc)) = serde_json::from_slice(bytes) {
            if doc.get("v") == Some(&serde_json::json!(1)) {
                let prompt = doc
                    .get("prompt")
                    .and_then(|p| p.as_str())
                    .ok_or_else(unreadable)?;
                let inputs = match doc.get("inputs") {
                    None | Some(serde_json::Value::Null) => None,
                    Some(serde_json::Value::Object(m)) => Some(m.clone()),
                    Some(_) => return Err(unreadable()),
                };
                return Ok(StoredRequest {
                    prompt: prompt.to_owned(),
                    inputs,
                });
            }
        }
        let prompt = String::from_utf8(bytes.to_vec()).map_err(|_| unreadable())?;
        Ok(StoredRequest {
            prompt,
            inputs: None,
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CreatedRun {
    pub run_id: RunId,
    /// `false` when the request id was known and this is the run created for it before.
    pub created: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, strum::IntoStaticStr, strum::EnumString)]
#[strum(serialize_all = "snake_case")]
pub enum RunStatus {
    Queued,
    Running,
    WaitingForApproval,
    Completed,
    Failed,
    Cancelled,
}

impl RunStatus {
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            RunStatus::Completed | RunStatus::Failed | RunStatus::Cancelled
        )
    }
}

/// Which stretch of a run a claim executes: from the prompt, or after a decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, strum::IntoStaticStr, strum::EnumString)]
#[strum(serialize_all = "snake_case")]
pub enum SegmentKind {
    Start,
    Resume,
}

impl SegmentKind {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// Why a run ended, in one machine-readable column: the domain's own list.
pub use countersign_core::TerminationReason;

/// The lease a claim won. Every later statement of the segment is guarded by it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub run_id: RunId,
    pub owner: String,
    pub epoch: LeaseEpoch,
}

impl Lease {
    /// The token a write of call `index` of suspension `seq` carries to the resource.
    pub fn fence_token(&self, seq: SuspensionSeq, index: CallIndex) -> FenceToken {
        FenceToken {
            run_id: self.run_id,
            lease_owner: self.owner.clone(),
            lease_epoch: self.epoch,
            suspension_seq: seq,
            call_index: index,
        }
    }
}

/// What the gates of a run request read ([`Store::request_facts`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestFacts {
    /// The producer holds a grant for the acting user.
    pub producer_granted: bool,
    /// The agent configuration exists and is active.
    pub agent_active: bool,
}

/// The counters a run carries across segments.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RunCounters {
    pub iterations: u32,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
}

impl RunCounters {
    pub(crate) fn columns(self) -> (i32, i64, i64) {
        (
            i32::try_from(self.iterations).unwrap_or(i32::MAX),
            i64::try_from(self.prompt_tokens).unwrap_or(i64::MAX),
            i64::try_from(self.completion_tokens).unwrap_or(i64::MAX),
        )
    }
}

/// A run as stored, without its sealed columns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunRecord {
    pub id: RunId,
    pub request_id: Uuid,
    pub agent: String,
    pub acting_user: String,
    pub status: RunStatus,
    pub segment: SegmentKind,
    pub suspension_seq: Option<SuspensionSeq>,
    pub turn_digest: Option<TurnDigest>,
    pub pending_tools: Vec<String>,
    pub lease_owner: Option<String>,
    pub lease_epoch: LeaseEpoch,
    pub lease_expires_at: Option<DateTime<Utc>>,
    pub pending_effect: Option<Effect>,
    pub requeue_count: i32,
    pub available_at: DateTime<Utc>,
    pub dispatched_at: Option<DateTime<Utc>>,
    pub approval_deadline: Option<DateTime<Utc>>,
    pub termination_reason: Option<TerminationReason>,
    pub error_code: Option<String>,
    /// The call of a turn that was sent outside the store and whose result is not journaled:
    /// in flight while the run runs; in doubt for good once the run failed `outcome_unknown`.
    pub sent_call: Option<SentCallRef>,
    pub counters: RunCounters,
    pub has_state: bool,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// A call of a turn named by its card and index: what [`RunRecord::sent_call`] names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SentCallRef {
    pub suspension_seq: SuspensionSeq,
    pub index: CallIndex,
}

pub(crate) fn run_id(uuid: Uuid) -> Result<RunId, StoreError> {
    RunId::from_uuid(uuid).map_err(|_| StoreError::unreadable("runs.id"))
}

pub(crate) fn epoch(n: i64) -> Result<LeaseEpoch, StoreError> {
    LeaseEpoch::new(n).map_err(|_| StoreError::unreadable("runs.lease_epoch"))
}

pub(crate) fn seq(n: i32) -> Result<SuspensionSeq, StoreError> {
    SuspensionSeq::from_i32(n).map_err(|_| StoreError::unreadable("suspension_seq"))
}

pub(crate) fn opt_seq(n: Option<i32>) -> Result<Option<SuspensionSeq>, StoreError> {
    n.map(seq).transpose()
}

pub(crate) fn segment(s: &str) -> Result<SegmentKind, StoreError> {
    s.parse()
        .map_err(|_| StoreError::unreadable("runs.segment"))
}

pub(crate) fn status(s: &str) -> Result<RunStatus, StoreError> {
    s.parse().map_err(|_| StoreError::unreadable("runs.status"))
}

pub(crate) fn pending_effect(s: Option<String>) -> Result<Option<Effect>, StoreError> {
    s.map(|e| {
        e.parse()
            .map_err(|_| StoreError::unreadable("runs.pending_effect"))
    })
    .transpose()
}

pub(crate) fn digest(s: &str) -> Result<TurnDigest, StoreError> {
    TurnDigest::parse(s).map_err(|_| StoreError::unreadable("runs.turn_digest"))
}

/// `run.accepted`: a run exists for the request.
pub fn run_accepted(request_id: Uuid, run_id: RunId) -> Event {
    Event::new(
        EventName::RunAccepted,
        json!({"request_id": request_id, "run_id": run_id}),
    )
}

/// `run.preview_moved`, when the binding refused an approved turn, then `run.suspended`.
pub(crate) fn suspension_events(
    run_id: RunId,
    state: &SuspendedRunState,
    moved_tools: &[&str],
) -> Vec<Event> {
    let seq = state.suspension_seq.get();
    let stale: Vec<usize> = state.stale_call_indexes.iter().map(|i| i.get()).collect();
    let mut events = Vec::with_capacity(2);
    if !moved_tools.is_empty() {
        events.push(Event::new(
            EventName::RunPreviewMoved,
            json!({"run_id": run_id, "suspension_seq": seq, "stale_call_indexes": stale,
                   "tools": moved_tools}),
        ));
    }
    let failed_previews = state.call_previews.iter().filter(|p| p.failed).count();
    events.push(Event::new(
        EventName::RunSuspended,
        json!({
            "run_id": run_id,
            "suspension_seq": seq,
            "turn_digest": state.turn_digest().as_str(),
            "stale_call_indexes": stale,
            "failed_previews": failed_previews,
        }),
    ));
    events
}

/// `run.failed`, `run.cancelled`: a run ended by the reaper or an operator.
pub(crate) fn ended_event(name: EventName, run_id: RunId, reason: TerminationReason) -> Event {
    Event::new(
        name,
        json!({"run_id": run_id, "termination_reason": reason.as_str()}),
    )
}

impl Store {
    /// [`Store::create_run_for`] as this repository's own tools request runs (tests, benchmarks,
    /// the demo's fixtures), under the producer [`LOCAL_PRODUCER`].
    pub async fn create_run(&self, new: &NewRun) -> Result<CreatedRun, StoreError> {
        self.create_run_for(LOCAL_PRODUCER, new, None).await
    }

    /// (new) → `queued`/`start`, with its `run.accepted` event in the same transaction. The
    /// request id is the producer's: a duplicate from the same producer with the same request
    /// (agent, acting user, prompt and inputs) returns the run created for it before, with
    /// `created == false`, and changes nothing (its event was announced with it); the same id
    /// with another request is [`StoreError::IdempotencyConflict`]. The prompt is sealed.
    ///
    /// A run recorded before producers were (`producer` NULL, see migration 0018) keeps its id
    /// for every producer: it is matched as a duplicate the same way, by its request.
    ///
    /// `traceparent` is the W3C trace context of the span that creates the run, ids and flags
    /// only, so that the trace of the decision that releases it can be linked to the request's
    /// ([`Store::request_traceparent`]). A duplicate keeps the first copy's.
    pub async fn create_run_for(
        &self,
        producer: &str,
        new: &NewRun,
        traceparent: Option<&str>,
    ) -> Result<CreatedRun, StoreError> {
        // With no gate, every fact holds: the run is created, or it is a duplicate.
        let created = self.insert_run(producer, None, new, traceparent).await?;
        created.map_err(|_| StoreError::unreadable("runs.request"))
    }

    /// [`Store::create_run_for`] behind the facts of the run request's gates, read by the same
    /// statement: the run is created only when `producer` holds a grant of `kind` for the
    /// acting user and the agent configuration exists and is active. Otherwise nothing is
    /// written, and the facts say which gate refuses (`Ok(Err(facts))`). A duplicate is gated
    /// like its first copy.
    pub async fn create_gated_run(
        &self,
        producer: &str,
        kind: &str,
        new: &NewRun,
        traceparent: Option<&str>,
    ) -> Result<Result<CreatedRun, RequestFacts>, StoreError> {
        self.insert_run(producer, Some(kind), new, traceparent)
            .await
    }

    async fn insert_run(
        &self,
        producer: &str,
        gate: Option<&str>,
        new: &NewRun,
        traceparent: Option<&str>,
    ) -> Result<Result<CreatedRun, RequestFacts>, StoreError> {
        let id = RunId::new();
        let request = self.seal_request(id, new)?;
        // One statement, one commit: the gates' facts, then the run and its `run.accepted`
        // outbox row — or, when a fact refuses or the request id is a duplicate, neither.
        let event = run_accepted(new.request_id, id);
        let row = sqlx::query_file!(
            "sql/insert_run.sql",
            id.as_uuid(),
            new.request_id,
            new.agent,
            new.acting_user,
            request,
            Uuid::now_v7(),
            event.name.as_str(),
            outbox::stored_body(&event),
            producer,
            traceparent,
            gate,
        )
        .fetch_one(&self.pool)
        .await?;
        if !(row.granted && row.active) {
            return Ok(Err(RequestFacts {
                producer_granted: row.granted,
                agent_active: row.active,
            }));
        }
        let Some(announced) =
            outbox::Row::announced(row.id, row.run_id, row.kind, row.body, row.created_at)
        else {
            return self.duplicate_run(producer, new).await.map(Ok);
        };
        self.hand_off(vec![announced.into()]);
        Ok(Ok(CreatedRun {
            run_id: id,
            created: true,
        }))
    }

    /// The request of run `id` as `new` gives it, sealed for its row.
    fn seal_request(&self, id: RunId, new: &NewRun) -> Result<Vec<u8>, StoreError> {
        let stored = StoredRequest {
            prompt: new.prompt.clone(),
            inputs: new.inputs.clone(),
        };
        Ok(self
            .keyring
            .seal(Purpose::Request, id, &stored.to_bytes())?)
    }

    /// The run an earlier copy of `new` created, or [`StoreError::IdempotencyConflict`] when
    /// the run its request id names was requested otherwise. The conflicting insert has
    /// committed (ON CONFLICT waited for it), so the row is visible to this new statement.
    async fn duplicate_run(&self, producer: &str, new: &NewRun) -> Result<CreatedRun, StoreError> {
        let existing = sqlx::query!(
            r#"SELECT id, agent, acting_user, request FROM runs
               WHERE request_id = $1 AND (producer = $2 OR producer IS NULL)"#,
            new.request_id,
            producer,
        )
        .fetch_one(&self.pool)
        .await?;
        let run_id = run_id(existing.id)?;
        let asked = self.open_request(run_id, &existing.request)?;
        let same = existing.agent == new.agent
            && existing.acting_user == new.acting_user
            && asked.prompt == new.prompt
            && asked.inputs == new.inputs;
        if !same {
            return Err(StoreError::IdempotencyConflict);
        }
        Ok(CreatedRun {
            run_id,
            created: false,
        })
    }

    /// The trace context [`Store::create_run_for`] kept for `run_id`; `None` for a run
    /// created untraced, or no such run.
    pub async fn request_traceparent(&self, run_id: RunId) -> Result<Option<String>, StoreError> {
        let kept = sqlx::query_scalar!(
            "SELECT request_traceparent FROM runs WHERE id = $1",
            run_id.as_uuid()
        )
        .fetch_optional(&self.pool)
        .await?;
        Ok(kept.flatten())
    }

    /// What the gates of a run request read, by one statement: whether `producer` holds a
    /// grant of `kind` for `acting_user` (`producer_grants`, as the coordinator's registry
    /// checks it), and whether the agent configuration exists and is active.
    pub async fn request_facts(
        &self,
        producer: &str,
        kind: &str,
        acting_user: &str,
        agent: &str,
    ) -> Result<RequestFacts, StoreError> {
        let r = sqlx::query!(
            r#"SELECT producer_may_assert($1, $2, $3) AS "granted!",
                      EXISTS (SELECT 1 FROM agents WHERE name = $4 AND active) AS "active!""#,
            producer,
            kind,
            acting_user,
            agent,
        )
        .fetch_one(&self.pool)
        .await?;
        Ok(RequestFacts {
            producer_granted: r.granted,
            agent_active: r.active,
        })
    }

    /// `running` → `waiting_for_approval`, guarded by owner and epoch. Seals the state, stores
    /// the turn digest, the pending tool names, the calls that landed under an earlier card
    /// and who edited the card in clear, the suspension number and counters,
    /// sets `approval_deadline = now()` + the agent's deadline (seven days when the
    /// configuration is gone) and clears the lease. In the same transaction it announces the
    /// suspension: when the binding refused an approved turn (`moved_tools`, the tools of the
    /// calls whose preview moved, not empty) `run.preview_moved`, then `run.suspended` — each an
    /// audit row and an outbox row. Nothing is written when the guard loses.
    pub async fn suspend(
        &self,
        lease: &Lease,
        state: &SuspendedRunState,
        moved_tools: &[&str],
    ) -> Result<bool, StoreError> {
        let card = CardColumns::of(self, lease.run_id, state)?;
        let events = outbox::Batch::of(&suspension_events(lease.run_id, state, moved_tools));
        // One statement: the guarded transition, which takes the audit numbers from the run's
        // counter, the audit rows and the outbox rows. Nothing is written when the guard loses.
        let rows = sqlx::query_as!(
            outbox::Row,
            r#"WITH suspended AS (
                   UPDATE runs
                   SET status = 'waiting_for_approval', state = $4, turn_digest = $5,
                       pending_tools = $6, suspension_seq = $7, card_landed = $15,
                       card_editors = $16,
                       approval_deadline = now() + coalesce(
                           (SELECT a.approval_deadline_seconds FROM agents a
                            WHERE a.name = runs.agent),
                           604800) * interval '1 second',
                       iterations = $8, prompt_tokens = $9, completion_tokens = $10,
                       sent_seq = NULL, sent_call = NULL, updated_at = now()
                   WHERE id = $1 AND status = 'running' AND lease_owner = $2 AND lease_epoch = $3
                   RETURNING id),
               announced AS (
                   SELECT announce(s.id, a.id, a.kind, a.body, a.payload) AS e
                   FROM suspended s,
                        unnest($11::text[], $12::jsonb[], $13::uuid[], $14::jsonb[])
                            WITH ORDINALITY AS a (kind, payload, id, body, n)
                   ORDER BY a.n)
               SELECT (e).id AS "id!", (e).run_id, (e).kind AS "kind!", (e).body AS "body!",
                      (e).created_at AS "created_at!"
               FROM announced"#,
            lease.run_id.as_uuid(),
            lease.owner,
            lease.epoch.get(),
            card.sealed,
            card.digest.as_str(),
            &card.tools,
            state.suspension_seq.as_i32(),
            card.counters.0,
            card.counters.1,
            card.counters.2,
            &events.kinds,
            &events.payloads,
            &events.ids,
            &events.bodies,
            &card.landed,
            &card.editors,
        )
        .fetch_all(&self.pool)
        .await?;
        if rows.is_empty() {
            return Ok(false);
        }
        self.hand_off(rows.into_iter().map(Into::into).collect());
        Ok(true)
    }

    /// `running` → `queued` of the same segment, guarded by owner and epoch, available again
    /// after `delay`: a segment that must stop (its process is shutting down) hands its run
    /// back instead of leaving it to the reaper. The requeue count is not charged. A call
    /// stamped as sent stays stamped (`sent_seq`, `sent_call`): the next segment asks its
    /// resource what became of it before anything else.
    pub async fn requeue_segment(
        &self,
        lease: &Lease,
        delay: Duration,
    ) -> Result<bool, StoreError> {
        let done = sqlx::query!(
            r#"UPDATE runs
               SET status = 'queued',
                   available_at = now() + $4 * interval '1 millisecond', dispatched_at = NULL,
                   updated_at = now()
               WHERE id = $1 AND status = 'running' AND lease_owner = $2 AND lease_epoch = $3"#,
            lease.run_id.as_uuid(),
            lease.owner,
            lease.epoch.get(),
            millis(delay) as f64,
        )
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Any non-terminal status → `cancelled` (reason `cancelled`), by an operator, with its
    /// `run.cancelled` audit row and outbox row in the same transaction: one commit, or nothing
    /// (`false` when the run does not exist or has already ended). A running segment learns it
    /// at its next heartbeat or fence.
    pub async fn cancel(&self, run_id: RunId) -> Result<bool, StoreError> {
        let mut tx = self.pool.begin().await?;
        let done = sqlx::query!(
            r#"UPDATE runs
               SET status = 'cancelled', termination_reason = 'cancelled', updated_at = now()
               WHERE id = $1 AND status IN ('queued', 'running', 'waiting_for_approval')"#,
            run_id.as_uuid(),
        )
        .execute(&mut *tx)
        .await?;
        self.end_announced(
            tx,
            done.rows_affected(),
            EventName::RunCancelled,
            run_id,
            TerminationReason::Cancelled,
        )
        .await
    }

    /// Finishes the transaction of a guarded transition that ends a run: when it won (`rows`
    /// is 1), its event is announced and everything commits; otherwise nothing does.
    pub(crate) async fn end_announced(
        &self,
        mut tx: Transaction<'_, Postgres>,
        rows: u64,
        name: EventName,
        run_id: RunId,
        reason: TerminationReason,
    ) -> Result<bool, StoreError> {
        if rows != 1 {
            tx.rollback().await?;
            return Ok(false);
        }
        let event = ended_event(name, run_id, reason);
        let row = outbox::announce_locked(&mut tx, &self.keyring, run_id, &event, None).await?;
        tx.commit().await?;
        self.hand_off(vec![row]);
        Ok(true)
    }

    /// Records that the run's wake-up was published, so the reaper's lost-dispatch scan skips
    /// it until it becomes available again.
    pub async fn mark_dispatched(&self, run_id: RunId) -> Result<bool, StoreError> {
        let done = sqlx::query!(
            "UPDATE runs SET dispatched_at = now() WHERE id = $1 AND status = 'queued'",
            run_id.as_uuid(),
        )
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// The decrypted suspended state of a run, for core to parse. A state that does not open
    /// (wrong key, tampered, another run's) is an error whose code is `state_unreadable`.
    pub async fn load_state(&self, run_id: RunId) -> Result<Vec<u8>, StoreError> {
        let row = sqlx::query!("SELECT state FROM runs WHERE id = $1", run_id.as_uuid())
            .fetch_optional(&self.pool)
            .await?
            .ok_or(StoreError::RunNotFound(run_id))?;
        let sealed = row.state.ok_or(StoreError::NoState(run_id))?;
        self.open_state(run_id, &sealed)
    }

    /// Opens a sealed suspended state (a claim's [`ClaimedInputs::state`]); an error whose code
    /// is `state_unreadable` when it does not open.
    ///
    /// [`ClaimedInputs::state`]: crate::ClaimedInputs::state
    pub fn open_state(&self, run_id: RunId, sealed: &[u8]) -> Result<Vec<u8>, StoreError> {
        Ok(self.keyring.open(Purpose::State, run_id, sealed)?)
    }

    /// Opens a sealed request (a claim's [`ClaimedInputs::request`]).
    ///
    /// [`ClaimedInputs::request`]: crate::ClaimedInputs::request
    pub fn open_request(&self, run_id: RunId, sealed: &[u8]) -> Result<StoredRequest, StoreError> {
        let bytes = self.keyring.open(Purpose::Request, run_id, sealed)?;
        StoredRequest::from_bytes(&bytes)
    }

    /// The decrypted prompt of a run.
    pub async fn load_prompt(&self, run_id: RunId) -> Result<String, StoreError> {
        Ok(self.load_request(run_id).await?.prompt)
    }

    /// The decrypted request of a run: its prompt and inputs.
    pub async fn load_request(&self, run_id: RunId) -> Result<StoredRequest, StoreError> {
        let sealed =
            sqlx::query_scalar!("SELECT request FROM runs WHERE id = $1", run_id.as_uuid())
                .fetch_optional(&self.pool)
                .await?
                .ok_or(StoreError::RunNotFound(run_id))?;
        self.open_request(run_id, &sealed)
    }

    /// A run without its sealed columns.
    pub async fn run(&self, run_id: RunId) -> Result<Option<RunRecord>, StoreError> {
        let row = sqlx::query!(
            r#"SELECT id, request_id, agent, acting_user, status, segment, suspension_seq,
                      turn_digest, pending_tools, lease_owner, lease_epoch, lease_expires_at,
                      pending_effect, requeue_count, available_at, dispatched_at,
                      approval_deadline, termination_reason, error_code, sent_seq, sent_call,
                      iterations, prompt_tokens, completion_tokens,
                      state IS NOT NULL AS "has_state!", created_at, updated_at
               FROM runs WHERE id = $1"#,
            run_id.as_uuid(),
        )
        .fetch_optional(&self.pool)
        .await?;
        let Some(r) = row else { return Ok(None) };
        Ok(Some(RunRecord {
            id: run_id,
            request_id: r.request_id,
            agent: r.agent,
            acting_user: r.acting_user,
            status: status(&r.status)?,
            segment: segment(&r.segment)?,
            suspension_seq: opt_seq(r.suspension_seq)?,
            turn_digest: r.turn_digest.as_deref().map(digest).transpose()?,
            pending_tools: r.pending_tools,
            lease_owner: r.lease_owner,
            lease_epoch: epoch(r.lease_epoch)?,
            lease_expires_at: r.lease_expires_at,
            pending_effect: pending_effect(r.pending_effect)?,
            requeue_count: r.requeue_count,
            available_at: r.available_at,
            dispatched_at: r.dispatched_at,
            approval_deadline: r.approval_deadline,
            termination_reason: r
                .termination_reason
                .map(|t| {
                    t.parse()
                        .map_err(|_| StoreError::unreadable("runs.termination_reason"))
                })
                .transpose()?,
            error_code: r.error_code,
            sent_call: match (r.sent_seq, r.sent_call) {
                (Some(seq), Some(index)) => Some(SentCallRef {
                    suspension_seq: SuspensionSeq::from_i32(seq)
                        .map_err(|_| StoreError::unreadable("runs.sent_seq"))?,
                    index: CallIndex::from_i32(index)
                        .map_err(|_| StoreError::unreadable("runs.sent_call"))?,
                }),
                _ => None,
            },
            counters: RunCounters {
                iterations: u32::try_from(r.iterations).unwrap_or_default(),
                prompt_tokens: u64::try_from(r.prompt_tokens).unwrap_or_default(),
                completion_tokens: u64::try_from(r.completion_tokens).unwrap_or_default(),
            },
            has_state: r.has_state,
            created_at: r.created_at,
            updated_at: r.updated_at,
        }))
    }
}

/// What the decision gates read of a card beside its digest, stored in clear: the calls that
/// landed under an earlier card of the turn, and who edited the card (each once, sorted).
/// What a suspension writes of its card besides the events: the state sealed, the turn digest,
/// the pending tool names, the calls that landed under an earlier card and who edited it (in
/// clear, for the inbox), and the run's counters.
struct CardColumns {
    sealed: Vec<u8>,
    digest: TurnDigest,
    tools: Vec<String>,
    landed: Vec<i32>,
    editors: Vec<String>,
    counters: (i32, i64, i64),
}

impl CardColumns {
    fn of(store: &Store, run_id: RunId, state: &SuspendedRunState) -> Result<Self, StoreError> {
        let mut editors: Vec<String> = state.edits.iter().map(|e| e.editor.clone()).collect();
        editors.sort();
        editors.dedup();
        Ok(CardColumns {
            sealed: store
                .keyring
                .seal(Purpose::State, run_id, &state.to_bytes())?,
            digest: state.turn_digest(),
            tools: state.pending_calls.iter().map(|c| c.tool.clone()).collect(),
            landed: state
                .landed_calls
                .iter()
                .map(|c| c.index.as_i32())
                .collect(),
            editors,
            counters: RunCounters {
                iterations: state.iterations,
                prompt_tokens: state.tokens.prompt,
                completion_tokens: state.tokens.completion,
            }
            .columns(),
        })
    }
}
