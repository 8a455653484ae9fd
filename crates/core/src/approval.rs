//! The approved turn: one pipeline for every kind of call.
//!
//! ```text
//! resolve the call in doubt → lock → re-plan → compare → prepare → apply → send → commit
//! ```
//!
//! - **Facts once.** Every call of the turn becomes one `TurnCall`: its index, the call, the
//!   preview its approver was shown, how it runs (`Step`: skipped, a read, a write to the run
//!   store's own database, a write elsewhere) and its result once it has one — journaled by an
//!   earlier attempt, or landed under an earlier card of the turn.
//! - **The call in doubt** — sent outside the store by an earlier attempt and never journaled —
//!   is resolved first, by asking its resource what became of its idempotency key. Only an
//!   answer becomes a result; a write that may have landed and cannot be resolved fails the run
//!   `outcome_unknown` (an idempotent one is sent again under its key instead).
//! - **Compare before any write.** Under the turn's transaction every local subject is locked
//!   in the one global order and every local call re-planned, which locks what the plan reads;
//!   every other shown preview is taken again from its tool. All of them are compared at once
//!   (`comparator::bind`); if any moved, nothing of the turn is written and the run
//!   re-suspends with the current previews.
//! - **Revocable first, irrevocable last.** Writes on resources that take two phases are
//!   prepared (each compares at its resource and holds the change), then the local writes are
//!   applied (uncommitted, under their locks), then the one-phase writes elsewhere are sent with
//!   the lines their approver was shown, then the prepared ones are committed, and the turn's
//!   transaction commits last. A resource that answers "moved" stops the turn: the held changes
//!   are aborted, the local writes rolled back, and the run re-suspends with the calls that had
//!   landed marked as done.
//! - Reads of the turn run after its commit; they change nothing.

use tracing::Instrument;

use crate::agent_loop::{
    self, no_longer_permitted_result, not_offered_at_suspend_result, HookError, Segment,
    SegmentHooks,
};
use crate::comparator::{self, Binding, Current};
use crate::ids::CallIndex;
use crate::preview::{self, Attempt, CallPreview};
use crate::state::{LandedCall, PendingCall, SuspendedRunState};
use crate::tool::{
    CallStatus, Effect, ExecContext, ExternalWrite, OfferedTools, Prepared, Tool, ToolError,
    ToolOutput,
};
use crate::turn::{JournalEntry, LocalWriter, PlannedWrite};

/// What became of an approved turn.
pub(crate) enum Approved {
    /// One output per pending call, in call order.
    Executed(Vec<ToolOutput>),
    /// A shown preview moved before the turn was done: the run re-suspends with `previews`,
    /// the `moved` indexes, and the calls that `landed` before it was found, which never run
    /// again.
    Moved {
        previews: Vec<CallPreview>,
        moved: Vec<CallIndex>,
        landed: Vec<LandedCall>,
    },
}

/// How one call of an approved turn runs.
enum Step<'a, Tx> {
    /// Not executed; the model is told why.
    Skip(ToolOutput),
    Read(&'a dyn Tool),
    /// A write to the run store's own database: planned and written in the turn transaction.
    Local(&'a dyn Tool, &'a dyn LocalWriter<Tx>),
    /// A write that acts outside the store: fenced, stamped, sent and journaled on its own.
    External(&'a dyn Tool),
}

/// One call of the approved turn, with everything known of it.
struct TurnCall<'a, Tx> {
    index: CallIndex,
    call: &'a PendingCall,
    /// The preview the approver was shown for it; `None` when its tool had none.
    shown: Option<&'a CallPreview>,
    step: Step<'a, Tx>,
    /// Its result, once it was carried out — by this attempt, an earlier one, or under an
    /// earlier card of the turn. It never runs again.
    done: Option<ToolOutput>,
    /// A local write's plan, settled under the turn's locks.
    plan: Option<Result<Box<dyn PlannedWrite<Tx>>, ToolError>>,
    /// Sent outside the store by an earlier attempt and not journaled: it may have landed, so
    /// it is not compared again (a preview now could read its own write) but sent again under
    /// its idempotency key.
    in_doubt: bool,
    /// Its resource said the shown preview moved: the turn re-suspends with it marked.
    moved_at_resource: bool,
    /// Prepared at a two-phase resource and neither committed nor aborted yet.
    held: bool,
}

