//! Decisions on suspended runs.
//!
//! A decision is recorded once per `decision_id`, whatever its outcome, so that a producer
//! replaying its message learns the same outcome again and nothing else happens. Its row, its
//! audit event and its public event (`decision.accepted` / `decision.refused`, in the outbox)
//! commit together, so a replay finds the announcement already made. An accepted decision
//! releases the turn: the transition `waiting_for_approval` → `queued`/`resume` (guarded by
//! status, suspension number and turn digest) is part of the same statement. If the transition
//! loses — another decision, a cancel or the reaper got there first — nothing is written, not
//! even the decision row, and the run stays as the winner left it: an approval is never on
//! record for a turn it did not release.

use countersign_core::{
    ArgumentsEdit, CallEdit, CallIndex, CallVerdict, Decision, DecisionMessage, Event, EventName,
    RunId, SuspensionSeq, TurnDigest,
};
use countersign_crypto::Purpose;
use serde::{Deserialize, Serialize};
use serde_json::json;
use strum::{EnumString, IntoStaticStr, VariantArray};
use uuid::Uuid;

use crate::agents::{AgentColumns, StoredAgent};
use crate::leases::SealedDecision;
use crate::runs::{self, RunStatus};
use crate::{outbox, Store, StoreError};

/// The outcome of a decision, as recorded and published.
///
/// `malformed` and `unauthenticated_producer` are not here on purpose: such a message is not
/// recorded, or anyone able to publish could claim a decision id before its real approver.
/// `not_auditable` and `idempotency_conflict` are published but never recorded: the first
/// because the database refused the record, the second because its decision id is taken.
///
/// The variants are in the order of the gates (a metric's label values, the API's document).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, IntoStaticStr, EnumString, VariantArray)]
#[strum(serialize_all = "snake_case")]
pub enum DecisionOutcome {
    IdempotencyConflict,
    NotAwaitingApproval,
    StaleTurn,
    AccessDenied,
    ConfigurationGone,
    SelfApprovalDenied,
    ApproverNotPermitted,
    /// A decision call by call that does not name each call of the card exactly once.
    CallsNotOfTheCard,
    /// An edit of a call the card does not have, or of one that landed under an earlier card.
    EditNotOfTheCard,
    /// An edit naming another tool than its call's: an edit never changes which tool runs.
    EditChangesTool,
    /// An edit whose arguments the tool's schema refuses.
    EditInvalidArguments,
    /// Under four-eyes, an approval by a person who edited the card: another must approve it.
    EditorApprovalDenied,
    /// Under a quorum, a decision by a person in none of the groups that may decide the card
    /// (their own, their delegators' now, or the backup group once the card is escalated).
    NotInApproverGroups,
    /// Under a quorum, a second vote by the same person on one card.
    AlreadyVoted,
    /// Under a quorum, an approval letting other calls run than the approvals given before:
    /// approvals count together only when they approve the same calls.
    QuorumCallsDiffer,
    NotAuditable,
    /// Under a quorum, an approval recorded as a vote: the card waits for the rest.
    ApprovalRecorded,
    /// Under a quorum ending a card at more than one denial, a denial recorded as a vote.
    DenialRecorded,
    Accepted,
}

impl DecisionOutcome {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// A gated decision to record: the message as its producer sent it, and what the gates made
/// of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewDecision {
    /// Its comment is sealed before it is stored.
    pub message: DecisionMessage,
    /// What the gates decided. `Accepted` releases the turn (for a denial too: the model is
    /// told the calls were denied).
    pub outcome: DecisionOutcome,
    /// Whether the decision's event joins the run's audit trail. `false` for a run its
    /// producer may not see: the refusal is recorded (for replays) as for a run that does not
    /// exist, and the run's history shows nothing of it.
    pub in_trail: bool,
}

/// Which policy made a decision: named in its audit event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PolicyMark {
    pub policy: String,
    pub version: u32,
    /// The rule (1-based) that decided.
    pub rule: Option<usize>,
    /// The digest of the facts it saw.
    pub facts_digest: String,
    pub mode: &'static str,
}

