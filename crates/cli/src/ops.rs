//! Operator commands: agent configurations, producer grants, the demo site, and the
//! submit / inbox / decide round trip through the real queues.
//!
//! `submit` and `decide` are queue producers like any other: they publish the public
//! messages as the AMQP user of their connection (which the broker validates), and wait for
//! the coordinator's reply on a private queue.
//!
//! A decision names the card its approver was shown — the suspension number and turn digest
//! `inbox` and `show` print with it, or the card file they `--save` — and never the run's
//! current ones: a card that changed since it was shown must come back `stale_turn`, not be
//! approved unseen.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use countersign_coordinator::{producers, ProducerKind};
use countersign_core::card::{build_card, ApprovalCard};
use countersign_core::{
    Approves, ArgumentsEdit, CallIndex, CallVerdict, DecisionMessage, EventName, Principal, RunId,
    RunRequest, SuspendedRunState, SuspensionSeq, ToolPolicy, ToolRegistry, TurnDigest,
    UserDirectory,
};
use countersign_crypto::Keyring;
use countersign_queue::{Broker, MessageProperties, QueueConfig, Topology};
use countersign_store::{AgentConfig, DecisionOutcome, RunStatus, Store, TableUsers};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sqlx::PgPool;
use uuid::Uuid;

use crate::render;
use crate::UsersCommand;

/// An agent configuration file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AgentFile {
    name: String,
    #[serde(default = "yes")]
    active: bool,
    #[serde(default)]
    model: Value,
    #[serde(default)]
    policy: ToolPolicy,
    max_iterations: u32,
    #[serde(default = "default_max_tool_calls")]
    max_tool_calls_per_turn: u32,
    #[serde(default)]
    four_eyes: bool,
    approval_deadline_secs: u64,
    /// Who must approve, when more than one person: groups and counts, reminders, escalation.
    #[serde(default)]
    approvers: Option<ApproversFile>,
}

/// The `approvers` of an agent file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ApproversFile {
    /// `[{"group": "legal", "count": 2}, {"group": "marketing", "count": 1}]`.
    require: Vec<countersign_core::quorum::Requirement>,
    #[serde(default = "one")]
    denials_to_end: u32,
    remind_after_secs: Option<u64>,
    escalate_after_secs: Option<u64>,
    escalate_to: Option<String>,
}

impl ApproversFile {
    fn checked(self) -> anyhow::Result<countersign_store::AgentApprovers> {
        anyhow::ensure!(
            self.require.iter().all(|r| r.count >= 1),
            "every group in approvers.require needs a count of at least 1"
        );
        anyhow::ensure!(
            self.escalate_after_secs.is_some() == self.escalate_to.is_some(),
            "approvers.escalate_after_secs and approvers.escalate_to go together"
        );
        Ok(countersign_store::AgentApprovers {
            quorum: countersign_core::quorum::Quorum {
                requirements: self.require,
                denials_to_end: self.denials_to_end.max(1),
            },
            remind_after: self.remind_after_secs.map(Duration::from_secs),
            escalate_after: self.escalate_after_secs.map(Duration::from_secs),
            backup_group: self.escalate_to,
        })
    }
}

fn one() -> u32 {
    1
}

fn default_max_tool_calls() -> u32 {
    countersign_core::DEFAULT_MAX_TOOL_CALLS_PER_TURN
}

fn yes() -> bool {
    true
}

/// A store for commands that open no sealed value: a key that lives only in this process
/// will do.
pub fn store_without_keys(pool: PgPool) -> Store {
    Store::new(pool, Arc::new(Keyring::ephemeral()))
}

pub async fn put_agent(store: &Store, path: &Path) -> anyhow::Result<()> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let file: AgentFile = serde_json::from_str(&text).context("the agent file is not valid")?;
    let (model, notes) = checked_model(&file.name, file.model)?;
    let approvers = file.approvers.map(ApproversFile::checked).transpose()?;
    for note in &notes {
        say!("note: {note}");
    }
    store
        .upsert_agent(&AgentConfig {
            name: file.name.clone(),
            active: file.active,
            model,
            policy: file.policy,
            max_iterations: file.max_iterations,
            max_tool_calls_per_turn: file.max_tool_calls_per_turn,
            four_eyes: file.four_eyes,
            approval_deadline: Duration::from_secs(file.approval_deadline_secs),
        })
        .await?;
    store
        .put_agent_approvers(&file.name, approvers.as_ref())
        .await
        .context("storing who must approve (are its groups created?)")?;
    say!("agent {} stored", file.name);
    Ok(())
}