impl<'a, Tx> TurnCall<'a, Tx> {
    fn effect(&self) -> Effect {
        match self.step {
            Step::Skip(_) => Effect::ReadOnly,
            Step::Read(tool) | Step::Local(tool, _) | Step::External(tool) => tool.spec().effect,
        }
    }

    fn external(&self) -> Option<(&'a dyn Tool, Option<&'a dyn ExternalWrite>)> {
        match self.step {
            Step::External(tool) => Some((tool, tool.external())),
            _ => None,
        }
    }

    fn two_phase(&self) -> bool {
        self.external()
            .and_then(|(_, ext)| ext)
            .is_some_and(ExternalWrite::two_phase)
    }

    /// The lines its approver was shown, when a resource can compare its own preview with them
    /// line for line: a preview that did not fail and that no bound cut.
    fn comparable_preview(&self) -> Option<Vec<String>> {
        let shown = self.shown.filter(|p| !p.failed)?;
        let cut = shown.lines.len() > preview::MAX_LINES
            || shown
                .lines
                .iter()
                .any(|l| l.chars().count() >= preview::MAX_LINE_CHARS);
        (!cut).then(|| shown.lines.clone())
    }
}

/// How the writing part of a turn ended before its commit.
enum Ran {
    /// Everything outside the store is done; these local writes wait for the commit.
    Written(Vec<(usize, ToolOutput)>),
    /// A preview moved: nothing more may be written.
    Moved {
        previews: Vec<CallPreview>,
        moved: Vec<CallIndex>,
    },
}

/// Runs the approved turn of `state`.
pub(crate) async fn approved<H: SegmentHooks>(
    seg: Segment<'_, H>,
    state: &SuspendedRunState,
    offered: &OfferedTools,
) -> Result<Approved, HookError> {
    let mut turn = Turn {
        seg,
        state,
        calls: facts(seg, state, offered),
    };
    let mut tx = seg.hooks.begin_turn(state.suspension_seq).await?;
    let ran = turn.run(&mut tx).await;
    turn.finish(tx, ran).await
}

/// Every call of the turn with how it runs now and what is already known of it.
fn facts<'a, H: SegmentHooks>(
    seg: Segment<'a, H>,
    state: &'a SuspendedRunState,
    offered: &'a OfferedTools,
) -> Vec<TurnCall<'a, H::Turn>> {
    state
        .pending_calls
        .iter()
        .enumerate()
        .map(|(i, call)| {
            let index = CallIndex::new(i);
            TurnCall {
                index,
                call,
                shown: state.preview_of(index),
                step: step(seg, state, offered, call),
                done: state.landed(index).map(|l| l.output.clone()),
                plan: None,
                in_doubt: false,
                moved_at_resource: false,
                held: false,
            }
        })
        .collect()
}

fn step<'a, H: SegmentHooks>(
    seg: Segment<'a, H>,
    state: &SuspendedRunState,
    offered: &'a OfferedTools,
    call: &PendingCall,
) -> Step<'a, H::Turn> {
    if !state.offered_tools.contains(&call.tool) {
        return Step::Skip(ToolOutput::error(not_offered_at_suspend_result(&call.tool)));
    }
    let Some(tool) = offered.get(&call.tool) else {
        return Step::Skip(ToolOutput::error(no_longer_permitted_result(&call.tool)));
    };
    let tool = tool.as_ref();
    if !tool.spec().effect.is_write() {
        return Step::Read(tool);
    }
    match seg.hooks.local(&call.tool) {
        Some(local) => Step::Local(tool, local),
        None => Step::External(tool),
    }
}

/// The approved turn while it runs.
struct Turn<'a, H: SegmentHooks> {
    seg: Segment<'a, H>,
    state: &'a SuspendedRunState,
    calls: Vec<TurnCall<'a, H::Turn>>,
}

