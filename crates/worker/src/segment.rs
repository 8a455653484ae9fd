//! One segment: claim won → load → tool loop → settle, every write guarded by the lease.

use std::sync::Arc;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use chrono::{SecondsFormat, Utc};
use countersign_core::agent_loop;
use countersign_core::{
    AgentConfig, Decision, Interruption, Outcome, Segment, SegmentHooks, TerminationReason,
};
use countersign_core::{
    CallIndex, DataClasses, LocalWriters, Model, ModelError, ModelRequest, ModelResponse,
    SuspendedRunState, TokenUsage, ToolRegistry, UserDirectory,
};
use countersign_model::ModelCatalog;
use countersign_service::tools::Tools;
use countersign_store::{
    Claim, DecisionOutcome, FencedWrite, Lease, RunCounters, SegmentKind, Settlement, Store,
    StoreError, StoredAgent,
};
use serde_json::Value;
use tracing::Instrument;

use crate::heartbeat::Heartbeat;
use crate::hooks::StoreHooks;
use crate::settler::Settler;

/// How a segment ended, for the caller's metrics (the `end` label its name) and logs.
#[derive(Debug, Clone, PartialEq, Eq, strum::IntoStaticStr, strum::VariantNames)]
#[strum(serialize_all = "snake_case")]
#[non_exhaustive]
pub enum SegmentEnd {
    Completed(TerminationReason),
    Failed(TerminationReason),
    /// Suspended for approval; `moved` counts the calls whose preview moved.
    Suspended {
        suspension_seq: u32,
        moved: usize,
    },
    /// Stopped without settling (lease lost, store unreachable); the reaper takes it from here.
    Interrupted(Interruption),
    /// Handed back to the queue at shutdown, its retry budget untouched.
    Released,
}

/// Why a resume segment cannot start: its run fails.
enum Unresumable {
    /// A sealed value of the run does not open (`state_unreadable`).
    Unreadable(StoreError),
    /// With this reason and code.
    Fail(TerminationReason, &'static str),
}

/// The reason and the code a run fails with.
type Failure = (TerminationReason, &'static str);

/// How often a segment interrupted by the store is run again before it is left to the reaper.
const SEGMENT_RETRIES: usize = 3;

/// Everything a worker needs to run segments.
#[derive(Debug, Clone)]
pub struct SegmentRunner {
    pub store: Store,
    pub registry: Arc<ToolRegistry>,
    /// The registry's writers whose writes land in `store`'s database.
    pub local: Arc<LocalWriters<FencedWrite>>,
    pub models: Models,
    pub users: Arc<dyn UserDirectory>,
    pub lease_ttl: Duration,
    /// The worker's one heartbeat for every lease its segments hold.
    pub heartbeat: Heartbeat,
    /// The worker's settlements: those that come together are written together.
    pub settler: Settler,
}

/// Where a segment's model comes from.
#[derive(Debug, Clone)]
pub enum Models {
    /// One model for every agent (tests, the demo, the bench).
    Fixed(Arc<dyn Model>),
    /// The provider each agent configuration's `model` settings name.
    PerAgent(Arc<ModelCatalog>),
}

impl Models {
    /// The agent's model and the data classes it may be sent, or the stable code of why its
    /// settings name none.
    fn for_agent(&self, settings: &Value) -> Result<(Arc<dyn Model>, DataClasses), &'static str> {
        match self {
            Models::Fixed(model) => Ok((model.clone(), DataClasses::all())),
            Models::PerAgent(catalog) => catalog
                .model_for(settings)
                .and_then(|model| Ok((model, catalog.data_classes(settings)?)))
                .map_err(|e| {
                    tracing::warn!(code = e.code(), error = %e, "the agent's model settings name no usable model");
                    e.code()
                }),
        }
    }
}

impl SegmentRunner {
    /// A runner over the deployment's tools and users (`countersign_service::tools`), as the
    /// worker binary assembles it, with a heartbeat and a settler of its own.
    pub fn new(store: Store, tools: Tools, models: Models, lease_ttl: Duration) -> SegmentRunner {
        SegmentRunner {
            store,
            registry: Arc::new(tools.registry),
            local: Arc::new(tools.local),
            models,
            users: tools.users,
            lease_ttl,
            heartbeat: Heartbeat::default(),
            settler: Settler::default(),
        }
    }