/// What became of [`Store::record_decision`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecisionRecord {
    /// Recorded now with this outcome; an accepted one has released the turn.
    Recorded(DecisionOutcome),
    /// The decision id was recorded before, for the same run, card and body: its outcome,
    /// and nothing else happened.
    Replayed(DecisionOutcome),
    /// The decision id was recorded before for another run, card or body: nothing happened.
    Conflict,
    /// An accepted decision whose transition lost: nothing was recorded.
    TransitionLost,
}

/// What a decision id was recorded with before, as a new message naming it finds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replay {
    /// The same run, card (suspension number, turn digest) and body (approved, approver,
    /// comment): the recorded outcome.
    Same(DecisionOutcome),
    /// Anything else: `idempotency_conflict`.
    Conflict,
}

/// A `run_decisions` row as the replay gate reads it.
struct RecordedRow {
    run_id: Uuid,
    suspension_seq: i32,
    turn_digest: String,
    approved: bool,
    approver: String,
    comment: Option<Vec<u8>>,
    detail: Option<Vec<u8>>,
    outcome: String,
}

impl RecordedRow {
    /// The row from the columns of an outer join: `None` when the decision id was never
    /// recorded.
    fn of_columns(
        (run_id, suspension_seq, turn_digest): (Option<Uuid>, Option<i32>, Option<String>),
        (approved, approver, comment): (Option<bool>, Option<String>, Option<Vec<u8>>),
        (detail, outcome): (Option<Vec<u8>>, Option<String>),
    ) -> Option<RecordedRow> {
        Some(RecordedRow {
            run_id: run_id?,
            suspension_seq: suspension_seq?,
            turn_digest: turn_digest?,
            approved: approved?,
            approver: approver?,
            comment,
            detail,
            outcome: outcome?,
        })
    }
}

/// What a decision call by call or an edit says of each call: the content sealed in
/// `run_decisions.detail`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Detail {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    calls: Vec<CallVerdict>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    edits: Vec<ArgumentsEdit>,
}

impl Detail {
    fn of(m: &DecisionMessage) -> Option<Detail> {
        (!m.calls.is_empty() || !m.edits.is_empty()).then(|| Detail {
            calls: m.calls.clone(),
            edits: m.edits.clone(),
        })
    }
}

/// The kind a decision is recorded as: `turn`, `calls` or `edit`.
fn kind(m: &DecisionMessage) -> &'static str {
    if !m.edits.is_empty() {
        "edit"
    } else if !m.calls.is_empty() {
        "calls"
    } else {
        "turn"
    }
}

/// The audit of a decision's calls: their indexes, never what was said of them.
fn audited_calls(m: &DecisionMessage, payload: &mut serde_json::Value) {
    payload["kind"] = json!(kind(m));
    if !m.calls.is_empty() {
        let of = |approved: bool| -> Vec<usize> {
            m.calls
                .iter()
                .filter(|c| c.approved == approved)
                .map(|c| c.index.get())
                .collect()
        };
        payload["approved_calls"] = json!(of(true));
        payload["denied_calls"] = json!(of(false));
    }
    if !m.edits.is_empty() {
        let edited: Vec<usize> = m.edits.iter().map(|e| e.index.get()).collect();
        payload["edited_calls"] = json!(edited);
    }
}

fn outcome(s: &str) -> Result<DecisionOutcome, StoreError> {
    s.parse()
        .map_err(|_| StoreError::unreadable("run_decisions.outcome"))
}

/// A decision's sealed columns.
pub(crate) struct Sealed {
    comment: Option<Vec<u8>>,
    detail: Option<Vec<u8>>,
}

/// `decision.accepted` / `decision.refused` with the gated outcome.
pub fn decision_event(decision_id: Uuid, run_id: RunId, outcome: DecisionOutcome) -> Event {
    let name = match outcome {
        DecisionOutcome::Accepted => EventName::DecisionAccepted,
        DecisionOutcome::ApprovalRecorded => EventName::CardApprovalRecorded,
        DecisionOutcome::DenialRecorded => EventName::CardDenialRecorded,
        _ => EventName::DecisionRefused,
    };
    Event::new(
        name,
        json!({"decision_id": decision_id, "run_id": run_id, "outcome": outcome.as_str()}),
    )
}