impl<H: SegmentHooks> Turn<'_, H> {
    async fn run(&mut self, tx: &mut H::Turn) -> Result<Ran, HookError> {
        let seq = self.state.suspension_seq;
        for (index, output) in self.seg.hooks.journaled(tx, seq).await? {
            if let Some(call) = self.calls.get_mut(index.get()) {
                call.done = Some(output);
            }
        }
        self.resolve_in_doubt().await?;
        if let Some(moved) = self.check(tx).await? {
            return Ok(moved);
        }
        self.seg.hooks.applying(seq).await;
        if let Some(i) = self.prepare().await? {
            return self.moved_at(i).await;
        }
        let local = self.apply(tx).await?;
        if let Some(i) = self.send().await? {
            return self.moved_at(i).await;
        }
        self.commit_held().await?;
        Ok(Ran::Written(local))
    }

    /// Commits or rolls back the turn's transaction, and says what became of the turn.
    async fn finish(
        mut self,
        tx: H::Turn,
        ran: Result<Ran, HookError>,
    ) -> Result<Approved, HookError> {
        let hooks = self.seg.hooks;
        match ran {
            Ok(Ran::Written(local)) => {
                let entries: Vec<JournalEntry<'_>> = local
                    .iter()
                    .map(|(i, output)| JournalEntry {
                        index: CallIndex::new(*i),
                        tool: &self.calls[*i].call.tool,
                        effect: self.calls[*i].effect(),
                        output,
                    })
                    .collect();
                hooks
                    .commit_turn(tx, self.state.suspension_seq, &entries)
                    .await?;
                for (i, output) in local {
                    self.calls[i].done = Some(output);
                }
                self.outputs().await.map(Approved::Executed)
            }
            Ok(Ran::Moved { previews, moved }) => {
                hooks.rollback_turn(tx).await;
                self.abort_held().await;
                Ok(Approved::Moved {
                    previews,
                    moved,
                    landed: self.landed(),
                })
            }
            Err(e) => {
                hooks.rollback_turn(tx).await;
                self.abort_held().await;
                Err(e)
            }
        }
    }

    /// Resolves the call an earlier attempt sent outside the store and never journaled, by
    /// asking its resource what became of its idempotency key.
    async fn resolve_in_doubt(&mut self) -> Result<(), HookError> {
        let seq = self.state.suspension_seq;
        let Some(index) = self.seg.hooks.sent_unjournaled(seq) else {
            return Ok(());
        };
        let seg = self.seg;
        let Some(call) = self.calls.get_mut(index.get()) else {
            return Ok(());
        };
        if call.done.is_some() {
            return Ok(());
        }
        let tool = seg.registry.get(&call.call.tool).map(|t| t.as_ref());
        let status = match tool.and_then(|t| t.external()) {
            Some(ext) => {
                let ctx = context(seg, Some(seg.hooks.token(seq, index)), None);
                ext.status(&ctx).await
            }
            None => Err(ToolError::failed("unsupported", "the tool cannot be asked")),
        };
        let said = match &status {
            Ok(CallStatus::Answered(_)) => "answered",
            Ok(CallStatus::Moved) => "moved",
            Ok(CallStatus::Prepared) => "prepared",
            Ok(CallStatus::Unseen) => "unseen",
            Err(e) => e.code(),
        };
        tracing::info!(call.index = %index, tool = %call.call.tool, said, "a call sent by an earlier attempt, asked about by its key");
        match status {
            Ok(CallStatus::Answered(output)) => {
                record(seg, seq, call, &output).await?;
                call.done = Some(output);
            }
            Ok(CallStatus::Moved) => call.moved_at_resource = true,
            Ok(CallStatus::Prepared) => call.held = true,
            Ok(CallStatus::Unseen) => {}
            Err(e) if call.effect() == Effect::NonIdempotentWrite => {
                return Err(HookError::OutcomeUnknown {
                    index,
                    code: e.code(),
                })
            }
            // Sending an idempotent write again under its key is safe whatever happened.
            Err(_) => call.in_doubt = true,
        }
        Ok(())
    }

    /// Locks and re-plans every local write, takes every other shown preview again, and
    /// compares them all with what the approver was shown. `Some` when any moved.
    async fn check(&mut self, tx: &mut H::Turn) -> Result<Option<Ran>, HookError> {
        self.lock(tx).await?;
        self.replan(tx).await?;
        let mut current = Vec::new();
        for call in &self.calls {
            let Some(shown) = call.shown else { continue };
            current.push((shown, self.now(call).await?));
        }
        let forced: Vec<CallIndex> = self
            .calls
            .iter()
            .filter(|c| c.moved_at_resource)
            .map(|c| c.index)
            .collect();
        Ok(match comparator::bind(current) {
            Binding::Unchanged if forced.is_empty() => None,
            Binding::Unchanged => Some(Ran::Moved {
                previews: self.state.call_previews.clone(),
                moved: forced,
            }),
            Binding::Moved {
                previews,
                mut moved,
            } => {
                moved.extend(forced);
                moved.sort();
                moved.dedup();
                Some(Ran::Moved { previews, moved })
            }
        })
    }

    /// Locks the subjects of every local write still to run, in the one global order; each
    /// run of subjects of one space is locked by a writer of that space.
    async fn lock(&self, tx: &mut H::Turn) -> Result<(), HookError> {
        let mut subjects = Vec::new();
        for call in self.calls.iter().filter(|c| c.done.is_none()) {
            if let Step::Local(_, local) = call.step {
                let named = local
                    .subjects(tx, &call.call.arguments)
                    .await
                    .map_err(|e| HookError::from_tool(&e))?;
                subjects.extend(named.into_iter().map(|s| (s, local)));
            }
        }
        subjects.sort_by(|a, b| a.0.cmp(&b.0));
        subjects.dedup_by(|a, b| a.0 == b.0);
        for run in subjects.chunk_by(|a, b| a.0.space == b.0.space) {
            let ordered: Vec<_> = run.iter().map(|(s, _)| s.clone()).collect();
            run[0]
                .1
                .lock(tx, &ordered)
                .await
                .map_err(|e| HookError::from_tool(&e))?;
        }
        Ok(())
    }

    /// Plans every local write still to run under the locks; a transient failure interrupts.
    async fn replan(&mut self, tx: &mut H::Turn) -> Result<(), HookError> {
        let user = self.seg.acting_user;
        for call in self.calls.iter_mut().filter(|c| c.done.is_none()) {
            if let Step::Local(_, local) = call.step {
                let span = tracing::info_span!("preview", tool = %call.call.tool, call.index = %call.index, at = "turn");
                let plan = local
                    .plan(tx, user, &call.call.arguments)
                    .instrument(span)
                    .await;
                let aborted = match &plan {
                    Err(e) if e.interrupts() => return Err(HookError::from_tool(e)),
                    // A statement that failed ended the transaction: the calls after it are
                    // previewed outside it, and the turn re-suspends on this one's failure.
                    Err(ToolError::Broken { .. }) => true,
                    _ => false,
                };
                call.plan = Some(plan);
                if aborted {
                    break;
                }
            }
        }
        Ok(())
    }

    /// What the shown preview of `call` reads now; `None` when it is not compared: a call
    /// carried out already, one that will not run, one in doubt, and a preview that failed when
    /// it was shown (the approver decided blind).
    async fn now(&self, call: &TurnCall<'_, H::Turn>) -> Result<Option<Current>, HookError> {
        if call.done.is_some() || call.in_doubt || call.shown.is_none_or(|p| p.failed) {
            return Ok(None);
        }
        let tool = match call.step {
            Step::Skip(_) => return Ok(None),
            Step::Local(tool, _) => {
                return Ok(Some(match (tool.previewer(), &call.plan) {
                    (None, _) => Current::Vanished,
                    (Some(_), Some(Ok(plan))) => {
                        Current::Attempt(Attempt::of_lines(plan.preview()))
                    }
                    (Some(_), Some(Err(e))) => Current::Attempt(Attempt::failed(e)),
                    (Some(_), None) => fresh(self.seg, tool, call).await?,
                }))
            }
            Step::Read(tool) | Step::External(tool) => tool,
        };
        Ok(Some(fresh(self.seg, tool, call).await?))
    }

    /// Prepares every two-phase write still to run. `Some(i)` when call `i`'s resource found
    /// its preview moved.
    async fn prepare(&mut self) -> Result<Option<usize>, HookError> {
        let seg = self.seg;
        let seq = self.state.suspension_seq;
        for (i, call) in self.calls.iter_mut().enumerate() {
            if call.done.is_some() || call.held || !call.two_phase() {
                continue;
            }
            let Some((tool, Some(ext))) = call.external() else {
                continue;
            };
            stop_if_lost(seg)?;
            let fence = seg.hooks.fence(seq, call.index, call.effect()).await?;
            let ctx = context(seg, Some(fence), call.comparable_preview());
            let span = tracing::info_span!("tool_call", tool = %tool.spec().name, call.index = i, phase = "prepare");
            match ext
                .prepare(&ctx, &call.call.arguments)
                .instrument(span)
                .await
            {
                Ok(Prepared::Held) => call.held = true,
                Ok(Prepared::Moved) | Err(ToolError::Moved) => return Ok(Some(i)),
                Ok(Prepared::Answered(output)) => {
                    record(seg, seq, call, &output).await?;
                    call.done = Some(output);
                }
                // A prepare whose answer was lost holds nothing anybody can see: it is aborted
                // with the rest, and the turn is tried again.
                Err(ToolError::OutcomeUnknown { code, detail }) => {
                    call.held = true;
                    return Err(HookError::Unavailable { code, detail });
                }
                Err(e) => settle_failure(seg, seq, call, &e).await?,
            }
        }
        Ok(None)
    }

    /// Applies every local write still to run, in call order, without committing.
    async fn apply(&mut self, tx: &mut H::Turn) -> Result<Vec<(usize, ToolOutput)>, HookError> {
        let mut outputs = Vec::new();
        for (i, call) in self.calls.iter_mut().enumerate() {
            if call.done.is_some() {
                continue;
            }
            let Some(plan) = call.plan.take() else {
                continue;
            };
            stop_if_lost(self.seg)?;
            let output = match plan {
                Ok(plan) => {
                    let span =
                        tracing::info_span!("tool_call", tool = %call.call.tool, call.index = i);
                    plan.apply(tx)
                        .instrument(span)
                        .await
                        .map_err(|e| HookError::from_tool(&e))?
                }
                Err(e @ ToolError::Failed { .. }) => {
                    agent_loop::failure_output(&call.call.tool, &e)
                }
                // The approver decided without a preview of this call, and its plan cannot be
                // made: the write is impossible, and retrying cannot help.
                Err(e) => return Err(HookError::from_tool(&e)),
            };
            outputs.push((i, output));
        }
        Ok(outputs)
    }

    /// Sends every one-phase write outside the store still to run, in call order, each with the
    /// lines its approver was shown, and journals each answer with its audit event. `Some(i)`
    /// when call `i`'s resource found its preview moved.
    async fn send(&mut self) -> Result<Option<usize>, HookError> {
        let seg = self.seg;
        let seq = self.state.suspension_seq;
        for (i, call) in self.calls.iter_mut().enumerate() {
            let Some((tool, _)) = call.external() else {
                continue;
            };
            if call.done.is_some() || call.held || call.two_phase() {
                continue;
            }
            stop_if_lost(seg)?;
            let fence = seg.hooks.fence(seq, call.index, call.effect()).await?;
            let ctx = context(seg, Some(fence), call.comparable_preview());
            match agent_loop::execute(tool, &ctx, &call.call.arguments).await {
                Ok(output) => {
                    record(seg, seq, call, &output).await?;
                    call.done = Some(output);
                }
                Err(ToolError::Moved) => return Ok(Some(i)),
                Err(e) => settle_failure(seg, seq, call, &e).await?,
            }
        }
        Ok(None)
    }

    /// Commits every held two-phase write, in call order, and journals each answer.
    async fn commit_held(&mut self) -> Result<(), HookError> {
        let seg = self.seg;
        let seq = self.state.suspension_seq;
        for call in self.calls.iter_mut().filter(|c| c.held) {
            let Some((tool, Some(ext))) = call.external() else {
                continue;
            };
            let fence = seg.hooks.fence(seq, call.index, call.effect()).await?;
            let ctx = context(seg, Some(fence), call.comparable_preview());
            let span = tracing::info_span!("tool_call", tool = %tool.spec().name, call.index = %call.index, phase = "commit");
            match ext
                .commit(&ctx, &call.call.arguments)
                .instrument(span)
                .await
            {
                Ok(output) => {
                    record(seg, seq, call, &output).await?;
                    call.held = false;
                    call.done = Some(output);
                }
                // Committing is idempotent by key: a retry asks the resource again.
                Err(e) => {
                    settle_failure(seg, seq, call, &e).await?;
                    call.held = false;
                }
            }
        }
        Ok(())
    }

    /// Drops what two-phase resources hold for the turn; best effort, as an abort of a key that
    /// holds nothing is one already done, and a resource expires what it held too long.
    async fn abort_held(&self) {
        for call in self
            .calls
            .iter()
            .filter(|c| c.done.is_none() && c.two_phase())
        {
            let Some((tool, Some(ext))) = call.external() else {
                continue;
            };
            let token = self.seg.hooks.token(self.state.suspension_seq, call.index);
            let ctx = context(self.seg, Some(token), None);
            if let Err(e) = ext.abort(&ctx, &call.call.arguments).await {
                tracing::warn!(tool = %tool.spec().name, call.index = %call.index, code = e.code(), error = %e, "abort failed; the resource expires the held change");
            }
        }
    }

    /// The re-suspension after call `i`'s resource found its preview moved: its current
    /// preview taken again, the others as they were shown.
    async fn moved_at(&self, i: usize) -> Result<Ran, HookError> {
        let call = &self.calls[i];
        let mut now = match call.step {
            Step::External(tool) => Some(fresh(self.seg, tool, call).await?),
            _ => None,
        };
        let current = self.state.call_previews.iter().map(|p| {
            let now = if p.index == call.index {
                now.take()
            } else {
                None
            };
            (p, now)
        });
        let previews = match comparator::bind(current) {
            Binding::Moved { previews, .. } => previews,
            Binding::Unchanged => self.state.call_previews.clone(),
        };
        Ok(Ran::Moved {
            previews,
            moved: vec![call.index],
        })
    }

    /// The writes of the turn carried out so far: they never run again.
    fn landed(&self) -> Vec<LandedCall> {
        self.calls
            .iter()
            .filter(|c| matches!(c.step, Step::Local(..) | Step::External(_)))
            .filter_map(|c| {
                Some(LandedCall {
                    index: c.index,
                    tool: c.call.tool.clone(),
                    output: c.done.clone()?,
                })
            })
            .collect()
    }

    /// One output per call, in call order: the reads run now, after the turn's writes.
    async fn outputs(self) -> Result<Vec<ToolOutput>, HookError> {
        let mut outputs = Vec::with_capacity(self.calls.len());
        for call in self.calls {
            let output = match (call.done, call.step) {
                (Some(output), _) => output,
                (None, Step::Skip(output)) => output,
                (None, Step::Read(tool)) => {
                    agent_loop::read(tool, self.seg.acting_user, &call.call.arguments).await?
                }
                (None, Step::Local(..) | Step::External(_)) => {
                    return Err(HookError::Unavailable {
                        code: "turn_incomplete",
                        detail: format!("call {} has no result after the commit", call.index),
                    })
                }
            };
            outputs.push(output);
        }
        Ok(outputs)
    }
}

