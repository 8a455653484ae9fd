//! `countersign demo`: one run, start to finish, in a throwaway database.
//!
//! Everything is real except the model, which is the deterministic scripted one: PostgreSQL
//! holds the runs and the content, state is sealed with AES-256-GCM, the tools are the content
//! store's writers, and every transition is the store's guarded statement. The story it tells
//! is the one the design exists for: a relative write whose preview moves between the card and
//! the approval is not executed, and the approver decides again on the current card.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use countersign_content::ContentUsers;
use countersign_coordinator::{producers, Coordinator, ProducerKind};
use countersign_core::card::build_card;
use countersign_core::{
    DecisionMessage, Principal, RunId, SuspendedRunState, ToolPolicy, ToolRegistry,
};
use countersign_crypto::Keyring;
use countersign_model::ScriptedModel;
use countersign_store::{AgentConfig, NewRun, Store};
use countersign_worker::{Models, SegmentEnd, SegmentRunner};
use serde_json::json;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::Connection;
use uuid::Uuid;

use crate::render;

const AGENT: &str = "seo-assistant";
const ACTING_USER: &str = "editor";
const APPROVER: &str = "admin";
const PROMPT: &str = "Tighten the description of page 12 and add bicycle.png to its teaser.";
const SCRIPT: &str = include_str!("../demo/seo-assistant.json");
const LEASE_TTL: Duration = Duration::from_secs(30);
/// The broker user the demo's decisions come from, as a queue producer's would.
const PRODUCER: &str = "demo-console";

pub async fn run(database_url: &str, database: &str, keep: bool) -> anyhow::Result<()> {
    anyhow::ensure!(
        database
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_'),
        "the demo database name may hold only letters, digits and underscores"
    );
    let server = PgConnectOptions::from_str(database_url).context("parsing DATABASE_URL")?;
    recreate_database(&server, database).await?;
    let pool = PgPoolOptions::new()
        .max_connections(8)
        .connect_with(server.clone().database(database))
        .await
        .context("connecting to the demo database")?;
    countersign_store::MIGRATOR
        .run(&pool)
        .await
        .context("migrating the demo database")?;
    countersign_content::seed_demo_site(&pool)
        .await
        .context("seeding the demo site")?;

    let keyring = match Keyring::from_env() {
        Ok(keyring) => keyring,
        Err(_) => Keyring::ephemeral(),
    };
    let store = Store::new(pool.clone(), Arc::new(keyring));
    let result = story(&store).await;
    pool.close().await;
    if !keep {
        drop_database(&server, database).await?;
    }
    result
}

