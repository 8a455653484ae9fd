//! The tool loop: one segment of a run, from a prompt or from a decision, until the run
//! completes, fails, or suspends for approval.
//!
//! The loop owns the approval rules so that no tool can forget them:
//!
//! - if ANY offered call of a turn has a write effect, the whole turn suspends before any of
//!   its calls runs — a read in the same turn waits too, so the approver sees the turn whole;
//! - at suspend, every offered call whose tool has a preview gets one, produced as the acting
//!   user and bounded;
//! - on an approved resume, every shown preview is re-previewed before any call executes, and
//!   a moved preview re-suspends the run with nothing written. For writes to the run store's
//!   own database the comparison and the writes share one transaction (see [`crate::turn`]),
//!   so nothing can land in between;
//! - every write is fenced, and every call of a resumed turn is journaled, so a retried resume
//!   reuses what already ran instead of writing twice;
//! - an infrastructure failure (a lost connection, a deadlock) is never a tool result, a
//!   preview line or a refusal: the segment is interrupted and retried.
//!
//! Everything with side effects is behind [`SegmentHooks`], [`Model`] and [`Tool`].

use std::fmt;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use tracing::Instrument;

use crate::comparator::{self, Binding, Current};
use crate::ids::{CallIndex, SuspensionSeq};
use crate::model::{Message, Model, ModelOptions, ModelRequest, Role, TokenUsage, ToolCall};
use crate::preview::{self, Attempt, CallPreview};
use crate::state::{PendingCall, SuspendedRunState, MAX_STATE_BYTES};
use crate::tool::{
    Effect, ExecContext, FenceToken, OfferedTools, Principal, Tool, ToolError, ToolOutput,
    ToolPolicy, ToolRegistry,
};
use crate::turn::{JournalEntry, LockSubject, PlannedWrite, TransactionalTool, TurnTransaction};

/// What the loop needs of an agent configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentConfig {
    pub name: String,
    #[serde(default)]
    pub system_prompt: Option<String>,
    #[serde(default)]
    pub policy: ToolPolicy,
    pub max_iterations: u32,
    /// A turn proposing more calls than this is refused whole, and the model told so.
    #[serde(default = "default_max_tool_calls")]
    pub max_tool_calls_per_turn: u32,
    #[serde(default)]
    pub model_options: ModelOptions,
}

/// The default of [`AgentConfig::max_tool_calls_per_turn`].
pub const DEFAULT_MAX_TOOL_CALLS_PER_TURN: u32 = 16;

fn default_max_tool_calls() -> u32 {
    DEFAULT_MAX_TOOL_CALLS_PER_TURN
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            name: String::new(),
            system_prompt: None,
            policy: ToolPolicy::default(),
            max_iterations: 0,
            max_tool_calls_per_turn: DEFAULT_MAX_TOOL_CALLS_PER_TURN,
            model_options: ModelOptions::default(),
        }
    }
}

/// Why a run ended, as stored in its one machine-readable column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TerminationReason {
    Completed,
    MaxIterations,
    ApprovalDenied,
    ApprovalExpired,
    ProviderFailed,
    StateUnreadable,
    RetriesExhausted,
    NotRetryable,
    SuspendFailed,
    Cancelled,
}

impl TerminationReason {
    pub const ALL: [TerminationReason; 10] = [
        TerminationReason::Completed,
        TerminationReason::MaxIterations,
        TerminationReason::ApprovalDenied,
        TerminationReason::ApprovalExpired,
        TerminationReason::ProviderFailed,
        TerminationReason::StateUnreadable,
        TerminationReason::RetriesExhausted,
        TerminationReason::NotRetryable,
        TerminationReason::SuspendFailed,
        TerminationReason::Cancelled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            TerminationReason::Completed => "completed",
            TerminationReason::MaxIterations => "max_iterations",
            TerminationReason::ApprovalDenied => "approval_denied",
            TerminationReason::ApprovalExpired => "approval_expired",
            TerminationReason::ProviderFailed => "provider_failed",
            TerminationReason::StateUnreadable => "state_unreadable",
            TerminationReason::RetriesExhausted => "retries_exhausted",
            TerminationReason::NotRetryable => "not_retryable",
            TerminationReason::SuspendFailed => "suspend_failed",
            TerminationReason::Cancelled => "cancelled",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.as_str() == s)
    }
}

