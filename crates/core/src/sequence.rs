//! A turn is one sequence: each call is previewed, compared and written against the state the
//! calls before it leave — at suspension and at the re-preview of an approved resume alike, so
//! the lines of a card compose (`2 → 3`, then `3 → 4`) and the comparison checks the same
//! sequence the approver was shown.
//!
//! - **The run store's own writers** ([`crate::LocalWriter`]) run in a transaction of the store: the
//!   subjects of every call are locked in the one global order, then each call is planned — its
//!   preview taken — and applied, uncommitted, before the next is planned. At suspension the
//!   transaction is rolled back once the previews are taken; at an approved resume it is the
//!   turn's own, committed once everything compared equal.
//! - **A tool outside the store** whose [`crate::Tool::sequence`] names a resource is previewed after the
//!   calls of the turn before it on that resource that are still to run ([`crate::EarlierCall`]): through
//!   [`crate::ToolPreview::preview_after`] when it composes; otherwise as if it were alone, and its
//!   preview says so ([`crate::CallPreview::alone`]), so the card can tell the approver.
//! - Anything else — a read, a tool of no shared resource — reads nothing another call of the
//!   turn writes, and is previewed alone.

use tracing::Instrument;

use crate::errors::{HookError, PREVIEW_CONFLICT};
use crate::ids::{CallIndex, SuspensionSeq};
use crate::local_writer::{LocalWriter, LockSubject};
use crate::preview::{self, Attempt, CallPreview};
use crate::segment::{Segment, SegmentHooks};
use crate::state::PendingCall;
use crate::tool::{EarlierCall, OfferedTools, Principal, Tool, ToolError, ToolOutput};

/// One local write of the sequence: what its preview reads now, and what carrying it out in
/// the transaction gave.
#[derive(Debug)]
pub struct Sequenced {
    pub(crate) now: Attempt,
    /// Its result (a refusal included), or why it could not be planned or applied: the tool's
    /// own failure ([`ToolError::Failed`]) is its result; a persistent failure of the store
    /// stops the sequence, and every later local call is not carried out.
    pub result: Result<ToolOutput, ToolError>,
}

impl Sequenced {
    /// The bounded preview lines the call reads now, when its plan gave some.
    pub fn lines(&self) -> Option<&[String]> {
        match &self.now {
            Attempt::Lines(lines, ..) => Some(lines),
            _ => None,
        }
    }
}

/// A local write of the turn still to run.
pub struct LocalCall<'a, Tx> {
    pub index: CallIndex,
    pub call: &'a PendingCall,
    pub writer: &'a dyn LocalWriter<Tx>,
}

impl<Tx> std::fmt::Debug for LocalCall<'_, Tx> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalCall")
            .field("index", &self.index)
            .field("tool", &self.call.tool)
            .finish_non_exhaustive()
    }
}

