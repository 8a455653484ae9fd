//! The tool loop: one segment of a run, from a prompt or from a decision, until the run
//! completes, fails, or suspends for approval.
//!
//! The loop owns the approval rules so that no tool can forget them:
//!
//! - if ANY offered call of a turn has a write effect, the whole turn suspends before any of
//!   its calls runs — a read in the same turn waits too, so the approver sees the turn whole;
//! - at suspend, every offered call whose tool has a preview gets one, produced as the acting
//!   user and bounded;
//! - on an approved resume, one pipeline carries every kind of call ([`crate::approval`]):
//!   every shown preview is compared again before any call writes — a store-local write under
//!   the locks it writes with, a write elsewhere by a fresh preview — and a moved preview
//!   re-suspends the run with nothing of it written;
//! - every write is fenced and journaled with its audit event, so a retried resume reuses what
//!   already ran instead of writing twice, and a write whose answer was lost is resolved by its
//!   idempotency key or fails the run `outcome_unknown` — never reported as failed;
//! - a transient infrastructure failure (a lost connection, a deadlock) is never a tool result,
//!   a preview line or a refusal: the segment is interrupted and retried.
//!
//! Everything with side effects is behind [`SegmentHooks`], [`Model`] and [`Tool`].

use std::fmt;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use tracing::Instrument;

use crate::approval::{self, Approved};
use crate::ids::{CallIndex, SuspensionSeq};
use crate::messages::CallVerdict;
use crate::model::{Message, Model, ModelOptions, ModelRequest, Role, TokenUsage, ToolCall};
use crate::preview::{self, CallPreview};
use crate::sequence;
use crate::state::{
    EditRecord, LandedCall, PendingCall, SuspendedRunState, ToolIdentity, MAX_STATE_BYTES,
};
use crate::tool::{
    DataClasses, Effect, ExecContext, FenceToken, OfferedTools, Principal, Tool, ToolError,
    ToolOutput, ToolPolicy, ToolRegistry,
};
use crate::turn::{JournalEntry, LocalWriter};

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
    /// The data classes the agent's model provider may be sent: a tool of any other class is
    /// not offered.
    #[serde(skip, default)]
    pub data_classes: DataClasses,
}

impl AgentConfig {
    /// The tools a run of this agent acting as `user` is offered now: the policy's, and of
    /// those only the ones whose data the agent's model provider may be sent.
    pub fn offered(&self, registry: &ToolRegistry, user: &Principal) -> OfferedTools {
        self.policy.offered(registry, user, &self.data_classes)
    }
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
            data_classes: DataClasses::all(),
        }
    }
}

/// Why a run ended, as stored in its one machine-readable column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[derive(strum::IntoStaticStr, strum::EnumString, strum::Display, strum::VariantArray)]
#[strum(serialize_all = "snake_case")]
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
    /// A write was sent outside the store and what became of it could not be learnt: it may
    /// have landed, so the run stops rather than tell the model anything about it.
    OutcomeUnknown,
}

