//! One heartbeat per worker for every lease it holds.
//!
//! A lease is renewed every third of its time to live. With one renewal statement per segment a
//! worker running two thousand long model calls would send two thousand statements a beat; so
//! the worker keeps the leases it holds in one book and renews them all with ONE guarded
//! `UPDATE` a beat ([`Store::renew_all`]). The statement waits for no row: a run row locked by
//! another transaction — most often the lease's own turn, waiting on a lock of its own — is
//! answered busy and asked again at the next beat, so one turn stuck behind a colleague's edit
//! does not stall the renewal of every other lease the worker holds. A lease the statement
//! finds no longer held is lost (another owner, another epoch, or the run left `running`) and
//! its segment is told at once. A beat that fails against the store, or that the store does not
//! answer within its deadline, is retried on the next; a lease that would expire before the next
//! beat could renew it is declared lost, and its segment stopped, before it expires: a worker cut
//! off from PostgreSQL gives up its runs before the reaper hands them to another.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use countersign_core::RunId;
use countersign_store::{Lease, Renewal, Store};
use tokio::time::Instant;

use crate::hooks::StoreHooks;

/// The book of leases a worker holds; cheap to clone. The renewal loop starts with the first
/// lease held and ends when the last clone is dropped.
#[derive(Debug, Clone, Default)]
pub struct Heartbeat {
    inner: Arc<Book>,
}

#[derive(Debug, Default)]
struct Book {
    held: Mutex<HashMap<RunId, Held>>,
    running: Mutex<bool>,
}

#[derive(Debug)]
struct Held {
    lease: Lease,
    hooks: StoreHooks,
    renewed: Instant,
}

/// A lease in the book; dropping it takes the lease out.
#[derive(Debug)]
pub struct HeldLease {
    book: Weak<Book>,
    run_id: RunId,
}

impl Drop for HeldLease {
    fn drop(&mut self) {
        if let Some(book) = self.book.upgrade() {
            book.held
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&self.run_id);
        }
    }
}

impl Heartbeat {
    /// Puts the segment's lease in the book until the returned guard drops.
    pub fn hold(&self, store: &Store, hooks: &StoreHooks, ttl: Duration) -> HeldLease {
        let lease = hooks.lease().clone();
        let run_id = lease.run_id;
        self.inner
            .held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(
                run_id,
                Held {
                    lease,
                    hooks: hooks.clone(),
                    renewed: Instant::now(),
                },
            );
        let mut running = self.inner.running.lock().unwrap_or_else(|p| p.into_inner());
        if !*running {
            *running = true;
            tokio::spawn(beat(Arc::downgrade(&self.inner), store.clone(), ttl));
        }
        HeldLease {
            book: Arc::downgrade(&self.inner),
            run_id,
        }
    }

    /// How many leases the book holds.
    pub fn len(&self) -> usize {
        self.inner
            .held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

async fn beat(book: Weak<Book>, store: Store, ttl: Duration) {
    let pause = ttl / 3;
    loop {
        tokio::time::sleep(pause).await;
        let Some(book) = book.upgrade() else { return };
        let leases: Vec<Lease> = book
            .held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .map(|h| h.lease.clone())
            .collect();
        metrics::gauge!("countersign_leases_held").set(leases.len() as f64);
        if leases.is_empty() {
            continue;
        }
        metrics::counter!("countersign_heartbeat_statements_total").increment(1);
        // Within the store's deadline (a third of the lease): a database that does not answer
        // is a beat that failed, so the branch below can declare the leases lost in time.
        let renewed = store.within(store.renew_all(&leases, ttl)).await;
        let mut held = book.held.lock().unwrap_or_else(|p| p.into_inner());
        match renewed {
            Ok(answered) => {
                let now = Instant::now();
                let answered: HashMap<RunId, Renewal> = answered.into_iter().collect();
                for lease in &leases {
                    let Some(h) = held.get_mut(&lease.run_id) else {
                        continue; // the segment ended meanwhile
                    };
                    match answered.get(&lease.run_id) {
                        Some(Renewal::Renewed) => h.renewed = now,
                        // Its row is locked (by its own turn, most often): asked again next beat.
                        Some(Renewal::Busy) => {}
                        None => {
                            tracing::warn!(run.id = %lease.run_id, "lease lost");
                            h.hooks.mark_lost();
                        }
                    }
                }
            }
            Err(e) => {
                tracing::warn!(code = e.code(), error = %e, leases = leases.len(), "heartbeat failed");
                for h in held.values() {
                    if h.renewed.elapsed() + pause >= ttl {
                        tracing::warn!(run.id = %h.lease.run_id, "lease not renewed in time; declared lost");
                        h.hooks.mark_lost();
                    }
                }
            }
        }
    }
}