/// The model settings of agent `name`, read by the workers' own parser: what it refuses would
/// fail every run of the agent, so it is not stored. What only the workers' environment can
/// settle (the key's variable, a script file) comes back as notes.
fn checked_model(name: &str, model: Value) -> anyhow::Result<(Value, Vec<String>)> {
    let model = if model.is_null() {
        Value::Object(Default::default())
    } else {
        model
    };
    match countersign_model::ModelCatalog::new(countersign_service::settings::environment)
        .check(&model)
    {
        Ok(check) => Ok((model, check.notes)),
        Err(e) => bail!(
            "agent {name} not stored: its model settings are not usable ({}): {e}",
            e.code()
        ),
    }
}

pub async fn list_agents(store: &Store) -> anyhow::Result<()> {
    for agent in store.agents().await? {
        let c = agent.config;
        say_columns!(
            c.name,
            format!("active={}", c.active),
            format!("four_eyes={}", c.four_eyes),
            format!("max_iterations={}", c.max_iterations),
            format!("enabled={}", c.policy.enabled_tools.join(","))
        );
    }
    Ok(())
}

/// Prints which tools a run of agent `name` is offered, acting as `acting_user` (or as nobody in
/// particular), and which are withheld with the reason: what `agents check` shows.
pub async fn check_agent(
    store: &Store,
    tools: &countersign_service::tools::Tools,
    name: &str,
    acting_user: Option<&str>,
) -> anyhow::Result<()> {
    let agent = store
        .agent(name)
        .await?
        .with_context(|| format!("no agent configuration {name:?}"))?
        .config;
    let classes = countersign_model::ModelCatalog::new(countersign_service::settings::environment)
        .data_classes(&agent.model)
        .context("the agent's model settings")?;
    let provider = agent
        .model
        .get("provider")
        .and_then(Value::as_str)
        .unwrap_or("?");
    let user = match acting_user {
        Some(user) => Some(
            tools
                .users
                .principal(user)
                .await
                .context("asking the user directory")?
                .with_context(|| format!("no user {user:?}"))?,
        ),
        None => None,
    };
    say!("agent {name} · provider {provider}, which may be sent: {classes}");
    for tool in tools.registry.iter() {
        let spec = tool.spec();
        // Without a user, the admin rule is the one thing left to say.
        let as_admin = countersign_core::Principal::new("(any)", true);
        let withheld =
            agent
                .policy
                .withheld_from(spec, user.as_ref().unwrap_or(&as_admin), &classes);
        let admin_only = user.is_none() && spec.requires_admin;
        let what = format!("{} ({}, {})", spec.name, spec.group, spec.data_class);
        match withheld {
            None if !tool.available() => say!(
                "  withheld  {what}: its server lists it otherwise than it was accepted (countersign tools pending)"
            ),
            None if admin_only => say!("  offered   {what} — to administrators only"),
            None => say!("  offered   {what}"),
            Some(reason) => say!("  withheld  {what}: {reason}"),
        }
    }
    Ok(())
}

pub fn producer_kind(kind: &str) -> anyhow::Result<ProducerKind> {
    ProducerKind::parse(&kind.replace('-', "_"))
        .with_context(|| format!("unknown kind {kind:?}: approver or acting-user"))
}

pub async fn allow_producer(
    pool: &PgPool,
    user: &str,
    kind: &str,
    name: &str,
) -> anyhow::Result<()> {
    producers::allow(pool, user, producer_kind(kind)?, name).await?;
    say!("{user} may assert {kind} {name}");
    Ok(())
}

pub async fn revoke_producer(
    pool: &PgPool,
    user: &str,
    kind: &str,
    name: &str,
) -> anyhow::Result<()> {
    let revoked = producers::revoke(pool, user, producer_kind(kind)?, name).await?;
    say!("{}", if revoked { "revoked" } else { "no such grant" });
    Ok(())
}