impl TerminationReason {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// A failure that stops the segment: of its own infrastructure (the fence, the journal), or of
/// a tool's that no retry or result can answer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HookError {
    /// The segment no longer holds its lease.
    #[error("lease lost")]
    LeaseLost,
    /// A transient failure ([`crate::Fault::Transient`]): the segment is interrupted and
    /// retried. The detail is for the log only.
    #[error("{code}: {detail}")]
    Unavailable { code: &'static str, detail: String },
    /// A persistent failure stopped a write ([`crate::Fault::Persistent`]): retrying cannot
    /// help, the run fails `not_retryable` with the code.
    #[error("{code} (persistent): {detail}")]
    Broken { code: &'static str, detail: String },
    /// A sealed value of the run (a journal entry, a comment) does not open: retrying cannot
    /// help, the run fails `state_unreadable`.
    #[error("sealed value unreadable: {what}")]
    Unreadable { what: &'static str },
    /// A write sent outside the store may have landed and nobody can say: the run fails
    /// `outcome_unknown`, and the call stays marked as sent for an operator to look at.
    #[error("the outcome of call {index} is unknown ({code})")]
    OutcomeUnknown {
        index: CallIndex,
        code: &'static str,
    },
}

impl HookError {
    /// What a tool's failure that stops the segment stands for.
    pub fn from_tool(e: &ToolError) -> Self {
        match e {
            ToolError::FenceLost => HookError::LeaseLost,
            ToolError::Unavailable { code, detail } => HookError::Unavailable {
                code,
                detail: detail.clone(),
            },
            other => HookError::Broken {
                code: other.code(),
                detail: other.to_string(),
            },
        }
    }
}

/// The code of a transient failure that says a row was locked by someone else: at suspension,
/// the local writes are then previewed each on its own ([`SegmentHooks::begin_preview`]).
pub const PREVIEW_CONFLICT: &str = "database_conflict";

/// What the run store holds of an approved turn from earlier attempts of it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TurnRecord {
    /// Every result journaled for the turn, in call order.
    pub journaled: Vec<(CallIndex, ToolOutput)>,
    /// The two-phase writes whose commit at their resource the turn owes: it passed its commit
    /// point ([`SegmentHooks::commit_turn`]) with them held, so they are committed, never
    /// compared or aborted again. In call order.
    pub owed: Vec<CallIndex>,
}

/// The side of a segment the loop cannot do itself: the lease, the approved turn's transaction
/// in the run store, and the execution journal.
#[async_trait]
pub trait SegmentHooks: Send + Sync {
    /// The run store's transaction in which a turn's local writes are sequenced: rolled back
    /// at suspension once the previews are taken, committed at an approved turn's commit point.
    type Turn: Send;

    /// What earlier attempts of suspension `seq`'s turn left: its journaled results and the
    /// commits it owes.
    async fn turn_record(&self, seq: SuspensionSeq) -> Result<TurnRecord, HookError>;

    /// Opens the transaction a turn's local writes are sequenced in, checking that the lease is
    /// still held. The lease is held to again, and renewed, at
    /// [`commit_turn`](Self::commit_turn); the run row is not locked meanwhile, so the turn's
    /// calls outside the store can be stamped and journaled on their own.
    async fn begin_turn(&self, seq: SuspensionSeq) -> Result<Self::Turn, HookError>;

    /// Opens the transaction a suspension previews its local writes in, in sequence, to roll
    /// it back once the previews are taken. A lock it cannot have at once is not waited for
    /// long: the suspension is not an approved turn, and must not hold the pool's connections a
    /// colleague's edit keeps waiting ([`HookError::Unavailable`] with the code
    /// [`PREVIEW_CONFLICT`]).
    async fn begin_preview(&self, seq: SuspensionSeq) -> Result<Self::Turn, HookError> {
        self.begin_turn(seq).await
    }

    /// The local writer of `tool`, when its writes land in the run store's own database.
    fn local(&self, tool: &str) -> Option<&dyn LocalWriter<Self::Turn>>;

    /// Called once every call of the approved turn compared equal — its local writes locked,
    /// planned and applied uncommitted — before anything of it is sent or committed: the
    /// pipeline's one step boundary between comparing and writing.
    async fn applying(&self, _seq: SuspensionSeq) {}

    /// The turn's commit point. Verifies the lease once more, appends an audit event and a
    /// journal row for every local write of the turn, records the two-phase writes it now owes
    /// the commit of (`owed`), and commits: the writes, their audit, their journal rows and the
    /// debt are kept together or lost together.
    async fn commit_turn(
        &self,
        turn: Self::Turn,
        seq: SuspensionSeq,
        entries: &[JournalEntry<'_>],
        owed: &[CallIndex],
    ) -> Result<(), HookError>;

    /// Abandons everything written in the transaction.
    async fn rollback_turn(&self, turn: Self::Turn);

    /// Called before a write that acts outside the store. Renews the lease and stamps the
    /// call as sent (`effect`, the suspension, the index) in the same statement, so a run that
    /// dies during the effect is resolved by the call's idempotency key, never sent blindly
    /// again. Errs when the lease is no longer held; the returned token carries the epoch and
    /// the idempotency key to the tool.
    async fn fence(
        &self,
        seq: SuspensionSeq,
        index: CallIndex,
        effect: Effect,
    ) -> Result<FenceToken, HookError>;

    /// Records the result of a call outside the store with its `tool_write` audit event (for a
    /// write), clears the stamp [`fence`](Self::fence) left and the debt of its commit, in one
    /// transaction: when the audit event cannot be stored, neither is the result. Idempotent.
    async fn record(
        &self,
        seq: SuspensionSeq,
        index: CallIndex,
        call: &PendingCall,
        effect: Effect,
        output: &ToolOutput,
    ) -> Result<(), HookError>;

    /// The fence token of call `index` of suspension `seq`'s turn under the lease this segment
    /// holds, without renewing or stamping anything: for asking a resource about a call.
    fn token(&self, seq: SuspensionSeq, index: CallIndex) -> FenceToken;

    /// The call of this suspension's turn that an earlier attempt sent outside the store
    /// ([`fence`](Self::fence) stamped it) and never journaled: it may have landed, so it is
    /// resolved by its key before anything else of the turn happens.
    fn sent_unjournaled(&self, _seq: SuspensionSeq) -> Option<CallIndex> {
        None
    }

    /// Checked at every step boundary: a segment that lost its lease stops and settles nothing.
    fn lease_lost(&self) -> bool {
        false
    }
}

/// Everything one segment runs with.
pub struct Segment<'a, H> {
    pub model: &'a dyn Model,
    pub registry: &'a ToolRegistry,
    pub agent: &'a AgentConfig,
    pub acting_user: &'a Principal,
    pub hooks: &'a H,
    /// The time stamp a suspension records (the loop reads no clock).
    pub captured_at: &'a str,
}

impl<H> Clone for Segment<'_, H> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<H> Copy for Segment<'_, H> {}

impl<H> fmt::Debug for Segment<'_, H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Segment")
            .field("agent", &self.agent.name)
            .field("acting_user", &self.acting_user.name)
            .finish_non_exhaustive()
    }
}

