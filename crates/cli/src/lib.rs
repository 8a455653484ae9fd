//! The `countersign` command line: what an operator runs against an installation — database
//! migrations, users, keys, agents, producers, tokens, tools, runs and their cards. The demo
//! and the bench are no part of it: they are `countersign-dev`'s.
//!
//! It is a thin layer over the library crates: every rule it exercises lives in them. It must
//! never print key material other than a key it was asked to generate, nor a sealed value's
//! plaintext other than the approval cards it shows (and saves) for their viewer (the previews
//! `tools check` asks a tool for are not sealed values: they are the tool's answer to the
//! operator, as the acting user); and it must never decide on a card other than the one its
//! approver names.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{ArgGroup, Parser, Subcommand};
use countersign_core::{SuspensionSeq, TurnDigest};
use countersign_crypto::{KeyId, Keyring};
use countersign_queue::Broker;
use countersign_store::Store;
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;

/// Prints one line to stdout as [`render::inert`] makes it: text from a tool, a server, a model
/// or a record is shown, never obeyed by the terminal.
macro_rules! say {
    ($($arg:tt)*) => {
        println!("{}", $crate::render::inert(&format!($($arg)*)))
    };
}

/// Prints one line of tab-separated columns to stdout, each column as [`render::inert`] makes
/// it, so a column's text can neither control the terminal nor forge another column.
macro_rules! say_columns {
    ($($column:expr),+ $(,)?) => {
        println!("{}", $crate::render::columns(&[$($column.to_string()),+]))
    };
}

/// As [`say!`], to stderr.
macro_rules! tell {
    ($($arg:tt)*) => {
        eprintln!("{}", $crate::render::inert(&format!($($arg)*)))
    };
}

mod groups;
mod healthcheck;
mod ops;
mod policies;
pub mod render;
mod tokens;
mod tools;
mod webhooks;

