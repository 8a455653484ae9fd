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
//! Everything with side effects is behind [`SegmentHooks`], [`crate::Model`] and [`crate::Tool`]; the
//! contract itself is [`crate::segment`], what the model is told [`crate::told`], and how one call
//! runs [`crate::execution`].

use serde_json::{Map, Value};

use crate::approval::{self, Approved};
use crate::decision::{CallEdit, Decision};
use crate::errors::HookError;
use crate::execution::read;
use crate::ids::{CallIndex, SuspensionSeq};
use crate::model::{Message, ModelOptions, ModelRequest, TokenUsage, ToolCall};
use crate::preview::CallPreview;
use crate::segment::{Interruption, Outcome, Segment, SegmentHooks, TerminationReason};
use crate::sequence;
use crate::state::{
    EditRecord, LandedCall, PendingCall, SuspendedRunState, ToolIdentity, MAX_STATE_BYTES,
};
use crate::told::{
    denied_result, edited_note, first_message, malformed_arguments_result, not_available_result,
    too_many_calls_result, unnamed_call_result,
};
use crate::tool::{OfferedTools, ToolOutput};

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
