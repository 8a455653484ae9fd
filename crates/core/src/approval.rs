//! The approved turn: one pipeline for every kind of call, one sequence on every resource.
//!
//! ```text
//! owed commits → the call in doubt → preview outside → prepare → sequence → compare
//!              → verify holds → send → COMMIT (the commit point) → commit holds
//! ```
//!
//! - **One state per call.** Every call of the turn is a `Call` whose `State` is what the
//!   steps found so far: skipped, done, a read, a local write to plan, one applied in the turn's
//!   transaction, a write outside the store to send, one in doubt, one held at its resource, one
//!   its resource found moved. Each step is one `match` on it.
//! - **A turn is a sequence** ([`crate::sequence`]): every call is previewed against the state
//!   the calls before it leave, as its card was — a write outside the store after the calls
//!   before it on its resource, the store's own writes planned and applied one after another in
//!   the turn's transaction.
//! - **Compare before anything is visible.** Two-phase writes outside the store are prepared
//!   first, with no lock of the store held while their resources answer: each compares the
//!   lines its approver was shown under its own lock and holds the change. Then the store's own
//!   writes are locked, planned and applied, uncommitted, and every shown preview is compared
//!   (`comparator::bind`). Anything moved: nothing is kept, the holds are aborted, and the run
//!   re-suspends with the current previews.
//! - **All or nothing to the last commit.** Before anything irrevocable happens the holds are
//!   asked once more whether they still hold (a lost hold is a moved call: nothing has landed).
//!   Writes on resources that take only one phase are sent next, each comparing at its resource.
//!   Then the turn's transaction commits — its **commit point**: the store's writes, their audit
//!   and journal rows, and the debt of every held change's commit, at once. After it the held
//!   changes are committed by their keys, by this attempt or, should it die, by the next, which
//!   finds the debt and does nothing else. A resource that takes one phase only cannot be taken
//!   back: a turn with more than one such write, or one such write and a commit point that fails
//!   after it, can land in part — see `docs/how-a-run-behaves.md`.
//! - **The call in doubt** — sent outside the store by an earlier attempt and never journaled —
//!   is resolved first, by asking its resource what became of its idempotency key.
//! - Reads of the turn run after its commit; they change nothing.

use tracing::Instrument;

use crate::comparator::{self, Current};
use crate::decision::Decision;
use crate::errors::HookError;
use crate::execution;
use crate::ids::{CallIndex, SuspensionSeq};
use crate::local_writer::{JournalEntry, LocalWriter};
use crate::preview::{self, CallPreview};
use crate::segment::{Segment, SegmentHooks};
use crate::sequence::{self, LocalCall};
use crate::state::{LandedCall, PendingCall, SuspendedRunState};
use crate::told::{self, no_longer_permitted_result, not_offered_at_suspend_result};
use crate::tool::{
    CallStatus, EarlierCall, Effect, ExecContext, ExternalWrite, FenceToken, OfferedTools,
    Prepared, Tool, ToolError, ToolOutput,
};

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