pub async fn list_producers(pool: &PgPool) -> anyhow::Result<()> {
    for g in producers::list(pool).await? {
        say_columns!(g.amqp_user, g.kind.as_str(), g.name);
    }
    Ok(())
}

/// `countersign users …` on the table directory.
pub async fn users(users: &TableUsers, command: UsersCommand) -> anyhow::Result<()> {
    let no_user = |name: &str| anyhow::anyhow!("no user {name:?} in the directory");
    match command {
        UsersCommand::Add { name, admin } => {
            users
                .put(&name, admin)
                .await
                .with_context(|| format!("adding user {name:?}"))?;
            let role = if admin { "administrator" } else { "user" };
            say!("{name} is an enabled {role}");
        }
        UsersCommand::Disable { name } => {
            if !users.set_disabled(&name, true).await? {
                return Err(no_user(&name));
            }
            say!("{name} is disabled");
        }
        UsersCommand::Enable { name } => {
            if !users.set_disabled(&name, false).await? {
                return Err(no_user(&name));
            }
            say!("{name} is enabled");
        }
        UsersCommand::Grant { name, agent } => {
            if !users
                .grant_approve(&name, &agent)
                .await
                .with_context(|| format!("granting {name:?} the approval of {agent:?}"))?
            {
                return Err(no_user(&name));
            }
            say!("{name} may approve runs of {agent}");
        }
        UsersCommand::Revoke { name, agent } => {
            let revoked = users.revoke_approve(&name, &agent).await?;
            say!("{}", if revoked { "revoked" } else { "no such grant" });
        }
        UsersCommand::List => {
            for u in users.list().await? {
                let flags = match (u.admin, u.disabled) {
                    (_, true) => "disabled",
                    (true, false) => "admin",
                    (false, false) => "user",
                };
                let approves = if u.approves.is_empty() {
                    "-".to_owned()
                } else {
                    u.approves.join(",")
                };
                say_columns!(u.name, flags, approves);
            }
        }
    }
    Ok(())
}

pub async fn connect_broker(addr: &str, prefix: &str) -> anyhow::Result<Broker> {
    Broker::connect(QueueConfig::new(addr, Topology::new(prefix)))
        .await
        .context("connecting to RabbitMQ (AMQP_ADDR)")
}

/// Publishes `body` to `queue` as the connection's user and waits for the coordinator's reply.
async fn publish_and_wait(
    broker: &Broker,
    queue: &str,
    body: &Value,
    wait: Duration,
) -> anyhow::Result<Value> {
    let reply_to = broker.declare_private_queue().await?;
    let mut replies = broker.consume(&reply_to, 1).await?;
    let correlation_id = Uuid::now_v7().to_string();
    let properties = MessageProperties {
        user_id: broker.user(),
        reply_to: Some(reply_to),
        correlation_id: Some(correlation_id.clone()),
    };
    broker
        .publish_message(queue, &serde_json::to_vec(body)?, &properties)
        .await?;
    let delivery = tokio::time::timeout(wait, replies.next())
        .await
        .context("no reply from the coordinator in time; is countersign-coordinator running?")?
        .context("the reply queue closed")??;
    let reply: Value = serde_json::from_slice(&delivery.body).context("the reply is not JSON")?;
    delivery.ack().await?;
    Ok(reply)
}

/// `--inputs`: a JSON object.
pub fn parse_inputs(text: &str) -> anyhow::Result<serde_json::Map<String, Value>> {
    match serde_json::from_str(text).context("--inputs is not JSON")? {
        Value::Object(map) => Ok(map),
        _ => bail!("--inputs must be a JSON object"),
    }
}

pub async fn submit(
    broker: &Broker,
    agent: &str,
    acting_user: &str,
    prompt: &str,
    inputs: Option<serde_json::Map<String, Value>>,
    wait: Duration,
) -> anyhow::Result<()> {
    let request = RunRequest {
        request_id: Uuid::now_v7(),
        agent: agent.into(),
        acting_user: acting_user.into(),
        prompt: prompt.into(),
        inputs,
    };
    let reply = publish_and_wait(
        broker,
        &broker.topology().run_requests(),
        &request.to_json(),
        wait,
    )
    .await?;
    match reply.get("run_id").and_then(Value::as_str) {
        Some(run_id) if reply["event"] == EventName::RunAccepted.as_str() => {
            say!("run {run_id} accepted")
        }
        _ => bail!(
            "run request refused: {}",
            reply["outcome"].as_str().unwrap_or("unknown")
        ),
    }
    Ok(())
}

