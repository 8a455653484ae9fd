//! A local writer's turn, run as the approval pipeline runs it, with its contract checked: the
//! read set it names is the same once locked, the plan's preview is the one the tool's own
//! preview gives for the same state, and the write applies and reads back.
//!
//! The transaction is the caller's: for the content store, a [`FencedWrite`] of a throwaway
//! database (see `docs/writing-tools.md`). Nothing is committed here; the caller commits or
//! drops it.
//!
//! [`FencedWrite`]: https://docs.rs/countersign-store

use countersign_core::preview::{bound_lines, texts};
use countersign_core::{LocalWriter, LockSubject, Principal, ToolError, ToolOutput, ToolPreview};
use serde_json::Value;

/// What one call of a writer did in a turn, and where it broke its contract.
#[derive(Debug, Clone, PartialEq)]
pub struct WriterRun {
    /// The read set, in the global lock order.
    pub subjects: Vec<LockSubject>,
    /// The plan's preview, bounded as a card shows it.
    pub preview: Vec<String>,
    /// The write's result, read back.
    pub output: ToolOutput,
    /// Each way the writer broke the contract; empty when it kept it.
    pub problems: Vec<String>,
}

impl WriterRun {
    /// Panics with the problems unless the writer kept its contract: for a tool's own tests.
    #[track_caller]
    pub fn assert_kept(&self) {
        assert!(
            self.problems.is_empty(),
            "the writer broke its contract: {}",
            self.problems.join("; ")
        );
    }
}

/// Runs the call of `writer` with `args` as `user` in `tx` as an approved turn of one call
/// runs it — names its read set, locks it, names it again under the locks, marks a savepoint,
/// plans, and applies — and compares the plan's preview with `previewer`'s for the same state,
/// taken before the locks. A tool error is returned as the pipeline would meet it.
pub async fn plan_and_apply<Tx: Send>(
    writer: &dyn LocalWriter<Tx>,
    previewer: &dyn ToolPreview,
    tx: &mut Tx,
    user: &Principal,
    args: &Value,
) -> Result<WriterRun, ToolError> {
    let mut problems = Vec::new();
    let shown = bound_lines(&previewer.preview(user, args).await?);
    let mut subjects = writer.subjects(tx, user, args).await?;
    subjects.sort();
    writer.lock(tx, &subjects).await?;
    let mut again = writer.subjects(tx, user, args).await?;
    again.sort();
    if again != subjects {
        problems.push(format!(
            "the read set is not the same under the locks ({} row(s) before, {} after): every turn of this call would be tried again",
            subjects.len(),
            again.len()
        ));
    }
    writer.savepoint(tx).await?;
    let plan = writer.plan(tx, user, args).await?;
    let preview = bound_lines(&texts(&plan.preview()));
    if preview != shown {
        problems.push(format!(
            "the plan's preview is not the tool's preview of the same state (plan: {preview:?}; preview: {shown:?}): every approval of this call would bounce"
        ));
    }
    let output = plan.apply(tx).await?;
    if output.is_error {
        problems.push(format!("the write was refused: {}", output.content));
    }
    Ok(WriterRun {
        subjects,
        preview,
        output,
        problems,
    })
}
