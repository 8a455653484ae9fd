//! Runs and the guarded transitions of their lifecycle.
//!
//! Every transition is one `UPDATE … WHERE status = … [AND lease guard]` whose
//! `rows_affected() == 1` is the only answer to "did I win". No transition reads the row first
//! and decides in Rust: between such a read and its write, a heartbeat, a reaper or a second
//! worker could have moved the run, and the write would undo their work. A caller that lost
//! must back off without side effects — the row already says what happened instead.
//!
//! The lease is `(lease_owner, lease_epoch, lease_expires_at)`. The epoch grows by one on every
//! claim and is never reset, so a [`Lease`] taken before a requeue can never match again: that
//! is what keeps a zombie segment from suspending, settling, renewing or writing.

use std::time::Duration;

use chrono::{DateTime, Utc};
use countersign_core::{
    CallIndex, Effect, EventName, FenceToken, LeaseEpoch, RunId, SuspendedRunState, SuspensionSeq,
    TurnDigest,
};
use countersign_crypto::Purpose;
use uuid::Uuid;

use crate::agents::{AgentColumns, StoredAgent};
use crate::{millis, outbox, Store, StoreError};

/// The producer of the runs this repository's own tools create through
/// [`Store::create_run`] (tests, benchmarks): no transport authenticated it.
pub const LOCAL_PRODUCER: &str = "countersign:local";

/// A run as requested by a producer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewRun {
    /// Chosen by the producer; a duplicate creates nothing.
    pub request_id: Uuid,
    pub agent: String,
    pub acting_user: String,
    /// Sealed before it is stored, together with `inputs`.
    pub prompt: String,
    /// Structured inputs of the run request (a JSON object), sealed with the prompt.
    pub inputs: Option<serde_json::Map<String, serde_json::Value>>,
}

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
pub enum Segment {
    Start,
    Resume,
}

impl Segment {
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

/// What one heartbeat did with a lease still held ([`Store::renew_all`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renewal {
    /// Extended to `now() + ttl`.
    Renewed,
    /// Not extended this beat: another transaction holds the run row (most often the lease's
    /// own turn). Neither renewed nor lost; the next beat asks again.
    Busy,
}

/// What the gates of a run request read ([`Store::request_facts`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestFacts {
    /// The producer holds a grant for the acting user.
    pub producer_granted: bool,
    /// The agent configuration exists and is active.
    pub agent_active: bool,
}

/// A won claim: the lease and what the segment needs to start.
#[derive(Debug, Clone, PartialEq)]
pub struct Claim {
    pub lease: Lease,
    /// By the database clock; renew every third of the ttl.
    pub lease_expires_at: DateTime<Utc>,
    pub segment: Segment,
    pub agent: String,
    pub acting_user: String,
    /// The suspension a resume segment continues; `None` for a start that never suspended.
    pub suspension_seq: Option<SuspensionSeq>,
    pub requeue_count: i32,
    /// For a resume: the call of this suspension's turn that an earlier attempt sent outside
    /// the store and did not journal ([`SentCall`]). It may have landed.
    pub sent_call: Option<CallIndex>,
    /// What the segment starts from, read by the claim's own statement.
    pub inputs: ClaimedInputs,
}

/// What a segment starts from, returned by the statement that won its claim rather than read
/// by one statement each: the agent's configuration as it is now, and the sealed request (a
/// start) or the sealed state and the accepted decision (a resume). The claim holds the run,
/// so nothing here can change under the segment; the sealed parts are opened by
/// [`Store::open_request`], [`Store::open_state`] and [`Store::open_decision`].
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimedInputs {
    /// `None` when the configuration is gone.
    pub agent: Option<StoredAgent>,
    /// The sealed request, for a start segment.
    pub request: Option<Vec<u8>>,
    /// The sealed suspended state, for a resume segment.
    pub state: Option<Vec<u8>>,
    /// The accepted decision of the suspension a resume continues, its comment still sealed.
    pub decision: Option<SealedDecision>,
}