/// A decision on a suspended turn, already gated by the coordinator: on the whole turn
/// (`approved`), call by call (`calls`), or an edit of some calls' arguments (`edits`), which
/// issues the card again instead of running anything.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Decision {
    pub approved: bool,
    /// The comment the model reads with a denial of the whole turn.
    pub comment: Option<String>,
    /// What the approver decided of each call, when they decided call by call; empty for a
    /// decision on the whole turn. A call the list does not approve is denied.
    pub calls: Vec<CallVerdict>,
    /// Calls whose arguments an approver changed: the turn is previewed again with them and
    /// its card issued anew, to be decided like any card.
    pub edits: Vec<CallEdit>,
}

impl Decision {
    /// Whether call `index` is to run: approved on its own, or as part of an approved turn.
    pub fn approves(&self, index: CallIndex) -> bool {
        if self.calls.is_empty() {
            return self.approved;
        }
        self.calls.iter().any(|c| c.index == index && c.approved)
    }

    /// What the model is told of call `index` denied, by the approver's words.
    pub fn denial_of(&self, index: CallIndex) -> Option<&str> {
        if self.calls.is_empty() {
            return self.comment.as_deref();
        }
        self.calls
            .iter()
            .find(|c| c.index == index)
            .and_then(|c| c.message.as_deref())
    }

    /// Whether anything of the turn is to run.
    pub fn approves_any(&self, calls: usize) -> bool {
        (0..calls).any(|i| self.approves(CallIndex::new(i)))
    }
}

/// New arguments for one call of the turn, from an approver.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallEdit {
    pub index: CallIndex,
    pub arguments: Value,
    /// Who changed them.
    pub editor: String,
}

/// How a segment ended.
// One outcome per segment, moved once: the suspended state is not worth a box.
#[allow(clippy::large_enum_variant)]
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
    Interrupted(Interruption),
}

/// Why a segment stopped without settling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum Interruption {
    /// The segment no longer holds its lease: its next owner takes the run over, so nothing
    /// here may run it again.
    LeaseLost,
    /// A transient failure, by its stable code: the segment may run again.
    #[strum(transparent)]
    Unavailable(&'static str),
}

