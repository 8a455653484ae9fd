//! The write side of the protocol: execute, the two-phase write (version 2), and asking a server
//! what became of an idempotency key.
//!
//! A write whose answer did not come back — a timeout, a connection broken after the request
//! went out, a 5xx, an answer that is not the protocol's — may have landed. It is never a
//! result: the client asks the server about the call's key (`GET /calls/{key}`), with a
//! backoff, until it has an answer or the budget ([`crate::Limits::resolve_budget`]) is spent.
//! Only an answer becomes the call's result. A key the server has never seen is sent again
//! under the same key. A server that cannot say (it does not serve `/calls`, or stays out of
//! reach) leaves the call in doubt: an idempotent write is then retried by the segment under its
//! key, a non-idempotent one is [`ToolError::OutcomeUnknown`] and fails the run.

use std::time::{Duration, Instant};

use async_trait::async_trait;
use countersign_core::{
    CallStatus, Effect, ExecContext, ExternalWrite, Prepared, ToolError, ToolOutput,
};
use hyper::Method;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::{principal_json, CallError, RemoteTool};

/// How many times one call is sent, the first time included, while its server says it has
/// never seen the key.
const MAX_SENDS: usize = 3;

/// The answer to an execute or a commit.
#[derive(Debug, Deserialize)]
struct Answer {
    content: String,
    is_error: bool,
    /// The server compared `shown_preview` with its own preview at the write, found it moved,
    /// and wrote nothing.
    #[serde(default)]
    moved: bool,
}

impl Answer {
    fn into_result(self) -> Result<ToolOutput, ToolError> {
        if self.moved {
            return Err(ToolError::Moved);
        }
        Ok(ToolOutput {
            content: self.content,
            is_error: self.is_error,
        })
    }
}

/// What a server says of a key, a prepare answered, or a call whose answer was lost.
#[derive(Debug, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
enum Status {
    Answered {
        content: String,
        is_error: bool,
    },
    Moved,
    Prepared,
    Unseen,
    /// A prepare only: another turn holds what the change depends on, and nothing was held.
    Busy,
}

impl From<Status> for CallStatus {
    fn from(s: Status) -> CallStatus {
        match s {
            Status::Answered { content, is_error } => {
                CallStatus::Answered(ToolOutput { content, is_error })
            }
            Status::Moved => CallStatus::Moved,
            Status::Prepared => CallStatus::Prepared,
            // Nothing is held under the key: as far as the key goes, it was never seen.
            Status::Unseen | Status::Busy => CallStatus::Unseen,
        }
    }
}

/// How a failed request leaves the call.
pub(crate) enum Failure {
    /// It cannot have been carried out, and what failed may pass: retry the segment.
    Retry(ToolError),
    /// It may have landed: ask the server about the key.
    InDoubt(CallError),
    /// A final failure: the lease was fenced out, or the tool's own.
    Final(ToolError),
}

impl RemoteTool {
    /// The body of an execute or a prepare.
    fn write_body(&self, ctx: &ExecContext, args: &Value) -> Result<Value, ToolError> {
        let (key, epoch) = match &ctx.fence {
            Some(fence) => (
                Value::from(fence.idempotency_key()),
                Value::from(fence.lease_epoch.get()),
            ),
            // A write is always fenced by the segment; a read has nothing to deduplicate.
            None if self.spec.effect.is_write() => {
                return Err(ToolError::failed(
                    "unfenced_write",
                    "a remote write was called without a fence",
                ))
            }
            None => (Value::Null, Value::Null),
        };
        Ok(json!({
            "acting_user": principal_json(&ctx.acting_user),
            "arguments": args,
            "idempotency_key": key,
            "fence_epoch": epoch,
            "shown_preview": ctx.shown_preview,
            "before": ctx.before,
        }))
    }

    /// How `e` leaves a call of this tool.
    pub(crate) fn failure(&self, e: CallError) -> Failure {
        tracing::warn!(tool = %self.spec.name, server = %self.server.name, code = e.code(), error = %e, "remote call failed");
        match e {
            CallError::Fenced => Failure::Final(ToolError::FenceLost),
            e if !e.may_have_arrived() => Failure::Retry(ToolError::unavailable(e.code(), e)),
            e if self.spec.effect.is_write() && e.may_have_landed() => Failure::InDoubt(e),
            e if e.is_transient() => Failure::Retry(ToolError::unavailable(e.code(), e)),
            e => Failure::Final(ToolError::failed(e.code(), e)),
        }
    }

    /// What a call stays when its server cannot say what became of it: an idempotent write is
    /// sent again by the retried segment under its key; any other may have landed.
    fn undecided(&self, e: &CallError) -> ToolError {
        if self.spec.effect == Effect::NonIdempotentWrite {
            ToolError::outcome_unknown(e.code(), e)
        } else {
            ToolError::unavailable(e.code(), e)
        }
    }

    /// Executes the call; a lost answer is resolved by the call's key.
    pub(crate) async fn execute_call(
        &self,
        ctx: &ExecContext,
        args: &Value,
    ) -> Result<ToolOutput, ToolError> {
        let body = self.write_body(ctx, args)?;
        let path = format!("{}/execute", self.path);
        let timeout = self.server.limits.execute_timeout;
        let mut sends = 0;
        loop {
            sends += 1;
            let e = match self.server.post::<Answer>(&path, &body, timeout).await {
                Ok(answer) => return answer.into_result(),
                Err(e) => e,
            };
            let lost = match self.failure(e) {
                Failure::Retry(e) | Failure::Final(e) => return Err(e),
                Failure::InDoubt(lost) => lost,
            };
            match self.resolve(ctx).await {
                Ok(CallStatus::Answered(output)) => return Ok(output),
                Ok(CallStatus::Moved) => return Err(ToolError::Moved),
                Ok(CallStatus::Unseen) if sends < MAX_SENDS => continue,
                Ok(_) | Err(_) => return Err(self.undecided(&lost)),
            }
        }
    }