impl Store {
    /// Records a decision, its audit event, its outbox event and, when accepted, the transition
    /// to `queued`/`resume` — in one statement. See the module documentation. The resume
    /// segment starts with a fresh requeue count and is available at once; its wake-up is
    /// not yet dispatched (`dispatched_at` is cleared), so the reaper re-publishes it if the
    /// caller's publish is lost.
    pub async fn record_decision(&self, d: &NewDecision) -> Result<DecisionRecord, StoreError> {
        Ok(self.record_decision_timed(d).await?.0)
    }

    /// [`Store::record_decision`], with how long the run waited for an approval it released:
    /// from its suspension (the run row's last change) to this decision, in seconds by the
    /// database clock; `None` unless it was released now.
    pub async fn record_decision_timed(
        &self,
        d: &NewDecision,
    ) -> Result<(DecisionRecord, Option<f64>), StoreError> {
        self.record_decision_by(d, None).await
    }

    /// [`Store::record_decision_timed`] for a decision a policy made: its audit event names
    /// the policy, the rule and the digest of the facts it saw.
    pub async fn record_policy_decision(
        &self,
        d: &NewDecision,
        policy: &PolicyMark,
    ) -> Result<(DecisionRecord, Option<f64>), StoreError> {
        self.record_decision_by(d, Some(policy)).await
    }

    async fn record_decision_by(
        &self,
        d: &NewDecision,
        policy: Option<&PolicyMark>,
    ) -> Result<(DecisionRecord, Option<f64>), StoreError> {
        let m = &d.message;
        let (sealed, event, mut payload) = self.decision_parts(d)?;
        if let Some(policy) = policy {
            payload["policy"] = json!(policy);
        }
        let Some((row, waited)) = self
            .insert_decision(&self.pool, d, sealed, &event, payload)
            .await?
        else {
            // Nothing committed. Lost to this decision id, recorded before or concurrently:
            // a replay or a conflict; otherwise an approval whose transition another decision,
            // a cancel or the reaper won.
            let record = match self.recorded_decision(m).await? {
                Some(Replay::Same(recorded)) => DecisionRecord::Replayed(recorded),
                Some(Replay::Conflict) => DecisionRecord::Conflict,
                None => DecisionRecord::TransitionLost,
            };
            return Ok((record, None));
        };
        self.hand_off(vec![row.into()]);
        Ok((DecisionRecord::Recorded(d.outcome), waited))
    }

    /// What [`Store::record_decision`] writes of `d` beside its statement: its sealed
    /// columns, its event and its audit payload.
    pub(crate) fn decision_parts(
        &self,
        d: &NewDecision,
    ) -> Result<(Sealed, Event, serde_json::Value), StoreError> {
        let m = &d.message;
        let comment = m
            .comment
            .as_ref()
            .map(|c| self.keyring.seal(Purpose::Comment, m.run_id, c.as_bytes()))
            .transpose()?;
        let detail = match Detail::of(m) {
            Some(detail) => {
                let plain = serde_json::to_vec(&detail)
                    .map_err(|_| StoreError::unreadable("run_decisions.detail"))?;
                Some(self.keyring.seal(Purpose::Comment, m.run_id, &plain)?)
            }
            None => None,
        };
        let event = decision_event(m.decision_id, m.run_id, d.outcome);
        let mut payload = json!({
            "decision_id": m.decision_id,
            "suspension_seq": m.suspension_seq.get(),
            "turn_digest": m.turn_digest.as_str(),
            "approved": m.approved,
            "approver": m.approver,
            "outcome": d.outcome.as_str(),
            "has_comment": m.comment.is_some(),
        });
        audited_calls(m, &mut payload);
        Ok((Sealed { comment, detail }, event, payload))
    }