/// Where one call of the approved turn stands.
enum State<'a, Tx> {
    /// Will not run; the model is told why.
    Skipped(ToolOutput),
    /// Carried out — by this attempt, an earlier one, or under an earlier card of the turn —
    /// with this result. It never runs again.
    Done(ToolOutput),
    /// A read: it runs after the commit.
    Read(&'a dyn Tool),
    /// A write to the run store's own database, to be planned in the turn's sequence.
    Local(&'a dyn Tool, &'a dyn LocalWriter<Tx>),
    /// Planned and applied in the turn's transaction with this result; it lands with the
    /// commit point.
    Applied(ToolOutput),
    /// A write outside the store, still to be prepared or sent.
    Outside(&'a dyn Tool),
    /// Sent by an earlier attempt and not resolved by its key: an idempotent write, sent again
    /// under its key. Not compared (a preview now could read its own write).
    InDoubt(&'a dyn Tool),
    /// Prepared at its two-phase resource, which compared it and holds the change.
    Held(&'a dyn Tool, &'a dyn ExternalWrite),
    /// Its resource compared the shown preview at the write and found it moved: nothing of it
    /// was written, and the turn re-suspends with it marked.
    MovedAtResource(&'a dyn Tool),
}

/// One call of the approved turn: its facts and where it stands.
struct Call<'a, Tx> {
    index: CallIndex,
    call: &'a PendingCall,
    /// The preview the approver was shown for it; `None` when its tool had none.
    shown: Option<&'a CallPreview>,
    effect: Effect,
    state: State<'a, Tx>,
}

impl<'a, Tx> Call<'a, Tx> {
    /// The tool of a write outside the store still to run.
    fn outside(&self) -> Option<&'a dyn Tool> {
        match self.state {
            State::Outside(tool)
            | State::InDoubt(tool)
            | State::Held(tool, _)
            | State::MovedAtResource(tool) => Some(tool),
            _ => None,
        }
    }

    /// The resource of a write outside the store still to run, for the sequence.
    fn resource(&self) -> Option<String> {
        self.outside().and_then(sequence::resource_of)
    }

    fn two_phase(&self) -> Option<&'a dyn ExternalWrite> {
        self.outside()
            .and_then(|t| t.external())
            .filter(|ext| ext.two_phase())
    }

    /// The whole preview its approver's card was built from, for a resource to compare its own
    /// preview with, line for line: one that did not fail. A preview stored before whole
    /// previews were kept, which a bound cut, cannot be compared.
    fn comparable_preview(&self) -> Option<Vec<String>> {
        let shown = self.shown.filter(|p| !p.failed)?;
        if !shown.full.is_empty() {
            return Some(shown.full.clone());
        }
        let cut = shown.lines.len() > preview::MAX_LINES
            || shown
                .lines
                .iter()
                .any(|l| l.chars().count() >= preview::MAX_LINE_CHARS);
        (!cut).then(|| shown.lines.clone())
    }

    /// Whether its shown preview is compared again: one that did not fail (the approver
    /// decided blind otherwise), of a call still to run and not in doubt.
    fn compared(&self) -> bool {
        self.shown.is_some_and(|p| !p.failed)
            && matches!(
                self.state,
                State::Read(_)
                    | State::Local(..)
                    | State::Applied(_)
                    | State::Outside(_)
                    | State::MovedAtResource(_)
            )
    }
}

/// How the part of a turn before its commit point ended.
enum Ran {
    /// Everything compared equal and the turn passed its commit point: only the commits of
    /// its held changes are left.
    Committed,
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
    decision: &Decision,
) -> Result<Approved, HookError> {
    let record = seg.hooks.turn_record(state.suspension_seq).await?;
    let mut turn = ApprovedTurn {
        seg,
        state,
        calls: facts(seg, state, offered, decision, &record.journaled),
        commit_in_doubt: false,
    };
    if !record.owed.is_empty() {
        // The commit point was passed with these held: they are committed, nothing else.
        turn.owe(&record.owed)?;
    } else {
        match turn.up_to_commit_point().await {
            Ok(Ran::Committed) => {}
            Ok(Ran::Moved { previews, moved }) => {
                turn.abort_held().await;
                return Ok(Approved::Moved {
                    previews,
                    moved,
                    landed: turn.landed(),
                });
            }
            Err(e) => {
                // A commit point that may have been passed leaves its holds to the next attempt,
                // which finds the debt (or none, and compares again).
                if !turn.commit_in_doubt {
                    turn.abort_held().await;
                }
                return Err(e);
            }
        }
    }
    turn.commit_held().await?;
    turn.outputs().await.map(Approved::Executed)
}

