//! The segment's side of the loop: the lease, the fence, the turn transaction and the
//! execution journal, in PostgreSQL.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use countersign_core::agent_loop::{HookError, SegmentHooks};
use countersign_core::{
    CallIndex, Effect, FenceToken, PendingCall, SuspensionSeq, ToolOutput, TurnTransaction,
};
use countersign_store::{hook_error, Lease, Store};
use tokio::sync::Notify;

/// Fence, journal and lease of one segment, over the store.
#[derive(Debug, Clone)]
pub struct StoreHooks {
    store: Store,
    lease: Lease,
    ttl: Duration,
    lost: Arc<Lost>,
}

/// Whether the lease is lost, and a way to wait for it.
#[derive(Debug, Default)]
struct Lost {
    flag: AtomicBool,
    notify: Notify,
}

impl StoreHooks {
    pub fn new(store: Store, lease: Lease, ttl: Duration) -> Self {
        StoreHooks {
            store,
            lease,
            ttl,
            lost: Arc::default(),
        }
    }

    /// Marks the lease lost: the loop stops at its next step boundary, and whoever waits in
    /// [`lost`](Self::lost) wakes.
    pub fn mark_lost(&self) {
        self.lost.flag.store(true, Ordering::SeqCst);
        self.lost.notify.notify_waiters();
    }

    /// Resolves once the lease is lost.
    pub async fn lost(&self) {
        loop {
            let notified = self.lost.notify.notified();
            if self.lost.flag.load(Ordering::SeqCst) {
                return;
            }
            notified.await;
        }
    }

    /// `e`, having marked the lease lost when that is what it says.
    fn lost_if(&self, e: HookError) -> HookError {
        if matches!(e, HookError::LeaseLost) {
            self.mark_lost();
        }
        e
    }

    /// The lease this segment runs under.
    pub fn lease(&self) -> &Lease {
        &self.lease
    }
}

#[async_trait]
impl SegmentHooks for StoreHooks {
    async fn fence(
        &self,
        seq: SuspensionSeq,
        index: CallIndex,
        effect: Effect,
    ) -> Result<FenceToken, HookError> {
        // Renewing is the check, and the stamp rides in the same UPDATE: it succeeds only while
        // owner, epoch and status still hold, and it leaves a full lease for the effect.
        match self
            .store
            .renew_stamping(&self.lease, self.ttl, Some(effect))
            .await
        {
            Ok(true) => Ok(self.lease.fence_token(seq, index)),
            Ok(false) => Err(self.lost_if(HookError::LeaseLost)),
            Err(e) => Err(self.lost_if(hook_error(e))),
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
            .map_err(hook_error)
    }

    async fn record(
        &self,
        seq: SuspensionSeq,
        index: CallIndex,
        call: &PendingCall,
        effect: Effect,
        output: &ToolOutput,
    ) -> Result<(), HookError> {
        let recorded = self
            .store
            .record_effect(&self.lease, seq, index, &call.tool, effect, output)
            .await;
        recorded
            .map(|_| ())
            .map_err(|e| self.lost_if(hook_error(e)))
    }

    async fn any_journaled(&self, seq: SuspensionSeq) -> Result<bool, HookError> {
        self.store
            .any_journaled(self.lease.run_id, seq)
            .await
            .map_err(hook_error)
    }

    async fn begin_turn(&self, seq: SuspensionSeq) -> Result<Box<dyn TurnTransaction>, HookError> {
        match self.store.begin_turn(&self.lease, seq, self.ttl).await {
            Ok(tx) => Ok(Box::new(tx)),
            Err(e) => Err(self.lost_if(hook_error(e))),
        }
    }

    fn lease_lost(&self) -> bool {
        self.lost.flag.load(Ordering::SeqCst)
    }
}