impl Interruption {
    /// The stable code, for the log.
    pub fn code(self) -> &'static str {
        self.into()
    }
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
pub async fn start<H: SegmentHooks>(
    seg: Segment<'_, H>,
    prompt: &str,
    inputs: Option<&Map<String, Value>>,
) -> Outcome {
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
pub async fn resume<H: SegmentHooks>(
    seg: Segment<'_, H>,
    state: SuspendedRunState,
    decision: &Decision,
) -> Outcome {
    if !decision.edits.is_empty() {
        return match reissue(seg, state, &decision.edits).await {
            Ok(state) => Outcome::Suspended {
                state,
                moved: vec![],
            },
            Err((e, iterations, tokens)) => interrupted(e, iterations, tokens),
        };
    }
    let seq = state.suspension_seq;
    let runs_any = decision.approves_any(state.pending_calls.len());
    let outputs = if runs_any {
        let offered = seg.agent.offered(seg.registry, seg.acting_user);
        match approval::approved(seg, &state, &offered, decision).await {
            Ok(Approved::Executed(outputs)) => outputs,
            Ok(Approved::Moved {
                previews,
                moved,
                landed,
            }) => return resuspend_moved(seg, state, decision, previews, moved, landed),
            Err(e) => return interrupted(e, state.iterations, state.tokens),
        }
    } else {
        denied(&state, decision)
    };

    let mut transcript = Vec::new();
    for (i, (call, output)) in state.pending_calls.iter().zip(outputs).enumerate() {
        let content = match state.edit_of(CallIndex::new(i)) {
            Some(edit) => format!("{}\n{}", edited_note(edit, &call.arguments), output.content),
            None => output.content,
        };
        transcript.push(Message::tool_result(&call.id, content, output.is_error));
    }
    let cursor = Cursor {
        transcript: [state.transcript, transcript].concat(),
        iterations: state.iterations,
        tokens: state.tokens,
        options: state.model_options,
        next_seq: seq.next(),
        after_denial: !runs_any,
    };
    run_turns(seg, cursor).await
}

/// What the model reads before the result of a call whose arguments a person changed: the call
/// as it ran.
pub fn edited_note(edit: &EditRecord, ran_with: &Value) -> String {
    format!(
        "Note: {} changed the arguments of this call before it ran; it ran with {ran_with}.",
        edit.editor
    )
}

/// The card issued anew with the arguments `edits` give: the same calls, some with new
/// arguments (each marked with who changed it, and from what), the whole turn previewed again
/// in sequence as its acting user, the next suspension number. Nothing runs.
async fn reissue<H: SegmentHooks>(
    seg: Segment<'_, H>,
    state: SuspendedRunState,
    edits: &[CallEdit],
) -> Result<SuspendedRunState, (HookError, u32, TokenUsage)> {
    let mut pending = state.pending_calls.clone();
    let mut records = state.edits.clone();
    for edit in edits {
        let Some(call) = pending.get_mut(edit.index.get()) else {
            tracing::warn!(call.index = %edit.index, "an edit names no call of the turn; ignored");
            continue;
        };
        records.retain(|r| r.index != edit.index);
        records.push(EditRecord {
            index: edit.index,
            tool: call.tool.clone(),
            editor: edit.editor.clone(),
            before: std::mem::replace(&mut call.arguments, edit.arguments.clone()),
            after: edit.arguments.clone(),
        });
    }
    records.sort_by_key(|r| r.index);
    let offered = seg.agent.offered(seg.registry, seg.acting_user);
    let next = state.suspension_seq.next();
    let previews = sequence::previews(seg, &pending, &offered, next)
        .await
        .map_err(|e| (e, state.iterations, state.tokens))?;
    let edited: Vec<CallIndex> = edits.iter().map(|e| e.index).collect();
    Ok(SuspendedRunState {
        tool_identities: identities(&pending, &offered),
        pending_calls: pending,
        call_previews: previews,
        stale_call_indexes: edited,
        excluded_calls: vec![],
        edits: records,
        suspension_seq: next,
        captured_at: seg.captured_at.to_owned(),
        ..state
    })
}

/// The results of a turn of which nothing runs: a call that landed under an earlier card of it
/// keeps its real result (it happened, and the model must not be told otherwise); every other
/// call is denied, with the approver's words for it.
fn denied(state: &SuspendedRunState, decision: &Decision) -> Vec<ToolOutput> {
    state
        .pending_calls
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let index = CallIndex::new(i);
            match state.landed(index) {
                Some(landed) => landed.output.clone(),
                None => ToolOutput::error(denied_result(&c.tool, decision.denial_of(index))),
            }
        })
        .collect()
}

