//! Requests that arrive while a statement is in flight go to PostgreSQL together in the next.
//!
//! A lone request is served as soon as it arrives: nothing waits to fill a batch, so one
//! segment at a time pays no latency for it, and a burst of them (a backlog of wake-ups, a
//! wave of model answers) costs one statement and one commit per batch instead of one per run.

use std::future::Future;

use tokio::sync::{mpsc, oneshot};

/// One request and where its answer goes.
type Asked<T, A> = (T, oneshot::Sender<A>);

/// The handle on one batching task; cloned into every task that asks.
#[derive(Debug)]
pub(crate) struct Batcher<T, A> {
    requests: mpsc::UnboundedSender<Asked<T, A>>,
}

impl<T, A> Clone for Batcher<T, A> {
    fn clone(&self) -> Self {
        Batcher {
            requests: self.requests.clone(),
        }
    }
}

impl<T: Send + 'static, A: Send + 'static> Batcher<T, A> {
    /// Starts the task that hands `serve` up to `limit` requests at a time, every one queued
    /// since its last batch; `serve` answers each, in order. The task ends with its last handle.
    pub(crate) fn start<F, Fut>(limit: usize, mut serve: F) -> Self
    where
        F: FnMut(Vec<T>) -> Fut + Send + 'static,
        Fut: Future<Output = Vec<A>> + Send + 'static,
    {
        let (requests, mut queued) = mpsc::unbounded_channel::<Asked<T, A>>();
        tokio::spawn(async move {
            let mut batch = Vec::with_capacity(limit);
            while queued.recv_many(&mut batch, limit).await > 0 {
                let (items, answers): (Vec<T>, Vec<_>) = batch.drain(..).unzip();
                let said = serve(items).await;
                for (answer, said) in answers.into_iter().zip(said) {
                    let _ = answer.send(said);
                }
            }
        });
        Batcher { requests }
    }

    /// The answer to `item`, or `None` when the task gave none (it stopped, or its `serve`
    /// answered fewer requests than it was handed): the caller then serves it alone.
    pub(crate) async fn ask(&self, item: T) -> Option<A> {
        let (answer, said) = oneshot::channel();
        self.requests.send((item, answer)).ok()?;
        said.await.ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[tokio::test]
    async fn requests_queued_while_a_batch_is_served_go_together_in_the_next_and_each_gets_its_answer(
    ) {
        let sizes = Arc::new(Mutex::new(Vec::new()));
        let seen = sizes.clone();
        let (hold, held) = tokio::sync::watch::channel(false);
        let batcher = Batcher::start(4, move |items: Vec<u32>| {
            seen.lock().unwrap().push(items.len());
            let mut held = held.clone();
            async move {
                // The first batch is held until every other request has queued.
                let _ = held.wait_for(|go| *go).await;
                items.iter().map(|i| i * 10).collect()
            }
        });
        let first = tokio::spawn({
            let b = batcher.clone();
            async move { b.ask(1).await }
        });
        while sizes.lock().unwrap().is_empty() {
            tokio::task::yield_now().await;
        }
        let rest: Vec<_> = (2..=7)
            .map(|i| {
                let b = batcher.clone();
                tokio::spawn(async move { b.ask(i).await })
            })
            .collect();
        // Time for the six to queue behind the held batch.
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        hold.send(true).unwrap();
        assert_eq!(first.await.unwrap(), Some(10));
        let mut answers = Vec::new();
        for task in rest {
            answers.push(task.await.unwrap());
        }
        assert_eq!(
            answers,
            [20, 30, 40, 50, 60, 70].map(Some).to_vec(),
            "each request its own answer"
        );
        assert_eq!(
            *sizes.lock().unwrap(),
            vec![1, 4, 2],
            "one alone, then the six queued meanwhile, four at most a batch"
        );
    }

    #[tokio::test]
    async fn a_request_serve_leaves_unanswered_gets_none() {
        let batcher = Batcher::start(8, |_items: Vec<u32>| async { Vec::<u32>::new() });
        assert_eq!(batcher.ask(1).await, None);
    }
}