    /// The statement of [`Store::record_decision`], with `comment` sealed and the audit
    /// `payload`: the outbox row it wrote and how long the run waited, or `None` when it wrote
    /// nothing.
    ///
    /// One statement, so one transaction without a round trip to open or close it:
    /// - `released`, for an accepted decision only, the transition (guarded by status,
    ///   suspension number and turn digest, and by the decision id being new). It comes
    ///   first, so two decisions on one turn serialise on the run row and the second finds
    ///   it no longer waiting. Its subquery reads the row as the statement's snapshot saw
    ///   it: as it was suspended, before this UPDATE.
    /// - `decided`, the decision row — for an accepted decision only if it released the
    ///   turn: an approval is never on record for a turn it did not release. A concurrent
    ///   insert of the same id makes this one wait for it; once it commits this inserts
    ///   nothing and is a replay (or a conflict), and if it rolls back this goes ahead.
    /// - the audit row, numbered by the run's counter (a refused decision may name a run
    ///   that does not exist, or one its producer may not see: it is still recorded, for
    ///   replays, but joins no trail);
    /// - the outbox row, announced whether or not the run exists: the producer learns its
    ///   refusal either way.
    pub(crate) async fn insert_decision<'e>(
        &self,
        conn: impl sqlx::PgExecutor<'e>,
        d: &NewDecision,
        sealed: Sealed,
        event: &Event,
        payload: serde_json::Value,
    ) -> Result<Option<(outbox::Row, Option<f64>)>, StoreError> {
        let m = &d.message;
        let Sealed { comment, detail } = sealed;
        let announced = sqlx::query_file!(
            "sql/insert_decision.sql",
            m.decision_id,
            m.run_id.as_uuid(),
            m.suspension_seq.as_i32(),
            m.turn_digest.as_str(),
            m.approved,
            m.approver,
            comment,
            d.outcome.as_str(),
            event.name.as_str(),
            payload,
            Uuid::now_v7(),
            outbox::stored_body(&event),
            d.in_trail,
            kind(m),
            detail,
        )
        .fetch_optional(conn)
        .await?;
        Ok(announced.map(|row| {
            let waited = row.waited;
            let row = outbox::Row {
                id: row.id,
                run_id: row.run_id,
                kind: row.kind,
                body: row.body,
                created_at: row.created_at,
            };
            (row, waited)
        }))
    }

    /// The recorded outcome of a decision id, whatever it was recorded for.
    pub async fn decision_outcome(
        &self,
        decision_id: Uuid,
    ) -> Result<Option<DecisionOutcome>, StoreError> {
        let recorded = sqlx::query_scalar!(
            "SELECT outcome FROM run_decisions WHERE decision_id = $1",
            decision_id
        )
        .fetch_optional(&self.pool)
        .await?;
        recorded.as_deref().map(outcome).transpose()
    }

    /// What the decision id of `claim` was recorded with, compared with what `claim` names:
    /// the coordinator's replay gate. `None` when the id was never recorded.
    pub async fn recorded_decision(
        &self,
        claim: &DecisionMessage,
    ) -> Result<Option<Replay>, StoreError> {
        let row = sqlx::query_as!(
            RecordedRow,
            r#"SELECT run_id, suspension_seq, turn_digest, approved, approver, comment, detail,
                      outcome
               FROM run_decisions WHERE decision_id = $1"#,
            claim.decision_id
        )
        .fetch_optional(&self.pool)
        .await?;
        row.map(|row| self.replay(row, claim)).transpose()
    }

    /// Whether `row` was recorded for exactly what `claim` names, and its outcome if so.
    fn replay(&self, row: RecordedRow, claim: &DecisionMessage) -> Result<Replay, StoreError> {
        let recorded = outcome(&row.outcome)?;
        let same_card = row.run_id == claim.run_id.as_uuid()
            && row.suspension_seq == claim.suspension_seq.as_i32()
            && row.turn_digest == claim.turn_digest.as_str();
        if !same_card || row.approved != claim.approved || row.approver != claim.approver {
            return Ok(Replay::Conflict);
        }
        let comment = self.open_comment(claim.run_id, row.comment.as_deref())?;
        let detail = self.open_detail(claim.run_id, row.detail.as_deref())?;
        Ok(if comment == claim.comment && detail == Detail::of(claim) {
            Replay::Same(recorded)
        } else {
            Replay::Conflict
        })
    }

    /// The decision that released suspension `seq` of the run, as its producer sent it (its
    /// comment opened).
    pub async fn accepted_decision(
        &self,
        run_id: RunId,
        seq: SuspensionSeq,
    ) -> Result<Option<DecisionMessage>, StoreError> {
        let row = sqlx::query!(
            r#"SELECT decision_id, turn_digest, approved, approver, comment, detail
               FROM run_decisions
               WHERE run_id = $1 AND suspension_seq = $2 AND outcome = 'accepted'"#,
            run_id.as_uuid(),
            seq.as_i32(),
        )
        .fetch_optional(&self.pool)
        .await?;
        let Some(row) = row else { return Ok(None) };
        let detail = self
            .open_detail(run_id, row.detail.as_deref())?
            .unwrap_or_default();
        Ok(Some(DecisionMessage {
            decision_id: row.decision_id,
            run_id,
            suspension_seq: seq,
            turn_digest: TurnDigest::parse(&row.turn_digest)
                .map_err(|_| StoreError::unreadable("run_decisions.turn_digest"))?,
            approved: row.approved,
            calls: detail.calls,
            edits: detail.edits,
            approver: row.approver,
            comment: self.open_comment(run_id, row.comment.as_deref())?,
        }))
    }

    /// Opens the accepted decision a claim read: what a resume segment continues from.
    pub fn open_decision(
        &self,
        run_id: RunId,
        sealed: &SealedDecision,
    ) -> Result<Decision, StoreError> {
        let detail = self
            .open_detail(run_id, sealed.detail.as_deref())?
            .unwrap_or_default();
        Ok(Decision {
            approved: sealed.approved,
            comment: self.open_comment(run_id, sealed.comment.as_deref())?,
            calls: detail.calls,
            edits: detail
                .edits
                .into_iter()
                .map(|e| CallEdit {
                    index: e.index,
                    arguments: serde_json::Value::Object(e.arguments),
                    editor: sealed.approver.clone(),
                })
                .collect(),
        })
    }

    /// A decision's sealed detail, opened.
    fn open_detail(
        &self,
        run_id: RunId,
        sealed: Option<&[u8]>,
    ) -> Result<Option<Detail>, StoreError> {
        sealed
            .map(|sealed| {
                let plain = self.keyring.open(Purpose::Comment, run_id, sealed)?;
                serde_json::from_slice(&plain)
                    .map_err(|_| StoreError::unreadable("run_decisions.detail"))
            })
            .transpose()
    }

    /// A decision's sealed comment, opened.
    fn open_comment(
        &self,
        run_id: RunId,
        sealed: Option<&[u8]>,
    ) -> Result<Option<String>, StoreError> {
        sealed
            .map(|sealed| {
                let plain = self.keyring.open(Purpose::Comment, run_id, sealed)?;
                String::from_utf8(plain)
                    .map_err(|_| StoreError::unreadable("run_decisions.comment"))
            })
            .transpose()
    }

    /// Everything the gates of a decision read, by one statement: whether `producer` holds a
    /// grant of `approver_kind` for the approver and one of `acting_kind` for the run's acting
    /// user (`producer_grants`, as the coordinator's registry checks them), what the decision
    /// id was recorded with, and the run with its agent's current configuration. The gates use
    /// them in their order; reading them together changes nothing they decide, because the
    /// release itself is guarded again by its `UPDATE`.
    pub async fn decision_facts(
        &self,
        d: &DecisionMessage,
        producer: &str,
        approver_kind: &str,
        acting_kind: &str,
    ) -> Result<DecisionFacts, StoreError> {
        let r = sqlx::query!(
            r#"SELECT producer_may_assert($3, $4, $5) AS "granted!",
                      coalesce(producer_may_assert($3, $6, r.acting_user), false) AS "follows!",
                      d.run_id AS "recorded_run_id?", d.suspension_seq AS "recorded_seq?",
                      d.turn_digest AS "recorded_digest?", d.approved AS "recorded_approved?",
                      d.approver AS "recorded_approver?", d.comment AS "recorded_comment?",
                      d.detail AS "recorded_detail?", d.outcome AS "recorded_outcome?",
                      r.status AS "status?", r.suspension_seq AS "suspension_seq?",
                      r.turn_digest AS "turn_digest?", r.acting_user AS "acting_user?",
                      r.agent AS "run_agent?", r.pending_tools AS "pending_tools?",
                      r.card_landed AS "card_landed?", r.card_editors AS "card_editors?",
                      s AS "settings: AgentColumns"
               FROM (SELECT 1) AS one
               LEFT JOIN run_decisions d ON d.decision_id = $1
               LEFT JOIN runs r ON r.id = $2
               LEFT JOIN agent_settings s ON s.name = r.agent"#,
            d.decision_id,
            d.run_id.as_uuid(),
            producer,
            approver_kind,
            &d.approver,
            acting_kind,
        )
        .fetch_one(&self.pool)
        .await?;
        let recorded = RecordedRow::of_columns(
            (r.recorded_run_id, r.recorded_seq, r.recorded_digest),
            (r.recorded_approved, r.recorded_approver, r.recorded_comment),
            (r.recorded_detail, r.recorded_outcome),
        )
        .map(|row| self.replay(row, d))
        .transpose()?;
        let run = DecidedRun::of_columns(
            (r.status, r.acting_user, r.run_agent, r.pending_tools),
            (
                r.suspension_seq,
                r.turn_digest,
                r.card_landed,
                r.card_editors,
            ),
            r.follows,
        )?;
        Ok(DecisionFacts {
            producer_granted: r.granted,
            recorded,
            run,
            agent: r.settings.map(StoredAgent::from),
        })
    }
}

