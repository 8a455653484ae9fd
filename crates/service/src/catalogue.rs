//! Every metric family the countersign binaries serve, described once: its name, its kind, its
//! `# HELP` text and the binaries that serve it. [`crate::install_metrics`] hands the
//! descriptions to the recorder, so every family on `/metrics` has its HELP line; the code that
//! knows the event still records it (and registers its series at zero when it starts, for the
//! label values it knows), and the standard `process_*` families come from `metrics-process`.
//!
//! `tests/e2e/observability` reads `/metrics` of each binary as it starts and checks it against
//! [`FAMILIES`]: every family listed for the binary is there before anything happened, and
//! nothing else is.

/// A binary that serves `/metrics`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Binary {
    Coordinator,
    Worker,
    /// Only when it loops (`--every`) with `--http-addr`.
    Reaper,
    Api,
}

impl Binary {
    pub const ALL: [Binary; 4] = [
        Binary::Coordinator,
        Binary::Worker,
        Binary::Reaper,
        Binary::Api,
    ];

    /// The binary's file name.
    pub fn name(self) -> &'static str {
        match self {
            Binary::Coordinator => "countersign-coordinator",
            Binary::Worker => "countersign-worker",
            Binary::Reaper => "countersign-reaper",
            Binary::Api => "countersign-api",
        }
    }
}

/// How a family is rendered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// One metric family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Family {
    pub name: &'static str,
    pub kind: Kind,
    pub help: &'static str,
    pub served_by: &'static [Binary],
}

use Binary::{Api, Coordinator, Reaper, Worker};
use Kind::{Counter, Gauge, Histogram};

const fn family(
    name: &'static str,
    kind: Kind,
    served_by: &'static [Binary],
    help: &'static str,
) -> Family {
    Family {
        name,
        kind,
        help,
        served_by,
    }
}

