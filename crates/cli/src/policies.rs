//! `countersign policies`: the policy files an operator keeps — listed, shown, validated — and
//! replayed against the cards people decided, so that a policy is turned on with evidence.
//!
//! A replay reads the facts the coordinator kept (sealed) of each card and the decision a person
//! made on it, evaluates the policy file over the facts, and prints the agreement table and the
//! cards it would have got wrong: an approval where people denied, a denial where they approved.
//! An `ask` is never wrong — a person decides — but it is no agreement either.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use chrono::{Duration, Utc};
use clap::Subcommand;
use countersign_coordinator::grants::GrantError;
use countersign_coordinator::Coordinator;
use countersign_policy::{CardFacts, OutcomeKind, Policy};
use countersign_store::{DecidedCard, Store};

#[derive(Debug, Subcommand)]
pub enum PoliciesCommand {
    /// Lists the policy files the coordinator loads: id, version, mode, rules.
    List {
        /// The coordinator's policy files.
        #[arg(
            long = "policy-file",
            env = "COUNTERSIGN_POLICY_FILES",
            value_delimiter = ','
        )]
        files: Vec<PathBuf>,
    },
    /// Shows one loaded policy: its header, its rules, and what it made of cards lately.
    Show {
        id: String,
        #[arg(
            long = "policy-file",
            env = "COUNTERSIGN_POLICY_FILES",
            value_delimiter = ','
        )]
        files: Vec<PathBuf>,
    },
    /// Validates FILE against the schema countersign ships; names the line it finds wrong.
    Validate { file: PathBuf },
    /// Evaluates FILE over the cards people decided since `--since` (e.g. 30d, 12h) and prints
    /// how often it agrees with them, and the cards it would have got wrong.
    Replay {
        file: PathBuf,
        #[arg(long, default_value = "30d", value_parser = parse_since)]
        since: Duration,
    },
    /// A standing grant from card SEQ of RUN: approve the same tool on the same subject by the
    /// run's agent, for HOURS. Given with the approval of the card (`decide --approve`), by a
    /// person who may approve the agent's runs; never for a call that removes anything or whose
    /// data class is above editor_content.
    Grant {
        run_id: countersign_core::RunId,
        #[arg(long, value_name = "N")]
        seq: i32,
        #[arg(long = "as", value_name = "APPROVER")]
        approver: String,
        #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(i32).range(1..=i64::from(countersign_coordinator::grants::MAX_GRANT_HOURS)))]
        hours: i32,
    },
    /// Revokes a standing grant.
    Revoke {
        grant_id: uuid::Uuid,
        #[arg(long = "as", value_name = "WHO")]
        by: String,
    },
    /// Lists the standing grants, active or not.
    Grants,
}

/// What a person made of a card, as the replay's columns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum People {
    Approved,
    Denied,
    /// Decided call by call, or edited.
    Other,
}

impl People {
    const ALL: [People; 3] = [People::Approved, People::Denied, People::Other];

    fn of(card: &DecidedCard) -> People {
        match (card.kind.as_str(), card.approved) {
            ("turn", true) => People::Approved,
            ("turn", false) => People::Denied,
            _ => People::Other,
        }
    }

    fn heading(self) -> &'static str {
        match self {
            People::Approved => "people approved",
            People::Denied => "people denied",
            People::Other => "people decided otherwise",
        }
    }
}

const OUTCOMES: [OutcomeKind; 3] = [OutcomeKind::Approve, OutcomeKind::Deny, OutcomeKind::Ask];

/// Runs a `policies` subcommand.
pub async fn run(
    database_url: &str,
    keys: &countersign_service::KeySettings,
    tools: &countersign_service::ToolSettings,
    command: PoliciesCommand,
) -> anyhow::Result<()> {
    match command {
        PoliciesCommand::Grant {
            run_id,
            seq,
            approver,
            hours,
        } => {
            let (store, registry, users) = crate::card_reader(database_url, keys, tools).await?;
            let coordinator = Coordinator::with_users(store, Arc::new(registry), users);
            grant(&coordinator, run_id, seq, &approver, hours).await
        }
        PoliciesCommand::Revoke { grant_id, by } => revoke(database_url, grant_id, &by).await,
        PoliciesCommand::Grants => list_grants(database_url).await,
        PoliciesCommand::List { files } => list(&files),
        PoliciesCommand::Show { id, files } => show(database_url, &id, &files).await,
        PoliciesCommand::Validate { file } => validate(&file),
        PoliciesCommand::Replay { file, since } => {
            replay_file(database_url, keys, &file, since).await
        }
    }
}