impl fmt::Display for TerminationReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A failure of the segment's own infrastructure (the fence, the journal).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HookError {
    /// The segment no longer holds its lease.
    #[error("lease lost")]
    LeaseLost,
    /// The store could not be reached; the detail is for the log only.
    #[error("{code}: {detail}")]
    Unavailable { code: &'static str, detail: String },
    /// A sealed value of the run (a journal entry, a comment) does not open: retrying cannot
    /// help, the run fails `state_unreadable`.
    #[error("sealed value unreadable: {what}")]
    Unreadable { what: &'static str },
}

impl HookError {
    /// The interruption a tool's infrastructure failure stands for.
    pub fn from_tool(e: &ToolError) -> Self {
        match e {
            ToolError::FenceLost => HookError::LeaseLost,
            other => HookError::Unavailable {
                code: other.code(),
                detail: other.to_string(),
            },
        }
    }
}

/// The side of a segment the loop cannot do itself: the lease and the execution journal.
#[async_trait]
pub trait SegmentHooks: Send + Sync {
    /// Called before a write that acts outside the store (the per-call path). Renews the lease
    /// and stamps `effect` on the run in the same statement, so a run that dies during the
    /// effect is never retried blindly when it is non-idempotent. Errs when the lease is no
    /// longer held; the returned token carries the epoch and the idempotency key to the tool.
    async fn fence(
        &self,
        seq: SuspensionSeq,
        index: CallIndex,
        effect: Effect,
    ) -> Result<FenceToken, HookError>;

    /// The recorded result of a call that already ran in an earlier attempt of this resume.
    async fn journaled(
        &self,
        seq: SuspensionSeq,
        index: CallIndex,
    ) -> Result<Option<ToolOutput>, HookError>;

    /// Records a call's result and clears the stamp [`fence`](Self::fence) left. Must be
    /// idempotent.
    async fn record(
        &self,
        seq: SuspensionSeq,
        index: CallIndex,
        call: &PendingCall,
        effect: Effect,
        output: &ToolOutput,
    ) -> Result<(), HookError>;

    /// Whether any call of this suspension's turn has been journaled.
    async fn any_journaled(&self, seq: SuspensionSeq) -> Result<bool, HookError>;

    /// The call of this suspension's turn that an earlier attempt sent outside the store
    /// ([`fence`](Self::fence) stamped it) and never journaled: it may have landed. The retry
    /// sends it again under the same idempotency key without comparing its preview first — a
    /// preview taken after the call landed would read the call's own write, and bounce a
    /// write that is done — and leaves the comparison to the resource, which refuses a call
    /// whose preview moved and answers a key it has seen with its recorded result.
    fn sent_unjournaled(&self, _seq: SuspensionSeq) -> Option<CallIndex> {
        None
    }

    /// Opens the transaction an approved store-local turn is compared and written in: the run
    /// row locked, owner, epoch and status verified, the lease renewed.
    async fn begin_turn(&self, _seq: SuspensionSeq) -> Result<Box<dyn TurnTransaction>, HookError> {
        Err(HookError::Unavailable {
            code: "no_turn_transactions",
            detail: "these hooks cannot open a turn transaction".to_owned(),
        })
    }

    /// Checked at every step boundary: a segment that lost its lease stops and settles nothing.
    fn lease_lost(&self) -> bool {
        false
    }
}

/// Everything one segment runs with.
#[derive(Clone, Copy)]
pub struct Segment<'a> {
    pub model: &'a dyn Model,
    pub registry: &'a ToolRegistry,
    pub agent: &'a AgentConfig,
    pub acting_user: &'a Principal,
    pub hooks: &'a dyn SegmentHooks,
    /// The time stamp a suspension records (the loop reads no clock).
    pub captured_at: &'a str,
}

impl fmt::Debug for Segment<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Segment")
            .field("agent", &self.agent.name)
            .field("acting_user", &self.acting_user.name)
            .finish_non_exhaustive()
    }
}

/// A decision on a suspended turn, already gated by the coordinator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub approved: bool,
    pub comment: Option<String>,
}

/// How a segment ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Completed {
        reason: TerminationReason,
        transcript: Vec<Message>,
        iterations: u32,
        tokens: TokenUsage,
    },
    Suspended {
        state: SuspendedRunState,
        /// The calls whose preview moved, when this suspension follows a refused binding.
        moved: Vec<(CallIndex, String)>,
    },
    Failed {
        reason: TerminationReason,
        /// A stable error code, for the run row.
        code: &'static str,
        iterations: u32,
        tokens: TokenUsage,
    },
    /// The segment stopped without settling: lease lost or the store unreachable. The row is
    /// left as it is for the reaper.
    Interrupted { code: &'static str },
}

/// Text the model receives for each call of a denied turn.
pub fn denied_result(tool: &str, comment: Option<&str>) -> String {
    match comment.map(str::trim).filter(|c| !c.is_empty()) {
        Some(c) => format!("Error: tool \"{tool}\" was denied by the operator. Comment: {c}"),
        None => format!("Error: tool \"{tool}\" was denied by the operator."),
    }
}