    /// Runs the segment of a won claim to its end.
    pub async fn run(&self, claim: &Claim) -> Result<SegmentEnd, StoreError> {
        self.run_until(claim, std::future::pending()).await
    }

    /// Runs the segment of a won claim to its end, or until `release` resolves (the process is
    /// shutting down): then the segment is dropped where it stands — a turn transaction in
    /// flight rolls back — and the run handed back to the queue without spending its retry
    /// budget, which counts crashes only.
    ///
    /// A lost lease drops the segment at once too, in-flight model call or preview included:
    /// its next owner must not race a zombie. A segment interrupted by the store (a lost
    /// connection, a deadlock) is run again from its stored state a few times with a backoff
    /// while the lease is held; the journal makes that safe.
    pub async fn run_until(
        &self,
        claim: &Claim,
        release: impl std::future::Future<Output = ()>,
    ) -> Result<SegmentEnd, StoreError> {
        let hooks = StoreHooks::new(
            self.store.clone(),
            self.local.clone(),
            claim.lease.clone(),
            self.lease_ttl,
        )
        .decided(
            claim
                .inputs
                .decision
                .as_ref()
                .and_then(|d| d.decided_secs_ago),
        )
        .sent(claim.suspension_seq, claim.sent_call);
        let _held = self.heartbeat.hold(&self.store, &hooks, self.lease_ttl);
        // Every log line of the segment, the tools' included, carries the run id.
        let span = tracing::info_span!("segment", run.id = %claim.lease.run_id, epoch = %claim.lease.epoch);
        let mut backoff = ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(200))
            .with_max_delay(Duration::from_secs(2))
            .with_max_times(SEGMENT_RETRIES)
            .build();
        tokio::pin!(release);
        let end = loop {
            // A shutdown already under way wins: the segment is not started only to be dropped
            // mid-statement.
            let end = tokio::select! {
                biased;
                () = &mut release => break self.release(&claim.lease).await,
                () = hooks.lost() => {
                    // Told by the heartbeat (or a fence) while it ran: dropped where it stood.
                    metrics::counter!("countersign_leases_lost_total").increment(1);
                    Ok(SegmentEnd::Interrupted(Interruption::LeaseLost))
                }
                end = self.drive(claim, &hooks).instrument(span.clone()) => end,
            };
            match end {
                Ok(SegmentEnd::Interrupted(Interruption::Unavailable(code)))
                    if !hooks.lease_lost() =>
                {
                    match backoff.next() {
                        Some(pause) => {
                            tracing::info!(run.id = %claim.lease.run_id, code, ?pause, "segment interrupted; running it again");
                            tokio::time::sleep(pause).await;
                        }
                        None => break end,
                    }
                }
                end => break end,
            }
        };
        end
    }

    /// Hands the run back to the queue at shutdown; the poll or the reaper's lost-dispatch
    /// scan wakes the next worker.
    async fn release(&self, lease: &Lease) -> Result<SegmentEnd, StoreError> {
        let handed_back = self.store.requeue_segment(lease, Duration::ZERO).await?;
        tracing::info!(run.id = %lease.run_id, handed_back, "segment released at shutdown");
        Ok(if handed_back {
            SegmentEnd::Released
        } else {
            SegmentEnd::Interrupted(Interruption::LeaseLost)
        })
    }