/// Every call of the turn with how it runs now and what is already known of it.
fn facts<'a, H: SegmentHooks>(
    seg: Segment<'a, H>,
    state: &'a SuspendedRunState,
    offered: &'a OfferedTools,
    decision: &Decision,
    journaled: &[(CallIndex, ToolOutput)],
) -> Vec<Call<'a, H::Transaction>> {
    state
        .pending_calls
        .iter()
        .enumerate()
        .map(|(i, call)| {
            let index = CallIndex::new(i);
            let done = state.landed(index).map(|l| &l.output).or_else(|| {
                journaled
                    .iter()
                    .find(|(j, _)| *j == index)
                    .map(|(_, output)| output)
            });
            let state_now = match done {
                Some(output) => State::Done(output.clone()),
                // Denied on its own: it never runs, and the calls after it are a sequence
                // without it.
                None if !decision.approves(index) => State::Skipped(ToolOutput::error(
                    told::denied_result(&call.tool, decision.denial_of(index)),
                )),
                None => fresh_state(seg, state, offered, call),
            };
            Call {
                index,
                call,
                shown: state.preview_of(index),
                effect: seg.registry.effect_of(&call.tool),
                state: state_now,
            }
        })
        .collect()
}

/// How a call not carried out yet runs now.
fn fresh_state<'a, H: SegmentHooks>(
    seg: Segment<'a, H>,
    state: &SuspendedRunState,
    offered: &'a OfferedTools,
    call: &PendingCall,
) -> State<'a, H::Transaction> {
    if !state.offered_tools.contains(&call.tool) {
        return State::Skipped(ToolOutput::error(not_offered_at_suspend_result(&call.tool)));
    }
    let Some(tool) = offered.get(&call.tool) else {
        return State::Skipped(ToolOutput::error(no_longer_permitted_result(&call.tool)));
    };
    let tool = tool.as_ref();
    if !tool.spec().effect.is_write() {
        return State::Read(tool);
    }
    match seg.hooks.local(&call.tool) {
        Some(local) => State::Local(tool, local),
        None => State::Outside(tool),
    }
}

/// The approved turn while it runs.
struct ApprovedTurn<'a, H: SegmentHooks> {
    seg: Segment<'a, H>,
    state: &'a SuspendedRunState,
    calls: Vec<Call<'a, H::Transaction>>,
    /// The commit point's commit failed in a way that does not say whether it happened (its
    /// answer was lost): the holds are not aborted.
    commit_in_doubt: bool,
}

