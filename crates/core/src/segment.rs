//! The contract between the tool loop and the service that runs it: what a segment runs with
//! ([`Segment`], [`AgentConfig`]), what it needs done outside ([`SegmentHooks`]: the lease,
//! the approved turn's transaction, the journal), and how it ends ([`Outcome`],
//! [`TerminationReason`]).

use std::fmt;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::errors::HookError;
use crate::ids::{CallIndex, SuspensionSeq};
use crate::local_writer::{JournalEntry, LocalWriter};
use crate::model::{Message, Model, ModelOptions, TokenUsage};
use crate::state::{PendingCall, SuspendedRunState};
use crate::tool::{
    DataClasses, Effect, FenceToken, OfferedTools, Principal, ToolOutput, ToolPolicy, ToolRegistry,
};

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
    type Transaction: Send;

    /// What earlier attempts of suspension `seq`'s turn left: its journaled results and the
    /// commits it owes.
    async fn turn_record(&self, seq: SuspensionSeq) -> Result<TurnRecord, HookError>;

    /// Opens the transaction a turn's local writes are sequenced in, checking that the lease is
    /// still held. The lease is held to again, and renewed, at
    /// [`commit_turn`](Self::commit_turn); the run row is not locked meanwhile, so the turn's
    /// calls outside the store can be stamped and journaled on their own.
    async fn begin_turn(&self, seq: SuspensionSeq) -> Result<Self::Transaction, HookError>;

    /// Opens the transaction a suspension previews its local writes in, in sequence, to roll
    /// it back once the previews are taken. A lock it cannot have at once is not waited for
    /// long: the suspension is not an approved turn, and must not hold the pool's connections a
    /// colleague's edit keeps waiting ([`HookError::Unavailable`] with the code
    /// [`crate::PREVIEW_CONFLICT`]).
    async fn begin_preview(&self, seq: SuspensionSeq) -> Result<Self::Transaction, HookError> {
        self.begin_turn(seq).await
    }

    /// The local writer of `tool`, when its writes land in the run store's own database.
    fn local(&self, tool: &str) -> Option<&dyn LocalWriter<Self::Transaction>>;

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
        turn: Self::Transaction,
        seq: SuspensionSeq,
        entries: &[JournalEntry<'_>],
        owed: &[CallIndex],
    ) -> Result<(), HookError>;

    /// Abandons everything written in the transaction.
    async fn rollback_turn(&self, turn: Self::Transaction);

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