    async fn drive(&self, claim: &Claim, hooks: &StoreHooks) -> Result<SegmentEnd, StoreError> {
        let lease = &claim.lease;
        let run_id = lease.run_id;
        let inputs = &claim.inputs;
        let (agent, model) = match self.agent_and_model(inputs.agent.as_ref()) {
            Ok(found) => found,
            Err((reason, code)) => return self.fail(lease, reason, code).await,
        };
        let acting_user = match self.users.principal(&claim.acting_user).await {
            Ok(Some(user)) => user,
            Ok(None) => {
                return self
                    .fail(lease, TerminationReason::NotRetryable, "acting_user_gone")
                    .await
            }
            Err(e) => {
                tracing::warn!(run.id = %run_id, code = e.code(), error = %e, "user directory failed");
                return Ok(SegmentEnd::Interrupted(Interruption::Unavailable(e.code())));
            }
        };
        let captured_at = Utc::now().to_rfc3339_opts(SecondsFormat::Secs, true);
        let seg = Segment {
            model: model.as_ref(),
            registry: &self.registry,
            agent: &agent,
            acting_user: &acting_user,
            hooks,
            captured_at: &captured_at,
        };

        let outcome = match claim.segment {
            SegmentKind::Start => {
                let opened = match &inputs.request {
                    Some(sealed) => self.store.open_request(run_id, sealed),
                    None => Err(StoreError::unreadable("runs.request")),
                };
                match opened {
                    Ok(request) => {
                        agent_loop::start(seg, &request.prompt, request.inputs.as_ref()).await
                    }
                    Err(e) => return self.unreadable(lease, &e).await,
                }
            }
            SegmentKind::Resume => match self.resume_inputs(claim) {
                Ok((state, decision)) => agent_loop::resume(seg, state, &decision).await,
                Err(Unresumable::Unreadable(e)) => return self.unreadable(lease, &e).await,
                Err(Unresumable::Fail(reason, code)) => {
                    return self.fail(lease, reason, code).await
                }
            },
        };
        self.settle(lease, outcome).await
    }

    /// The loop's configuration of the claimed run's `agent` and the model it runs on; the
    /// reason and code to fail the run with when the agent is gone or inactive, or its model
    /// cannot be made.
    fn agent_and_model(
        &self,
        agent: Option<&StoredAgent>,
    ) -> Result<(AgentConfig, Arc<dyn Model>), Failure> {
        match agent {
            Some(stored) if stored.config.active => {
                match self.models.for_agent(&stored.config.model) {
                    Ok((model, data_classes)) => Ok((
                        loop_config(&stored.config, data_classes),
                        observed(model, &stored.config.model),
                    )),
                    Err(code) => Err((TerminationReason::ProviderFailed, code)),
                }
            }
            _ => Err((
                TerminationReason::NotRetryable,
                DecisionOutcome::ConfigurationGone.as_str(),
            )),
        }
    }

    /// What a resume continues from: the suspended state of the card the claim resumes, and
    /// the decision on it. A sealed value that does not open fails the run: no retry can
    /// open it.
    fn resume_inputs(&self, claim: &Claim) -> Result<(SuspendedRunState, Decision), Unresumable> {
        let run_id = claim.lease.run_id;
        let unreadable = TerminationReason::StateUnreadable;
        let seq = claim
            .suspension_seq
            .ok_or(Unresumable::Fail(unreadable, unreadable.as_str()))?;
        let state = match &claim.inputs.state {
            Some(sealed) => self.store.open_state(run_id, sealed),
            None => Err(StoreError::NoState(run_id)),
        }
        .map_err(Unresumable::Unreadable)?;
        let state = match SuspendedRunState::from_bytes(&state) {
            Ok(state) if state.suspension_seq == seq => state,
            Ok(_) => return Err(Unresumable::Fail(unreadable, unreadable.as_str())),
            Err(e) => {
                tracing::error!(run.id = %run_id, error = %e, "suspended state unreadable");
                return Err(Unresumable::Fail(unreadable, e.code()));
            }
        };
        let Some(sealed) = &claim.inputs.decision else {
            let missing = Unresumable::Fail(TerminationReason::NotRetryable, "decision_missing");
            return Err(missing);
        };
        let decision = self
            .store
            .open_decision(run_id, sealed)
            .map_err(Unresumable::Unreadable)?;
        Ok((state, decision))
    }

