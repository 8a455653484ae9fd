//! The settlements of segments that end together go to PostgreSQL as one statement
//! ([`Store::settle_many`]); a lone one is [`Store::settle`], as before.

use std::sync::{Arc, OnceLock};

use countersign_store::{Lease, Settlement, Store, StoreError};

use crate::batch::Batcher;

/// The most settlements one statement writes.
const BATCH: usize = 64;

/// What the batch said about one settlement.
#[derive(Debug)]
enum Settled {
    /// Written, or its guard lost (`false`), or, alone, its own error: the answer is final.
    Written(Result<bool, StoreError>),
    /// The statement of a batch of several failed: nothing of it was written.
    Again,
}

/// The worker's settlements, shared by its segments; its task starts with the first.
#[derive(Debug, Clone, Default)]
pub struct Settler {
    batcher: Arc<OnceLock<Batcher<(Lease, Settlement), Settled>>>,
}

impl Settler {
    /// Settles as [`Store::settle`] does: `false` when the lease's guard lost.
    pub async fn settle(
        &self,
        store: &Store,
        lease: &Lease,
        settlement: &Settlement,
    ) -> Result<bool, StoreError> {
        let batcher = self.batcher.get_or_init(|| start(store.clone()));
        match batcher.ask((lease.clone(), settlement.clone())).await {
            Some(Settled::Written(answer)) => answer,
            // A failed batch, or a stopped task: the settlement's own try.
            Some(Settled::Again) | None => {
                counted();
                store.within(store.settle(lease, settlement)).await
            }
        }
    }
}

fn start(store: Store) -> Batcher<(Lease, Settlement), Settled> {
    Batcher::start(BATCH, move |given: Vec<(Lease, Settlement)>| {
        let store = store.clone();
        async move {
            counted();
            let batch: Vec<_> = given.iter().map(|(l, s)| (l, s)).collect();
            // Within the store's deadline: this task settles every segment of the worker, and a
            // statement the database never answers must not hold all of them.
            match store.within(store.settle_many(&batch)).await {
                Ok(written) => written
                    .into_iter()
                    .map(|w| Settled::Written(Ok(w)))
                    .collect(),
                // Alone, the error is the settlement's own, as from `Store::settle`.
                Err(e) if given.len() == 1 => vec![Settled::Written(Err(e))],
                Err(e) => {
                    tracing::warn!(runs = given.len(), code = e.code(), error = %e, "batched settlement failed; each is settled alone");
                    given.iter().map(|_| Settled::Again).collect()
                }
            }
        }
    })
}

/// Counts one settlement statement.
fn counted() {
    metrics::counter!("countersign_settle_statements_total").increment(1);
}