/// The re-suspension of a turn whose previews moved: the same calls, the current previews, the
/// moved indexes, the calls that landed, the next suspension number. Nothing else of the turn
/// was written.
fn resuspend_moved<H>(
    seg: Segment<'_, H>,
    state: SuspendedRunState,
    decision: &Decision,
    previews: Vec<CallPreview>,
    moved: Vec<CallIndex>,
    landed: Vec<LandedCall>,
) -> Outcome {
    // A decision call by call had the turn previewed without the calls it denied: the new card
    // says so of them.
    let excluded = (0..state.pending_calls.len())
        .map(CallIndex::new)
        .filter(|i| !decision.approves(*i) && state.landed(*i).is_none())
        .collect();
    let moved_tools = moved
        .iter()
        .filter_map(|i| Some((*i, state.pending_calls.get(i.get())?.tool.clone())))
        .collect();
    let offered = seg.agent.offered(seg.registry, seg.acting_user);
    let state = SuspendedRunState {
        call_previews: previews,
        stale_call_indexes: moved,
        landed_calls: landed,
        excluded_calls: excluded,
        tool_identities: identities(&state.pending_calls, &offered),
        suspension_seq: state.suspension_seq.next(),
        captured_at: seg.captured_at.to_owned(),
        ..state
    };
    Outcome::Suspended {
        state,
        moved: moved_tools,
    }
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

impl Cursor {
    fn failed(&self, reason: TerminationReason, code: &'static str) -> Outcome {
        Outcome::Failed {
            reason,
            code,
            iterations: self.iterations,
            tokens: self.tokens,
        }
    }

    /// The run's end on a turn without calls.
    fn completed(self) -> Outcome {
        let reason = if self.after_denial {
            TerminationReason::ApprovalDenied
        } else {
            TerminationReason::Completed
        };
        Outcome::Completed {
            reason,
            transcript: self.transcript,
            iterations: self.iterations,
            tokens: self.tokens,
        }
    }
}

async fn run_turns<H: SegmentHooks>(seg: Segment<'_, H>, mut cur: Cursor) -> Outcome {
    loop {
        if seg.hooks.lease_lost() {
            return Outcome::Interrupted(Interruption::LeaseLost);
        }
        if cur.iterations >= seg.agent.max_iterations {
            let reason = TerminationReason::MaxIterations;
            return cur.failed(reason, reason.as_str());
        }
        let offered = seg.agent.offered(seg.registry, seg.acting_user);
        let calls = match next_turn(seg, &mut cur, &offered).await {
            Ok(calls) if calls.is_empty() => return cur.completed(),
            Ok(calls) => calls,
            Err(failed) => return failed,
        };
        cur.after_denial = false;
        if refused_at_the_boundary(seg, &mut cur, &calls) {
            continue;
        }
        let writes = calls.iter().any(|c| {
            offered
                .get(&c.name)
                .is_some_and(|t| t.spec().effect.is_write())
        });
        if writes {
            return suspended(seg, cur, calls, &offered).await;
        }
        if let Err(e) = run_reads(seg, &mut cur, &calls, &offered).await {
            return interrupted(e, cur.iterations, cur.tokens);
        }
    }
}

/// Asks the model for the next turn and keeps its answer in the transcript: its calls, or the
/// run's failure when the provider failed.
async fn next_turn<H: SegmentHooks>(
    seg: Segment<'_, H>,
    cur: &mut Cursor,
    offered: &OfferedTools,
) -> Result<Vec<ToolCall>, Outcome> {
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
            cur.iterations += 1;
            return Err(cur.failed(TerminationReason::ProviderFailed, e.code()));
        }
    };
    cur.iterations += 1;
    cur.tokens.add(response.usage);
    let calls = response.tool_calls;
    cur.transcript
        .push(Message::assistant(response.content, calls.clone()));
    Ok(calls)
}

/// Model output is untrusted: a turn is refused whole, before anything is stored, when a call
/// names no tool, has arguments that are not an object, or the turn has more calls than the
/// agent allows. `true` when it was, the model told why in every call's result.
fn refused_at_the_boundary<H>(seg: Segment<'_, H>, cur: &mut Cursor, calls: &[ToolCall]) -> bool {
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
    let Some(text) = refusal else {
        return false;
    };
    tracing::warn!(calls = calls.len(), "turn refused at the model boundary");
    for call in calls {
        cur.transcript
            .push(Message::tool_result(&call.id, text(call, limit), true));
    }
    true
}