/// An accepted decision as a claim reads it: the comment is opened with
/// [`Store::open_decision`].
#[derive(Debug, Clone, PartialEq)]
pub struct SealedDecision {
    pub decision_id: Uuid,
    pub approved: bool,
    pub approver: String,
    pub comment: Option<Vec<u8>>,
    /// How long before the claim it was recorded, in seconds by the database clock: where a
    /// segment starts timing decision → write.
    pub decided_secs_ago: Option<f64>,
}

/// The counters a run carries across segments.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RunCounters {
    pub iterations: u32,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
}

impl RunCounters {
    fn columns(self) -> (i32, i64, i64) {
        (
            i32::try_from(self.iterations).unwrap_or(i32::MAX),
            i64::try_from(self.prompt_tokens).unwrap_or(i64::MAX),
            i64::try_from(self.completion_tokens).unwrap_or(i64::MAX),
        )
    }
}

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

/// A run as stored, without its sealed columns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunRecord {
    pub id: RunId,
    pub request_id: Uuid,
    pub agent: String,
    pub acting_user: String,
    pub status: RunStatus,
    pub segment: Segment,
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

/// A run waiting for a decision, as the inbox lists it (no content).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaitingRun {
    pub run_id: RunId,
    pub agent: String,
    pub acting_user: String,
    pub suspension_seq: SuspensionSeq,
    pub turn_digest: TurnDigest,
    pub pending_tools: Vec<String>,
    pub approval_deadline: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
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

fn opt_seq(n: Option<i32>) -> Result<Option<SuspensionSeq>, StoreError> {
    n.map(seq).transpose()
}

fn segment(s: &str) -> Result<Segment, StoreError> {
    s.parse()
        .map_err(|_| StoreError::unreadable("runs.segment"))
}

fn digest(s: &str) -> Result<TurnDigest, StoreError> {
    TurnDigest::parse(s).map_err(|_| StoreError::unreadable("runs.turn_digest"))
}

/// The stamp a heartbeat may leave: only writes are stamped, a read needs no warning.
fn effect_stamp(effect: Option<Effect>) -> Option<&'static str> {
    effect.filter(|e| e.is_write()).map(Effect::as_str)
}

/// A call about to be sent outside the store, as its stamp records it: its effect (what the
/// reaper may do with the run if it dies now) and which call of which turn it is (what the
/// segment that retries the turn must send again rather than compare).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SentCall {
    pub seq: SuspensionSeq,
    pub index: CallIndex,
    pub effect: Effect,
}

/// What a claim's statement (`claim_runs`) gives back: the claimed row, its agent and, for a
/// resume, the accepted decision.
struct ClaimRow {
    id: Uuid,
    lease_epoch: i64,
    lease_expires_at: DateTime<Utc>,
    segment: String,
    agent: String,
    acting_user: String,
    suspension_seq: Option<i32>,
    requeue_count: i32,
    sent_call: Option<i32>,
    request: Option<Vec<u8>>,
    state: Option<Vec<u8>>,
    settings: Option<AgentColumns>,
    decision_id: Option<Uuid>,
    approved: Option<bool>,
    approver: Option<String>,
    comment: Option<Vec<u8>>,
    decided_secs_ago: Option<f64>,
}

