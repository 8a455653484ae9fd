//! The segment's side of the loop: the lease, the fence, the turn transaction, the local
//! writers that share it, and the execution journal, in PostgreSQL.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use countersign_core::{
    CallIndex, Effect, FenceToken, JournalEntry, LocalWriter, LocalWriters, PendingCall,
    SuspensionSeq, ToolOutput, TurnRecord,
};
use countersign_core::{HookError, SegmentHooks};
use countersign_store::{hook_error, FencedWrite, Lease, SentCall, Store};
use tokio::sync::Notify;

/// Fence, journal and lease of one segment, over the store.
#[derive(Debug, Clone)]
pub struct StoreHooks {
    store: Store,
    /// The writers whose writes land in `store`'s database: an approved turn plans and writes
    /// them in its transaction.
    local: Arc<LocalWriters<FencedWrite>>,
    lease: Lease,
    ttl: Duration,
    lost: Arc<Lost>,
    /// For a resume: when its approval was recorded, as an instant of this process's clock
    /// (the claim's age of the decision, by the database clock, taken back from the claim).
    decided_at: Option<Instant>,
    /// The call of the turn sent and not journaled: as the claim read it, then as this
    /// segment's own stamps and journal entries leave it — so that an attempt run again in
    /// this process after an interruption asks about the call an earlier attempt sent, rather
    /// than previewing it again (a preview now could read its own write).
    sent: Arc<Mutex<Option<(SuspensionSeq, CallIndex)>>>,
}

/// Whether the lease is lost, and a way to wait for it.
#[derive(Debug, Default)]
struct Lost {
    flag: AtomicBool,
    notify: Notify,
}

impl StoreHooks {
    pub fn new(
        store: Store,
        local: Arc<LocalWriters<FencedWrite>>,
        lease: Lease,
        ttl: Duration,
    ) -> Self {
        StoreHooks {
            store,
            local,
            lease,
            ttl,
            lost: Arc::default(),
            decided_at: None,
            sent: Arc::default(),
        }
    }

    /// The call of suspension `seq`'s turn an earlier attempt sent and did not journal
    /// ([`countersign_store::Claim::sent_call`]).
    #[must_use]
    pub fn sent(self, seq: Option<SuspensionSeq>, call: Option<CallIndex>) -> Self {
        self.set_sent(seq.zip(call));
        self
    }

    fn set_sent(&self, sent: Option<(SuspensionSeq, CallIndex)>) {
        *self.sent.lock().unwrap_or_else(PoisonError::into_inner) = sent;
    }

    /// Times `countersign_decision_to_write_seconds` from an approval recorded `secs_ago`
    /// seconds before the claim (see [`countersign_store::SealedDecision::decided_secs_ago`]).
    #[must_use]
    pub fn decided(mut self, secs_ago: Option<f64>) -> Self {
        self.decided_at = secs_ago
            .filter(|s| s.is_finite())
            .and_then(|s| Instant::now().checked_sub(Duration::from_secs_f64(s.max(0.0))));
        self
    }

    /// Records how long after its approval a write of the turn committed.
    fn written(&self) {
        if let Some(decided_at) = self.decided_at {
            metrics::histogram!("countersign_decision_to_write_seconds")
                .record(decided_at.elapsed().as_secs_f64());
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
    type Transaction = FencedWrite;

    async fn turn_record(&self, seq: SuspensionSeq) -> Result<TurnRecord, HookError> {
        self.store
            .turn_record(self.lease.run_id, seq)
            .await
            .map_err(hook_error)
    }

    async fn begin_turn(&self, seq: SuspensionSeq) -> Result<FencedWrite, HookError> {
        self.store
            .begin_turn(&self.lease, seq)
            .await
            .map_err(|e| self.lost_if(hook_error(e)))
    }

    async fn begin_preview(&self, seq: SuspensionSeq) -> Result<FencedWrite, HookError> {
        self.store
            .begin_preview(&self.lease, seq)
            .await
            .map_err(|e| self.lost_if(hook_error(e)))
    }

    fn local(&self, tool: &str) -> Option<&dyn LocalWriter<FencedWrite>> {
        self.local.get(tool)
    }

    async fn commit_turn(
        &self,
        turn: FencedWrite,
        _seq: SuspensionSeq,
        entries: &[JournalEntry<'_>],
        owed: &[CallIndex],
    ) -> Result<(), HookError> {
        turn.commit_turn(self.ttl, entries, owed)
            .await
            .map_err(|e| self.lost_if(hook_error(e)))?;
        if entries.iter().any(|e| e.effect.is_write()) {
            self.written();
        }
        Ok(())
    }

    async fn rollback_turn(&self, turn: FencedWrite) {
        if let Err(e) = turn.rollback().await {
            tracing::warn!(run.id = %self.lease.run_id, error = %e, "turn rollback failed; the connection drops it");
        }
    }

    async fn fence(
        &self,
        seq: SuspensionSeq,
        index: CallIndex,
        effect: Effect,
    ) -> Result<FenceToken, HookError> {
        // Renewing is the check, and the stamp rides in the same UPDATE: it succeeds only while
        // owner, epoch and status still hold, and it leaves a full lease for the effect.
        let sent = SentCall { seq, index, effect };
        match self
            .store
            .renew_stamping(&self.lease, self.ttl, Some(sent))
            .await
        {
            Ok(true) => {
                self.set_sent(Some((seq, index)));
                Ok(self.lease.fence_token(seq, index))
            }
            Ok(false) => Err(self.lost_if(HookError::LeaseLost)),
            Err(e) => Err(self.lost_if(hook_error(e))),
        }
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
        if recorded.is_ok() {
            // Journaling clears the stamp with the entry.
            self.set_sent(None);
            if effect.is_write() {
                self.written();
            }
        }
        recorded
            .map(|_| ())
            .map_err(|e| self.lost_if(hook_error(e)))
    }

    fn token(&self, seq: SuspensionSeq, index: CallIndex) -> FenceToken {
        self.lease.fence_token(seq, index)
    }

    fn sent_unjournaled(&self, seq: SuspensionSeq) -> Option<CallIndex> {
        self.sent
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .filter(|(at, _)| *at == seq)
            .map(|(_, call)| call)
    }

    fn lease_lost(&self) -> bool {
        self.lost.flag.load(Ordering::SeqCst)
    }
}
