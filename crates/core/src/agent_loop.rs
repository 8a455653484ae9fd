//! The tool loop: one segment of a run, from a prompt or from a decision, until the run
//! completes, fails, or suspends for approval.
//!
//! The loop owns the approval rules so that no tool can forget them:
//!
//! - if ANY offered call of a turn has a write effect, the whole turn suspends before any of
//!   its calls runs — a read in the same turn waits too, so the approver sees the turn whole;
//! - at suspend, every offered call whose tool has a preview gets one, produced as the acting
//!   user and bounded;
//! - on an approved resume, the comparator re-previews the turn before any call executes, and
//!   a moved preview re-suspends the run with nothing written;
//! - every write is fenced, and every call of a resumed turn is journaled, so a retried resume
//!   skips what already ran and reuses its recorded result.
//!
//! Everything with side effects is behind [`SegmentHooks`], [`Model`] and [`Tool`].

use std::fmt;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::comparator::{self, Binding};
use crate::ids::{CallIndex, SuspensionSeq};
use crate::model::{Message, Model, ModelOptions, ModelRequest, TokenUsage, ToolCall};
use crate::preview;
use crate::state::{PendingCall, SuspendedRunState};
use crate::tool::{
    Effect, ExecContext, FenceToken, OfferedTools, Principal, Tool, ToolError, ToolOutput,
    ToolPolicy, ToolRegistry,
};

/// What the loop needs of an agent configuration.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct AgentConfig {
    pub name: String,
    #[serde(default)]
    pub system_prompt: Option<String>,
    #[serde(default)]
    pub policy: ToolPolicy,
    pub max_iterations: u32,
    #[serde(default)]
    pub model_options: ModelOptions,
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
}

/// The side of a segment the loop cannot do itself: the lease and the execution journal.
#[async_trait]
pub trait SegmentHooks: Send + Sync {
    /// Called before every write. Errs when the lease is no longer held; the returned token
    /// goes to the tool, which verifies it again at the resource.
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

    /// Records a call's result. Must be idempotent: a tool writing to the run's own database
    /// journals inside its own transaction.
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

/// Text the model receives when a turn is refused for malformed arguments.
pub fn malformed_arguments_result(tool: &str) -> String {
    format!(
        "Error: the arguments of this call to tool \"{tool}\" are not a JSON object, so no call of this turn was executed."
    )
}

/// Runs a new run from its prompt.
pub async fn start(seg: Segment<'_>, prompt: &str) -> Outcome {
    let mut transcript = Vec::with_capacity(2);
    if let Some(system) = seg.agent.system_prompt.as_deref().filter(|s| !s.is_empty()) {
        transcript.push(Message::system(system));
    }
    transcript.push(Message::user(prompt));
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
    let offered = seg.agent.policy.offered(seg.registry, seg.acting_user);
    let seq = state.suspension_seq;

    if decision.approved {
        match seg.hooks.any_journaled(seq).await {
            Err(e) => return interrupted(e),
            Ok(true) => {}
            Ok(false) => {
                if let Binding::Moved { previews, moved } =
                    comparator::compare(&state, &offered, seg.acting_user).await
                {
                    let moved_tools = moved
                        .iter()
                        .filter_map(|i| Some((*i, state.pending_calls.get(i.get())?.tool.clone())))
                        .collect();
                    let state = SuspendedRunState {
                        call_previews: previews,
                        stale_call_indexes: moved,
                        suspension_seq: seq.next(),
                        captured_at: seg.captured_at.to_owned(),
                        ..state
                    };
                    return Outcome::Suspended {
                        state,
                        moved: moved_tools,
                    };
                }
            }
        }
    }

    let mut transcript = state.transcript;
    for (i, call) in state.pending_calls.iter().enumerate() {
        if seg.hooks.lease_lost() {
            return Outcome::Interrupted { code: "lease_lost" };
        }
        let index = CallIndex::new(i);
        let output = if !decision.approved {
            ToolOutput::error(denied_result(&call.tool, decision.comment.as_deref()))
        } else if let Some(tool) = offered.get(&call.tool) {
            match run_journaled(seg, seq, index, call, tool.as_ref()).await {
                Ok(output) => output,
                Err(e) => return interrupted(e),
            }
        } else {
            ToolOutput::error(no_longer_permitted_result(&call.tool))
        };
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

        if calls.iter().any(|c| !c.arguments.is_object()) {
            for call in &calls {
                let text = malformed_arguments_result(&call.name);
                cur.transcript
                    .push(Message::tool_result(&call.id, text, true));
            }
            continue;
        }

        let writes = calls.iter().any(|c| {
            offered
                .get(&c.name)
                .is_some_and(|t| t.spec().effect.is_write())
        });
        if writes {
            return Outcome::Suspended {
                state: suspend(seg, cur, calls, &offered).await,
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
                    };
                    match execute(tool.as_ref(), &ctx, &call.arguments).await {
                        Ok(output) => output,
                        Err(_) => return Outcome::Interrupted { code: "lease_lost" },
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
) -> SuspendedRunState {
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
        let attempt = preview::attempt(previewer, seg.acting_user, &call.arguments).await;
        call_previews.push(preview::at_suspend(CallIndex::new(i), &call.tool, attempt));
    }
    SuspendedRunState {
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
    }
}

/// Runs one call of an approved turn exactly once: a journaled result is reused; otherwise the
/// write is fenced, executed and journaled.
async fn run_journaled(
    seg: Segment<'_>,
    seq: SuspensionSeq,
    index: CallIndex,
    call: &PendingCall,
    tool: &dyn Tool,
) -> Result<ToolOutput, HookError> {
    if let Some(recorded) = seg.hooks.journaled(seq, index).await? {
        return Ok(recorded);
    }
    let effect = tool.spec().effect;
    let fence = if effect.is_write() {
        Some(seg.hooks.fence(seq, index, effect).await?)
    } else {
        None
    };
    let ctx = ExecContext {
        acting_user: seg.acting_user.clone(),
        fence,
    };
    let output = execute(tool, &ctx, &call.arguments).await?;
    seg.hooks.record(seq, index, call, effect, &output).await?;
    Ok(output)
}

/// Executes a call; a tool failure becomes an error result naming only its code, a lost fence
/// stops the segment.
async fn execute(
    tool: &dyn Tool,
    ctx: &ExecContext,
    args: &Value,
) -> Result<ToolOutput, HookError> {
    let name = &tool.spec().name;
    match preview::catch_unwind(tool.execute(ctx, args)).await {
        Ok(Ok(output)) => Ok(output),
        Ok(Err(ToolError::FenceLost)) => Err(HookError::LeaseLost),
        Ok(Err(e)) => {
            tracing::warn!(tool = %name, code = e.code(), error = %e, "tool call failed");
            Ok(ToolOutput::error(format!(
                "Error: tool \"{name}\" failed ({}).",
                e.code()
            )))
        }
        Err(_) => {
            tracing::error!(tool = %name, "tool call panicked");
            Ok(ToolOutput::error(format!(
                "Error: tool \"{name}\" failed (panic)."
            )))
        }
    }
}

fn interrupted(e: HookError) -> Outcome {
    match e {
        HookError::LeaseLost => Outcome::Interrupted { code: "lease_lost" },
        HookError::Unavailable { code, detail } => {
            tracing::warn!(code, detail, "segment interrupted");
            Outcome::Interrupted { code }
        }
    }
}