    async fn settle(&self, lease: &Lease, outcome: Outcome) -> Result<SegmentEnd, StoreError> {
        let run_id = lease.run_id;
        match outcome {
            Outcome::Completed {
                reason,
                transcript,
                iterations,
                tokens,
            } => {
                let counters = counters(iterations, tokens);
                let answer = transcript
                    .last()
                    .map(|m| m.content.clone())
                    .unwrap_or_default();
                // `run.completed` (the answer sealed into its audit row) commits with the settle.
                let settlement = Settlement::completed(reason, counters).with_answer(answer);
                if !self.settler.settle(&self.store, lease, &settlement).await? {
                    return Ok(SegmentEnd::Interrupted(Interruption::LeaseLost));
                }
                tracing::info!(run.id = %run_id, reason = reason.as_str(), "run completed");
                metrics::counter!("countersign_runs_total", "status" => "completed", "reason" => reason.as_str()).increment(1);
                Ok(SegmentEnd::Completed(reason))
            }
            Outcome::Failed {
                reason,
                code,
                iterations,
                tokens,
            } => {
                let settlement =
                    Settlement::failed(reason, Some(code), Some(counters(iterations, tokens)));
                if !self.settler.settle(&self.store, lease, &settlement).await? {
                    return Ok(SegmentEnd::Interrupted(Interruption::LeaseLost));
                }
                failed(run_id, reason, code);
                Ok(SegmentEnd::Failed(reason))
            }
            Outcome::Suspended { state, moved } => self.suspend(lease, &state, &moved).await,
            Outcome::Interrupted(cause) => {
                if cause == Interruption::LeaseLost {
                    metrics::counter!("countersign_leases_lost_total").increment(1);
                }
                tracing::warn!(run.id = %run_id, code = cause.code(), "segment interrupted; nothing settled");
                Ok(SegmentEnd::Interrupted(cause))
            }
        }
    }

    /// Stores the suspension of the run for approval; `moved` are the calls whose preview
    /// moved, when it follows a refused binding.
    async fn suspend(
        &self,
        lease: &Lease,
        state: &SuspendedRunState,
        moved: &[(CallIndex, String)],
    ) -> Result<SegmentEnd, StoreError> {
        let run_id = lease.run_id;
        // `run.preview_moved` (when the binding refused the approved turn) and
        // `run.suspended` commit with the suspension, or the run fails `suspend_failed`.
        let moved_tools: Vec<&str> = moved.iter().map(|(_, t)| t.as_str()).collect();
        match self.store.suspend(lease, state, &moved_tools).await {
            Ok(true) => {}
            Ok(false) => return Ok(SegmentEnd::Interrupted(Interruption::LeaseLost)),
            Err(e) => {
                tracing::error!(run.id = %run_id, code = e.code(), error = %e, "suspend failed");
                return self
                    .fail(lease, TerminationReason::SuspendFailed, e.code())
                    .await;
            }
        }
        let seq = state.suspension_seq.get();
        metrics::counter!("countersign_suspensions_total").increment(1);
        for p in state.call_previews.iter().filter(|p| p.failed) {
            metrics::counter!("countersign_preview_failures_total", "tool" => p.tool.clone())
                .increment(1);
        }
        for (_, tool) in moved {
            metrics::counter!("countersign_preview_moves_total", "tool" => tool.clone())
                .increment(1);
        }
        tracing::info!(run.id = %run_id, suspension_seq = seq, moved = moved.len(), "run suspended for approval");
        Ok(SegmentEnd::Suspended {
            suspension_seq: seq,
            moved: moved.len(),
        })
    }