    /// `GET /calls/{key}` until the server answers or the budget is spent: what became of the
    /// call under `ctx`'s key. A server that does not serve it (404) answers at once.
    async fn resolve(&self, ctx: &ExecContext) -> Result<CallStatus, CallError> {
        let Some(fence) = &ctx.fence else {
            return Err(CallError::NotFound);
        };
        let path = format!("/calls/{}", fence.idempotency_key());
        let started = Instant::now();
        let mut pause = Duration::from_millis(200);
        loop {
            let asked = self
                .server
                .exchange(
                    Method::GET,
                    &path,
                    None,
                    self.server.limits.preview_timeout,
                    self.server.limits.max_response_bytes,
                )
                .await
                .and_then(|body| {
                    serde_json::from_slice::<Status>(&body)
                        .map_err(|e| CallError::Malformed(e.to_string()))
                });
            match asked {
                Ok(status) => return Ok(status.into()),
                Err(e)
                    if e.is_transient()
                        && started.elapsed() < self.server.limits.resolve_budget =>
                {
                    tracing::info!(tool = %self.spec.name, server = %self.server.name, code = e.code(), ?pause, "asking the tool server about a call again");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(5));
                }
                Err(e) => {
                    tracing::warn!(tool = %self.spec.name, server = %self.server.name, code = e.code(), error = %e, "the tool server cannot say what became of a call");
                    return Err(e);
                }
            }
        }
    }

    /// One POST of the two-phase write, its lost answer resolved by the call's key.
    async fn phase<T: for<'de> Deserialize<'de>>(
        &self,
        ctx: &ExecContext,
        phase: &str,
        body: &Value,
    ) -> Result<Result<T, CallStatus>, ToolError> {
        let path = format!("{}/{phase}", self.path);
        let timeout = self.server.limits.execute_timeout;
        match self.server.post::<T>(&path, body, timeout).await {
            Ok(answer) => Ok(Ok(answer)),
            Err(e) => match self.failure(e) {
                Failure::Retry(e) | Failure::Final(e) => Err(e),
                Failure::InDoubt(lost) => match self.resolve(ctx).await {
                    Ok(status) => Ok(Err(status)),
                    Err(_) => Err(ToolError::outcome_unknown(lost.code(), lost)),
                },
            },
        }
    }

    fn key_body(ctx: &ExecContext) -> Value {
        let fence = ctx.fence.as_ref();
        json!({
            "idempotency_key": fence.map(|f| f.idempotency_key()),
            "fence_epoch": fence.map(|f| f.lease_epoch.get()),
        })
    }
}

#[async_trait]
impl ExternalWrite for RemoteTool {
    fn two_phase(&self) -> bool {
        self.server.two_phase
    }

    async fn prepare(&self, ctx: &ExecContext, args: &Value) -> Result<Prepared, ToolError> {
        let mut body = self.write_body(ctx, args)?;
        body["hold_secs"] = Value::from(self.server.limits.hold.as_secs());
        for _ in 0..MAX_SENDS {
            let status = match self.phase::<Status>(ctx, "prepare", &body).await? {
                // Another turn holds what the change depends on: the turn lets go of what it
                // holds and is tried again, so no two turns wait for each other's holds.
                Ok(Status::Busy) => {
                    return Err(ToolError::unavailable(
                        "remote_busy",
                        "another turn holds what the change depends on",
                    ))
                }
                Ok(answer) => CallStatus::from(answer),
                Err(resolved) => resolved,
            };
            return Ok(match status {
                CallStatus::Prepared => Prepared::Held,
                CallStatus::Moved => Prepared::Moved,
                CallStatus::Answered(output) => Prepared::Answered(output),
                CallStatus::Unseen => continue,
            });
        }
        Err(ToolError::unavailable(
            CallError::Unreachable.code(),
            "the prepare never reached the tool server",
        ))
    }

    async fn commit(&self, ctx: &ExecContext, _args: &Value) -> Result<ToolOutput, ToolError> {
        let body = Self::key_body(ctx);
        for _ in 0..MAX_SENDS {
            match self.phase::<Answer>(ctx, "commit", &body).await? {
                Ok(answer) => return answer.into_result(),
                Err(CallStatus::Answered(output)) => return Ok(output),
                Err(CallStatus::Prepared) => continue,
                Err(CallStatus::Moved | CallStatus::Unseen) => {
                    return Err(ToolError::failed(
                        "prepared_change_gone",
                        "the tool server no longer holds the prepared change",
                    ))
                }
            }
        }
        Err(ToolError::outcome_unknown(
            CallError::Unreachable.code(),
            "the commit was never confirmed",
        ))
    }

    async fn abort(&self, ctx: &ExecContext, _args: &Value) -> Result<(), ToolError> {
        let path = format!("{}/abort", self.path);
        self.server
            .post::<Value>(
                &path,
                &Self::key_body(ctx),
                self.server.limits.execute_timeout,
            )
            .await
            .map(|_| ())
            .map_err(|e| ToolError::failed(e.code(), e))
    }

    async fn status(&self, ctx: &ExecContext) -> Result<CallStatus, ToolError> {
        self.resolve(ctx).await.map_err(|e| match e {
            CallError::NotFound => {
                ToolError::failed("unsupported", "the tool server does not serve /calls")
            }
            e => ToolError::failed(e.code(), e),
        })
    }
}