/// A preview of `call` taken again from `tool` now, outside the turn's transaction.
async fn fresh<H: SegmentHooks, Tx>(
    seg: Segment<'_, H>,
    tool: &dyn Tool,
    call: &TurnCall<'_, Tx>,
) -> Result<Current, HookError> {
    let Some(previewer) = tool.previewer() else {
        return Ok(Current::Vanished);
    };
    let span = tracing::info_span!("preview", tool = %call.call.tool, call.index = %call.index, at = "resume");
    let attempt = preview::attempt(previewer, seg.acting_user, &call.call.arguments)
        .instrument(span)
        .await;
    attempt.interruption()?;
    Ok(Current::Attempt(attempt))
}

/// What a call is given besides its arguments.
fn context<H>(
    seg: Segment<'_, H>,
    fence: Option<crate::tool::FenceToken>,
    shown_preview: Option<Vec<String>>,
) -> ExecContext {
    ExecContext {
        acting_user: seg.acting_user.clone(),
        fence,
        shown_preview,
    }
}

/// Journals the answer of a call outside the store with its audit event.
async fn record<H: SegmentHooks, Tx>(
    seg: Segment<'_, H>,
    seq: crate::ids::SuspensionSeq,
    call: &TurnCall<'_, Tx>,
    output: &ToolOutput,
) -> Result<(), HookError> {
    seg.hooks
        .record(seq, call.index, call.call, call.effect(), output)
        .await
}

/// What a failed call outside the store comes to: the tool's own failure is its journaled
/// result; anything else stops the segment — to be retried, or failing the run.
async fn settle_failure<H: SegmentHooks, Tx>(
    seg: Segment<'_, H>,
    seq: crate::ids::SuspensionSeq,
    call: &mut TurnCall<'_, Tx>,
    e: &ToolError,
) -> Result<(), HookError> {
    match e {
        ToolError::Failed { .. } => {
            let output = agent_loop::failure_output(&call.call.tool, e);
            record(seg, seq, call, &output).await?;
            call.done = Some(output);
            Ok(())
        }
        ToolError::OutcomeUnknown { code, .. } => Err(HookError::OutcomeUnknown {
            index: call.index,
            code,
        }),
        other => Err(HookError::from_tool(other)),
    }
}

fn stop_if_lost<H: SegmentHooks>(seg: Segment<'_, H>) -> Result<(), HookError> {
    if seg.hooks.lease_lost() {
        Err(HookError::LeaseLost)
    } else {
        Ok(())
    }
}