#[derive(Debug, Parser)]
#[command(
    name = "countersign",
    version,
    about = "Agents that propose, humans who countersign."
)]
pub struct Cli {
    #[command(flatten)]
    pub endpoints: countersign_service::Endpoints,
    #[command(flatten)]
    pub keys: countersign_service::KeySettings,
    #[command(flatten)]
    pub tools: countersign_service::ToolSettings,
    #[command(flatten)]
    pub logging: countersign_service::Logging,
    /// Log at debug level.
    #[arg(short, long, global = true)]
    pub verbose: bool,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Applies the engine's database migrations; with `--with-content`, the reference content
    /// store's too (its schema `content`).
    Migrate {
        /// Also install (or update) the reference content store's schema. A deployment whose
        /// tools are all remote leaves it out, runs its services with
        /// COUNTERSIGN_CONTENT_STORE=off and keeps its users with `countersign users`.
        #[arg(long)]
        with_content: bool,
    },
    /// Manages the master keys that seal state at rest.
    Keys {
        #[command(subcommand)]
        command: KeysCommand,
    },
    /// Manages agent configurations.
    Agents {
        #[command(subcommand)]
        command: AgentsCommand,
    },
    /// Manages which broker users may assert which approvers and acting users.
    Producers {
        #[command(subcommand)]
        command: ProducersCommand,
    },
    /// Manages the tokens of the HTTP API and the web inbox.
    Tokens {
        #[command(subcommand)]
        command: tokens::TokensCommand,
    },
    /// Lists the tools this deployment registers, checks a tool's preview, and adds tool
    /// servers to the tool servers file.
    Tools {
        #[command(subcommand)]
        command: tools::ToolsCommand,
    },
    /// Manages the webhook endpoints that hear of cards and runs (Standard Webhooks).
    Webhooks {
        #[command(subcommand)]
        command: webhooks::WebhooksCommand,
    },
    /// Manages the user directory of a deployment without the content store
    /// (COUNTERSIGN_CONTENT_STORE=off): who may be a run's acting user, who is an
    /// administrator, and whose runs each user may approve.
    Users {
        #[command(subcommand)]
        command: UsersCommand,
    },
    /// Lists, shows, validates and replays policies (Cedar files the coordinator loads).
    Policies {
        #[command(subcommand)]
        command: policies::PoliciesCommand,
    },
    /// Manages the groups of approvers an agent's quorum names (`approvers` in its file).
    Groups {
        #[command(subcommand)]
        command: groups::GroupsCommand,
    },
    /// Manages delegations: "alice's cards go to bob from … until …".
    Delegations {
        #[command(subcommand)]
        command: groups::DelegationsCommand,
    },
    /// Maps Slack users to directory users, for deciding from Slack's buttons.
    Slack {
        #[command(subcommand)]
        command: groups::SlackCommand,
    },
    /// Seeds the reference content store with the demo site (idempotent).
    SeedDemoSite,
    /// Sends a run request through the queue and prints the coordinator's answer.
    Submit {
        #[arg(long)]
        agent: String,
        /// The user the run acts as.
        #[arg(long = "as")]
        acting_user: String,
        prompt: String,
        /// Structured inputs of the run, a JSON object (sealed like the prompt).
        #[arg(long, value_name = "JSON")]
        inputs: Option<String>,
        /// Seconds to wait for the coordinator's reply.
        #[arg(long, default_value_t = 30)]
        wait: u64,
    },
    /// Lists the runs waiting for approval, with their cards as VIEWER may see them, each with
    /// the suspension number and turn digest a decision on it names.
    Inbox {
        #[arg(long = "as", value_name = "VIEWER")]
        viewer: String,
        /// Also write the cards shown to FILE (JSON), for `decide --card FILE`.
        #[arg(long, value_name = "FILE")]
        save: Option<PathBuf>,
    },
    /// Decides, through the queue, on the card the approver was shown: `--card FILE` (from
    /// `inbox --save` or `show --save`), or `--seq` and `--digest` as `inbox` and `show` print
    /// them. Never on the run's current card: one that changed since is refused `stale_turn`.
    ///
    /// `--approve` or `--deny` decides the whole turn. `--call` decides it call by call: name
    /// every call of the card once, `--call 0=approve --call 1=deny:"Keep the old title"` (the
    /// words after `deny:` are what the agent reads). `--edit INDEX FILE` gives a call the
    /// arguments in FILE (a JSON object; `-` reads standard input) and has the card issued anew
    /// with them, marked as your edit: it approves nothing.
    #[command(group(ArgGroup::new("card_shown").required(true).args(["card", "seq"])))]
    #[command(group(ArgGroup::new("verdict").required(true).args(["approve", "deny", "calls", "edits"])))]
    Decide(DecideArgs),
    /// Shows a run: its status, counters and audit trail (codes, no content); with `--as`, its
    /// card as VIEWER may see it.
    Show {
        run_id: countersign_core::RunId,
        /// Also show the run's card as VIEWER may see it (opens the sealed state: needs the
        /// keyring).
        #[arg(long = "as", value_name = "VIEWER")]
        viewer: Option<String>,
        /// Also write the card shown to FILE (JSON), for `decide --card FILE`.
        #[arg(long, value_name = "FILE", requires = "viewer")]
        save: Option<PathBuf>,
        /// Show each long preview whole, rather than the lines a card shows.
        #[arg(long, requires = "viewer")]
        full: bool,
    },
    /// Cancels a run that has not ended.
    Cancel { run_id: countersign_core::RunId },
    /// Exits 0 if URL (a service's readiness, e.g. http://127.0.0.1:9464/readyz) answers 200
    /// within the timeout, non-zero otherwise: a container's healthcheck without a shell.
    Healthcheck {
        #[arg(value_parser = healthcheck::parse_url)]
        url: hyper::Uri,
        /// Seconds to wait for the answer, connecting included.
        #[arg(long, default_value_t = 3)]
        timeout_secs: u64,
    },
}