/// The families, by the binaries that serve them.
#[rustfmt::skip]
pub const FAMILIES: &[Family] = &[
    family("countersign_build_info", Gauge, &Binary::ALL,
        "The version running, as its label; always 1."),
    // The gates, by whichever door a message came through.
    family("countersign_run_requests_total", Counter, &[Coordinator, Api],
        "Run requests gated, by outcome code."),
    family("countersign_decisions_total", Counter, &[Coordinator, Api],
        "Decisions gated, by outcome code."),
    family("countersign_policy_decisions_total", Counter, &[Coordinator],
        "Cards evaluated by a policy, by policy, outcome (approve, deny, ask) and mode (enforce, shadow)."),
    family("countersign_policy_load_refused_total", Counter, &[Coordinator],
        "Policy files that changed and no longer load (their last good version stays), by code."),
    family("countersign_policy_evaluation_seconds", Histogram, &[Coordinator],
        "Time one policy took to evaluate one card."),
    family("countersign_approval_wait_seconds", Histogram, &[Coordinator, Api],
        "Run suspended to the decision that released it accepted (database clock)."),
    family("countersign_queue_wait_seconds", Histogram, &[Coordinator, Worker],
        "Message published to consumed, by queue."),
    // The coordinator's view of the backlog, sampled every 15 s.
    family("countersign_runs_waiting_for_approval", Gauge, &[Coordinator],
        "Runs waiting for an approval."),
    family("countersign_oldest_approval_wait_seconds", Gauge, &[Coordinator],
        "How long the run waiting longest for an approval has waited."),
    family("countersign_approvals_expiring_soon", Gauge, &[Coordinator],
        "Waiting runs whose approval deadline falls within the hour."),
    family("countersign_expired_leases", Gauge, &[Coordinator],
        "Running runs whose lease expired and that no reaper has handled yet."),
    family("countersign_dead_letter_messages", Gauge, &[Coordinator],
        "Messages in the dead-letter queue."),
    family("countersign_queue_messages", Gauge, &[Coordinator],
        "Messages ready in a work queue (run-requests, decisions, segments), not yet delivered."),
    // Webhook deliveries, made by the coordinator.
    family("countersign_webhook_deliveries_total", Counter, &[Coordinator],
        "Webhook delivery attempts, by outcome (delivered, retried, failed)."),
    family("countersign_webhook_backlog_age_seconds", Gauge, &[Coordinator],
        "Age of the oldest webhook delivery not yet delivered or failed."),
    // The tools every binary that builds a registry holds to what an operator accepted.
    family("countersign_tools_withheld", Gauge, &[Coordinator, Worker, Api],
        "Tools withheld from every run because their server lists them otherwise than an operator accepted them."),
    // The worker's segments.
    family("countersign_segment_duration_seconds", Histogram, &[Worker],
        "A segment, claim to end, by segment kind and how it ended."),
    family("countersign_model_call_duration_seconds", Histogram, &[Worker],
        "One model call as the loop waits for it (the provider's retries included), by provider and outcome."),
    family("countersign_decision_to_write_seconds", Histogram, &[Worker],
        "Approval accepted to the approved turn's writes journaled under the fence (database clock)."),
    family("countersign_runs_total", Counter, &[Worker],
        "Runs a worker ended, by status and termination reason."),
    family("countersign_suspensions_total", Counter, &[Worker],
        "Runs suspended for approval."),
    family("countersign_preview_failures_total", Counter, &[Worker],
        "Previews that failed at a suspension, by tool."),
    family("countersign_preview_moves_total", Counter, &[Worker],
        "Previews that moved between the card and the approval, by tool."),
    family("countersign_leases_lost_total", Counter, &[Worker],
        "Segments that found their lease gone and stopped without settling."),
    family("countersign_expired_lease_claims_total", Counter, &[Worker],
        "Claims of a segment whose previous lease expired and was requeued by the reaper: one per rescued lease expiry."),
    family("countersign_leases_held", Gauge, &[Worker],
        "Leases the worker held at its last heartbeat."),
    family("countersign_heartbeat_statements_total", Counter, &[Worker],
        "Lease renewal statements (one a beat, however many leases it holds)."),
    family("countersign_claim_statements_total", Counter, &[Worker],
        "Statements that claimed wake-ups (those arriving together share one)."),
    family("countersign_settle_statements_total", Counter, &[Worker],
        "Statements that settled segments (those ending together share one)."),
    // The reaper, when it loops.
    family("countersign_reaper_actions_total", Counter, &[Reaper],
        "What the reaper's passes did, by action."),
    family("countersign_reaper_pass_duration_seconds", Histogram, &[Reaper],
        "One reaper pass, start to end (it waits on no row another transaction holds)."),
    // Every service's PostgreSQL pool.
    family("countersign_db_connections_discarded_total", Counter, &Binary::ALL,
        "Pooled PostgreSQL connections closed instead of handed out, by reason (in_transaction, aborted_transaction, unanswered, broken)."),
    // The HTTP API.
    family("countersign_http_requests_total", Counter, &[Api],
        "HTTP requests answered, by method, route template and status code."),
    family("countersign_http_request_duration_seconds", Histogram, &[Api],
        "HTTP request received to response headers sent, by method and route template."),
];

/// The families `binary` serves.
pub fn served_by(binary: Binary) -> impl Iterator<Item = &'static Family> {
    FAMILIES
        .iter()
        .filter(move |f| f.served_by.contains(&binary))
}

/// Hands every family's description to the installed recorder.
pub(crate) fn describe() {
    for f in FAMILIES {
        match f.kind {
            Kind::Counter => metrics::describe_counter!(f.name, f.help),
            Kind::Gauge => metrics::describe_gauge!(f.name, f.help),
            Kind::Histogram => metrics::describe_histogram!(f.name, f.help),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_is_named_once_by_the_conventions_of_its_kind_and_served_somewhere() {
        let mut names = std::collections::BTreeSet::new();
        for f in FAMILIES {
            assert!(names.insert(f.name), "{} listed twice", f.name);
            assert!(f.name.starts_with("countersign_"), "{}", f.name);
            assert!(!f.help.is_empty() && f.help.ends_with('.'), "{}", f.name);
            assert!(!f.served_by.is_empty(), "{}", f.name);
            assert_eq!(
                f.kind == Kind::Counter,
                f.name.ends_with("_total"),
                "{}: only counters end in _total",
                f.name
            );
        }
        for binary in Binary::ALL {
            assert!(served_by(binary).any(|f| f.name == "countersign_build_info"));
        }
    }
}