async fn story(store: &Store) -> anyhow::Result<()> {
    let mut registry = ToolRegistry::new();
    for tool in countersign_content::tools(store.clone()) {
        registry.register(tool);
    }
    let registry = Arc::new(registry);
    let users = Arc::new(ContentUsers::new(store.pool().clone()));
    producers::allow(store.pool(), PRODUCER, ProducerKind::Approver, "*").await?;
    let coordinator = Coordinator::new(store.clone(), registry.clone());
    let runner = SegmentRunner {
        store: store.clone(),
        registry: registry.clone(),
        models: Models::Fixed(Arc::new(ScriptedModel::from_json(SCRIPT)?)),
        users: users.clone(),
        lease_ttl: LEASE_TTL,
    };
    store
        .upsert_agent(&AgentConfig {
            name: AGENT.into(),
            active: true,
            model: json!({"provider": "scripted"}),
            policy: ToolPolicy {
                allowed_tools: vec![],
                allowed_groups: vec!["content".into(), "editing".into()],
                enabled_tools: vec![
                    "update_page_metadata".into(),
                    "attach_file_to_content_element".into(),
                ],
            },
            max_iterations: 8,
            max_tool_calls_per_turn: countersign_core::agent_loop::DEFAULT_MAX_TOOL_CALLS_PER_TURN,
            four_eyes: true,
            approval_deadline: Duration::from_secs(24 * 3600),
        })
        .await?;

    println!("countersign demo — an agent proposes, a human countersigns\n");

    // 1. The request.
    let run = store
        .create_run(&NewRun {
            request_id: Uuid::now_v7(),
            agent: AGENT.into(),
            acting_user: ACTING_USER.into(),
            prompt: PROMPT.into(),
        })
        .await?;
    let run_id = run.run_id;
    println!("1. A run request arrives for agent \"{AGENT}\", acting as \"{ACTING_USER}\":");
    println!("     \"{PROMPT}\"");
    println!("   → run {run_id} queued\n");

    // 2. The first segment suspends the write turn.
    println!("2. A worker claims the run and runs the tool loop. The model reads page 12, then");
    println!("   proposes two writes in one turn. The whole turn suspends before either runs, and");
    println!(
        "   each call's preview is produced as \"{ACTING_USER}\" and sealed with the run state."
    );
    let end = claim_and_run(store, &runner, run_id, "worker-a").await?;
    expect_suspended(&end, 1)?;
    let state = load_state(store, run_id).await?;
    println!("   → waiting for approval, suspension 1\n");
    print!(
        "{}",
        render::card(
            &build_card(&state, &registry, Some(&principal(&users, APPROVER).await?)).await
        )
    );
    let ops = build_card(
        &state,
        &registry,
        Some(&principal(&users, "approver").await?),
    )
    .await;
    let withheld = ops
        .calls
        .iter()
        .filter(|c| {
            matches!(
                c.preview,
                countersign_core::card::CardPreview::Withheld { .. }
            )
        })
        .count();
    println!(
        "   (\"approver\", who may approve but holds no rights on page 12, is shown the same card"
    );
    println!("    with {withheld} preview(s) withheld.)\n");

    // 3. Someone edits the target in the CMS.
    println!("3. Meanwhile a colleague attaches logo.svg to the same teaser in the CMS.");
    sqlx::query(
        "INSERT INTO content.file_references (element, field, file, sorting)
         SELECT 5, 'image', 10, coalesce(max(sorting), 0) + 1
         FROM content.file_references WHERE element = 5 AND field = 'image'",
    )
    .execute(store.pool())
    .await?;
    println!("   → the teaser's image field now holds one more reference than the card shows\n");

    // 4. The approval of the first card.
    println!("4. \"{APPROVER}\" approves suspension 1.");
    let outcome = decide(&coordinator, run_id, &state, APPROVER, true).await?;
    println!("   → decision {}; the run is queued to resume\n", outcome);

    // 5. The resume re-previews and finds the relative write moved.
    println!("5. A worker claims the resume and re-previews the whole turn before any write.");
    let end = claim_and_run(store, &runner, run_id, "worker-b").await?;
    expect_suspended(&end, 2)?;
    let moved_state = load_state(store, run_id).await?;
    let moved: Vec<String> = moved_state
        .stale_call_indexes
        .iter()
        .map(|i| i.to_string())
        .collect();
    println!(
        "   The attach call's preview no longer reads as shown: nothing is written, and the run"
    );
    println!(
        "   re-suspends with the current previews. Moved call(s): [{}]",
        moved.join(", ")
    );
    println!("   → waiting for approval, suspension 2 (same calls, same digest, new card)\n");
    print!(
        "{}",
        render::card(
            &build_card(
                &moved_state,
                &registry,
                Some(&principal(&users, APPROVER).await?)
            )
            .await
        )
    );
    println!();

    // 6. A stale tab.
    println!("6. A second approver's tab still shows suspension 1, and approves it.");
    let outcome = decide(&coordinator, run_id, &state, "approver", true).await?;
    println!(
        "   → decision refused: {}; the run stays waiting, untouched\n",
        outcome
    );

    // 7. The approval of the current card executes the turn.
    println!("7. \"{APPROVER}\" approves suspension 2.");
    let outcome = decide(&coordinator, run_id, &moved_state, APPROVER, true).await?;
    println!("   → decision {}", outcome);
    let end = claim_and_run(store, &runner, run_id, "worker-c").await?;
    let record = store.run(run_id).await?.context("the run vanished")?;
    println!(
        "   A worker claims the resume (lease epoch {}): every preview reads as shown, so both",
        record.lease_epoch
    );
    println!("   writes execute under the lease fence, each with its read-back, audit event and");
    println!("   journal row in one transaction. The model is told the results and answers.");
    match end {
        SegmentEnd::Completed(reason) => {
            println!("   → run {}: {}\n", record.status.as_str(), reason.as_str())
        }
        other => bail!("expected the run to complete, it ended {other:?}"),
    }

    // 8. What changed.
    println!("8. What the run changed:");
    let description: String =
        sqlx::query_scalar("SELECT description FROM content.pages WHERE uid = 12")
            .fetch_one(store.pool())
            .await?;
    println!("   page 12 description: \"{description}\"");
    let files: Vec<String> = sqlx::query_scalar(
        "SELECT f.name FROM content.file_references r JOIN content.files f ON f.uid = r.file
         WHERE r.element = 5 AND r.field = 'image' AND NOT r.deleted ORDER BY r.sorting, r.uid",
    )
    .fetch_all(store.pool())
    .await?;
    println!("   teaser images, in order: {}", files.join(", "));
    let kinds: Vec<String> = store
        .events(run_id)
        .await?
        .into_iter()
        .map(|e| e.kind)
        .collect();
    println!("   run events: {}", kinds.join(" → "));
    Ok(())
}