/// The card a decision is made on: the run, and the suspension number and turn digest of the
/// card its approver was shown. What `decide --card` reads of a saved card.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Reviewed {
    pub run_id: RunId,
    pub suspension_seq: SuspensionSeq,
    pub turn_digest: TurnDigest,
    /// The calls of the card, when it was read from a card file.
    #[serde(default)]
    pub calls: Vec<ReviewedCall>,
}

/// What `decide` reads of a call on a saved card: its tool, which an edit names.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ReviewedCall {
    pub tool: String,
}

impl Reviewed {
    /// The tool of call `index` on the card reviewed, when the card file says.
    fn tool(&self, index: usize) -> Option<String> {
        self.calls.get(index).map(|c| c.tool.clone())
    }
}

/// What an approver decided of a card: the whole turn, call by call, or new arguments.
#[derive(Debug, Clone, Default)]
pub struct Verdict {
    pub approved: bool,
    pub comment: Option<String>,
    pub calls: Vec<CallVerdict>,
    /// Call indexes and the JSON files of their new arguments, as `--edit` names them.
    pub edits: Vec<(usize, PathBuf)>,
}

impl Verdict {
    /// The verdict `decide`'s flags give: `--approve`, `--comment`, `--call`, `--edit`. A
    /// decision call by call approves when any call is approved.
    pub fn of_flags(
        approve: bool,
        comment: Option<String>,
        calls: Vec<CallVerdict>,
        edits: &[String],
    ) -> anyhow::Result<Verdict> {
        Ok(Verdict {
            approved: approve || calls.iter().any(|c| c.approved),
            comment,
            calls,
            edits: edit_files(edits)?,
        })
    }
}

/// `--edit INDEX FILE` pairs, as clap gives them.
pub fn edit_files(pairs: &[String]) -> anyhow::Result<Vec<(usize, PathBuf)>> {
    pairs
        .chunks(2)
        .map(|pair| {
            let [index, file] = pair else {
                bail!("--edit takes a call index and a file");
            };
            let index = index.parse::<usize>().with_context(|| {
                format!("--edit {index}: a call index is a whole number from 0")
            })?;
            Ok((index, PathBuf::from(file)))
        })
        .collect()
}

/// The edits `verdict` names, each file read as a JSON object (`-`: standard input), each
/// naming its call's tool when the card file says which.
fn read_edits(
    reviewed: &Reviewed,
    edits: &[(usize, PathBuf)],
) -> anyhow::Result<Vec<ArgumentsEdit>> {
    edits
        .iter()
        .map(|(index, path)| {
            let text = if path.as_os_str() == "-" {
                std::io::read_to_string(std::io::stdin()).context("reading standard input")?
            } else {
                std::fs::read_to_string(path)
                    .with_context(|| format!("reading {}", path.display()))?
            };
            let arguments: serde_json::Map<String, serde_json::Value> = serde_json::from_str(&text)
                .with_context(|| {
                    format!("{}: the new arguments are a JSON object", path.display())
                })?;
            Ok(ArgumentsEdit {
                index: CallIndex::new(*index),
                tool: reviewed.tool(*index),
                arguments,
            })
        })
        .collect()
}

/// `type` of a card file.
const CARD_FILE: &str = "countersign.cards";

/// A card file as `inbox --save` and `show --save` write it: every card shown, as shown.
#[derive(Debug, Serialize)]
struct CardFileOut<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    version: u32,
    viewer: &'a str,
    cards: Vec<SavedCard<'a>>,
}

/// One card as shown, with the run it is of: `run_id`, `suspension_seq`, `turn_digest`,
/// `captured_at` and every call with its arguments and its preview as this viewer saw it.
#[derive(Debug, Serialize)]
struct SavedCard<'a> {
    run_id: RunId,
    #[serde(flatten)]
    card: &'a ApprovalCard,
}

/// What `decide --card` reads of a card file; the rest is the approver's record of what they
/// were shown.
#[derive(Debug, Deserialize)]
struct CardFileIn {
    #[serde(rename = "type")]
    kind: String,
    version: u32,
    cards: Vec<Reviewed>,
}

