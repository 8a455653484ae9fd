//! A turn is one sequence: each call is previewed, compared and written against the state the
//! calls before it leave — at suspension and at the re-preview of an approved resume alike, so
//! the lines of a card compose (`2 → 3`, then `3 → 4`) and the comparison checks the same
//! sequence the approver was shown.
//!
//! - **The run store's own writers** ([`LocalWriter`]) run in a transaction of the store: the
//!   subjects of every call are locked in the one global order, then each call is planned — its
//!   preview taken — and applied, uncommitted, before the next is planned. At suspension the
//!   transaction is rolled back once the previews are taken; at an approved resume it is the
//!   turn's own, committed once everything compared equal.
//! - **A tool outside the store** whose [`Tool::sequence`] names a resource is previewed after the
//!   calls of the turn before it on that resource that are still to run ([`EarlierCall`]): through
//!   [`ToolPreview::preview_after`] when it composes; otherwise as if it were alone, and its
//!   preview says so ([`CallPreview::alone`]), so the card can tell the approver.
//! - Anything else — a read, a tool of no shared resource — reads nothing another call of the
//!   turn writes, and is previewed alone.

use tracing::Instrument;

use crate::agent_loop::{HookError, Segment, SegmentHooks};
use crate::ids::{CallIndex, SuspensionSeq};
use crate::preview::{self, Attempt, CallPreview};
use crate::state::PendingCall;
use crate::tool::{EarlierCall, OfferedTools, Principal, Tool, ToolError, ToolOutput};
use crate::turn::{LocalWriter, LockSubject};

/// One local write of the sequence: what its preview reads now, and what carrying it out in
/// the transaction gave.
pub(crate) struct Sequenced {
    pub now: Attempt,
    /// Its result (a refusal included), or why it could not be planned or applied: the tool's
    /// own failure ([`ToolError::Failed`]) is its result; a persistent failure of the store
    /// stops the sequence, and every later local call is not carried out.
    pub result: Result<ToolOutput, ToolError>,
}

/// A local write of the turn still to run.
pub(crate) struct LocalCall<'a, Tx> {
    pub index: CallIndex,
    pub call: &'a PendingCall,
    pub writer: &'a dyn LocalWriter<Tx>,
}