// The arguments of `decide` (its help is the variant's).
#[derive(Debug, clap::Args)]
pub struct DecideArgs {
    pub run_id: countersign_core::RunId,
    #[arg(long = "as", value_name = "APPROVER")]
    pub approver: String,
    #[arg(long)]
    pub approve: bool,
    #[arg(long)]
    pub deny: bool,
    /// With `--approve` or `--deny`: the comment the agent reads with a denial.
    #[arg(long, conflicts_with_all = ["calls", "edits"])]
    pub comment: Option<String>,
    /// One call's verdict: `INDEX=approve`, `INDEX=deny` or `INDEX=deny:MESSAGE`.
    #[arg(long = "call", value_name = "INDEX=VERDICT", value_parser = parse_verdict)]
    pub calls: Vec<countersign_core::CallVerdict>,
    /// New arguments for call INDEX, from the JSON object in FILE (`-`: standard input).
    #[arg(long = "edit", num_args = 2, value_names = ["INDEX", "FILE"])]
    pub edits: Vec<String>,
    /// The card file `inbox --save` or `show --save` wrote; the decision names RUN_ID's
    /// card in it.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["seq", "digest"])]
    pub card: Option<PathBuf>,
    /// The suspension number of the card shown.
    #[arg(long, value_name = "N", requires = "digest", value_parser = parse_seq)]
    pub seq: Option<SuspensionSeq>,
    /// The turn digest of the card shown: all 64 hex characters.
    #[arg(long, value_name = "HEX", requires = "seq", value_parser = parse_digest)]
    pub digest: Option<TurnDigest>,
    /// Seconds to wait for the coordinator's reply.
    #[arg(long, default_value_t = 30)]
    pub wait: u64,
}