/// What the gates of a decision read ([`Store::decision_facts`]).
#[derive(Debug, Clone, PartialEq)]
pub struct DecisionFacts {
    /// The producer holds a grant for the approver.
    pub producer_granted: bool,
    /// What the decision id was recorded with before, if it was.
    pub recorded: Option<Replay>,
    /// `None` when the run does not exist.
    pub run: Option<DecidedRun>,
    /// The run's agent configuration; `None` when it is gone.
    pub agent: Option<StoredAgent>,
}

/// The facts of a run its decision's gates read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecidedRun {
    pub status: RunStatus,
    pub suspension_seq: Option<SuspensionSeq>,
    pub turn_digest: Option<TurnDigest>,
    pub acting_user: String,
    pub agent: String,
    pub pending_tools: Vec<String>,
    /// The calls of the card that landed under an earlier card of the turn.
    pub card_landed: Vec<CallIndex>,
    /// Who changed the arguments of a call of the card.
    pub card_editors: Vec<String>,
    /// The decision's producer may start runs as the run's acting user, and so may follow it.
    pub producer_follows: bool,
}

/// The columns of a run as [`Store::decision_facts`] reads them through an outer join: the
/// run's status, acting user, agent and pending tools (all null when no run has the id); its
/// card (suspension, digest, the calls landed under an earlier card, the editors); whether the
/// producer may assert the acting user.
type RunColumns = (
    Option<String>,
    Option<String>,
    Option<String>,
    Option<Vec<String>>,
);
type CardColumns = (
    Option<i32>,
    Option<String>,
    Option<Vec<i32>>,
    Option<Vec<String>>,
);

impl DecidedRun {
    fn of_columns(
        run: RunColumns,
        card: CardColumns,
        producer_follows: bool,
    ) -> Result<Option<DecidedRun>, StoreError> {
        let (Some(status), Some(acting_user), Some(agent), Some(pending_tools)) = run else {
            return Ok(None);
        };
        let (suspension_seq, turn_digest, card_landed, card_editors) = card;
        Ok(Some(DecidedRun {
            status: runs::status(&status)?,
            suspension_seq: runs::opt_seq(suspension_seq)?,
            turn_digest: turn_digest.as_deref().map(runs::digest).transpose()?,
            acting_user,
            agent,
            pending_tools,
            card_landed: card_landed
                .unwrap_or_default()
                .into_iter()
                .map(CallIndex::from_i32)
                .collect::<Result<_, _>>()
                .map_err(|_| StoreError::unreadable("runs.card_landed"))?,
            card_editors: card_editors.unwrap_or_default(),
            producer_follows,
        }))
    }
}