async fn claim_and_run(
    store: &Store,
    runner: &SegmentRunner,
    run_id: RunId,
    owner: &str,
) -> anyhow::Result<SegmentEnd> {
    let claim = store
        .claim(run_id, owner, LEASE_TTL)
        .await?
        .context("the run could not be claimed")?;
    Ok(runner.run(&claim).await?)
}

fn expect_suspended(end: &SegmentEnd, seq: u32) -> anyhow::Result<()> {
    match end {
        SegmentEnd::Suspended { suspension_seq, .. } if *suspension_seq == seq => Ok(()),
        other => bail!("expected suspension {seq}, the segment ended {other:?}"),
    }
}

async fn load_state(store: &Store, run_id: RunId) -> anyhow::Result<SuspendedRunState> {
    let bytes = store.load_state(run_id).await?;
    Ok(SuspendedRunState::from_bytes(&bytes)?)
}

async fn principal(users: &ContentUsers, name: &str) -> anyhow::Result<Principal> {
    use countersign_core::UserDirectory;
    users
        .principal(name)
        .await?
        .with_context(|| format!("no user {name}"))
}

/// A decision through the coordinator's gates, as the demo console's producer.
async fn decide(
    coordinator: &Coordinator,
    run_id: RunId,
    reviewed: &SuspendedRunState,
    approver: &str,
    approved: bool,
) -> anyhow::Result<&'static str> {
    let decision = DecisionMessage {
        decision_id: Uuid::now_v7(),
        run_id,
        suspension_seq: reviewed.suspension_seq,
        turn_digest: reviewed.turn_digest(),
        approved,
        approver: approver.into(),
        comment: None,
    };
    let body = decision.to_json().to_string();
    let verdict = coordinator
        .take_decision(body.as_bytes(), Some(PRODUCER))
        .await?;
    Ok(verdict.outcome.code())
}

async fn recreate_database(server: &PgConnectOptions, name: &str) -> anyhow::Result<()> {
    let mut conn = sqlx::PgConnection::connect_with(server)
        .await
        .context("connecting to PostgreSQL")?;
    sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        .execute(&mut conn)
        .await?;
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&mut conn)
        .await?;
    Ok(())
}

async fn drop_database(server: &PgConnectOptions, name: &str) -> anyhow::Result<()> {
    let mut conn = sqlx::PgConnection::connect_with(server).await?;
    sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        .execute(&mut conn)
        .await?;
    Ok(())
}
