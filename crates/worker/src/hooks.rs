//! The segment's side of the loop: the lease fence and the execution journal, in PostgreSQL.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use countersign_core::agent_loop::{HookError, SegmentHooks};
use countersign_core::{CallIndex, Effect, FenceToken, PendingCall, SuspensionSeq, ToolOutput};
use countersign_store::{Lease, Store, StoreError};

/// Fence and journal of one segment, over the store.
#[derive(Debug, Clone)]
pub struct StoreHooks {
    store: Store,
    lease: Lease,
    ttl: Duration,
    lost: Arc<AtomicBool>,
}

impl StoreHooks {
    pub fn new(store: Store, lease: Lease, ttl: Duration) -> Self {
        StoreHooks {
            store,
            lease,
            ttl,
            lost: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Marks the lease lost: the loop stops at its next step boundary.
    pub fn mark_lost(&self) {
        self.lost.store(true, Ordering::SeqCst);
    }

    /// Renews the lease every third of its time to live until it is lost or the task is
    /// aborted. A store error is retried on the next beat: the lease may still be ours.
    pub fn spawn_heartbeat(&self) -> tokio::task::JoinHandle<()> {
        let hooks = self.clone();
        tokio::spawn(async move {
            let beat = hooks.ttl / 3;
            loop {
                tokio::time::sleep(beat).await;
                match hooks.store.renew(&hooks.lease, hooks.ttl).await {
                    Ok(true) => {}
                    Ok(false) => {
                        tracing::warn!(run.id = %hooks.lease.run_id, "lease lost");
                        hooks.mark_lost();
                        return;
                    }
                    Err(e) => {
                        tracing::warn!(run.id = %hooks.lease.run_id, code = e.code(), error = %e, "heartbeat failed")
                    }
                }
            }
        })
    }
}

fn unavailable(e: StoreError) -> HookError {
    HookError::Unavailable {
        code: e.code(),
        detail: e.to_string(),
    }
}

#[async_trait]
impl SegmentHooks for StoreHooks {
    async fn fence(
        &self,
        seq: SuspensionSeq,
        index: CallIndex,
        _effect: Effect,
    ) -> Result<FenceToken, HookError> {
        // Renewing is the check: it succeeds only while owner, epoch and status still hold,
        // and it leaves a full lease for the write. The tool checks the token again at the
        // resource, inside its own transaction.
        match self.store.renew(&self.lease, self.ttl).await {
            Ok(true) => Ok(self.lease.fence_token(seq, index)),
            Ok(false) => {
                self.mark_lost();
                Err(HookError::LeaseLost)
            }
            Err(e) => Err(unavailable(e)),
        }
    }

    async fn journaled(
        &self,
        seq: SuspensionSeq,
        index: CallIndex,
    ) -> Result<Option<ToolOutput>, HookError> {
        self.store
            .journaled(self.lease.run_id, seq, index)
            .await
            .map_err(unavailable)
    }

    async fn record(
        &self,
        seq: SuspensionSeq,
        index: CallIndex,
        call: &PendingCall,
        effect: Effect,
        output: &ToolOutput,
    ) -> Result<(), HookError> {
        let token = self.lease.fence_token(seq, index);
        self.store
            .record_journal(&token, &call.tool, effect, output)
            .await
            .map(|_| ())
            .map_err(unavailable)
    }

    async fn any_journaled(&self, seq: SuspensionSeq) -> Result<bool, HookError> {
        self.store
            .any_journaled(self.lease.run_id, seq)
            .await
            .map_err(unavailable)
    }

    fn lease_lost(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
    }
}