/// Text the model receives for a call whose tool is no longer offered at resume.
pub fn no_longer_permitted_result(tool: &str) -> String {
    format!("Error: tool \"{tool}\" is no longer permitted and was not executed.")
}

/// Text the model receives for a call to a tool it was not offered.
pub fn not_available_result(tool: &str) -> String {
    format!("Error: tool \"{tool}\" is not available.")
}

/// Text the model receives for a call whose tool was not offered when the turn suspended: it
/// was never on a card as a call that could run, so it does not run now.
pub fn not_offered_at_suspend_result(tool: &str) -> String {
    format!("Error: tool \"{tool}\" was not available when this turn was proposed and was not executed.")
}

/// Text the model receives for a call of a partly executed turn whose preview moved after the
/// approval: it is not executed against a state nobody was shown.
pub fn moved_after_approval_result(tool: &str) -> String {
    format!(
        "Error: tool \"{tool}\" was not executed: what it would do changed after the approval, \
         and other calls of this turn had already run."
    )
}

/// Text the model receives for every call of a turn with more calls than the agent allows.
pub fn too_many_calls_result(tool: &str, limit: u32) -> String {
    format!(
        "Error: this turn proposed more than {limit} tool calls, so no call of it was executed \
         (tool \"{tool}\"). Propose fewer calls per turn."
    )
}

/// Text the model receives for every call of a turn in which a call names no tool.
pub fn unnamed_call_result() -> String {
    "Error: a call of this turn names no tool, so no call of this turn was executed.".to_owned()
}

/// Text the model receives when a turn is refused for malformed arguments.
pub fn malformed_arguments_result(tool: &str) -> String {
    format!(
        "Error: the arguments of this call to tool \"{tool}\" are not a JSON object, so no call of this turn was executed."
    )
}

/// The line that introduces a run's inputs in its first user message.
pub const INPUTS_MARKER: &str = "Inputs (JSON):";

/// The first user message of a run: its prompt, then its inputs (when it has any) as one line
/// of JSON after [`INPUTS_MARKER`]. Kept in the transcript, so every later segment and every
/// provider sees the same inputs.
pub fn first_message(prompt: &str, inputs: Option<&Map<String, Value>>) -> String {
    match inputs.filter(|m| !m.is_empty()) {
        None => prompt.to_owned(),
        Some(inputs) => format!(
            "{prompt}\n\n{INPUTS_MARKER}\n{}",
            Value::Object(inputs.clone())
        ),
    }
}

/// The inputs of a run, read back from the first user message of its transcript.
pub fn inputs_of(transcript: &[Message]) -> Option<Map<String, Value>> {
    let first = transcript.iter().find(|m| m.role == Role::User)?;
    let (_, json) = first
        .content
        .rsplit_once(&format!("\n\n{INPUTS_MARKER}\n"))?;
    match serde_json::from_str(json).ok()? {
        Value::Object(map) => Some(map),
        _ => None,
    }
}

/// Runs a new run from its prompt and inputs.
pub async fn start(seg: Segment<'_>, prompt: &str, inputs: Option<&Map<String, Value>>) -> Outcome {
    let mut transcript = Vec::with_capacity(2);
    if let Some(system) = seg.agent.system_prompt.as_deref().filter(|s| !s.is_empty()) {
        transcript.push(Message::system(system));
    }
    transcript.push(Message::user(first_message(prompt, inputs)));
    let cursor = Cursor {
        transcript,
        iterations: 0,
        tokens: TokenUsage::default(),
        options: seg.agent.model_options.clone(),
        next_seq: SuspensionSeq::FIRST,
        after_denial: false,
    };
    run_turns(seg, cursor).await
}

/// Resumes a suspended run with a decision on its turn.
pub async fn resume(seg: Segment<'_>, state: SuspendedRunState, decision: &Decision) -> Outcome {
    let seq = state.suspension_seq;
    let outputs = if decision.approved {
        let offered = seg.agent.policy.offered(seg.registry, seg.acting_user);
        match approved(seg, &state, &offered).await {
            Ok(Approved::Executed(outputs)) => outputs,
            Ok(Approved::Moved { previews, moved }) => {
                return resuspend_moved(seg, state, previews, moved)
            }
            Err(e) => return interrupted(e, state.iterations, state.tokens),
        }
    } else {
        state
            .pending_calls
            .iter()
            .map(|c| ToolOutput::error(denied_result(&c.tool, decision.comment.as_deref())))
            .collect()
    };

    let mut transcript = state.transcript;
    for (call, output) in state.pending_calls.iter().zip(outputs) {
        transcript.push(Message::tool_result(
            &call.id,
            output.content,
            output.is_error,
        ));
    }
    let cursor = Cursor {
        transcript,
        iterations: state.iterations,
        tokens: state.tokens,
        options: state.model_options,
        next_seq: seq.next(),
        after_denial: !decision.approved,
    };
    run_turns(seg, cursor).await
}