fn save_cards(path: &Path, viewer: &str, cards: &[(RunId, ApprovalCard)]) -> anyhow::Result<()> {
    let file = CardFileOut {
        kind: CARD_FILE,
        version: 1,
        viewer,
        cards: cards
            .iter()
            .map(|(run_id, card)| SavedCard {
                run_id: *run_id,
                card,
            })
            .collect(),
    };
    let mut text = serde_json::to_string_pretty(&file)?;
    text.push('\n');
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    // The previews and arguments are content: readable by the approver only.
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut out = options
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    std::io::Write::write_all(&mut out, text.as_bytes())
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// The card of `run_id` in the card file at `path`.
pub fn saved_card(path: &Path, run_id: RunId) -> anyhow::Result<Reviewed> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let file: CardFileIn = serde_json::from_str(&text).with_context(|| {
        format!(
            "{} is not a card file written by `inbox --save` or `show --save`",
            path.display()
        )
    })?;
    anyhow::ensure!(
        file.kind == CARD_FILE && file.version == 1,
        "{} is not a version-1 card file ({} version {})",
        path.display(),
        file.kind,
        file.version
    );
    file.cards
        .into_iter()
        .find(|card| card.run_id == run_id)
        .with_context(|| format!("{} holds no card of run {run_id}", path.display()))
}

/// The run's card as `viewer` may see it, built from its sealed state — so the suspension
/// number and digest it carries are those of the previews on it. `None` when the state cannot
/// be opened with this keyring.
async fn card_of(
    store: &Store,
    registry: &ToolRegistry,
    viewer: Option<&Principal>,
    run_id: RunId,
) -> Option<ApprovalCard> {
    let state = store
        .load_state(run_id)
        .await
        .map(|bytes| SuspendedRunState::from_bytes(&bytes));
    match state {
        Ok(Ok(state)) => Some(build_card(&state, registry, viewer).await),
        _ => None,
    }
}

/// Prints a card, and how to decide on exactly this card.
fn print_card(run_id: RunId, card: &ApprovalCard, viewer: &str, whole: bool) {
    print!("{}", render::card_with(card, whole));
    say!(
        "  decide on this card: countersign decide {run_id} --seq {} --digest {} --as {viewer} --approve (or --deny, or --call INDEX=approve|deny:MESSAGE for each call, or --edit INDEX FILE)",
        card.suspension_seq, card.turn_digest
    );
}

pub async fn inbox(
    store: &Store,
    registry: &ToolRegistry,
    users: &dyn UserDirectory,
    viewer_name: &str,
    save: Option<&Path>,
) -> anyhow::Result<()> {
    let viewer: Option<Principal> = users.principal(viewer_name).await?;
    let waiting = store
        .inbox(viewer_name, &Approves::Every, None, 100, None)
        .await?
        .runs;
    if waiting.is_empty() {
        say!("no run is waiting for approval");
    }
    let mut shown = Vec::new();
    for run in waiting {
        say!(
            "run {} · agent {} · acting as {} · decide by {}",
            run.run_id,
            run.agent,
            run.acting_user,
            run.approval_deadline.to_rfc3339()
        );
        let Some(card) = card_of(store, registry, viewer.as_ref(), run.run_id).await else {
            say!("  (the suspended state cannot be read with this keyring: state_unreadable)");
            continue;
        };
        print_card(run.run_id, &card, viewer_name, false);
        shown.push((run.run_id, card));
    }
    if let Some(path) = save {
        save_cards(path, viewer_name, &shown)?;
        say!(
            "saved {} card(s) to {}; decide on one with: countersign decide RUN_ID --card {} --as {viewer_name} --approve (or --deny)",
            shown.len(),
            path.display(),
            path.display()
        );
    }
    Ok(())
}

/// The card of one run, as `viewer_name` may see it, printed after [`show_run`] and saved to
/// `save` when asked.
/// How `show --as` shows a card: saved to a file as well, and its long previews whole.
#[derive(Debug, Clone, Copy)]
pub struct Shown<'a> {
    pub save: Option<&'a Path>,
    pub full: bool,
}