/// `revoke`: takes the active grant `grant_id` back, `by` whom.
async fn revoke(database_url: &str, grant_id: uuid::Uuid, by: &str) -> anyhow::Result<()> {
    let store = crate::ops::store_without_keys(crate::connect(database_url).await?);
    if store.revoke_grant(grant_id, by).await? {
        say!("grant {grant_id} revoked by {by}");
        Ok(())
    } else {
        anyhow::bail!("no active grant {grant_id}")
    }
}

/// `grants`: every standing grant, one line each, with whether it is active.
async fn list_grants(database_url: &str) -> anyhow::Result<()> {
    let store = crate::ops::store_without_keys(crate::connect(database_url).await?);
    for g in store.grants().await? {
        say_columns!(
            g.id,
            g.agent,
            g.tool,
            format!("by {}", g.granted_by),
            format!("until {}", g.expires_at.format("%Y-%m-%d %H:%M UTC")),
            match (g.active, &g.revoked_by) {
                (true, _) => "active".to_owned(),
                (false, Some(by)) => format!("revoked by {by}"),
                (false, None) => "expired".to_owned(),
            }
        );
    }
    Ok(())
}

/// `list`: each policy file the coordinator loads, one line each.
fn list(files: &[PathBuf]) -> anyhow::Result<()> {
    for file in files {
        let policy = load(file)?;
        say_columns!(
            policy.id,
            format!("v{}", policy.version),
            policy.mode.as_str(),
            format!("{} rule(s)", policy.rules()),
            file.display()
        );
    }
    Ok(())
}

/// `validate`: loads `file` against the schema, and says what it holds.
fn validate(file: &Path) -> anyhow::Result<()> {
    let policy = load(file)?;
    say!(
        "valid: policy {} v{} ({}), {} rule(s)",
        policy.id,
        policy.version,
        policy.mode.as_str(),
        policy.rules()
    );
    Ok(())
}

/// `replay`: the policy in `file` over the cards decided `since` ago, opened with the keyring.
async fn replay_file(
    database_url: &str,
    keys: &countersign_service::KeySettings,
    file: &Path,
    since: Duration,
) -> anyhow::Result<()> {
    let policy = load(file)?;
    let pool = crate::connect(database_url).await?;
    let keyring = keys
        .keyring()
        .context("loading the keyring to open the cards")?;
    let store = Store::new(pool, std::sync::Arc::new(keyring));
    replay(&store, &policy, since).await
}

fn load(file: &Path) -> anyhow::Result<Policy> {
    countersign_policy::read(file).map_err(|e| anyhow::anyhow!("{e} ({})", e.code()))
}

async fn show(database_url: &str, id: &str, files: &[PathBuf]) -> anyhow::Result<()> {
    let mut found = None;
    for file in files {
        let policy = load(file)?;
        if policy.id == id {
            found = Some(policy);
        }
    }
    let policy = found.with_context(|| format!("no loaded policy is called {id}"))?;
    say!(
        "policy {} v{} ({}), {} rule(s); decides as {}",
        policy.id,
        policy.version,
        policy.mode.as_str(),
        policy.rules(),
        policy.principal()
    );
    for line in policy.source.lines() {
        say!("  {line}");
    }
    let pool = crate::connect(database_url).await?;
    let counts: Vec<(String, String, i64)> = sqlx::query_as(
        "SELECT mode, outcome, count(*) FROM policy_evaluations
         WHERE policy_id = $1 AND evaluated_at > now() - interval '30 days'
         GROUP BY mode, outcome ORDER BY mode, outcome",
    )
    .bind(id)
    .fetch_all(&pool)
    .await?;
    say!("cards evaluated in the last 30 days:");
    for (mode, outcome, n) in counts {
        say!("  {mode}\t{outcome}\t{n}");
    }
    Ok(())
}

