//! The claims of wake-ups that arrive together go to PostgreSQL as one statement.
//!
//! Each wake-up's task asks the claimer for its run. The claimer sends one request alone, as
//! [`Store::claim`] does; while a statement is in flight the next requests queue, and the next
//! statement claims all of them at once ([`Store::claim_many`]). Nothing waits to fill a
//! batch: one wake-up at a time is claimed as soon as it arrives, and a backlog of wake-ups
//! costs one statement and one commit per batch instead of one per run.
//!
//! A batch skips the rows another transaction holds; a run it did not win is claimed again
//! alone by its task, which waits for the row and tells a lost claim from a skipped one.

use std::time::Duration;

use countersign_core::RunId;
use countersign_store::{Claim, Store, StoreError};
use tokio::sync::{mpsc, oneshot};

/// The most runs one statement claims.
const BATCH: usize = 64;

/// What a claim came to.
type Answer = Result<Option<Claim>, StoreError>;

/// What the claimer said about one run.
enum Said {
    /// Claimed alone: the answer is final.
    Alone(Answer),
    /// Won in a batch.
    Won(Claim),
    /// Not won in a batch: lost, its row was busy, or the batch's statement failed.
    NotWon,
}

struct Request {
    run_id: RunId,
    answer: oneshot::Sender<Said>,
}

/// A handle on the worker's claimer; cloned into every wake-up's task.
#[derive(Debug, Clone)]
pub struct Claimer {
    requests: mpsc::UnboundedSender<Request>,
    store: Store,
    owner: String,
    ttl: Duration,
}

impl Claimer {
    /// Starts the claimer; it stops when the last handle is dropped.
    pub fn start(store: Store, owner: String, ttl: Duration) -> Claimer {
        let (requests, queued) = mpsc::unbounded_channel();
        tokio::spawn(serve(store.clone(), owner.clone(), ttl, queued));
        Claimer {
            requests,
            store,
            owner,
            ttl,
        }
    }

    /// Claims `run_id` as [`Store::claim`] does: `None` when the claim lost.
    pub async fn claim(&self, run_id: RunId) -> Answer {
        let (answer, said) = oneshot::channel();
        let asked = self.requests.send(Request { run_id, answer }).is_ok();
        let said = match asked {
            true => said.await.ok(),
            false => None,
        };
        match said {
            Some(Said::Alone(answer)) => answer,
            Some(Said::Won(claim)) => Ok(Some(claim)),
            // The claim alone waits for a busy row and answers whether it was lost; after a
            // failed batch it is the run's own try.
            Some(Said::NotWon) | None => {
                counted();
                self.store.claim(run_id, &self.owner, self.ttl).await
            }
        }
    }
}

async fn serve(
    store: Store,
    owner: String,
    ttl: Duration,
    mut queued: mpsc::UnboundedReceiver<Request>,
) {
    let mut batch = Vec::with_capacity(BATCH);
    while queued.recv_many(&mut batch, BATCH).await > 0 {
        if batch.len() == 1 {
            for one in batch.drain(..) {
                counted();
                let answer = store.claim(one.run_id, &owner, ttl).await;
                let _ = one.answer.send(Said::Alone(answer));
            }
            continue;
        }
        let ids: Vec<RunId> = batch.iter().map(|r| r.run_id).collect();
        counted();
        match store.claim_many(&ids, &owner, ttl).await {
            Ok(mut won) => {
                for request in batch.drain(..) {
                    let said = match won.iter().position(|(id, _)| *id == request.run_id) {
                        Some(at) => match won.swap_remove(at).1 {
                            Ok(claim) => Said::Won(claim),
                            Err(e) => Said::Alone(Err(e)),
                        },
                        None => Said::NotWon,
                    };
                    let _ = request.answer.send(said);
                }
            }
            Err(e) => {
                tracing::warn!(runs = batch.len(), code = e.code(), error = %e, "batched claim failed; each run is claimed alone");
                for request in batch.drain(..) {
                    let _ = request.answer.send(Said::NotWon);
                }
            }
        }
    }
}

/// Counts one claim statement sent for wake-ups.
fn counted() {
    metrics::counter!("countersign_claim_statements_total").increment(1);
}