pub async fn show_card(
    store: &Store,
    registry: &ToolRegistry,
    users: &dyn UserDirectory,
    run_id: RunId,
    viewer_name: &str,
    shown: Shown<'_>,
) -> anyhow::Result<()> {
    let save = shown.save;
    let run = store.run(run_id).await?.context("no such run")?;
    if run.status != RunStatus::WaitingForApproval {
        say!("  (no card: the run is not waiting for approval)");
        anyhow::ensure!(
            save.is_none(),
            "run {run_id} is {}: it has no card to save",
            run.status.as_str()
        );
        return Ok(());
    }
    let viewer: Option<Principal> = users.principal(viewer_name).await?;
    let Some(card) = card_of(store, registry, viewer.as_ref(), run_id).await else {
        say!("  (the suspended state cannot be read with this keyring: state_unreadable)");
        anyhow::ensure!(save.is_none(), "run {run_id}: no card to save");
        return Ok(());
    };
    print_card(run_id, &card, viewer_name, shown.full);
    print_policy_verdicts(store, run_id, card.suspension_seq).await?;
    if let Some(standing) = store.card_standing(run_id).await? {
        say!("  approvals: {}", standing.summary());
    }
    if let Some(path) = save {
        save_cards(path, viewer_name, &[(run_id, card)])?;
        say!(
            "saved the card to {}; decide on it with: countersign decide {run_id} --card {} --as {viewer_name} --approve (or --deny)",
            path.display(),
            path.display()
        );
    }
    Ok(())
}

/// What the policies made of card `seq`: a shadowed verdict ("would approve"), or a card an
/// enforced policy left to a person, and why.
async fn print_policy_verdicts(
    store: &Store,
    run_id: RunId,
    seq: countersign_core::SuspensionSeq,
) -> anyhow::Result<()> {
    for recorded in store.policy_evaluations(run_id).await? {
        let e = recorded.evaluation;
        if e.suspension_seq != seq {
            continue;
        }
        let rule = e.rule.map_or_else(String::new, |r| format!(", rule {r}"));
        let why = e.reason.map_or_else(String::new, |r| format!(" ({r})"));
        let verb = match (e.mode.as_str(), e.outcome.as_str()) {
            ("shadow", "approve") => "would have approved this",
            ("shadow", "deny") => "would have denied this",
            ("shadow", _) => "would have asked a person",
            (_, "approve") => "approved this",
            (_, "deny") => "denied this",
            _ => "left this to a person",
        };
        say!(
            "  policy {} v{} ({}) {verb}{rule}{why}",
            e.policy_id,
            e.policy_version,
            e.mode
        );
    }
    Ok(())
}

/// Sends a decision on the card `reviewed` names and waits for the coordinator's verdict.
/// A refusal is an error naming its outcome code, so the command exits non-zero.
pub async fn decide(
    broker: &Broker,
    reviewed: &Reviewed,
    approver: &str,
    verdict: Verdict,
    wait: Duration,
) -> anyhow::Result<()> {
    let edits = read_edits(reviewed, &verdict.edits)?;
    let decision = DecisionMessage {
        decision_id: Uuid::now_v7(),
        run_id: reviewed.run_id,
        suspension_seq: reviewed.suspension_seq,
        turn_digest: reviewed.turn_digest.clone(),
        approved: verdict.approved && edits.is_empty(),
        calls: verdict.calls,
        edits,
        approver: approver.into(),
        comment: verdict.comment,
    };
    let reply = publish_and_wait(
        broker,
        &broker.topology().decisions(),
        &decision.to_json(),
        wait,
    )
    .await?;
    if report_taken(&reply, &decision, reviewed) {
        return Ok(());
    }
    let outcome = reply["outcome"].as_str().unwrap_or("unknown");
    let why = refusal_reason(outcome, reviewed);
    bail!("decision refused: {outcome}{why}")
}