#[derive(Debug, Subcommand)]
pub enum AgentsCommand {
    /// Creates or replaces a configuration from a JSON file.
    Put { file: PathBuf },
    /// Lists the configurations.
    List,
    /// Says which tools a run of the agent is offered and which are withheld, and why: the
    /// allow-list, groups, enable flags and admin rule for the acting user, and the data
    /// classes the agent's model provider may be sent.
    Check {
        name: String,
        /// The acting user to check for (resolved through the deployment's users); without it,
        /// tools offered to administrators only are reported as such.
        #[arg(long = "as", value_name = "USER")]
        acting_user: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
pub enum ProducersCommand {
    /// Lets AMQP_USER assert KIND (approver | acting-user) NAME (`*` for any).
    Allow {
        amqp_user: String,
        kind: String,
        name: String,
    },
    /// Takes a grant back.
    Revoke {
        amqp_user: String,
        kind: String,
        name: String,
    },
    /// Lists the grants.
    List,
}

#[derive(Debug, Subcommand)]
pub enum UsersCommand {
    /// Adds NAME (enabled), or updates an existing NAME's admin flag and enables it.
    Add {
        name: String,
        /// An administrator: approves every agent's runs and passes the tools' admin checks.
        #[arg(long)]
        admin: bool,
    },
    /// Disables NAME: neither a run's acting user nor an approver until enabled again.
    Disable { name: String },
    /// Enables NAME again.
    Enable { name: String },
    /// Lets NAME approve the runs of AGENT (`*` for every agent), whoever their acting user.
    Grant { name: String, agent: String },
    /// Takes a grant back.
    Revoke { name: String, agent: String },
    /// Lists the users with their flags and grants.
    List,
}

#[derive(Debug, Subcommand)]
pub enum KeysCommand {
    /// Prints a new key entry `ID:BASE64` for COUNTERSIGN_KEYS or a key file.
    Generate {
        /// The key id.
        #[arg(long, default_value = "k1")]
        id: String,
    },
    /// Re-seals every stored data key under the active (first) key, in batches.
    Rotate {
        /// Envelopes re-sealed per transaction.
        #[arg(long, default_value_t = 500)]
        batch: i64,
    },
}

pub async fn run(cli: Cli) -> anyhow::Result<()> {
    let url = cli.endpoints.database_url.as_str();
    let endpoints = &cli.endpoints;
    match cli.command {
        Command::Migrate { with_content } => migrate(url, with_content).await,
        Command::Users { command } => users(url, command).await,
        Command::Keys { command } => keys(url, &cli.keys, command).await,
        Command::Agents { command } => agents(url, &cli.tools, command).await,
        Command::Producers { command } => producers(url, command).await,
        Command::Tokens { command } => tokens::run(&connect(url).await?, command).await,
        Command::Tools { command } => tools::run(url, &cli.tools, command).await,
        Command::Webhooks { command } => {
            webhooks::run(connect(url).await?, &cli.keys, command).await
        }
        Command::Groups { command } => groups::groups(&keyless(url).await?, command).await,
        Command::Delegations { command } => {
            groups::delegations(&keyless(url).await?, command).await
        }
        Command::Slack { command } => groups::slack(&keyless(url).await?, command).await,
        Command::SeedDemoSite => seed_demo_site(url).await,
        Command::Policies { command } => policies::run(url, &cli.keys, &cli.tools, command).await,
        Command::Submit {
            agent,
            acting_user,
            prompt,
            inputs,
            wait,
        } => {
            submit(
                endpoints,
                &agent,
                &acting_user,
                &prompt,
                inputs.as_deref(),
                wait,
            )
            .await
        }
        Command::Inbox { viewer, save } => {
            inbox(url, &cli.keys, &cli.tools, &viewer, save.as_deref()).await
        }
        Command::Decide(args) => decide(endpoints, args).await,
        Command::Show {
            run_id,
            viewer,
            save,
            full,
        } => {
            let shown = ops::Shown {
                save: save.as_deref(),
                full,
            };
            show(url, &cli.keys, &cli.tools, run_id, viewer.as_deref(), shown).await
        }
        Command::Cancel { run_id } => cancel(url, endpoints, run_id).await,
        Command::Healthcheck { url, timeout_secs } => {
            healthcheck::ready(&url, secs(timeout_secs)).await
        }
    }
}

/// The broker the commands that go through the queue publish to.
async fn broker(endpoints: &countersign_service::Endpoints) -> anyhow::Result<Broker> {
    ops::connect_broker(&endpoints.amqp_addr, &endpoints.queue_prefix).await
}

/// `decide`: a decision on the card the approver names, through the queue.
async fn decide(
    endpoints: &countersign_service::Endpoints,
    args: DecideArgs,
) -> anyhow::Result<()> {
    let DecideArgs {
        run_id,
        approver,
        approve,
        deny: _,
        comment,
        calls,
        edits,
        card,
        seq,
        digest,
        wait,
    } = args;
    let reviewed = reviewed(run_id, card, seq, digest)?;
    let verdict = ops::Verdict::of_flags(approve, comment, calls, &edits)?;
    let broker = broker(endpoints).await?;
    ops::decide(&broker, &reviewed, &approver, verdict, secs(wait)).await
}

/// `users`: the table directory of a deployment without the content store.
async fn users(url: &str, command: UsersCommand) -> anyhow::Result<()> {
    let users = countersign_store::TableUsers::new(connect(url).await?);
    ops::users(&users, command).await
}

/// `submit`: a run request through the queue, its `inputs` a JSON object.
async fn submit(
    endpoints: &countersign_service::Endpoints,
    agent: &str,
    acting_user: &str,
    prompt: &str,
    inputs: Option<&str>,
    wait: u64,
) -> anyhow::Result<()> {
    let broker = broker(endpoints).await?;
    let inputs = inputs.map(ops::parse_inputs).transpose()?;
    ops::submit(&broker, agent, acting_user, prompt, inputs, secs(wait)).await
}

/// `inbox`: the waiting runs' cards as `viewer` may see them, saved to `save` if given.
async fn inbox(
    url: &str,
    keys: &countersign_service::KeySettings,
    tools: &countersign_service::ToolSettings,
    viewer: &str,
    save: Option<&std::path::Path>,
) -> anyhow::Result<()> {
    let (store, registry, users) = card_reader(url, keys, tools).await?;
    ops::inbox(&store, &registry, &*users, viewer, save).await
}

/// `cancel`: ends the run `run_id` unless it has ended.
async fn cancel(
    url: &str,
    endpoints: &countersign_service::Endpoints,
    run_id: countersign_core::RunId,
) -> anyhow::Result<()> {
    let store = ops::store_without_keys(connect(url).await?);
    let broker = broker(endpoints).await?;
    ops::cancel(&store, &broker, run_id).await
}

/// The store without the keyring: for the commands that seal nothing (the directory's).
async fn keyless(url: &str) -> anyhow::Result<countersign_store::Store> {
    Ok(ops::store_without_keys(connect(url).await?))
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// `show`: the run, and with a viewer its card as they may see it.
async fn show(
    url: &str,
    keys: &countersign_service::KeySettings,
    tools: &countersign_service::ToolSettings,
    run_id: countersign_core::RunId,
    viewer: Option<&str>,
    shown: ops::Shown<'_>,
) -> anyhow::Result<()> {
    let Some(viewer) = viewer else {
        return ops::show_run(&ops::store_without_keys(connect(url).await?), run_id).await;
    };
    let (store, registry, users) = card_reader(url, keys, tools).await?;
    ops::show_run(&store, run_id).await?;
    ops::show_card(&store, &registry, &*users, run_id, viewer, shown).await
}

async fn migrate(database_url: &str, with_content: bool) -> anyhow::Result<()> {
    let pool = connect(database_url).await?;
    countersign_store::MIGRATOR
        .run(&pool)
        .await
        .context("applying the engine's migrations")?;
    if with_content {
        countersign_content::MIGRATOR
            .run(&pool)
            .await
            .context("applying the content store's migrations")?;
        say!("migrations applied (with the content store)");
    } else {
        say!("migrations applied");
    }
    Ok(())
}

async fn keys(
    database_url: &str,
    settings: &countersign_service::KeySettings,
    command: KeysCommand,
) -> anyhow::Result<()> {
    let batch = match command {
        KeysCommand::Generate { id } => {
            let id = KeyId::parse(&id).context("invalid key id")?;
            say!("{}", Keyring::generate_entry(&id));
            return Ok(());
        }
        KeysCommand::Rotate { batch } => batch,
    };
    let keyring = settings.keyring().context("loading the keyring")?;
    let store = Store::new(connect(database_url).await?, Arc::new(keyring));
    let report = store.rotate_keys(batch).await.context("rotating keys")?;
    say!(
        "re-sealed {} data key(s) under key {} in {} batch(es)",
        report.resealed(),
        store.keyring().active_key_id(),
        report.batches
    );
    anyhow::ensure!(
        report.unreadable() == 0,
        "{} envelope(s) could not be opened with this keyring and were left as they are",
        report.unreadable()
    );
    Ok(())
}

async fn agents(
    database_url: &str,
    settings: &countersign_service::ToolSettings,
    command: AgentsCommand,
) -> anyhow::Result<()> {
    let store = ops::store_without_keys(connect(database_url).await?);
    match command {
        AgentsCommand::Put { file } => ops::put_agent(&store, &file).await,
        AgentsCommand::List => ops::list_agents(&store).await,
        AgentsCommand::Check { name, acting_user } => {
            let tools = countersign_service::tools::tools(&store, settings).await?;
            ops::check_agent(&store, &tools, &name, acting_user.as_deref()).await
        }
    }
}

async fn producers(database_url: &str, command: ProducersCommand) -> anyhow::Result<()> {
    let pool = connect(database_url).await?;
    match command {
        ProducersCommand::Allow {
            amqp_user,
            kind,
            name,
        } => ops::allow_producer(&pool, &amqp_user, &kind, &name).await,
        ProducersCommand::Revoke {
            amqp_user,
            kind,
            name,
        } => ops::revoke_producer(&pool, &amqp_user, &kind, &name).await,
        ProducersCommand::List => ops::list_producers(&pool).await,
    }
}

async fn seed_demo_site(database_url: &str) -> anyhow::Result<()> {
    let pool = connect(database_url).await?;
    anyhow::ensure!(
        countersign_content::is_installed(&pool).await?,
        "the content store's schema is not installed: run `countersign migrate --with-content` first"
    );
    countersign_content::seed_demo_site(&pool).await?;
    say!("demo site seeded");
    Ok(())
}

/// The card a decision names: from the card file, or by its number and digest.
fn reviewed(
    run_id: countersign_core::RunId,
    card: Option<PathBuf>,
    seq: Option<SuspensionSeq>,
    digest: Option<TurnDigest>,
) -> anyhow::Result<ops::Reviewed> {
    match (card, seq, digest) {
        (Some(path), _, _) => ops::saved_card(&path, run_id),
        (None, Some(suspension_seq), Some(turn_digest)) => Ok(ops::Reviewed {
            run_id,
            suspension_seq,
            turn_digest,
            calls: vec![],
        }),
        // clap requires --card, or --seq with --digest.
        _ => anyhow::bail!("name the card decided on: --card FILE, or --seq and --digest"),
    }
}

/// What opening a card takes: a store whose keyring opens the sealed state, the tools whose
/// previews are on it, and the users who may or may not read them.
pub(crate) async fn card_reader(
    database_url: &str,
    keys: &countersign_service::KeySettings,
    tools: &countersign_service::ToolSettings,
) -> anyhow::Result<(
    Store,
    countersign_core::ToolRegistry,
    Arc<dyn countersign_core::UserDirectory>,
)> {
    let pool = connect(database_url).await?;
    let keyring = keys
        .keyring()
        .context("loading the keyring to open the cards")?;
    let store = Store::new(pool, Arc::new(keyring));
    let countersign_service::tools::Tools {
        registry, users, ..
    } = countersign_service::tools::tools(&store, tools).await?;
    Ok((store, registry, users))
}

fn parse_seq(s: &str) -> Result<SuspensionSeq, String> {
    s.parse::<u32>()
        .ok()
        .and_then(|n| SuspensionSeq::new(n).ok())
        .ok_or_else(|| "a suspension number is a whole number from 1".to_owned())
}

/// `INDEX=approve`, `INDEX=deny` or `INDEX=deny:MESSAGE`.
fn parse_verdict(s: &str) -> Result<countersign_core::CallVerdict, String> {
    let usage = || "a call's verdict is INDEX=approve, INDEX=deny or INDEX=deny:MESSAGE".to_owned();
    let (index, verdict) = s.split_once('=').ok_or_else(usage)?;
    let index = index
        .parse::<usize>()
        .map(countersign_core::CallIndex::new)
        .map_err(|_| usage())?;
    let (approved, message) = match verdict.split_once(':') {
        None if verdict == "approve" => (true, None),
        None if verdict == "deny" => (false, None),
        Some(("deny", message)) => (false, Some(message.to_owned())),
        _ => return Err(usage()),
    };
    Ok(countersign_core::CallVerdict {
        index,
        approved,
        message: message.filter(|m| !m.trim().is_empty()),
    })
}

fn parse_digest(s: &str) -> Result<TurnDigest, String> {
    TurnDigest::parse(s).map_err(|_| "a turn digest is 64 lowercase hex characters".to_owned())
}

pub(crate) async fn connect(url: &str) -> anyhow::Result<PgPool> {
    PgPoolOptions::new()
        .max_connections(8)
        .connect(url)
        .await
        .context("connecting to PostgreSQL (DATABASE_URL)")
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn verify_cli() {
        Cli::command().debug_assert();
    }

    const RUN: &str = "0193c1f2-0000-7000-8000-000000000000";

    fn decide(args: &[&str]) -> Result<Cli, clap::Error> {
        let mut argv = vec![
            "countersign",
            "decide",
            RUN,
            "--as",
            "approver",
            "--approve",
        ];
        argv.extend_from_slice(args);
        Cli::try_parse_from(argv)
    }

    /// `decide` on a card by number and digest, with `args` as its verdict.
    fn decide_with(args: &[&str]) -> Result<Cli, clap::Error> {
        let digest = "0123456789abcdef".repeat(4);
        let mut argv = vec![
            "countersign",
            "decide",
            RUN,
            "--as",
            "approver",
            "--seq",
            "1",
            "--digest",
            &digest,
        ];
        argv.extend_from_slice(args);
        Cli::try_parse_from(argv)
    }

    #[test]
    fn a_decision_must_name_the_card_it_was_made_on() {
        let digest = "a".repeat(64);
        for (args, kind) in [
            (vec![], clap::error::ErrorKind::MissingRequiredArgument),
            (
                vec!["--seq", "1"],
                clap::error::ErrorKind::MissingRequiredArgument,
            ),
            (
                vec!["--digest", digest.as_str()],
                clap::error::ErrorKind::MissingRequiredArgument,
            ),
            (
                vec![
                    "--card",
                    "c.json",
                    "--seq",
                    "1",
                    "--digest",
                    digest.as_str(),
                ],
                clap::error::ErrorKind::ArgumentConflict,
            ),
            (
                vec!["--seq", "0", "--digest", digest.as_str()],
                clap::error::ErrorKind::ValueValidation,
            ),
            (
                vec!["--seq", "1", "--digest", &digest[..16]],
                clap::error::ErrorKind::ValueValidation,
            ),
        ] {
            let err = decide(&args).expect_err(&format!("{args:?} is refused"));
            assert_eq!(err.kind(), kind, "{args:?}: {err}");
        }
    }

    #[test]
    fn a_decision_call_by_call_names_each_verdict_and_excludes_a_whole_turn_verdict() {
        let Command::Decide(DecideArgs { calls, approve, .. }) = decide_with(&[
            "--call",
            "0=approve",
            "--call",
            "1=deny:Keep the old title: it ranks",
            "--call",
            "2=deny",
        ])
        .unwrap()
        .command
        else {
            panic!("not decide")
        };
        assert!(!approve);
        let read: Vec<_> = calls
            .iter()
            .map(|c| (c.index.get(), c.approved, c.message.as_deref()))
            .collect();
        assert_eq!(
            read,
            vec![
                (0, true, None),
                (1, false, Some("Keep the old title: it ranks")),
                (2, false, None)
            ]
        );
        for (args, kind) in [
            (
                vec!["--call", "0=maybe"],
                clap::error::ErrorKind::ValueValidation,
            ),
            (
                vec!["--call", "x=approve"],
                clap::error::ErrorKind::ValueValidation,
            ),
            (
                vec!["--call", "0=approve", "--approve"],
                clap::error::ErrorKind::ArgumentConflict,
            ),
            (
                vec!["--edit", "1", "a.json", "--deny"],
                clap::error::ErrorKind::ArgumentConflict,
            ),
            (
                vec!["--call", "0=deny", "--comment", "no"],
                clap::error::ErrorKind::ArgumentConflict,
            ),
            (vec![], clap::error::ErrorKind::MissingRequiredArgument),
        ] {
            let err = decide_with(&args).expect_err(&format!("{args:?} is refused"));
            assert_eq!(err.kind(), kind, "{args:?}: {err}");
        }
        let Command::Decide(DecideArgs { edits, .. }) =
            decide_with(&["--edit", "1", "a.json", "--edit", "2", "-"])
                .unwrap()
                .command
        else {
            panic!("not decide")
        };
        assert_eq!(edits, vec!["1", "a.json", "2", "-"]);
    }

    #[test]
    fn a_decision_names_its_card_by_file_or_by_number_and_digest() {
        let digest = "0123456789abcdef".repeat(4);
        let Command::Decide(DecideArgs {
            seq,
            digest: d,
            card,
            ..
        }) = decide(&["--seq", "2", "--digest", &digest])
            .unwrap()
            .command
        else {
            panic!("not decide")
        };
        assert_eq!(seq.map(SuspensionSeq::get), Some(2));
        assert_eq!(d.as_ref().map(TurnDigest::as_str), Some(digest.as_str()));
        assert_eq!(card, None);

        let Command::Decide(DecideArgs { seq, card, .. }) =
            decide(&["--card", "c.json"]).unwrap().command
        else {
            panic!("not decide")
        };
        assert_eq!(seq, None);
        assert_eq!(card, Some(PathBuf::from("c.json")));
    }
}