/// The suspension of a turn with a write, or the run's failure when it cannot be stored.
async fn suspended<H: SegmentHooks>(
    seg: Segment<'_, H>,
    cur: Cursor,
    calls: Vec<ToolCall>,
    offered: &OfferedTools,
) -> Outcome {
    let (iterations, tokens) = (cur.iterations, cur.tokens);
    let state = match suspend(seg, cur, calls, offered).await {
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
    Outcome::Suspended {
        state,
        moved: vec![],
    }
}

/// Runs a turn of reads, in order, each result into the transcript.
async fn run_reads<H: SegmentHooks>(
    seg: Segment<'_, H>,
    cur: &mut Cursor,
    calls: &[ToolCall],
    offered: &OfferedTools,
) -> Result<(), HookError> {
    for call in calls {
        if seg.hooks.lease_lost() {
            return Err(HookError::LeaseLost);
        }
        let output = match offered.get(&call.name) {
            None => ToolOutput::error(not_available_result(&call.name)),
            Some(tool) => read(tool.as_ref(), seg.acting_user, &call.arguments).await?,
        };
        cur.transcript.push(Message::tool_result(
            &call.id,
            output.content,
            output.is_error,
        ));
    }
    Ok(())
}

/// The identity of each offered call's tool, for the card to be bound to.
fn identities(pending: &[PendingCall], offered: &OfferedTools) -> Vec<ToolIdentity> {
    pending
        .iter()
        .enumerate()
        .filter_map(|(i, call)| {
            Some(ToolIdentity {
                index: CallIndex::new(i),
                tool: call.tool.clone(),
                identity: offered.get(&call.tool)?.identity(),
            })
        })
        .collect()
}

/// The state of a turn suspended for approval, with the previews of its offered calls.
async fn suspend<H: SegmentHooks>(
    seg: Segment<'_, H>,
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
    let call_previews = sequence::previews(seg, &pending, offered, cur.next_seq).await?;
    let tool_identities = identities(&pending, offered);
    Ok(SuspendedRunState {
        transcript: cur.transcript,
        pending_calls: pending,
        iterations: cur.iterations,
        tokens: cur.tokens,
        offered_tools: offered.names(),
        model_options: cur.options,
        call_previews,
        stale_call_indexes: vec![],
        landed_calls: vec![],
        excluded_calls: vec![],
        edits: vec![],
        tool_identities,
        suspension_seq: cur.next_seq,
        captured_at: seg.captured_at.to_owned(),
    })
}

/// Executes a call outside any turn transaction: the tool's own failure (or a persistent one
/// of its infrastructure) becomes an error result naming only its code; a transient failure or
/// a lost fence stops the segment.
pub(crate) async fn execute(
    tool: &dyn Tool,
    ctx: &ExecContext,
    args: &Value,
) -> Result<ToolOutput, ToolError> {
    let name = &tool.spec().name;
    let span = tracing::info_span!("tool_call", tool = %name);
    match preview::catch_unwind(tool.execute(ctx, args))
        .instrument(span)
        .await
    {
        Ok(result) => result,
        Err(_) => {
            tracing::error!(tool = %name, "tool call panicked");
            Ok(ToolOutput::error(format!(
                "Error: tool \"{name}\" failed (panic)."
            )))
        }
    }
}

/// Runs a read-only call: its own failure, or a persistent one of its infrastructure, is its
/// result; a transient failure interrupts.
pub(crate) async fn read(
    tool: &dyn Tool,
    acting_user: &Principal,
    args: &Value,
) -> Result<ToolOutput, HookError> {
    let ctx = ExecContext::new(acting_user.clone());
    match execute(tool, &ctx, args).await {
        Ok(output) => Ok(output),
        Err(e) if e.interrupts() => Err(HookError::from_tool(&e)),
        Err(e) => Ok(failure_output(&tool.spec().name, &e)),
    }
}

pub(crate) fn failure_output(name: &str, e: &ToolError) -> ToolOutput {
    tracing::warn!(tool = %name, code = e.code(), error = %e, "tool call failed");
    ToolOutput::error(format!("Error: tool \"{name}\" failed ({}).", e.code()))
}

/// The outcome of a segment stopped by `e`: interrupted for a retry, or failed at once when
/// retrying cannot help.
fn interrupted(e: HookError, iterations: u32, tokens: TokenUsage) -> Outcome {
    let failed = |reason, code| Outcome::Failed {
        reason,
        code,
        iterations,
        tokens,
    };
    match e {
        HookError::LeaseLost => Outcome::Interrupted(Interruption::LeaseLost),
        HookError::Unavailable { code, detail } => {
            tracing::warn!(code, detail, "segment interrupted");
            Outcome::Interrupted(Interruption::Unavailable(code))
        }
        HookError::Broken { code, detail } => {
            tracing::error!(code, detail, "a persistent failure stopped a write");
            failed(TerminationReason::NotRetryable, code)
        }
        HookError::Unreadable { what } => {
            tracing::error!(what, "sealed run data unreadable");
            failed(
                TerminationReason::StateUnreadable,
                TerminationReason::StateUnreadable.as_str(),
            )
        }
        HookError::OutcomeUnknown { index, code } => {
            tracing::error!(call.index = %index, code, "the outcome of a write sent outside the store is unknown");
            failed(
                TerminationReason::OutcomeUnknown,
                TerminationReason::OutcomeUnknown.as_str(),
            )
        }
    }
}