/// The re-suspension of a turn whose previews moved: the same calls, the current previews, the
/// moved indexes, the next suspension number. Nothing of the turn was written.
fn resuspend_moved(
    seg: Segment<'_>,
    state: SuspendedRunState,
    previews: Vec<CallPreview>,
    moved: Vec<CallIndex>,
) -> Outcome {
    let moved_tools = moved
        .iter()
        .filter_map(|i| Some((*i, state.pending_calls.get(i.get())?.tool.clone())))
        .collect();
    let state = SuspendedRunState {
        call_previews: previews,
        stale_call_indexes: moved,
        suspension_seq: state.suspension_seq.next(),
        captured_at: seg.captured_at.to_owned(),
        ..state
    };
    Outcome::Suspended {
        state,
        moved: moved_tools,
    }
}

/// What became of an approved turn.
enum Approved {
    /// One output per pending call, in call order.
    Executed(Vec<ToolOutput>),
    /// A shown preview moved: nothing was written.
    Moved {
        previews: Vec<CallPreview>,
        moved: Vec<CallIndex>,
    },
}

/// How one call of an approved turn runs.
enum Step<'a> {
    /// Not executed; the model is told why.
    Skip(ToolOutput),
    Read(&'a dyn Tool),
    /// A write to the run store's own database: compared and written in the turn transaction.
    Local(&'a dyn Tool, &'a dyn TransactionalTool),
    /// A write that acts outside the store: fenced, stamped and journaled per call.
    External(&'a dyn Tool),
}

fn steps<'a>(state: &SuspendedRunState, offered: &'a OfferedTools) -> Vec<Step<'a>> {
    state
        .pending_calls
        .iter()
        .map(|call| {
            if !state.offered_tools.contains(&call.tool) {
                return Step::Skip(ToolOutput::error(not_offered_at_suspend_result(&call.tool)));
            }
            let Some(tool) = offered.get(&call.tool) else {
                return Step::Skip(ToolOutput::error(no_longer_permitted_result(&call.tool)));
            };
            let tool = tool.as_ref();
            match (tool.spec().effect.is_write(), tool.transactional()) {
                (false, _) => Step::Read(tool),
                (true, Some(local)) => Step::Local(tool, local),
                (true, None) => Step::External(tool),
            }
        })
        .collect()
}

async fn approved(
    seg: Segment<'_>,
    state: &SuspendedRunState,
    offered: &OfferedTools,
) -> Result<Approved, HookError> {
    let steps = steps(state, offered);
    if steps.iter().any(|s| matches!(s, Step::External(_))) {
        return per_call(seg, state, offered, &steps).await;
    }
    let all: Vec<usize> = (0..steps.len()).collect();
    match in_one_transaction(seg, state, &steps, &all).await? {
        Transacted::Done(outputs) => Ok(Approved::Executed(outputs)),
        Transacted::Moved { previews, moved } => Ok(Approved::Moved { previews, moved }),
        // Results of an earlier attempt on the per-call path: finish it that way.
        Transacted::Partial => per_call(seg, state, offered, &steps).await,
    }
}

/// What [`in_one_transaction`] did.
enum Transacted {
    /// One output per call named, in the order named; committed (now or by an earlier attempt).
    Done(Vec<ToolOutput>),
    /// A shown preview of a named call moved; rolled back. `previews` are the current ones of
    /// the named calls' stored previews.
    Moved {
        previews: Vec<CallPreview>,
        moved: Vec<CallIndex>,
    },
    /// Some, not all, of the turn's calls were journaled by an earlier attempt.
    Partial,
}