/// Locks the subjects of `calls` — the local writes of a turn still to run, in call order — in
/// the one global order, then plans and applies each in `tx` before the next is planned. A
/// transient failure interrupts (nothing of the sequence is kept: the caller rolls back).
pub(crate) async fn local<Tx: Send>(
    tx: &mut Tx,
    user: &Principal,
    calls: &[LocalCall<'_, Tx>],
) -> Result<Vec<Sequenced>, HookError> {
    lock(tx, user, calls).await?;
    let mut out = Vec::with_capacity(calls.len());
    let mut broken: Option<&'static str> = None;
    for call in calls {
        if let Some(code) = broken {
            // A statement that failed ended the transaction: nothing after it can be planned.
            let e = ToolError::Broken {
                code,
                detail: "an earlier call of the turn failed in the store".into(),
            };
            out.push(Sequenced {
                now: Attempt::failed(&e),
                result: Err(e),
            });
            continue;
        }
        let span = tracing::info_span!("preview", tool = %call.call.tool, call.index = %call.index, at = "sequence");
        let sequenced = one(tx, user, call).instrument(span).await?;
        if let Err(e @ ToolError::Broken { .. }) = &sequenced.result {
            broken = Some(e.code());
        }
        out.push(sequenced);
    }
    Ok(out)
}

/// Plans one local call in the sequence and, when it has a plan, applies it.
async fn one<Tx: Send>(
    tx: &mut Tx,
    user: &Principal,
    call: &LocalCall<'_, Tx>,
) -> Result<Sequenced, HookError> {
    let plan = match call.writer.plan(tx, user, &call.call.arguments).await {
        Ok(plan) => plan,
        Err(e) if e.interrupts() => return Err(HookError::from_tool(&e)),
        Err(e) => {
            return Ok(Sequenced {
                now: Attempt::failed(&e),
                result: Err(e),
            })
        }
    };
    let now = Attempt::of_lines(plan.preview());
    let result = match plan.apply(tx).await {
        Err(e) if e.interrupts() => return Err(HookError::from_tool(&e)),
        result => result,
    };
    Ok(Sequenced { now, result })
}

/// Locks the read sets of every call at once, in the one global order, each row in the
/// strongest mode any call needs; each run of rows of one space is locked by a writer of that
/// space. Then asks every call for its read set again, under the locks: one that grew in between
/// (a row joined it before it was locked) interrupts the turn, to be run again.
async fn lock<Tx: Send>(
    tx: &mut Tx,
    user: &Principal,
    calls: &[LocalCall<'_, Tx>],
) -> Result<(), HookError> {
    let mut rows = Vec::new();
    for call in calls {
        let named = call
            .writer
            .subjects(tx, user, &call.call.arguments)
            .await
            .map_err(|e| HookError::from_tool(&e))?;
        rows.extend(named.into_iter().map(|s| (s, call.writer)));
    }
    // Sorted by (space, rank, id, mode): of the entries of one row, the last has the strongest.
    rows.sort_by(|a, b| a.0.cmp(&b.0));
    rows.reverse();
    rows.dedup_by(|a, b| same_row(&a.0, &b.0));
    rows.reverse();
    for run in rows.chunk_by(|a, b| a.0.space == b.0.space) {
        let ordered: Vec<_> = run.iter().map(|(s, _)| s.clone()).collect();
        run[0]
            .1
            .lock(tx, &ordered)
            .await
            .map_err(|e| HookError::from_tool(&e))?;
    }
    let locked: Vec<LockSubject> = rows.into_iter().map(|(s, _)| s).collect();
    for call in calls {
        let named = call
            .writer
            .subjects(tx, user, &call.call.arguments)
            .await
            .map_err(|e| HookError::from_tool(&e))?;
        if let Some(missing) = named.iter().find(|s| !covered(&locked, s)) {
            return Err(HookError::Unavailable {
                code: "read_set_moved",
                detail: format!(
                    "call {} reads {missing:?}, which joined its read set as it was locked",
                    call.index
                ),
            });
        }
    }
    Ok(())
}

fn same_row(a: &LockSubject, b: &LockSubject) -> bool {
    (a.space, a.rank, a.id) == (b.space, b.rank, b.id)
}

/// Whether `row` is locked in `locked` (sorted) in its mode or a stronger one.
fn covered(locked: &[LockSubject], row: &LockSubject) -> bool {
    locked
        .binary_search_by(|l| (l.space, l.rank, l.id).cmp(&(row.space, row.rank, row.id)))
        .is_ok_and(|i| locked[i].mode >= row.mode)
}

/// The calls before position `k` on the resource of call `k`, in order: `resources[j]` is the
/// resource of call `j` when it is a write still to run, `None` otherwise.
pub(crate) fn earlier(
    k: usize,
    calls: &[PendingCall],
    resources: &[Option<String>],
) -> Vec<EarlierCall> {
    let Some(Some(resource)) = resources.get(k) else {
        return Vec::new();
    };
    (0..k)
        .filter(|&j| resources[j].as_deref() == Some(resource.as_str()))
        .map(|j| EarlierCall {
            tool: calls[j].tool.clone(),
            arguments: calls[j].arguments.clone(),
        })
        .collect()
}

/// The resource of a write to `tool`, when its calls share one with other tools' calls.
pub(crate) fn resource_of(tool: &dyn Tool) -> Option<String> {
    tool.spec()
        .effect
        .is_write()
        .then(|| tool.sequence().map(|s| s.resource))
        .flatten()
}

/// A preview of a call to `tool` outside the store taken now, after `before` (the calls of the
/// turn before it on its resource still to run): the attempt, and whether it was taken alone
/// although calls came before it. `None` when the tool has no preview.
pub(crate) async fn preview_outside(
    tool: &dyn Tool,
    user: &Principal,
    args: &serde_json::Value,
    before: &[EarlierCall],
) -> Option<(Attempt, bool)> {
    let previewer = tool.previewer()?;
    let composes = tool.sequence().is_some_and(|s| s.composes);
    Some(if before.is_empty() {
        (preview::attempt(previewer, user, args).await, false)
    } else if composes {
        let attempt = preview::attempt_after(previewer, user, args, before).await;
        (attempt, false)
    } else {
        (preview::attempt(previewer, user, args).await, true)
    })
}

/// The previews of a turn about to suspend, in call order: one for every offered call whose
/// tool previews, each against the state the calls before it leave.
pub(crate) async fn previews<H: SegmentHooks>(
    seg: Segment<'_, H>,
    pending: &[PendingCall],
    offered: &OfferedTools,
    seq: SuspensionSeq,
) -> Result<Vec<CallPreview>, HookError> {
    let tools: Vec<Option<&dyn Tool>> = pending
        .iter()
        .map(|c| offered.get(&c.tool).map(|t| t.as_ref()))
        .collect();
    let local_calls: Vec<LocalCall<'_, H::Turn>> = pending
        .iter()
        .zip(&tools)
        .enumerate()
        .filter(|(_, (_, tool))| tool.is_some_and(|t| t.spec().effect.is_write()))
        .filter_map(|(i, (call, _))| {
            Some(LocalCall {
                index: CallIndex::new(i),
                call,
                writer: seg.hooks.local(&call.tool)?,
            })
        })
        .collect();
    let mut local_now: Vec<Option<Attempt>> = pending.iter().map(|_| None).collect();
    if !local_calls.is_empty() {
        let mut tx = seg.hooks.begin_turn(seq).await?;
        let sequenced = local(&mut tx, seg.acting_user, &local_calls).await;
        seg.hooks.rollback_turn(tx).await;
        for (call, s) in local_calls.iter().zip(sequenced?) {
            local_now[call.index.get()] = Some(s.now);
        }
    }
    let resources: Vec<Option<String>> = tools.iter().map(|t| t.and_then(resource_of)).collect();
    let mut previews = Vec::new();
    for (i, call) in pending.iter().enumerate() {
        let Some(tool) = tools[i].filter(|t| t.previewer().is_some()) else {
            continue;
        };
        let (attempt, alone) = match local_now[i].take() {
            Some(attempt) => (attempt, false),
            None => {
                let before = earlier(i, pending, &resources);
                let span = tracing::info_span!("preview", tool = %call.tool, call.index = i, at = "suspend");
                preview_outside(tool, seg.acting_user, &call.arguments, &before)
                    .instrument(span)
                    .await
                    .unwrap_or((Attempt::Empty, false))
            }
        };
        // A lost connection says nothing about the call: the approver must not be shown a
        // failed preview for it.
        attempt.interruption()?;
        let mut preview = preview::at_suspend(CallIndex::new(i), &call.tool, attempt);
        preview.alone = alone && !preview.failed;
        previews.push(preview);
    }
    Ok(previews)
}