async fn replay(store: &Store, policy: &Policy, since: Duration) -> anyhow::Result<()> {
    let from = Utc::now() - since;
    let cards = store.decided_cards(from).await?;
    let mut table = [[0usize; 3]; 3];
    let mut wrong = Vec::new();
    let mut replayed = 0;
    for card in &cards {
        let Ok(facts) = serde_json::from_slice::<CardFacts>(&card.facts) else {
            continue;
        };
        let would = policy.evaluate(&facts).outcome.kind();
        let people = People::of(card);
        let (row, column) = (index(&OUTCOMES, would), index(&People::ALL, people));
        table[row][column] += 1;
        replayed += 1;
        let miss = matches!(
            (would, people),
            (OutcomeKind::Approve, People::Denied) | (OutcomeKind::Deny, People::Approved)
        );
        if miss {
            wrong.push((card, would, people));
        }
    }
    say!(
        "replay of policy {} v{} over {replayed} card(s) people decided since {}",
        policy.id,
        policy.version,
        from.format("%Y-%m-%d %H:%M UTC")
    );
    say_columns!(
        "",
        People::Approved.heading(),
        People::Denied.heading(),
        People::Other.heading()
    );
    for (row, outcome) in OUTCOMES.iter().enumerate() {
        let [a, d, o] = table[row];
        say_columns!(format!("would {}", outcome.as_str()), a, d, o);
    }
    let agreed = table[0][0] + table[1][1];
    say!(
        "agreement: {agreed} of {replayed}; would have got wrong: {}",
        wrong.len()
    );
    for (card, would, people) in wrong {
        say!(
            "  run {} card {}: would {}, {} ({})",
            card.run_id,
            card.suspension_seq,
            would.as_str(),
            people.heading(),
            card.approver
        );
    }
    Ok(())
}

fn index<T: PartialEq>(all: &[T], item: T) -> usize {
    all.iter().position(|x| *x == item).unwrap_or(0)
}

/// `30d`, `12h`, `90m`: a span back from now.
fn parse_since(s: &str) -> Result<Duration, String> {
    let (n, unit) = s.split_at(s.len().saturating_sub(1));
    let n: i64 = n.parse().map_err(|_| format!("not a span like 30d: {s}"))?;
    match unit {
        "d" => Ok(Duration::days(n)),
        "h" => Ok(Duration::hours(n)),
        "m" => Ok(Duration::minutes(n)),
        _ => Err(format!("not a span like 30d, 12h or 90m: {s}")),
    }
}

/// Gives the standing grants of card `seq` of `run_id` ([`Coordinator::grant_from_card`]) and
/// says each.
async fn grant(
    coordinator: &Coordinator,
    run_id: countersign_core::RunId,
    seq: i32,
    approver: &str,
    hours: i32,
) -> anyhow::Result<()> {
    let seq = countersign_core::SuspensionSeq::from_i32(seq)
        .map_err(|_| anyhow::anyhow!("--seq: not a suspension number"))?;
    let given = match coordinator
        .grant_from_card(run_id, seq, approver, hours)
        .await
    {
        Ok(given) => given,
        Err(GrantError::NotFound) => {
            anyhow::bail!("no run {run_id} whose agent {approver} may approve (access_denied)")
        }
        Err(e) => anyhow::bail!("no grant given: {e} ({})", e.code()),
    };
    for g in given {
        say!(
            "grant {} (policy {}): {} may call {} on {} for {hours} hour(s), approved without asking",
            g.id,
            g.policy,
            g.agent,
            g.tool,
            g.subjects.join(", ")
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_span_reads_in_days_hours_or_minutes() {
        assert_eq!(parse_since("30d"), Ok(Duration::days(30)));
        assert_eq!(parse_since("12h"), Ok(Duration::hours(12)));
        assert!(parse_since("30").is_err());
        assert!(parse_since("d").is_err());
    }
}