/// Compares and executes the calls at `indexes` in one turn transaction: lock the run row and
/// verify the lease; lock every subject in the global order; re-plan every call and bound its
/// preview as at suspend; compare with what the approver was shown; roll back if any moved,
/// otherwise apply every call in order and commit the results with their audit events and
/// journal rows once.
async fn in_one_transaction(
    seg: Segment<'_>,
    state: &SuspendedRunState,
    steps: &[Step<'_>],
    indexes: &[usize],
) -> Result<Transacted, HookError> {
    let mut tx = seg.hooks.begin_turn(state.suspension_seq).await?;
    match transact(seg, state, steps, indexes, tx.as_mut()).await {
        Ok(Planned::Journaled(outputs)) => {
            tx.rollback().await;
            Ok(outputs)
        }
        Ok(Planned::Moved { previews, moved }) => {
            tx.rollback().await;
            Ok(Transacted::Moved { previews, moved })
        }
        Ok(Planned::Written(outputs)) => {
            let entries: Vec<JournalEntry<'_>> = indexes
                .iter()
                .zip(&outputs)
                .map(|(&i, output)| JournalEntry {
                    index: CallIndex::new(i),
                    tool: &state.pending_calls[i].tool,
                    effect: effect_of(&steps[i]),
                    output,
                })
                .collect();
            tx.commit(&entries).await?;
            Ok(Transacted::Done(outputs))
        }
        Err(e) => {
            tx.rollback().await;
            Err(e)
        }
    }
}

enum Planned {
    Journaled(Transacted),
    Moved {
        previews: Vec<CallPreview>,
        moved: Vec<CallIndex>,
    },
    Written(Vec<ToolOutput>),
}

async fn transact(
    seg: Segment<'_>,
    state: &SuspendedRunState,
    steps: &[Step<'_>],
    indexes: &[usize],
    tx: &mut dyn TurnTransaction,
) -> Result<Planned, HookError> {
    // A retry after a commit whose answer was lost: the journal says what happened.
    let recorded = tx.journaled().await?;
    let found: Vec<Option<&ToolOutput>> = indexes
        .iter()
        .map(|&i| recorded.iter().find(|(j, _)| j.get() == i).map(|(_, o)| o))
        .collect();
    if found.iter().all(Option::is_some) {
        let outputs = found.into_iter().flatten().cloned().collect();
        return Ok(Planned::Journaled(Transacted::Done(outputs)));
    }
    if found.iter().any(Option::is_some) {
        return Ok(Planned::Journaled(Transacted::Partial));
    }

    // Lock every subject of every call in the one global order.
    let mut subjects: Vec<(LockSubject, &dyn TransactionalTool)> = Vec::new();
    for &i in indexes {
        if let Step::Local(_, local) = &steps[i] {
            let args = &state.pending_calls[i].arguments;
            for subject in local
                .subjects(tx, args)
                .await
                .map_err(|e| HookError::from_tool(&e))?
            {
                subjects.push((subject, *local));
            }
        }
    }
    subjects.sort_by(|a, b| a.0.cmp(&b.0));
    subjects.dedup_by(|a, b| a.0 == b.0);
    for (subject, local) in &subjects {
        local
            .lock(tx, subject)
            .await
            .map_err(|e| HookError::from_tool(&e))?;
    }

    // Re-plan every call under the locks.
    let mut plans: Vec<Option<Result<Box<dyn PlannedWrite>, ToolError>>> =
        indexes.iter().map(|_| None).collect();
    for (slot, &i) in plans.iter_mut().zip(indexes) {
        if let Step::Local(_, local) = &steps[i] {
            let args = &state.pending_calls[i].arguments;
            let tool = &state.pending_calls[i].tool;
            let planned = local
                .plan(tx, seg.acting_user, args)
                .instrument(
                    tracing::info_span!("preview", %tool, call.index = i, at = "write_transaction"),
                )
                .await;
            match planned {
                Err(e) if e.is_infrastructure() => return Err(HookError::from_tool(&e)),
                planned => *slot = Some(planned),
            }
        }
    }

    // Compare what every plan would show with what the approver was shown.
    let current = state
        .call_previews
        .iter()
        .filter_map(|stored| {
            let at = indexes.iter().position(|&i| i == stored.index.get())?;
            let now = match (&steps[stored.index.get()], stored.failed, &plans[at]) {
                (_, true, _) => None,
                (Step::Local(tool, _), false, Some(planned)) => Some(match tool.previewer() {
                    None => Current::Vanished,
                    Some(_) => Current::Attempt(match planned {
                        Ok(plan) => Attempt::of_lines(&plan.preview()),
                        Err(e) => Attempt::Error(ToolError::failed(e.code(), "plan failed")),
                    }),
                }),
                // Not offered any more, or no longer a store-local write: it will not run here.
                _ => None,
            };
            Some((stored, now))
        })
        .collect::<Vec<_>>();
    if let Binding::Moved { previews, moved } = comparator::bind(current) {
        return Ok(Planned::Moved { previews, moved });
    }

    // Apply every call in order.
    let mut outputs = Vec::with_capacity(indexes.len());
    for (slot, &i) in plans.into_iter().zip(indexes) {
        if seg.hooks.lease_lost() {
            return Err(HookError::LeaseLost);
        }
        let call = &state.pending_calls[i];
        let output = match (&steps[i], slot) {
            (Step::Skip(output), _) => output.clone(),
            (Step::Read(tool), _) => read(seg, *tool, &call.arguments).await?,
            (Step::Local(..), Some(Ok(plan))) => match plan
                .apply(tx)
                .instrument(tracing::info_span!("tool_call", tool = %call.tool, call.index = i))
                .await
            {
                Ok(output) => output,
                Err(e) if e.is_infrastructure() => return Err(HookError::from_tool(&e)),
                Err(e) => failure_output(&call.tool, &e),
            },
            (Step::Local(..), Some(Err(e))) => failure_output(&call.tool, &e),
            // Never: external calls do not come here, and every local call was planned.
            (Step::Local(..), None) | (Step::External(_), _) => {
                return Err(HookError::Unavailable {
                    code: "turn_not_planned",
                    detail: format!("call {i} reached the write without a plan"),
                })
            }
        };
        outputs.push(output);
    }
    Ok(Planned::Written(outputs))
}

/// The per-call path, for a turn with a write that acts outside the store. The whole turn is
/// compared before its first call runs; a retry that finds some calls journaled, or one sent
/// and not journaled, compares each remaining one again just before it runs, and a call whose
/// preview moved then is not run — except the call that was sent, which goes again under its
/// key ([`SegmentHooks::sent_unjournaled`]). Every external write carries the lines the
/// approver was shown, for the resource to compare at its write.
async fn per_call(
    seg: Segment<'_>,
    state: &SuspendedRunState,
    offered: &OfferedTools,
    steps: &[Step<'_>],
) -> Result<Approved, HookError> {
    let seq = state.suspension_seq;
    let sent = seg.hooks.sent_unjournaled(seq);
    let retry = sent.is_some() || seg.hooks.any_journaled(seq).await?;
    if !retry {
        if let Binding::Moved { previews, moved } =
            comparator::compare(state, offered, seg.acting_user).await?
        {
            return Ok(Approved::Moved { previews, moved });
        }
    }
    let mut outputs = Vec::with_capacity(steps.len());
    for (i, step) in steps.iter().enumerate() {
        if seg.hooks.lease_lost() {
            return Err(HookError::LeaseLost);
        }
        let index = CallIndex::new(i);
        let call = &state.pending_calls[i];
        if let Some(recorded) = seg.hooks.journaled(seq, index).await? {
            outputs.push(recorded);
            continue;
        }
        let output = match step {
            Step::Skip(output) => output.clone(),
            Step::Read(tool) => read(seg, *tool, &call.arguments).await?,
            Step::Local(..) => match in_one_transaction(seg, state, steps, &[i]).await? {
                Transacted::Done(mut one) => one.remove(0),
                Transacted::Moved { .. } => {
                    ToolOutput::error(moved_after_approval_result(&call.tool))
                }
                Transacted::Partial => {
                    return Err(HookError::Unavailable {
                        code: "journal_inconsistent",
                        detail: format!("call {i} is journaled and not journaled"),
                    })
                }
            },
            Step::External(tool) => {
                let sent_before = sent == Some(index);
                if retry && !sent_before && moved_since_shown(seg, state, i, *tool).await? {
                    ToolOutput::error(moved_after_approval_result(&call.tool))
                } else {
                    let effect = tool.spec().effect;
                    let fence = seg.hooks.fence(seq, index, effect).await?;
                    let ctx = ExecContext {
                        acting_user: seg.acting_user.clone(),
                        fence: Some(fence),
                        shown_preview: comparable_preview(state, i),
                    };
                    let output = execute(*tool, &ctx, &call.arguments).await?;
                    seg.hooks.record(seq, index, call, effect, &output).await?;
                    output
                }
            }
        };
        outputs.push(output);
    }
    Ok(Approved::Executed(outputs))
}

/// The lines the approver was shown for call `i`, when a resource can compare its own preview
/// with them line for line: a preview that did not fail and that no bound cut (at most
/// [`preview::MAX_LINES`] lines, each shorter than [`preview::MAX_LINE_CHARS`]).
fn comparable_preview(state: &SuspendedRunState, i: usize) -> Option<Vec<String>> {
    let shown = state
        .call_previews
        .iter()
        .find(|p| p.index.get() == i && !p.failed)?;
    let cut = shown.lines.len() > preview::MAX_LINES
        || shown
            .lines
            .iter()
            .any(|l| l.chars().count() >= preview::MAX_LINE_CHARS);
    (!cut).then(|| shown.lines.clone())
}

/// Whether the shown preview of call `i` reads differently now.
async fn moved_since_shown(
    seg: Segment<'_>,
    state: &SuspendedRunState,
    i: usize,
    tool: &dyn Tool,
) -> Result<bool, HookError> {
    let Some(stored) = state
        .call_previews
        .iter()
        .find(|p| p.index.get() == i && !p.failed)
    else {
        return Ok(false);
    };
    let now = match tool.previewer() {
        None => Current::Vanished,
        Some(previewer) => {
            let attempt = preview::attempt(
                previewer,
                seg.acting_user,
                &state.pending_calls[i].arguments,
            )
            .instrument(tracing::info_span!(
                "preview",
                tool = %tool.spec().name,
                call.index = i,
                at = "resume"
            ))
            .await;
            attempt.interruption()?;
            Current::Attempt(attempt)
        }
    };
    Ok(comparator::bind([(stored, Some(now))]) != Binding::Unchanged)
}

fn effect_of(step: &Step<'_>) -> Effect {
    match step {
        Step::Skip(_) => Effect::ReadOnly,
        Step::Read(tool) | Step::Local(tool, _) | Step::External(tool) => tool.spec().effect,
    }
}

/// Runs a read-only call: its own failure is its result, an infrastructure failure interrupts.
async fn read(seg: Segment<'_>, tool: &dyn Tool, args: &Value) -> Result<ToolOutput, HookError> {
    let ctx = ExecContext {
        acting_user: seg.acting_user.clone(),
        fence: None,
        shown_preview: None,
    };
    execute(tool, &ctx, args).await
}

/// Where a segment is in its run.
struct Cursor {
    transcript: Vec<Message>,
    iterations: u32,
    tokens: TokenUsage,
    options: ModelOptions,
    next_seq: SuspensionSeq,
    after_denial: bool,
}

async fn run_turns(seg: Segment<'_>, mut cur: Cursor) -> Outcome {
    loop {
        if seg.hooks.lease_lost() {
            return Outcome::Interrupted { code: "lease_lost" };
        }
        if cur.iterations >= seg.agent.max_iterations {
            return Outcome::Failed {
                reason: TerminationReason::MaxIterations,
                code: "max_iterations",
                iterations: cur.iterations,
                tokens: cur.tokens,
            };
        }
        let offered = seg.agent.policy.offered(seg.registry, seg.acting_user);
        let specs = offered.specs();
        let request = ModelRequest {
            messages: &cur.transcript,
            tools: &specs,
            options: &cur.options,
        };
        let response = match seg.model.complete(request).await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(code = e.code(), error = %e, "model call failed");
                return Outcome::Failed {
                    reason: TerminationReason::ProviderFailed,
                    code: e.code(),
                    iterations: cur.iterations + 1,
                    tokens: cur.tokens,
                };
            }
        };
        cur.iterations += 1;
        cur.tokens.add(response.usage);
        let calls = response.tool_calls;
        cur.transcript
            .push(Message::assistant(response.content, calls.clone()));

        if calls.is_empty() {
            let reason = if cur.after_denial {
                TerminationReason::ApprovalDenied
            } else {
                TerminationReason::Completed
            };
            return Outcome::Completed {
                reason,
                transcript: cur.transcript,
                iterations: cur.iterations,
                tokens: cur.tokens,
            };
        }
        cur.after_denial = false;

        // Model output is untrusted: a turn is refused whole, before anything is stored,
        // when a call names no tool, has arguments that are not an object, or the turn has
        // more calls than the agent allows.
        let limit = seg.agent.max_tool_calls_per_turn;
        let refusal: Option<fn(&ToolCall, u32) -> String> = if calls.len() > limit as usize {
            Some(|c, limit| too_many_calls_result(&c.name, limit))
        } else if calls.iter().any(|c| c.name.trim().is_empty()) {
            Some(|_, _| unnamed_call_result())
        } else if calls.iter().any(|c| !c.arguments.is_object()) {
            Some(|c, _| malformed_arguments_result(&c.name))
        } else {
            None
        };
        if let Some(text) = refusal {
            tracing::warn!(calls = calls.len(), "turn refused at the model boundary");
            for call in &calls {
                cur.transcript
                    .push(Message::tool_result(&call.id, text(call, limit), true));
            }
            continue;
        }

        let writes = calls.iter().any(|c| {
            offered
                .get(&c.name)
                .is_some_and(|t| t.spec().effect.is_write())
        });
        if writes {
            let (iterations, tokens) = (cur.iterations, cur.tokens);
            let state = match suspend(seg, cur, calls, &offered).await {
                Ok(state) => state,
                Err(e) => return interrupted(e, iterations, tokens),
            };
            if state.to_bytes().len() > MAX_STATE_BYTES {
                tracing::error!(
                    limit = MAX_STATE_BYTES,
                    "suspended state too large to store"
                );
                return Outcome::Failed {
                    reason: TerminationReason::SuspendFailed,
                    code: "state_too_large",
                    iterations,
                    tokens,
                };
            }
            return Outcome::Suspended {
                state,
                moved: vec![],
            };
        }

        for call in &calls {
            if seg.hooks.lease_lost() {
                return Outcome::Interrupted { code: "lease_lost" };
            }
            let output = match offered.get(&call.name) {
                None => ToolOutput::error(not_available_result(&call.name)),
                Some(tool) => {
                    let ctx = ExecContext {
                        acting_user: seg.acting_user.clone(),
                        fence: None,
                        shown_preview: None,
                    };
                    match execute(tool.as_ref(), &ctx, &call.arguments).await {
                        Ok(output) => output,
                        Err(e) => return interrupted(e, cur.iterations, cur.tokens),
                    }
                }
            };
            cur.transcript.push(Message::tool_result(
                &call.id,
                output.content,
                output.is_error,
            ));
        }
    }
}

/// The state of a turn suspended for approval, with the previews of its offered calls.
async fn suspend(
    seg: Segment<'_>,
    cur: Cursor,
    calls: Vec<ToolCall>,
    offered: &OfferedTools,
) -> Result<SuspendedRunState, HookError> {
    let pending: Vec<PendingCall> = calls
        .into_iter()
        .map(|c| PendingCall {
            id: c.id,
            tool: c.name,
            arguments: c.arguments,
        })
        .collect();
    let mut call_previews = Vec::new();
    for (i, call) in pending.iter().enumerate() {
        let Some(previewer) = offered.get(&call.tool).and_then(|t| t.previewer()) else {
            continue;
        };
        let attempt = preview::attempt(previewer, seg.acting_user, &call.arguments)
            .instrument(
                tracing::info_span!("preview", tool = %call.tool, call.index = i, at = "suspend"),
            )
            .await;
        // A lost connection says nothing about the call: the approver must not be shown a
        // failed preview for it.
        attempt.interruption()?;
        call_previews.push(preview::at_suspend(CallIndex::new(i), &call.tool, attempt));
    }
    Ok(SuspendedRunState {
        transcript: cur.transcript,
        pending_calls: pending,
        iterations: cur.iterations,
        tokens: cur.tokens,
        offered_tools: offered.names(),
        model_options: cur.options,
        call_previews,
        stale_call_indexes: vec![],
        suspension_seq: cur.next_seq,
        captured_at: seg.captured_at.to_owned(),
    })
}

/// Executes a call: the tool's own failure becomes an error result naming only its code; an
/// infrastructure failure or a lost fence stops the segment.
async fn execute(
    tool: &dyn Tool,
    ctx: &ExecContext,
    args: &Value,
) -> Result<ToolOutput, HookError> {
    let name = &tool.spec().name;
    let span = tracing::info_span!("tool_call", tool = %name);
    match preview::catch_unwind(tool.execute(ctx, args))
        .instrument(span)
        .await
    {
        Ok(Ok(output)) => Ok(output),
        Ok(Err(e)) if e.is_infrastructure() => Err(HookError::from_tool(&e)),
        Ok(Err(e)) => Ok(failure_output(name, &e)),
        Err(_) => {
            tracing::error!(tool = %name, "tool call panicked");
            Ok(ToolOutput::error(format!(
                "Error: tool \"{name}\" failed (panic)."
            )))
        }
    }
}

fn failure_output(name: &str, e: &ToolError) -> ToolOutput {
    tracing::warn!(tool = %name, code = e.code(), error = %e, "tool call failed");
    ToolOutput::error(format!("Error: tool \"{name}\" failed ({}).", e.code()))
}

/// The outcome of a segment stopped by `e`: interrupted for a retry, or failed at once when
/// retrying cannot help.
fn interrupted(e: HookError, iterations: u32, tokens: TokenUsage) -> Outcome {
    match e {
        HookError::LeaseLost => Outcome::Interrupted { code: "lease_lost" },
        HookError::Unavailable { code, detail } => {
            tracing::warn!(code, detail, "segment interrupted");
            Outcome::Interrupted { code }
        }
        HookError::Unreadable { what } => {
            tracing::error!(what, "sealed run data unreadable");
            Outcome::Failed {
                reason: TerminationReason::StateUnreadable,
                code: "state_unreadable",
                iterations,
                tokens,
            }
        }
    }
}
