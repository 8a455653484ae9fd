//! The claims of wake-ups that arrive together go to PostgreSQL as one statement
//! ([`Store::claim_many`]); a lone wake-up's claim is [`Store::claim`], as before.
//!
//! A batch skips the rows another transaction holds; a run it did not win is claimed again
//! alone by its task, which waits for the row and tells a lost claim from a skipped one.

use std::time::Duration;

use countersign_core::RunId;
use countersign_store::{Claim, Store, StoreError};

use crate::batch::Batcher;

/// The most runs one statement claims.
const BATCH: usize = 64;

/// What a claim came to.
type Answer = Result<Option<Claim>, StoreError>;

/// What the batch said about one run: its answer, or `None` when a batch of several did not
/// win it (lost, its row busy, or the statement failed).
type Said = Option<Answer>;

/// A handle on the worker's claimer; cloned into every wake-up's task.
#[derive(Debug, Clone)]
pub struct Claimer {
    batcher: Batcher<RunId, Said>,
    store: Store,
    owner: String,
    ttl: Duration,
}

impl Claimer {
    /// Starts the claimer; it stops when the last handle is dropped.
    pub fn start(store: Store, owner: String, ttl: Duration) -> Claimer {
        let batcher = Batcher::start(BATCH, {
            let (store, owner) = (store.clone(), owner.clone());
            move |ids: Vec<RunId>| {
                let (store, owner) = (store.clone(), owner.clone());
                async move { claim(&store, &owner, ttl, ids).await }
            }
        });
        Claimer {
            batcher,
            store,
            owner,
            ttl,
        }
    }

    /// Claims `run_id` as [`Store::claim`] does: `None` when the claim lost.
    pub async fn claim(&self, run_id: RunId) -> Answer {
        match self.batcher.ask(run_id).await {
            Some(Some(answer)) => answer,
            // The claim alone waits for a busy row and answers whether it was lost; after a
            // failed batch it is the run's own try.
            Some(None) | None => {
                counted();
                let store = &self.store;
                store
                    .within(store.claim(run_id, &self.owner, self.ttl))
                    .await
            }
        }
    }
}

/// One statement for `ids`: a claim alone for one, a batch for more.
async fn claim(store: &Store, owner: &str, ttl: Duration, ids: Vec<RunId>) -> Vec<Said> {
    counted();
    // Each statement within the store's deadline: this task serves every wake-up of the worker,
    // and a statement the database never answers must not hold all of them.
    if let [one] = ids[..] {
        return vec![Some(store.within(store.claim(one, owner, ttl)).await)];
    }
    match store.within(store.claim_many(&ids, owner, ttl)).await {
        Ok(won) => won
            .into_iter()
            .map(|claim| claim.map(|c| c.map(Some)))
            .collect(),
        Err(e) => {
            tracing::warn!(runs = ids.len(), code = e.code(), error = %e, "batched claim failed; each run is claimed alone");
            ids.iter().map(|_| None).collect()
        }
    }
}

/// Counts one claim statement sent for wake-ups.
fn counted() {
    metrics::counter!("countersign_claim_statements_total").increment(1);
}