/// Which runs a claim asks for.
#[derive(Clone, Copy)]
enum Asked<'a> {
    /// These runs, each waited for while another transaction holds its row.
    Waiting(&'a [Uuid]),
    /// These runs, skipping a row another transaction holds.
    Free(&'a [Uuid]),
    /// Any available runs, those available longest first, skipping held rows.
    Next(i64),
}

impl ClaimRow {
    fn into_claim(self, owner: &str) -> Result<Claim, StoreError> {
        let agent = self.settings.map(StoredAgent::from);
        let decision = match (self.decision_id, self.approved, self.approver) {
            (Some(decision_id), Some(approved), Some(approver)) => Some(SealedDecision {
                decision_id,
                approved,
                approver,
                comment: self.comment,
                decided_secs_ago: self.decided_secs_ago,
            }),
            _ => None,
        };
        Ok(Claim {
            lease: Lease {
                run_id: run_id(self.id)?,
                owner: owner.to_owned(),
                epoch: epoch(self.lease_epoch)?,
            },
            lease_expires_at: self.lease_expires_at,
            segment: segment(&self.segment)?,
            agent: self.agent,
            acting_user: self.acting_user,
            suspension_seq: opt_seq(self.suspension_seq)?,
            requeue_count: self.requeue_count,
            sent_call: self
                .sent_call
                .map(|i| {
                    CallIndex::from_i32(i).map_err(|_| StoreError::unreadable("runs.sent_call"))
                })
                .transpose()?,
            inputs: ClaimedInputs {
                agent,
                request: self.request,
                state: self.state,
                decision,
            },
        })
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
        let event = outbox::settlement_event(lease.run_id, s);
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
        self.kinds.push(event.name.to_string());
        self.payloads.push(outbox::audit_payload(&event));
        self.event_ids.push(Uuid::now_v7());
        self.bodies.push(outbox::stored_body(&event));
        Ok(())
    }
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
        let id = RunId::new();
        let stored = StoredRequest {
            prompt: new.prompt.clone(),
            inputs: new.inputs.clone(),
        };
        let request = self
            .keyring
            .seal(Purpose::Request, id, &stored.to_bytes())?;
        // One statement, one commit: the run and its `run.accepted` outbox row, or, on a
        // duplicate request id, neither.
        let event = outbox::run_accepted(new.request_id, id);
        let announced = sqlx::query_as!(
            outbox::Row,
            r#"WITH created AS (
                   INSERT INTO runs (id, request_id, producer, agent, acting_user, status, segment,
                                     request, request_traceparent)
                   SELECT $1, $2, $9, $3, $4, 'queued', 'start', $5, $10
                   WHERE NOT EXISTS (SELECT 1 FROM runs
                                     WHERE request_id = $2 AND producer IS NULL)
                   ON CONFLICT (producer, request_id) DO NOTHING
                   RETURNING id)
               INSERT INTO event_outbox (id, run_id, kind, body)
               SELECT $6, created.id, $7,
                      announced_body($8::jsonb, $6::uuid)
               FROM created
               RETURNING id, run_id, kind, body, created_at, published_at"#,
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
        )
        .fetch_optional(&self.pool)
        .await?;
        if let Some(row) = announced {
            self.hand_off(vec![row.into()]);
            return Ok(CreatedRun {
                run_id: id,
                created: true,
            });
        }
        self.duplicate_run(producer, new).await
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

    /// `queued` → `running`: one UPDATE that sets the owner, `lease_epoch + 1` and
    /// `lease_expires_at = now() + ttl`, only if the run is available by the database clock.
    /// `None` when it lost (another claimer, not queued, or not yet available). [`Store::claim_many`]
    /// of one, except that a row another transaction holds is waited for: the answer says
    /// whether the claim was truly lost.
    pub async fn claim(
        &self,
        run_id: RunId,
        owner: &str,
        ttl: Duration,
    ) -> Result<Option<Claim>, StoreError> {
        let ids = [run_id.as_uuid()];
        let row = self.claim_runs(Asked::Waiting(&ids), owner, ttl).await?;
        row.into_iter()
            .next()
            .map(|r| r.into_claim(owner))
            .transpose()
    }

    /// [`Store::claim`] for many wake-ups in one statement: each run is claimed as `claim`
    /// would claim it, but a row another transaction holds is skipped rather than waited for,
    /// so one busy row never holds up the others and two batches never wait on each other.
    /// The answer is in the order asked: the claim won, or `None` for a run lost or skipped
    /// (only [`Store::claim`] tells which); a run asked for twice is won once at most.
    pub async fn claim_many(
        &self,
        run_ids: &[RunId],
        owner: &str,
        ttl: Duration,
    ) -> Result<Vec<Option<Result<Claim, StoreError>>>, StoreError> {
        let ids: Vec<Uuid> = run_ids.iter().map(|r| r.as_uuid()).collect();
        let rows = self.claim_runs(Asked::Free(&ids), owner, ttl).await?;
        let mut won: Vec<Option<ClaimRow>> = rows.into_iter().map(Some).collect();
        Ok(ids
            .iter()
            .map(|id| {
                let row = won
                    .iter_mut()
                    .find(|r| r.as_ref().is_some_and(|r| r.id == *id))?;
                row.take().map(|r| r.into_claim(owner))
            })
            .collect())
    }

    /// Claims up to `limit` of the queued runs that have been available longest, skipping rows
    /// another transaction holds: the polling fallback when no wake-up arrived, one statement
    /// for as many runs as the worker has slots free. Empty when none is available.
    pub async fn claim_next(
        &self,
        owner: &str,
        ttl: Duration,
        limit: usize,
    ) -> Result<Vec<Result<Claim, StoreError>>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = self.claim_runs(Asked::Next(limit), owner, ttl).await?;
        Ok(rows.into_iter().map(|r| r.into_claim(owner)).collect())
    }

    /// The one claim statement (the function `claim_runs` of the migrations).
    async fn claim_runs(
        &self,
        asked: Asked<'_>,
        owner: &str,
        ttl: Duration,
    ) -> Result<Vec<ClaimRow>, StoreError> {
        let (ids, skip_locked, limit) = match asked {
            Asked::Waiting(ids) => (Some(ids), false, None),
            Asked::Free(ids) => (Some(ids), true, None),
            Asked::Next(limit) => (None, true, Some(limit)),
        };
        Ok(sqlx::query_as!(
            ClaimRow,
            r#"SELECT id AS "id!", lease_epoch AS "lease_epoch!",
                      lease_expires_at AS "lease_expires_at!", segment AS "segment!",
                      agent AS "agent!", acting_user AS "acting_user!", suspension_seq,
                      requeue_count AS "requeue_count!", sent_call, request, state,
                      settings AS "settings: AgentColumns", decision_id, approved, approver,
                      comment, decided_secs_ago
               FROM claim_runs($1, $2, $3, $4, $5)"#,
            ids as Option<&[Uuid]>,
            skip_locked,
            limit,
            owner,
            millis(ttl) as f64,
        )
        .fetch_all(&self.pool)
        .await?)
    }

    /// Heartbeat: extends the lease to `now() + ttl` if this segment still holds it. `false`
    /// means the lease is lost: stop at the next step boundary and settle nothing.
    pub async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<bool, StoreError> {
        let done = sqlx::query!(
            r#"UPDATE runs SET lease_expires_at = now() + $4 * interval '1 millisecond'
               WHERE id = $1 AND status = 'running' AND lease_owner = $2 AND lease_epoch = $3"#,
            lease.run_id.as_uuid(),
            lease.owner,
            lease.epoch.get(),
            millis(ttl) as f64,
        )
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// One heartbeat for many leases: extends every lease still held (owner, epoch, `running`)
    /// to `now() + ttl` in one statement. A lease missing from the answer is lost.
    ///
    /// The statement waits for no row: a run row another transaction has locked is skipped and
    /// answered [`Renewal::Busy`]. The lock is most often the lease's own turn transaction,
    /// which renewed the lease when it began and renews it again with its journal rows; waiting
    /// for it would stall the renewal of every other lease of the worker behind one turn that
    /// waits on a lock of its own (a colleague editing the same page). A transition that holds
    /// the row (a cancel, the reaper) shows as lost at the next beat.
    pub async fn renew_all(
        &self,
        leases: &[Lease],
        ttl: Duration,
    ) -> Result<Vec<(RunId, Renewal)>, StoreError> {
        let ids: Vec<Uuid> = leases.iter().map(|l| l.run_id.as_uuid()).collect();
        let owners: Vec<String> = leases.iter().map(|l| l.owner.clone()).collect();
        let epochs: Vec<i64> = leases.iter().map(|l| l.epoch.get()).collect();
        let rows = sqlx::query!(
            r#"WITH leases AS (
                   SELECT * FROM unnest($1::uuid[], $2::text[], $3::int8[]) AS h (id, owner, epoch)),
               held AS (
                   SELECT r.id FROM runs r JOIN leases h ON r.id = h.id
                   WHERE r.lease_owner = h.owner AND r.lease_epoch = h.epoch
                     AND r.status = 'running'),
               -- The guard again: a row locked and changed meanwhile is checked against its
               -- newest version once its lock is taken.
               free AS (
                   SELECT r.id FROM runs r JOIN leases h ON r.id = h.id
                   WHERE r.lease_owner = h.owner AND r.lease_epoch = h.epoch
                     AND r.status = 'running'
                   FOR UPDATE OF r SKIP LOCKED),
               renewed AS (
                   UPDATE runs r SET lease_expires_at = now() + $4 * interval '1 millisecond'
                   FROM free WHERE r.id = free.id
                   RETURNING r.id)
               -- A hashed subplan, not a join: the planner cannot size the CTEs, and the join
               -- it chose compared every held lease with every renewed one.
               SELECT held.id AS "id!", held.id IN (SELECT id FROM renewed) AS "renewed!"
               FROM held"#,
            &ids,
            &owners,
            &epochs,
            millis(ttl) as f64,
        )
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter()
            .map(|r| {
                let renewal = if r.renewed {
                    Renewal::Renewed
                } else {
                    Renewal::Busy
                };
                Ok((run_id(r.id)?, renewal))
            })
            .collect()
    }

    /// A heartbeat that also stamps the call about to be sent outside the store (or clears the
    /// stamp with `None`) in the same UPDATE, before its effect runs: the reaper never retries
    /// a run stamped `non_idempotent_write`, because the effect may already have happened; and
    /// the segment that retries a turn sends the stamped call again under its key.
    pub async fn renew_stamping(
        &self,
        lease: &Lease,
        ttl: Duration,
        sent: Option<SentCall>,
    ) -> Result<bool, StoreError> {
        let done = sqlx::query!(
            r#"UPDATE runs SET lease_expires_at = now() + $4 * interval '1 millisecond',
                               pending_effect = $5, sent_seq = $6, sent_call = $7
               WHERE id = $1 AND status = 'running' AND lease_owner = $2 AND lease_epoch = $3"#,
            lease.run_id.as_uuid(),
            lease.owner,
            lease.epoch.get(),
            millis(ttl) as f64,
            effect_stamp(sent.map(|s| s.effect)),
            sent.map(|s| s.seq.as_i32()),
            sent.map(|s| s.index.as_i32()),
        )
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// `running` → `waiting_for_approval`, guarded by owner and epoch. Seals the state, stores
    /// the turn digest, the pending tool names in clear, the suspension number and counters,
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
        let sealed = self
            .keyring
            .seal(Purpose::State, lease.run_id, &state.to_bytes())?;
        let digest = state.turn_digest();
        let tools: Vec<String> = state.pending_calls.iter().map(|c| c.tool.clone()).collect();
        let (iterations, prompt_tokens, completion_tokens) = RunCounters {
            iterations: state.iterations,
            prompt_tokens: state.tokens.prompt,
            completion_tokens: state.tokens.completion,
        }
        .columns();
        let events =
            outbox::Batch::of(&outbox::suspension_events(lease.run_id, state, moved_tools));
        // One statement: the guarded transition, which takes the audit numbers from the run's
        // counter, the audit rows and the outbox rows. Nothing is written when the guard loses.
        let rows = sqlx::query_as!(
            outbox::Row,
            r#"WITH suspended AS (
                   UPDATE runs
                   SET status = 'waiting_for_approval', state = $4, turn_digest = $5,
                       pending_tools = $6, suspension_seq = $7,
                       approval_deadline = now() + coalesce(
                           (SELECT a.approval_deadline_seconds FROM agents a
                            WHERE a.name = runs.agent),
                           604800) * interval '1 second',
                       iterations = $8, prompt_tokens = $9, completion_tokens = $10,
                       lease_owner = NULL, lease_expires_at = NULL, pending_effect = NULL,
                       sent_seq = NULL, sent_call = NULL, updated_at = now()
                   WHERE id = $1 AND status = 'running' AND lease_owner = $2 AND lease_epoch = $3
                   RETURNING id),
               numbered AS (
                   INSERT INTO run_trails (run_id, last_sequence)
                   SELECT id, cardinality($11::text[]) FROM suspended
                   ON CONFLICT (run_id) DO UPDATE
                       SET last_sequence = run_trails.last_sequence + excluded.last_sequence
                   RETURNING run_id, last_sequence - cardinality($11::text[]) AS first_seq),
               announced AS (
                   SELECT e.kind, e.payload, e.id, e.body, e.n
                   FROM unnest($11::text[], $12::jsonb[], $13::uuid[], $14::jsonb[])
                        WITH ORDINALITY AS e (kind, payload, id, body, n)),
               audit AS (
                   INSERT INTO run_events (run_id, sequence, kind, payload)
                   SELECT t.run_id, t.first_seq + a.n, a.kind, a.payload
                   FROM numbered t, announced a
                   RETURNING sequence)
               INSERT INTO event_outbox (id, run_id, kind, body)
               SELECT a.id, s.id, a.kind,
                      announced_body(a.body, a.id)
               FROM suspended s, announced a
               ORDER BY a.n
               RETURNING id, run_id, kind, body, created_at, published_at"#,
            lease.run_id.as_uuid(),
            lease.owner,
            lease.epoch.get(),
            sealed,
            digest.as_str(),
            &tools,
            state.suspension_seq.as_i32(),
            iterations,
            prompt_tokens,
            completion_tokens,
            &events.kinds,
            &events.payloads,
            &events.ids,
            &events.bodies,
        )
        .fetch_all(&self.pool)
        .await?;
        if rows.is_empty() {
            return Ok(false);
        }
        self.hand_off(rows.into_iter().map(Into::into).collect());
        Ok(true)
    }

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
        let settleable =
            |s: &Settlement| matches!(s.status, RunStatus::Completed | RunStatus::Failed);
        let mut given = SettlementColumns::default();
        for (lease, settlement) in settlements.iter().filter(|(_, s)| settleable(s)) {
            given.push(self, lease, settlement)?;
        }
        if given.ids.is_empty() {
            return Ok(vec![false; settlements.len()]);
        }
        let rows = sqlx::query_as!(
            outbox::Row,
            r#"WITH given AS (
                   SELECT DISTINCT ON (id) *
                   FROM unnest($1::uuid[], $2::text[], $3::int8[], $4::text[], $5::text[],
                               $6::text[], $7::int4[], $8::int8[], $9::int8[], $10::text[],
                               $11::jsonb[], $12::bytea[], $13::uuid[], $14::jsonb[])
                        AS g (id, owner, epoch, status, reason, error_code, iterations,
                              prompt_tokens, completion_tokens, kind, payload, sealed,
                              event_id, body)),
               held AS (
                   SELECT r.id FROM runs r JOIN given g ON r.id = g.id
                   WHERE r.status = 'running' AND r.lease_owner = g.owner
                     AND r.lease_epoch = g.epoch
                   ORDER BY r.id
                   FOR UPDATE OF r),
               settled AS (
                   UPDATE runs r
                   SET status = g.status, termination_reason = g.reason,
                       error_code = g.error_code,
                       iterations = coalesce(g.iterations, r.iterations),
                       prompt_tokens = coalesce(g.prompt_tokens, r.prompt_tokens),
                       completion_tokens = coalesce(g.completion_tokens, r.completion_tokens),
                       lease_owner = NULL, lease_expires_at = NULL, pending_effect = NULL,
                       updated_at = now()
                   FROM given g
                   WHERE r.id = g.id AND r.id IN (SELECT id FROM held)
                     AND r.status = 'running' AND r.lease_owner = g.owner
                     AND r.lease_epoch = g.epoch
                   RETURNING r.id),
               numbered AS (
                   INSERT INTO run_trails (run_id, last_sequence)
                   SELECT id, 1 FROM settled
                   ON CONFLICT (run_id) DO UPDATE SET last_sequence = run_trails.last_sequence + 1
                   RETURNING run_id, last_sequence),
               audit AS (
                   INSERT INTO run_events (run_id, sequence, kind, payload, sealed)
                   SELECT t.run_id, t.last_sequence, g.kind, g.payload, g.sealed
                   FROM numbered t JOIN given g ON g.id = t.run_id
                   RETURNING sequence)
               INSERT INTO event_outbox (id, run_id, kind, body)
               SELECT g.event_id, s.id, g.kind, announced_body(g.body, g.event_id)
               FROM settled s JOIN given g ON g.id = s.id
               RETURNING id, run_id, kind, body, created_at, published_at"#,
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
            .map(|(lease, s)| settleable(s) && written.contains(&Some(lease.run_id.as_uuid())))
            .collect())
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
               SET status = 'queued', lease_owner = NULL, lease_expires_at = NULL,
                   pending_effect = NULL,
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
               SET status = 'cancelled', termination_reason = 'cancelled',
                   lease_owner = NULL, lease_expires_at = NULL, updated_at = now()
               WHERE id = $1 AND status IN ('queued', 'running', 'waiting_for_approval')"#,
            run_id.as_uuid(),
        )
        .execute(&mut *tx)
        .await?;
        if done.rows_affected() != 1 {
            tx.rollback().await?;
            return Ok(false);
        }
        let event = outbox::ended_event(
            EventName::RunCancelled,
            run_id,
            TerminationReason::Cancelled,
        );
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
    pub fn open_state(&self, run_id: RunId, sealed: &[u8]) -> Result<Vec<u8>, StoreError> {
        Ok(self.keyring.open(Purpose::State, run_id, sealed)?)
    }

    /// Opens a sealed request (a claim's [`ClaimedInputs::request`]).
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
            status: r
                .status
                .parse()
                .map_err(|_| StoreError::unreadable("runs.status"))?,
            segment: segment(&r.segment)?,
            suspension_seq: opt_seq(r.suspension_seq)?,
            turn_digest: r.turn_digest.as_deref().map(digest).transpose()?,
            pending_tools: r.pending_tools,
            lease_owner: r.lease_owner,
            lease_epoch: epoch(r.lease_epoch)?,
            lease_expires_at: r.lease_expires_at,
            pending_effect: r
                .pending_effect
                .map(|e| {
                    e.parse()
                        .map_err(|_| StoreError::unreadable("runs.pending_effect"))
                })
                .transpose()?,
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

    /// Runs waiting for a decision, soonest deadline first.
    pub async fn inbox(&self, limit: i64) -> Result<Vec<WaitingRun>, StoreError> {
        let rows = sqlx::query!(
            r#"SELECT id, agent, acting_user, suspension_seq AS "suspension_seq!",
                      turn_digest AS "turn_digest!", pending_tools,
                      approval_deadline AS "approval_deadline!", updated_at
               FROM runs WHERE status = 'waiting_for_approval'
               ORDER BY approval_deadline, id LIMIT $1"#,
            limit,
        )
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter()
            .map(|r| {
                Ok(WaitingRun {
                    run_id: run_id(r.id)?,
                    agent: r.agent,
                    acting_user: r.acting_user,
                    suspension_seq: seq(r.suspension_seq)?,
                    turn_digest: digest(&r.turn_digest)?,
                    pending_tools: r.pending_tools,
                    approval_deadline: r.approval_deadline,
                    updated_at: r.updated_at,
                })
            })
            .collect()
    }
}