/// Says what became of `decision` when the coordinator's `reply` took it: a vote recorded, a
/// turn released, or a card issued anew. Whether it did.
fn report_taken(reply: &Value, decision: &DecisionMessage, reviewed: &Reviewed) -> bool {
    if reply["event"] == EventName::CardApprovalRecorded.as_str()
        || reply["event"] == EventName::CardDenialRecorded.as_str()
    {
        say!(
            "{} recorded: run {} suspension {} waits for the rest of its approvers",
            if decision.approved {
                "approval"
            } else {
                "denial"
            },
            reviewed.run_id,
            reviewed.suspension_seq
        );
        return true;
    }
    if reply["event"] == EventName::DecisionAccepted.as_str() {
        if decision.edits_calls() {
            say!(
                "edit accepted: run {} suspension {} is issued anew with the new arguments; look at the new card and decide on it",
                reviewed.run_id,
                reviewed.suspension_seq
            );
        } else {
            say!(
                "decision accepted: run {} suspension {} released",
                reviewed.run_id,
                reviewed.suspension_seq
            );
        }
        return true;
    }
    false
}

/// What the decision's refusal `outcome` means for the card `reviewed`, as words to add to
/// its code; nothing for an outcome that says enough itself.
fn refusal_reason(outcome: &str, reviewed: &Reviewed) -> String {
    match outcome.parse().ok() {
        Some(DecisionOutcome::StaleTurn) => format!(
            " — run {} no longer shows the card decided on (suspension {}, turn {}); \
             nothing changed: look at the run again and decide on the card it shows now",
            reviewed.run_id, reviewed.suspension_seq, reviewed.turn_digest
        ),
        Some(DecisionOutcome::NotAwaitingApproval) => format!(
            " — run {} is not waiting for approval (decided, cancelled or expired)",
            reviewed.run_id
        ),
        Some(DecisionOutcome::NotAuditable) => {
            " — the decision could not be recorded and nothing changed; send it again".to_owned()
        }
        Some(DecisionOutcome::IdempotencyConflict) => {
            " — the decision id was recorded for another run, card or body; nothing changed"
                .to_owned()
        }
        _ => String::new(),
    }
}

/// A run as an operator reads it: its row (no content) and its audit trail (codes only).
pub async fn show_run(store: &Store, run_id: RunId) -> anyhow::Result<()> {
    let run = store.run(run_id).await?.context("no such run")?;
    say!("run {run_id}");
    say!("  agent {} · acting as {}", run.agent, run.acting_user);
    say!(
        "  status {} · segment {}",
        run.status.as_str(),
        run.segment.as_str()
    );
    if let Some(seq) = run.suspension_seq {
        let digest = run.turn_digest.as_ref().map_or("", |d| d.as_str());
        say!("  suspension {seq} · turn {digest}");
    }
    if let Some(reason) = run.termination_reason {
        say!(
            "  termination {} · error {}",
            reason.as_str(),
            run.error_code.as_deref().unwrap_or("-")
        );
    }
    if let Some(sent) = run.sent_call {
        let tool = (run.suspension_seq == Some(sent.suspension_seq))
            .then(|| run.pending_tools.get(sent.index.get()))
            .flatten()
            .map_or(String::new(), |t| format!(" ({t})"));
        say!(
            "  sent and not journaled: call {}{tool} of card {} — {}",
            sent.index,
            sent.suspension_seq,
            if run.status.is_terminal() {
                "it may have landed; ask its tool server what became of it"
            } else {
                "in flight"
            }
        );
    }
    say!(
        "  lease epoch {} · requeues {} · iterations {} · tokens {}/{}",
        run.lease_epoch,
        run.requeue_count,
        run.counters.iterations,
        run.counters.prompt_tokens,
        run.counters.completion_tokens
    );
    for event in store.events(run_id).await? {
        say!(
            "  {:>3} {} {} {}",
            event.sequence,
            event.created_at.to_rfc3339(),
            event.kind,
            event.payload
        );
    }
    Ok(())
}

/// Cancels a run that has not ended, records and announces it. A running segment loses its
/// lease at its next heartbeat or fence and writes nothing more.
pub async fn cancel(
    store: &Store,
    broker: &Broker,
    run_id: countersign_core::RunId,
) -> anyhow::Result<()> {
    // The transition, its audit event and its outbox event: one transaction.
    if !store.cancel(run_id).await? {
        bail!("run {run_id} does not exist or has already ended");
    }
    // Published now rather than at a service relay's next poll; a failure leaves it to them.
    countersign_service::relay::relay_now(store, broker).await;
    say!("run {run_id} cancelled");
    Ok(())
}

