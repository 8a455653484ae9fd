//! Running one pending call: a read, or a write outside the turn's transaction. A tool's own
//! failure becomes its result, naming only its code; a transient one stops the segment.

use serde_json::Value;
use tracing::Instrument;

use crate::errors::HookError;
use crate::preview;
use crate::tool::{ExecContext, Principal, Tool, ToolError, ToolOutput};

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