impl<H: SegmentHooks> ApprovedTurn<'_, H> {
    fn seq(&self) -> SuspensionSeq {
        self.state.suspension_seq
    }

    /// Everything up to and including the commit point.
    async fn up_to_commit_point(&mut self) -> Result<Ran, HookError> {
        self.resolve_in_doubt().await?;
        let mut now = self.preview_outside().await?;
        self.prepare().await?;
        let mut tx = self.seg.hooks.begin_turn(self.seq()).await?;
        match self.in_transaction(&mut tx, &mut now).await {
            Ok(None) => {}
            Ok(Some(moved)) => {
                self.seg.hooks.rollback_turn(tx).await;
                return Ok(moved);
            }
            Err(e) => {
                self.seg.hooks.rollback_turn(tx).await;
                return Err(e);
            }
        }
        if let Err(e) = self.commit_point(tx).await {
            self.commit_in_doubt = matches!(e, HookError::Unavailable { .. });
            return Err(e);
        }
        Ok(Ran::Committed)
    }

    /// The turn's sequence in its transaction, the comparison, and everything that must happen
    /// before the commit point. `Some` when a preview moved.
    async fn in_transaction(
        &mut self,
        tx: &mut H::Transaction,
        now: &mut [Option<Current>],
    ) -> Result<Option<Ran>, HookError> {
        let results = self.sequence(tx, now).await?;
        if let Some(moved) = self.compare(now).await? {
            return Ok(Some(moved));
        }
        self.applied(results)?;
        if let Some(i) = self.verify_held().await? {
            return self.moved_at(i).await.map(Some);
        }
        self.seg.hooks.applying(self.seq()).await;
        if let Some(i) = self.send().await? {
            return self.moved_at(i).await.map(Some);
        }
        Ok(None)
    }

    /// The debt of a commit point passed by an earlier attempt: every owed call is held at its
    /// resource, whatever the configuration says of its tool now.
    fn owe(&mut self, owed: &[CallIndex]) -> Result<(), HookError> {
        let registry = self.seg.registry;
        for index in owed {
            let Some(call) = self.calls.get_mut(index.get()) else {
                return Err(owed_gone(*index));
            };
            if matches!(call.state, State::Done(_)) {
                continue;
            }
            let tool = registry.get(&call.call.tool).map(|t| t.as_ref());
            let Some((tool, ext)) = tool.and_then(|t| Some((t, t.external()?))) else {
                return Err(owed_gone(*index));
            };
            call.state = State::Held(tool, ext);
        }
        Ok(())
    }

    /// Resolves the call an earlier attempt sent outside the store and never journaled, by
    /// asking its resource what became of its idempotency key.
    async fn resolve_in_doubt(&mut self) -> Result<(), HookError> {
        let seq = self.seq();
        let Some(index) = self.seg.hooks.sent_unjournaled(seq) else {
            return Ok(());
        };
        let seg = self.seg;
        let Some(call) = self.calls.get_mut(index.get()) else {
            return Ok(());
        };
        if matches!(call.state, State::Done(_)) {
            return Ok(());
        }
        let Some(tool) = seg.registry.get(&call.call.tool).map(|t| t.as_ref()) else {
            return Err(HookError::OutcomeUnknown {
                index,
                code: "tool_gone",
            });
        };
        let status = match tool.external() {
            Some(ext) => {
                let ctx = context(seg, seg.hooks.token(seq, index), None, Vec::new());
                ext.status(&ctx).await
            }
            None => Err(ToolError::failed("unsupported", "the tool cannot be asked")),
        };
        tracing::info!(call.index = %index, tool = %call.call.tool, said = said(&status), "a call sent by an earlier attempt, asked about by its key");
        match status {
            Ok(CallStatus::Answered(output)) => {
                record(seg, seq, call, &output).await?;
                call.state = State::Done(output);
            }
            Ok(CallStatus::Moved) => call.state = State::MovedAtResource(tool),
            Ok(CallStatus::Prepared) => match tool.external() {
                Some(ext) => call.state = State::Held(tool, ext),
                None => call.state = State::InDoubt(tool),
            },
            Ok(CallStatus::Unseen) => call.state = State::Outside(tool),
            Err(e) if call.effect == Effect::NonIdempotentWrite => {
                return Err(HookError::OutcomeUnknown {
                    index,
                    code: e.code(),
                })
            }
            // Sending an idempotent write again under its key is safe whatever happened.
            Err(_) => call.state = State::InDoubt(tool),
        }
        Ok(())
    }

    /// The calls before call `k` on its resource still to run.
    fn before(&self, k: usize) -> Vec<EarlierCall> {
        let resources: Vec<Option<String>> = self.calls.iter().map(Call::resource).collect();
        sequence::earlier(k, &self.state.pending_calls, &resources)
    }

    /// What the shown preview of every call outside the store reads now, after the calls
    /// before it on its resource: taken before any lock of the store is, so no local lock waits
    /// on a tool server.
    async fn preview_outside(&self) -> Result<Vec<Option<Current>>, HookError> {
        let mut now = Vec::with_capacity(self.calls.len());
        for (k, call) in self.calls.iter().enumerate() {
            let tool = match call.state {
                State::Read(tool) | State::Outside(tool) if call.compared() => tool,
                _ => {
                    now.push(None);
                    continue;
                }
            };
            now.push(Some(self.fresh(k, tool).await?));
        }
        Ok(now)
    }

    /// A preview of call `k` taken again from `tool` now, after the calls before it on its
    /// resource still to run.
    async fn fresh(&self, k: usize, tool: &dyn Tool) -> Result<Current, HookError> {
        let call = &self.calls[k];
        let before = self.before(k);
        let span = tracing::info_span!("preview", tool = %call.call.tool, call.index = %call.index, at = "resume");
        let taken =
            sequence::preview_outside(tool, self.seg.acting_user, &call.call.arguments, &before)
                .instrument(span)
                .await;
        let Some((attempt, alone)) = taken else {
            return Ok(Current::Vanished);
        };
        attempt.interruption()?;
        Ok(Current::Attempt { attempt, alone })
    }

    /// Prepares every two-phase write still to run, in call order, each after the ones before
    /// it on its resource. Stops at the first its resource found moved.
    async fn prepare(&mut self) -> Result<(), HookError> {
        let seg = self.seg;
        let seq = self.seq();
        for k in 0..self.calls.len() {
            let call = &self.calls[k];
            if !matches!(call.state, State::Outside(_) | State::InDoubt(_)) {
                continue;
            }
            let (Some(tool), Some(ext)) = (call.outside(), call.two_phase()) else {
                continue;
            };
            stop_if_lost(seg)?;
            let before = self.before(k);
            let call = &mut self.calls[k];
            let fence = seg.hooks.fence(seq, call.index, call.effect).await?;
            let ctx = context(seg, fence, call.comparable_preview(), before);
            let span = tracing::info_span!("tool_call", tool = %tool.spec().name, call.index = k, phase = "prepare");
            match ext
                .prepare(&ctx, &call.call.arguments)
                .instrument(span)
                .await
            {
                Ok(Prepared::Held) => call.state = State::Held(tool, ext),
                Ok(Prepared::Moved) | Err(ToolError::Moved) => {
                    call.state = State::MovedAtResource(tool);
                    return Ok(());
                }
                Ok(Prepared::Answered(output)) => {
                    record(seg, seq, call, &output).await?;
                    call.state = State::Done(output);
                }
                // A prepare whose answer was lost may hold something nobody can see: it is
                // aborted with the rest, and the turn is tried again.
                Err(ToolError::OutcomeUnknown { code, detail }) => {
                    call.state = State::Held(tool, ext);
                    return Err(HookError::Unavailable { code, detail });
                }
                Err(e) => settle_failure(seg, seq, call, &e).await?,
            }
        }
        Ok(())
    }

    /// Locks, plans and applies the store's own writes of the turn in its transaction, in call
    /// order: what each shown preview reads now goes to `now`; what carrying each out gave is
    /// returned, by call, to be kept once everything compared equal.
    async fn sequence(
        &mut self,
        tx: &mut H::Transaction,
        now: &mut [Option<Current>],
    ) -> Result<Vec<(usize, Result<ToolOutput, ToolError>)>, HookError> {
        let local: Vec<LocalCall<'_, H::Transaction>> = self
            .calls
            .iter()
            .filter_map(|c| match c.state {
                State::Local(_, writer) => Some(LocalCall {
                    index: c.index,
                    call: c.call,
                    writer,
                }),
                _ => None,
            })
            .collect();
        if local.is_empty() {
            return Ok(Vec::new());
        }
        let sequenced = sequence::local(tx, self.seg.acting_user, &local).await?;
        let mut results = Vec::with_capacity(local.len());
        for (call, s) in local.iter().zip(sequenced) {
            let i = call.index.get();
            if self.calls[i].compared() {
                now[i] = Some(match self.calls[i].state {
                    State::Local(tool, _) if tool.previewer().is_none() => Current::Vanished,
                    _ => Current::of(s.now),
                });
            }
            results.push((i, s.result));
        }
        Ok(results)
    }

    /// The results of the store's own writes, once everything compared equal: the tool's own
    /// failure is its result; any other failure stops the turn (the run fails with its code).
    fn applied(
        &mut self,
        results: Vec<(usize, Result<ToolOutput, ToolError>)>,
    ) -> Result<(), HookError> {
        for (i, result) in results {
            let call = &mut self.calls[i];
            let output = match result {
                Ok(output) => output,
                Err(e @ ToolError::Failed { .. }) => execution::failure_output(&call.call.tool, &e),
                // The approver decided without a preview of this call, and it cannot be
                // carried out: retrying cannot help.
                Err(e) => return Err(HookError::from_tool(&e)),
            };
            call.state = State::Applied(output);
        }
        Ok(())
    }

    /// Compares every shown preview with what it reads now. `Some` when any moved, or a
    /// resource found one moved at its write.
    async fn compare(&self, now: &mut [Option<Current>]) -> Result<Option<Ran>, HookError> {
        let mut forced = Vec::new();
        for (k, call) in self.calls.iter().enumerate() {
            if let State::MovedAtResource(tool) = call.state {
                forced.push(call.index);
                if call.compared() {
                    now[k] = Some(self.fresh(k, tool).await?);
                }
            }
            if let Some(tool) = self.changed_tool(call) {
                tracing::warn!(call.index = %call.index, tool = %tool.spec().name, "the tool is no longer what the card was made with; the turn re-suspends");
                forced.push(call.index);
            }
        }
        let current = self
            .calls
            .iter()
            .zip(now.iter_mut())
            .filter_map(|(call, now)| Some((call.shown?, now.take())));
        let (previews, mut moved) = comparator::bind(current);
        if moved.is_empty() && forced.is_empty() {
            return Ok(None);
        }
        moved.extend(forced);
        moved.sort();
        moved.dedup();
        Ok(Some(Ran::Moved { previews, moved }))
    }

    /// The tool of `call`, still to run, when it is no longer the tool the card was made with:
    /// its effect, its arguments' schema or its preview changed (and an operator accepted it).
    fn changed_tool<'c>(&self, call: &Call<'c, H::Transaction>) -> Option<&'c dyn Tool> {
        let tool = match call.state {
            State::Read(tool)
            | State::Local(tool, _)
            | State::Outside(tool)
            | State::InDoubt(tool)
            | State::MovedAtResource(tool) => tool,
            _ => return None,
        };
        let shown = self.state.identity_of(call.index)?;
        (shown != tool.identity()).then_some(tool)
    }

    /// Asks every resource holding a change of the turn whether it still holds it, before
    /// anything irrevocable happens. `Some(k)` when call `k`'s hold is gone: nothing of the
    /// turn has landed, and the turn re-suspends as moved.
    async fn verify_held(&mut self) -> Result<Option<usize>, HookError> {
        let seq = self.seq();
        for k in 0..self.calls.len() {
            let State::Held(tool, ext) = self.calls[k].state else {
                continue;
            };
            let ctx = context(
                self.seg,
                self.seg.hooks.token(seq, self.calls[k].index),
                None,
                Vec::new(),
            );
            match ext.status(&ctx).await {
                Ok(CallStatus::Prepared) => {}
                Ok(other) => {
                    tracing::warn!(call.index = k, tool = %tool.spec().name, said = said(&Ok(other)), "a held change is no longer held before the commit point; the turn re-suspends");
                    self.calls[k].state = State::MovedAtResource(tool);
                    return Ok(Some(k));
                }
                Err(e) => return Err(HookError::from_tool(&ToolError::unavailable(e.code(), e))),
            }
        }
        Ok(None)
    }

    /// Sends every one-phase write outside the store still to run, in call order, each with
    /// the lines its approver was shown, and journals each answer with its audit event.
    /// `Some(k)` when call `k`'s resource found its preview moved.
    async fn send(&mut self) -> Result<Option<usize>, HookError> {
        let seg = self.seg;
        let seq = self.seq();
        for k in 0..self.calls.len() {
            let call = &self.calls[k];
            let tool = match call.state {
                State::Outside(tool) | State::InDoubt(tool) if call.two_phase().is_none() => tool,
                _ => continue,
            };
            stop_if_lost(seg)?;
            let before = self.before(k);
            let call = &mut self.calls[k];
            let fence = seg.hooks.fence(seq, call.index, call.effect).await?;
            let ctx = context(seg, fence, call.comparable_preview(), before);
            match execution::execute(tool, &ctx, &call.call.arguments).await {
                Ok(output) => {
                    record(seg, seq, call, &output).await?;
                    call.state = State::Done(output);
                }
                Err(ToolError::Moved) => {
                    call.state = State::MovedAtResource(tool);
                    return Ok(Some(k));
                }
                Err(e) => settle_failure(seg, seq, call, &e).await?,
            }
        }
        Ok(None)
    }

    /// The commit point: the store's writes with their audit and journal rows, and the debt of
    /// every held change's commit, in one commit.
    async fn commit_point(&self, tx: H::Transaction) -> Result<(), HookError> {
        stop_if_lost(self.seg)?;
        let entries: Vec<JournalEntry<'_>> = self
            .calls
            .iter()
            .filter_map(|c| match &c.state {
                State::Applied(output) => Some(JournalEntry {
                    index: c.index,
                    tool: &c.call.tool,
                    effect: c.effect,
                    output,
                }),
                _ => None,
            })
            .collect();
        let owed: Vec<CallIndex> = self
            .calls
            .iter()
            .filter(|c| matches!(c.state, State::Held(..)))
            .map(|c| c.index)
            .collect();
        self.seg
            .hooks
            .commit_turn(tx, self.seq(), &entries, &owed)
            .await
    }

    /// Commits every held change, in call order, and journals each answer: the turn passed its
    /// commit point, so this is a debt, paid by whichever attempt gets here.
    async fn commit_held(&mut self) -> Result<(), HookError> {
        let seg = self.seg;
        let seq = self.seq();
        for call in &mut self.calls {
            let (tool, ext) = match &call.state {
                State::Applied(output) => {
                    call.state = State::Done(output.clone());
                    continue;
                }
                State::Held(tool, ext) => (*tool, *ext),
                _ => continue,
            };
            let fence = seg.hooks.fence(seq, call.index, call.effect).await?;
            let ctx = context(seg, fence, call.comparable_preview(), Vec::new());
            let span = tracing::info_span!("tool_call", tool = %tool.spec().name, call.index = %call.index, phase = "commit");
            match ext
                .commit(&ctx, &call.call.arguments)
                .instrument(span)
                .await
            {
                Ok(output) => {
                    record(seg, seq, call, &output).await?;
                    call.state = State::Done(output);
                }
                Err(e) => return Err(commit_failed(call.index, &e)),
            }
        }
        Ok(())
    }

    /// Drops what two-phase resources hold for the turn; best effort, as an abort of a key that
    /// holds nothing is one already done, and a resource expires what it held too long.
    async fn abort_held(&self) {
        for call in &self.calls {
            let (tool, ext) = match call.state {
                State::Held(tool, ext) => (tool, ext),
                _ => continue,
            };
            let token = self.seg.hooks.token(self.seq(), call.index);
            let ctx = context(self.seg, token, None, Vec::new());
            if let Err(e) = ext.abort(&ctx, &call.call.arguments).await {
                tracing::warn!(tool = %tool.spec().name, call.index = %call.index, code = e.code(), error = %e, "abort failed; the resource expires the held change");
            }
        }
    }

    /// The re-suspension after call `k`'s resource found its preview moved (or lost its hold):
    /// its current preview taken again, the others as they were shown.
    async fn moved_at(&self, k: usize) -> Result<Ran, HookError> {
        let call = &self.calls[k];
        let mut now = match call.state {
            State::MovedAtResource(tool) => Some(self.fresh(k, tool).await?),
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
        let (previews, _) = comparator::bind(current);
        Ok(Ran::Moved {
            previews,
            moved: vec![call.index],
        })
    }

    /// The writes of the turn carried out so far: they never run again.
    fn landed(&self) -> Vec<LandedCall> {
        self.calls
            .iter()
            .filter(|c| c.effect.is_write())
            .filter_map(|c| match &c.state {
                State::Done(output) => Some(LandedCall {
                    index: c.index,
                    tool: c.call.tool.clone(),
                    output: output.clone(),
                }),
                _ => None,
            })
            .collect()
    }

    /// One output per call, in call order: the reads run now, after the turn's writes.
    async fn outputs(self) -> Result<Vec<ToolOutput>, HookError> {
        let mut outputs = Vec::with_capacity(self.calls.len());
        for call in self.calls {
            let output = match call.state {
                State::Done(output) | State::Skipped(output) => output,
                State::Read(tool) => {
                    execution::read(tool, self.seg.acting_user, &call.call.arguments).await?
                }
                _ => {
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

/// What a call is given besides its arguments.
fn context<H>(
    seg: Segment<'_, H>,
    fence: FenceToken,
    shown_preview: Option<Vec<String>>,
    before: Vec<EarlierCall>,
) -> ExecContext {
    ExecContext {
        acting_user: seg.acting_user.clone(),
        fence: Some(fence),
        shown_preview,
        before,
    }
}

/// What a resource said of a key, for the log.
fn said(status: &Result<CallStatus, ToolError>) -> &'static str {
    match status {
        Ok(CallStatus::Answered(_)) => "answered",
        Ok(CallStatus::Moved) => "moved",
        Ok(CallStatus::Prepared) => "prepared",
        Ok(CallStatus::Unseen) => "unseen",
        Err(e) => e.code(),
    }
}

/// Journals the answer of a call outside the store with its audit event.
async fn record<H: SegmentHooks, Tx>(
    seg: Segment<'_, H>,
    seq: SuspensionSeq,
    call: &Call<'_, Tx>,
    output: &ToolOutput,
) -> Result<(), HookError> {
    seg.hooks
        .record(seq, call.index, call.call, call.effect, output)
        .await
}

/// What a failed call outside the store comes to: the tool's own failure is its journaled
/// result; anything else stops the segment — to be retried, or failing the run.
async fn settle_failure<H: SegmentHooks, Tx>(
    seg: Segment<'_, H>,
    seq: SuspensionSeq,
    call: &mut Call<'_, Tx>,
    e: &ToolError,
) -> Result<(), HookError> {
    match e {
        ToolError::Failed { .. } => {
            let output = execution::failure_output(&call.call.tool, e);
            record(seg, seq, call, &output).await?;
            call.state = State::Done(output);
            Ok(())
        }
        ToolError::OutcomeUnknown { code, .. } => Err(HookError::OutcomeUnknown {
            index: call.index,
            code,
        }),
        other => Err(HookError::from_tool(other)),
    }
}

/// What a commit the turn owes comes to when its resource does not carry it out: a transient
/// failure or a lost answer is tried again (the debt stays); anything else means the resource
/// dropped a change it held after the commit point — the turn landed in part, and the run fails
/// with the code for an operator to look at.
fn commit_failed(index: CallIndex, e: &ToolError) -> HookError {
    match e {
        ToolError::OutcomeUnknown { code, detail } => HookError::Unavailable {
            code,
            detail: detail.clone(),
        },
        e if e.interrupts() => HookError::from_tool(e),
        e => {
            tracing::error!(call.index = %index, code = e.code(), error = %e, "a change held for a turn past its commit point was not committed: the turn landed in part");
            HookError::Broken {
                code: e.code(),
                detail: format!("the commit of call {index} owed by the turn failed"),
            }
        }
    }
}

/// A commit the turn owes whose call or tool is not there to commit it.
fn owed_gone(index: CallIndex) -> HookError {
    tracing::error!(call.index = %index, "a commit the turn owes names a call or tool that is gone");
    HookError::Broken {
        code: "owed_tool_gone",
        detail: format!("call {index}'s owed commit cannot be sent"),
    }
}

fn stop_if_lost<H: SegmentHooks>(seg: Segment<'_, H>) -> Result<(), HookError> {
    if seg.hooks.lease_lost() {
        Err(HookError::LeaseLost)
    } else {
        Ok(())
    }
}