/// Locks the read sets of `calls` — the local writes of a turn still to run, in call order — in
/// the one global order, then plans and applies each in `tx` before the next is planned. A call
/// that fails in the store is rolled back to the savepoint before it, and the calls after it are
/// planned against the state without it. A transient failure interrupts (nothing of the sequence
/// is kept: the caller rolls back); a persistent one while locking fails every call, each with
/// the failure's code.
pub async fn local<Tx: Send>(
    tx: &mut Tx,
    user: &Principal,
    calls: &[LocalCall<'_, Tx>],
) -> Result<Vec<Sequenced>, HookError> {
    if let Err(e) = lock(tx, user, calls).await {
        let HookError::Broken { code, detail } = e else {
            return Err(e);
        };
        tracing::warn!(code, detail, "the turn's read sets could not be locked");
        return Ok(calls.iter().map(|_| failed(code, &detail)).collect());
    }
    let mut out = Vec::with_capacity(calls.len());
    let mut broken: Option<&'static str> = None;
    for (k, call) in calls.iter().enumerate() {
        if let Some(code) = broken {
            // The transaction could not go back to before a failed call: nothing after it can be
            // planned.
            out.push(failed(
                code,
                "an earlier call of the turn failed in the store",
            ));
            continue;
        }
        // The last call needs no way back: nothing is planned after it.
        let last = k + 1 == calls.len();
        if !last {
            call.writer
                .savepoint(tx)
                .await
                .map_err(|e| HookError::from_tool(&e))?;
        }
        let span = tracing::info_span!("preview", tool = %call.call.tool, call.index = %call.index, at = "sequence");
        let sequenced = one(tx, user, call).instrument(span).await?;
        if let Err(e @ ToolError::Broken { .. }) = &sequenced.result {
            if last {
                // Nothing comes after it.
            } else if let Err(again) = call.writer.rollback_to_savepoint(tx).await {
                tracing::warn!(code = again.code(), error = %again, "the turn could not go back to before a failed call");
                broken = Some(e.code());
            }
        }
        out.push(sequenced);
    }
    Ok(out)
}

/// A call of the sequence that could not be carried out: a failed preview and a failed result,
/// naming only `code`.
fn failed(code: &'static str, detail: &str) -> Sequenced {
    let e = ToolError::Broken {
        code,
        detail: detail.to_owned(),
    };
    Sequenced {
        now: Attempt::failed(&e),
        result: Err(e),
    }
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

/// How often a turn takes its locks again because a read set grew while they were taken.
const LOCK_ATTEMPTS: usize = 5;

/// Locks the read sets of every call at once, in the one global order, each row in the
/// strongest mode any call needs; each run of rows of one space is locked by a writer of that
/// space. Then asks every call for its read set again, under the locks: should one have grown in
/// between (a row joined it before it was locked), the locks are let go — rolled back to a
/// savepoint taken before them — and taken again, the new rows with them, in the same order. A
/// set that keeps growing interrupts the turn, to be run again.
async fn lock<Tx: Send>(
    tx: &mut Tx,
    user: &Principal,
    calls: &[LocalCall<'_, Tx>],
) -> Result<(), HookError> {
    let Some(first) = calls.first() else {
        return Ok(());
    };
    let mut rows = Vec::new();
    for call in calls {
        rows.extend(read_set(tx, user, call).await?);
    }
    for attempt in 1..=LOCK_ATTEMPTS {
        let locked = strongest(std::mem::take(&mut rows));
        let last = attempt == LOCK_ATTEMPTS;
        if !last {
            first
                .writer
                .savepoint(tx)
                .await
                .map_err(|e| HookError::from_tool(&e))?;
        }
        for run in locked.chunk_by(|a, b| a.0.space == b.0.space) {
            let ordered: Vec<_> = run.iter().map(|(s, _)| s.clone()).collect();
            run[0]
                .1
                .lock(tx, &ordered)
                .await
                .map_err(|e| HookError::from_tool(&e))?;
        }
        let held: Vec<LockSubject> = locked.iter().map(|(s, _)| s.clone()).collect();
        let mut grown = Vec::new();
        for call in calls {
            let now = read_set(tx, user, call).await?;
            if now.iter().any(|(s, _)| !covered(&held, s)) {
                grown.extend(now);
            }
        }
        if grown.is_empty() {
            return Ok(());
        }
        if last {
            break;
        }
        tracing::info!(attempt, "a read set grew as it was locked; locking again");
        first
            .writer
            .rollback_to_savepoint(tx)
            .await
            .map_err(|e| HookError::from_tool(&e))?;
        rows = locked;
        rows.extend(grown);
    }
    Err(HookError::Unavailable {
        code: "read_set_moved",
        detail: format!("a read set kept growing as it was locked, {LOCK_ATTEMPTS} times"),
    })
}

/// The read set of one call, each row with the writer that locks it.
async fn read_set<'a, Tx: Send>(
    tx: &mut Tx,
    user: &Principal,
    call: &LocalCall<'a, Tx>,
) -> Result<Vec<(LockSubject, &'a dyn LocalWriter<Tx>)>, HookError> {
    let named = call
        .writer
        .subjects(tx, user, &call.call.arguments)
        .await
        .map_err(|e| HookError::from_tool(&e))?;
    Ok(named.into_iter().map(|s| (s, call.writer)).collect())
}

/// `rows` sorted in the global order, each row once, in the strongest mode named for it.
fn strongest<W>(mut rows: Vec<(LockSubject, W)>) -> Vec<(LockSubject, W)> {
    // Sorted by (space, rank, id, mode): of the entries of one row, the last has the strongest.
    rows.sort_by(|a, b| a.0.cmp(&b.0));
    rows.reverse();
    rows.dedup_by(|a, b| same_row(&a.0, &b.0));
    rows.reverse();
    rows
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
///
/// The store's own writes of a turn with more than one are planned and applied in a transaction
/// rolled back once the previews are taken. Should a row of their read sets be locked by someone
/// else, the suspension does not wait: they are previewed each on its own, the later ones marked
/// alone, and the approval compares them in sequence. A single local write needs no sequence: it
/// is previewed in a snapshot, taking no lock.
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
    let local_calls = local_writes(seg.hooks, pending, &tools);
    let (mut local_now, local_alone) =
        local_previews(seg, seq, pending.len(), &local_calls).await?;
    let first_local = local_calls.first().map(|c| c.index.get());
    let resources: Vec<Option<String>> = tools.iter().map(|t| t.and_then(resource_of)).collect();
    let mut previews = Vec::new();
    for (i, call) in pending.iter().enumerate() {
        let Some(tool) = tools[i].filter(|t| t.previewer().is_some()) else {
            continue;
        };
        let (attempt, alone) = match local_now[i].take() {
            Some(attempt) => (attempt, false),
            None => {
                let is_local = local_calls.iter().any(|c| c.index.get() == i);
                let before = if is_local {
                    Vec::new()
                } else {
                    earlier(i, pending, &resources)
                };
                let span = tracing::info_span!("preview", tool = %call.tool, call.index = i, at = "suspend");
                let (attempt, alone) =
                    preview_outside(tool, seg.acting_user, &call.arguments, &before)
                        .instrument(span)
                        .await
                        .unwrap_or((Attempt::Empty, false));
                (
                    attempt,
                    alone || (is_local && local_alone && first_local != Some(i)),
                )
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

/// The offered calls that are writes the store makes itself, in call order; `tools[i]` is the
/// offered tool of `pending[i]`, if any.
fn local_writes<'a, H: SegmentHooks>(
    hooks: &'a H,
    pending: &'a [PendingCall],
    tools: &[Option<&dyn Tool>],
) -> Vec<LocalCall<'a, H::Transaction>> {
    pending
        .iter()
        .zip(tools)
        .enumerate()
        .filter(|(_, (_, tool))| tool.is_some_and(|t| t.spec().effect.is_write()))
        .filter_map(|(i, (call, _))| {
            Some(LocalCall {
                index: CallIndex::new(i),
                call,
                writer: hooks.local(&call.tool)?,
            })
        })
        .collect()
}

/// The previews of the local writes of a turn about to suspend, by call position, when there
/// is more than one to sequence; and whether they are to be previewed alone instead, because a
/// row they read was locked by someone else.
async fn local_previews<H: SegmentHooks>(
    seg: Segment<'_, H>,
    seq: SuspensionSeq,
    calls: usize,
    local_calls: &[LocalCall<'_, H::Transaction>],
) -> Result<(Vec<Option<Attempt>>, bool), HookError> {
    let mut now: Vec<Option<Attempt>> = (0..calls).map(|_| None).collect();
    if local_calls.len() < 2 {
        return Ok((now, false));
    }
    let mut tx = seg.hooks.begin_preview(seq).await?;
    let sequenced = local(&mut tx, seg.acting_user, local_calls).await;
    seg.hooks.rollback_turn(tx).await;
    match sequenced {
        Ok(sequenced) => {
            for (call, s) in local_calls.iter().zip(sequenced) {
                now[call.index.get()] = Some(s.now);
            }
            Ok((now, false))
        }
        Err(HookError::Unavailable { code, detail }) if code == PREVIEW_CONFLICT.as_str() => {
            tracing::info!(
                code,
                detail,
                "a row the turn's local writes read is locked; previewed each on its own"
            );
            Ok((now, true))
        }
        Err(e) => Err(e),
    }
}