    async fn unreadable(&self, lease: &Lease, e: &StoreError) -> Result<SegmentEnd, StoreError> {
        tracing::error!(run.id = %lease.run_id, error = %e, "sealed run data unreadable");
        self.fail_as(lease, TerminationReason::StateUnreadable)
            .await
    }

    /// Fails the run with `reason`, which is its error code too.
    async fn fail_as(
        &self,
        lease: &Lease,
        reason: TerminationReason,
    ) -> Result<SegmentEnd, StoreError> {
        self.fail(lease, reason, reason.as_str()).await
    }

    async fn fail(
        &self,
        lease: &Lease,
        reason: TerminationReason,
        code: &'static str,
    ) -> Result<SegmentEnd, StoreError> {
        let settlement = Settlement::failed(reason, Some(code), None);
        if !self.settler.settle(&self.store, lease, &settlement).await? {
            return Ok(SegmentEnd::Interrupted(Interruption::LeaseLost));
        }
        failed(lease.run_id, reason, code);
        Ok(SegmentEnd::Failed(reason))
    }
}

/// Logs and counts a failed run; its `run.failed` event committed with the settle.
fn failed(run_id: countersign_core::RunId, reason: TerminationReason, code: &str) {
    tracing::warn!(run.id = %run_id, reason = reason.as_str(), code, "run failed");
    metrics::counter!("countersign_runs_total", "status" => "failed", "reason" => reason.as_str())
        .increment(1);
}

/// The run's counters as the row stores them.
fn counters(iterations: u32, tokens: TokenUsage) -> RunCounters {
    RunCounters {
        iterations,
        prompt_tokens: tokens.prompt,
        completion_tokens: tokens.completion,
    }
}

/// The loop's view of a stored agent configuration. Provider settings may carry a
/// `system_prompt` and the model `options` passed to every call.
fn loop_config(agent: &countersign_store::AgentConfig, data_classes: DataClasses) -> AgentConfig {
    AgentConfig {
        name: agent.name.clone(),
        system_prompt: agent
            .model
            .get("system_prompt")
            .and_then(|v| v.as_str())
            .map(str::to_owned),
        policy: agent.policy.clone(),
        max_iterations: agent.max_iterations,
        max_tool_calls_per_turn: agent.max_tool_calls_per_turn,
        model_options: agent
            .model
            .get("options")
            .and_then(|v| v.as_object())
            .cloned()
            .unwrap_or_default(),
        data_classes,
    }
}

/// `model` with every call traced as a `model_call` span and timed into
/// `countersign_model_call_duration_seconds{provider, outcome}` (retries inside the provider
/// included: the latency the loop waits).
fn observed(model: Arc<dyn Model>, settings: &Value) -> Arc<dyn Model> {
    let provider = match settings.get("provider").and_then(Value::as_str) {
        Some("scripted") => "scripted",
        Some("openai") => "openai",
        _ => "other",
    };
    Arc::new(Observed {
        inner: model,
        provider,
    })
}

/// The `provider` label values of `countersign_model_call_duration_seconds`, as `observed`
/// names them.
pub(crate) const PROVIDER_LABELS: [&str; 3] = ["scripted", "openai", "other"];

#[derive(Debug)]
struct Observed {
    inner: Arc<dyn Model>,
    provider: &'static str,
}

#[async_trait::async_trait]
impl Model for Observed {
    async fn complete(&self, request: ModelRequest<'_>) -> Result<ModelResponse, ModelError> {
        let span = tracing::info_span!(
            "model_call",
            provider = self.provider,
            messages = request.messages.len(),
            tools = request.tools.len()
        );
        let started = std::time::Instant::now();
        let answer = self.inner.complete(request).instrument(span).await;
        let outcome = answer.as_ref().map_or_else(ModelError::code, |_| "ok");
        metrics::histogram!(
            "countersign_model_call_duration_seconds",
            "provider" => self.provider,
            "outcome" => outcome
        )
        .record(started.elapsed().as_secs_f64());
        answer
    }
}