#[cfg(test)]
mod tests {
    use countersign_core::card::{CardCall, CardPreview, CAPTION};
    use countersign_core::CallIndex;
    use serde_json::json;

    use super::*;

    fn card(seq: u32, digest: &str) -> ApprovalCard {
        ApprovalCard {
            suspension_seq: SuspensionSeq::new(seq).unwrap(),
            turn_digest: TurnDigest::parse(digest).unwrap(),
            captured_at: "2026-11-30T10:00:00Z".into(),
            caption: CAPTION,
            moved_notice: None,
            calls: vec![CardCall {
                index: CallIndex::new(0),
                tool: "update_page_metadata".into(),
                arguments: json!({"uid": 12}),
                preview: CardPreview::Shown {
                    full: vec![],
                    lines: vec!["field description: \"old\" → \"new\"".into()],
                    forms: vec![],
                },
                moved: false,
                landed: false,
                alone: false,
                edit: None,
                excluded: false,
            }],
        }
    }

    #[test]
    fn an_agent_whose_model_settings_a_worker_would_refuse_is_not_stored_and_an_unset_key_is_noted()
    {
        for (model, says) in [
            (Value::Null, "name no provider"),
            (
                json!({"provider": "oracle"}),
                "unknown model provider \"oracle\"",
            ),
            (
                json!({"provider": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "m"}),
                "api_key_env is missing",
            ),
        ] {
            let err = checked_model("seo-assistant", model)
                .unwrap_err()
                .to_string();
            assert!(
                err.starts_with("agent seo-assistant not stored") && err.contains(says),
                "{err}"
            );
        }

        let variable = "COUNTERSIGN_CLI_TEST_KEY_NEVER_SET";
        std::env::remove_var(variable);
        let settings = json!({"provider": "openai", "base_url": "https://api.example.test/v1",
                              "model": "m", "api_key_env": variable});
        let (stored, notes) = checked_model("seo-assistant", settings.clone()).unwrap();
        assert_eq!(stored, settings, "stored as written");
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(
            notes[0].contains(&format!("{variable} is not set here")),
            "{notes:?}"
        );
    }

    #[test]
    fn a_saved_card_file_names_each_card_shown_and_decide_reads_back_the_one_of_its_run() {
        let dir = std::env::temp_dir().join(format!("countersign-cards-{}", Uuid::now_v7()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("cards.json");
        let (a, b) = (RunId::new(), RunId::new());
        let (da, db) = ("a".repeat(64), "b".repeat(64));
        save_cards(&path, "approver", &[(a, card(1, &da)), (b, card(3, &db))]).unwrap();

        let text: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(text["type"], "countersign.cards");
        assert_eq!(text["viewer"], "approver");
        assert_eq!(text["cards"][1]["run_id"], json!(b));
        assert_eq!(text["cards"][1]["suspension_seq"], 3);
        assert_eq!(text["cards"][1]["turn_digest"], db.as_str());
        assert_eq!(
            text["cards"][1]["calls"][0]["preview"]["lines"][0],
            "field description: \"old\" → \"new\"",
            "the previews as shown"
        );
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o077, 0, "readable by its owner only");
        }

        let reviewed = saved_card(&path, b).unwrap();
        assert_eq!(
            (
                reviewed.run_id,
                reviewed.suspension_seq,
                &reviewed.turn_digest
            ),
            (
                b,
                SuspensionSeq::new(3).unwrap(),
                &TurnDigest::parse(&db).unwrap()
            )
        );
        assert_eq!(
            reviewed.tool(0).as_deref(),
            Some(card(3, &db).calls[0].tool.as_str()),
            "an edit names the tool of the call the card showed"
        );
        assert_eq!(reviewed.tool(1), None);
        let missing = saved_card(&path, RunId::new()).unwrap_err();
        assert!(
            missing.to_string().contains("holds no card of run"),
            "{missing}"
        );

        std::fs::write(
            &path,
            r#"{"type": "countersign.cards", "version": 2, "cards": []}"#,
        )
        .unwrap();
        assert!(
            saved_card(&path, a).is_err(),
            "a newer format is not guessed at"
        );
        std::fs::write(&path, r#"{"run_id": "x"}"#).unwrap();
        assert!(saved_card(&path, a).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
