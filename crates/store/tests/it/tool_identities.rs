//! What each tool from a server was accepted as: the first listing is accepted, a differing one
//! is the pending change announced once, and only the change an operator names is accepted.

use countersign_core::tool::identity_of;
use countersign_store::{Listing, Pinned, Store};
use serde_json::{json, Value};
use sqlx::PgPool;

use crate::support::store;

fn facts(effect: &str) -> Value {
    json!({ "server": "mcp:lying", "name": "lookup", "effect": effect,
            "parameters": { "type": "object" }, "preview": null })
}

async fn pin(store: &Store, facts: &Value) -> Pinned {
    let identity = identity_of(facts);
    store
        .pin_tool(Listing {
            tool: "lookup",
            server: "mcp:lying",
            identity: &identity,
            facts,
        })
        .await
        .unwrap()
}

async fn announced(pool: &PgPool) -> Vec<Value> {
    sqlx::query_scalar(
        "SELECT body FROM event_outbox WHERE kind = 'tool.withheld' ORDER BY created_at",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn a_tools_first_listing_is_accepted_and_a_differing_one_is_withheld_and_announced_once(
    pool: PgPool,
) {
    let store = store(pool.clone());
    let read = facts("read_only");
    let write = facts("non_idempotent_write");
    assert_eq!(pin(&store, &read).await, Pinned::Accepted, "first listing");
    assert_eq!(pin(&store, &read).await, Pinned::Accepted, "the same again");
    assert!(announced(&pool).await.is_empty());

    let accepted_identity = identity_of(&read);
    assert_eq!(
        pin(&store, &write).await,
        Pinned::Withheld {
            accepted_identity: accepted_identity.clone(),
            announced: true
        }
    );
    // Another process finds the same change: withheld, not announced again.
    assert_eq!(
        pin(&store, &write).await,
        Pinned::Withheld {
            accepted_identity: accepted_identity.clone(),
            announced: false
        }
    );
    let events = announced(&pool).await;
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["tool"], "lookup");
    assert_eq!(events[0]["server"], "mcp:lying");
    assert_eq!(events[0]["identity"], identity_of(&write));
    assert_eq!(events[0]["accepted_identity"], accepted_identity);
    assert!(events[0].get("run_id").is_none(), "about no run");

    let recorded = store.tool_identities().await.unwrap();
    let pending = recorded[0].pending.as_ref().expect("a pending change");
    assert_eq!(pending.facts, write);
    assert_eq!(recorded[0].facts, read);
    assert_eq!(
        recorded[0].accepted_by, None,
        "accepted at its first listing"
    );

    // The server goes back: the change is no longer pending.
    assert_eq!(pin(&store, &read).await, Pinned::Accepted);
    assert!(store.tool_identities().await.unwrap()[0].pending.is_none());
}

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn only_the_pending_change_an_operator_names_is_accepted(pool: PgPool) {
    let store = store(pool);
    let read = facts("read_only");
    let write = facts("non_idempotent_write");
    pin(&store, &read).await;
    pin(&store, &write).await;

    let other = identity_of(&facts("idempotent_write"));
    assert!(!store.accept_tool("lookup", &other, "alice").await.unwrap());
    assert!(!store
        .accept_tool("nothing", &identity_of(&write), "alice")
        .await
        .unwrap());
    assert!(store
        .accept_tool("lookup", &identity_of(&write), "alice")
        .await
        .unwrap());
    assert!(
        !store
            .accept_tool("lookup", &identity_of(&write), "alice")
            .await
            .unwrap(),
        "accepted already: nothing pending"
    );

    let recorded = &store.tool_identities().await.unwrap()[0];
    assert_eq!(recorded.identity, identity_of(&write));
    assert_eq!(recorded.facts, write);
    assert_eq!(recorded.accepted_by.as_deref(), Some("alice"));
    assert!(recorded.pending.is_none());
    assert_eq!(pin(&store, &write).await, Pinned::Accepted);
}
