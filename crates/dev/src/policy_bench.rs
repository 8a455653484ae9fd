//! The bench's policy part: the approval cycle with a policy approving every card (request →
//! suspension → policy approval → re-preview → write), beside the people's cycles, and the time
//! one policy of 100 rules takes to evaluate one card.
//!
//! The cycles run through the same coordinator, worker and policy loop the services run; the
//! evaluation time is measured on its own, over a card like the bench's, because inside the
//! cycle it is lost in the database's round trips.

use std::sync::Arc;
use std::time::{Duration, Instant};

use countersign_coordinator::{policies, Coordinator};
use countersign_policy::{Arg, CallFacts, CardFacts, Outcome, Policy, PolicySource, PreviewFacts};
use tokio::sync::Notify;
use tokio::task::JoinSet;

use crate::bench::Driver;

/// Cards in flight in the auto-approved phase.
const IN_FLIGHT: usize = 16;
/// Evaluations timed for the percentiles.
const EVALUATIONS: usize = 5_000;
/// How often the bench's policy loop looks for new cards.
const POLL: Duration = Duration::from_millis(10);

/// Approves the bench's cards: a description change of at most 160 characters.
const APPROVING: &str = r#"// policy: bench-descriptions
// version: 1
permit (
  principal == Agent::"bench-agent",
  action == Action::"approve",
  resource == Tool::"update_page_metadata"
) when {
  context.call.preview.changed_fields == ["description"] &&
  context.call.preview.max_after_chars <= 160 &&
  !context.call.preview.removes
};
"#;

/// Cycles the auto-approved phase runs for a bench of `cycles` per phase.
pub(crate) fn cycles(cycles: usize) -> usize {
    cycles.max(IN_FLIGHT * 2)
}

/// Runs the auto-approved phase on the bench's services and prints its figures, then the
/// evaluation time of a policy of 100 rules. The policy file stays until the services stop
/// ([`remove_policy_file`]): the loop reads it on every pass.
pub(crate) async fn auto_approved(
    services: &mut JoinSet<()>,
    coordinator: Coordinator,
    driver: &mut Driver<'_>,
    stop: &Arc<Notify>,
    per_phase: usize,
) -> anyhow::Result<()> {
    let file = policy_file();
    std::fs::write(&file, APPROVING)?;
    let source = PolicySource::open(std::slice::from_ref(&file))
        .map_err(|e| anyhow::anyhow!("the bench policy: {e}"))?;
    let stopped = stop.clone();
    services.spawn(policies::run(coordinator, source, POLL, async move {
        stopped.notified().await
    }));
    let n = cycles(per_phase);
    driver.auto = true;
    let started = Instant::now();
    let done = driver.closed_loop(n, IN_FLIGHT).await;
    driver.auto = false;
    let done = done?;
    let elapsed = started.elapsed();
    println!(
        "policy    auto-approved cycles (request → suspend → policy approval → re-preview → write), {IN_FLIGHT} in flight: \
         {} cycles in {:.2} s, {:.1} cycles/s (policy loop polling every {} ms)",
        done.len(),
        elapsed.as_secs_f64(),
        done.len() as f64 / elapsed.as_secs_f64(),
        POLL.as_millis()
    );
    evaluation_time()
}

/// Prints the evaluation time per card of a policy of 100 rules (99 that do not match the
/// card, then the one that approves it).
pub(crate) fn evaluation_time() -> anyhow::Result<()> {
    let policy = Policy::load(&hundred_rules()).map_err(|e| anyhow::anyhow!("{e}"))?;
    let facts = card();
    anyhow::ensure!(
        policy.evaluate(&facts).outcome == Outcome::Approve,
        "the bench policy does not approve the bench card"
    );
    let mut times: Vec<Duration> = (0..EVALUATIONS)
        .map(|_| policy.evaluate(&facts).elapsed)
        .collect();
    times.sort();
    let at = |p: usize| times[(times.len() * p / 100).min(times.len() - 1)];
    println!(
        "policy    evaluation of one card by a policy of {} rules, {EVALUATIONS} times: p50 {:.1} µs, p99 {:.1} µs, max {:.1} µs",
        policy.rules(),
        at(50).as_secs_f64() * 1e6,
        at(99).as_secs_f64() * 1e6,
        times[times.len() - 1].as_secs_f64() * 1e6,
    );
    Ok(())
}

/// 99 rules about other agents, tools and fields, then the bench's.
fn hundred_rules() -> String {
    let mut source = String::from("// policy: hundred\n// version: 1\n");
    for i in 0..99 {
        source.push_str(&other_rule(i));
    }
    source.push_str(
        APPROVING
            .split_once("// version: 1\n")
            .map_or("", |(_, r)| r),
    );
    source
}

/// A rule for agent, tool and field number `i`, none of them the bench's.
fn other_rule(i: u32) -> String {
    let scope = format!("permit (principal == Agent::\"agent-{i}\", action == Action::\"approve\", resource == Tool::\"tool-{i}\")");
    let condition = format!("context.call.preview.changed_fields.contains(\"field-{i}\") && context.call.preview.max_after_chars <= {i}");
    format!("{scope}\nwhen {{ {condition} }};\n")
}

/// A card like the bench's: one description change on one page.
fn card() -> CardFacts {
    let lines = vec![
        "Page [1000] \"Bench page 1\" — 1 field(s):".to_owned(),
        "description: \"Untouched.\" → \"Bench cycle wrote page 1000.\"".to_owned(),
    ];
    CardFacts {
        agent: "bench-agent".into(),
        acting_user: "editor".into(),
        request_kind: "run_request".into(),
        writes_in_turn: 1,
        writes_by_agent_last_hour: 0,
        tokens_used: 0,
        calls: vec![CallFacts {
            index: 0,
            tool: "update_page_metadata".into(),
            effect: "idempotent_write".into(),
            group: "editing".into(),
            data_class: "editor_content".into(),
            args: vec![Arg {
                name: "uid".into(),
                text: "1000".into(),
            }],
            arg_names: vec!["uid".into(), "description".into()],
            subject_ids: vec!["uid:1000".into()],
            preview: PreviewFacts {
                shown: true,
                text: lines.join("\n"),
                line_count: 2,
                lines,
                changed_fields: vec!["description".into()],
                changes: 1,
                max_before_chars: 10,
                max_after_chars: 28,
                max_delta_chars: 18,
                ..PreviewFacts::default()
            },
        }],
    }
}

fn policy_file() -> std::path::PathBuf {
    std::env::temp_dir().join(format!("countersign-bench-{}.cedar", std::process::id()))
}

/// Removes the bench's policy file, once the services stopped.
pub(crate) fn remove_policy_file() {
    let _ = std::fs::remove_file(policy_file());
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_hundred_rule_policy_loads_and_approves_the_bench_card() {
        super::evaluation_time().expect("loads and approves");
    }
}
