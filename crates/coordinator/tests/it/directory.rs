//! The gates ask the directory they are given, not the content store: who may be a run's acting
//! user, who may approve, and the principal the approver's tool permissions are checked as.

use std::sync::Arc;

use async_trait::async_trait;
use countersign_coordinator::producers::{self, ProducerKind, ANY};
use countersign_coordinator::{Coordinator, CoordinatorError, RequestOutcome};
use countersign_core::{Approver, Approves, DirectoryError, Principal, UserDirectory};
use countersign_store::TableUsers;
use sqlx::PgPool;

use crate::support::{
    assert_refused, bytes, harness, request, Harness, AGENT, DESK, INBOX, PORTAL,
};

/// A directory of its own, unlike the content store's: it knows `auditor` (whom the content
/// store does not) and lets them approve the runs of [`AGENT`], knows `approver` without the approve grant the
/// content store gives them, and nobody else. Or it cannot answer at all.
#[derive(Debug)]
enum Directory {
    Own,
    Down,
}

#[async_trait]
impl UserDirectory for Directory {
    async fn principal(&self, name: &str) -> Result<Option<Principal>, DirectoryError> {
        Ok(self.approver(name).await?.map(|a| a.principal().clone()))
    }

    async fn approver(&self, name: &str) -> Result<Option<Approver>, DirectoryError> {
        match self {
            Directory::Down => Err(DirectoryError::database(std::io::Error::other(
                "directory unreachable",
            ))),
            Directory::Own => Ok(match name {
                "auditor" => Some(Approver::new(
                    Principal::new("auditor", false),
                    Approves::of([AGENT]),
                )),
                "approver" => Some(Approver::new(
                    Principal::new("approver", false),
                    Approves::Nothing,
                )),
                _ => None,
            }),
        }
    }
}

/// The coordinator of `h`, with `directory` for its users.
fn coordinator(h: &Harness, directory: Directory) -> Coordinator {
    Coordinator::with_users(
        h.store.clone(),
        h.coordinator.registry.clone(),
        Arc::new(directory),
    )
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn the_decision_gate_lets_approve_whom_the_injected_directory_grants_and_no_one_else(
    pool: PgPool,
) {
    let h = harness(pool).await;
    let card = h.suspended_run("editor").await;
    let before = h.row(card.run_id).await;

    // Against the content store's users, `auditor` is nobody.
    let d = card.decision(true, "auditor");
    assert_refused(&h.decide(&d, Some(DESK)).await, &d, "access_denied");

    // Against the directory's, `approver` holds no grant, whatever the content store says.
    let own = coordinator(&h, Directory::Own);
    let d = card.decision(true, "approver");
    let v = own.take_decision(&bytes(&d), Some(DESK)).await.unwrap();
    assert_refused(&v, &d, "access_denied");
    assert_eq!(h.row(card.run_id).await, before);

    // And `auditor` may approve, and is permitted the writes as the directory's principal.
    let v = own
        .take_decision(&bytes(&card.decision(true, "auditor")), Some(INBOX))
        .await
        .unwrap();
    assert!(v.is_accepted(), "{:?}", v.outcome);
    assert_eq!(h.decisions(card.run_id).await.len(), 3);
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn the_request_gate_takes_acting_users_from_the_injected_directory(pool: PgPool) {
    let h = harness(pool).await;
    producers::allow(&h.pool, "scheduler", ProducerKind::ActingUser, ANY)
        .await
        .unwrap();
    let own = coordinator(&h, Directory::Own);
    let take = |c: &Coordinator, acting_user: &str| {
        let body = bytes(&request(acting_user, AGENT));
        let c = c.clone();
        async move {
            let verdict = c.take_run_request(&body, Some("scheduler")).await;
            verdict.unwrap().outcome
        }
    };

    assert_eq!(
        take(&h.coordinator, "auditor").await,
        RequestOutcome::UnknownActingUser,
        "against the content store's users"
    );
    assert_eq!(take(&own, "auditor").await, RequestOutcome::Accepted);
    assert_eq!(
        take(&own, "editor").await,
        RequestOutcome::UnknownActingUser,
        "a user of the content store the directory does not know"
    );
    assert_eq!(h.runs().await, 1);
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_directory_that_cannot_answer_is_an_error_and_the_decision_is_not_recorded(pool: PgPool) {
    let h = harness(pool).await;
    let card = h.suspended_run("editor").await;
    let before = h.row(card.run_id).await;
    let down = coordinator(&h, Directory::Down);

    match down
        .take_decision(&bytes(&card.decision(true, "admin")), Some(INBOX))
        .await
    {
        Err(e @ CoordinatorError::Users(_)) => assert_eq!(e.code(), "database_error"),
        other => panic!("expected the directory's failure, got {other:?}"),
    }
    assert_eq!(h.row(card.run_id).await, before);
    assert!(
        h.decisions(card.run_id).await.is_empty(),
        "nothing recorded"
    );
    assert!(h.decision_events(card.run_id).await.is_empty());

    let result = down
        .take_run_request(&bytes(&request("editor", AGENT)), Some(PORTAL))
        .await;
    assert!(
        matches!(result, Err(CoordinatorError::Users(_))),
        "{result:?}"
    );
    assert_eq!(h.runs().await, 1, "no run created");
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn the_table_directory_lets_approve_only_the_agents_a_grant_names_and_forgets_disabled_users(
    pool: PgPool,
) {
    let h = harness(pool).await;
    let users = TableUsers::new(h.pool.clone());
    // The run's acting user must be known to the table directory for the run to exist at all;
    // the harness's run was requested through the content store's gate, which is fine here:
    // the decision gate alone asks the table.
    let card = h.suspended_run("editor").await;
    let before = h.row(card.run_id).await;
    let table = Coordinator::with_users(
        h.store.clone(),
        h.coordinator.registry.clone(),
        Arc::new(users.clone()),
    );
    let decide = |approver: &str| {
        let d = card.decision(true, approver);
        let table = table.clone();
        async move {
            (
                table.take_decision(&bytes(&d), Some(DESK)).await.unwrap(),
                d,
            )
        }
    };

    users.put("reviewer", false).await.unwrap();
    assert!(users
        .grant_approve("reviewer", "another-agent")
        .await
        .unwrap());
    let (v, d) = decide("reviewer").await;
    assert_refused(&v, &d, "access_denied");

    users.put("chief", true).await.unwrap();
    users.set_disabled("chief", true).await.unwrap();
    let (v, d) = decide("chief").await;
    assert_refused(&v, &d, "access_denied");
    assert_eq!(
        h.row(card.run_id).await,
        before,
        "refusals leave the run as it was"
    );

    assert!(users.grant_approve("reviewer", AGENT).await.unwrap());
    let (v, _) = decide("reviewer").await;
    assert!(v.is_accepted(), "{:?}", v.outcome);
}
