//! Coalescing concurrent decisions into one script call per connection.
//!
//! Why: on a busy sidecar, Redis spends most of each decision on the call itself (reading the
//! command, entering Lua, `TIME`, writing the reply) and sluice on one socket write and read per
//! call. One `FCALL` that carries several requests pays that once. The function decides the
//! requests of a batched call one after the other, each all-or-nothing on its own, exactly as if
//! each had its own call in that order (the layout is on [`super::script::LIBRARY`]), so batching
//! changes no decision: only how many requests share a round trip.
//!
//! How: each connection slot has a bounded queue and one flush task. A request that finds its
//! slot with no call out is sent at once from its own task, alone (an idle sidecar pays no hop
//! to another task). Otherwise it is queued with a reply channel; the flush task takes the first
//! request it finds and every other one already waiting (up to `batch_max`), sends them as one
//! call, and hands each request its own outcome. Nothing ever waits for a batch to fill: batches
//! form only while the slot is busy with an earlier call, so batching adds no delay of its own. Requests with an explicit clock (tests) share a call only with requests of
//! the same clock. A request whose caller has gone (the guard's task holds it otherwise) is
//! dropped before it is sent.
//!
//! Failures: a call that fails fails every request in it with the same error (they were sent
//! together, so none of them is known to have been recorded or not, as for a single call). A
//! request the script refuses on its own (malformed arguments, a key holding another type of
//! value) is an error element of the reply: that request fails alone, having recorded nothing,
//! and the others get their outcomes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::sync::lock;

use tokio::sync::{mpsc, oneshot};

use super::script::{DecideCall, decode_batched_reply};
use super::{Gauge, Shared};
use crate::limiter::{BatchOutcome, Item, LimiterError};

/// Requests queued per slot beyond which new ones fail fast instead of queueing.
const QUEUE_CAPACITY: usize = 4096;

/// One request waiting for its call.
struct Job {
    items: Vec<Item>,
    now: Option<u64>,
    reply: oneshot::Sender<Result<BatchOutcome, LimiterError>>,
}

/// A slot's queue; its flush task is started by the first request (so a limiter can be built
/// outside a runtime) and again if it ever ended (its runtime was shut down).
pub(super) struct Queue {
    slot: usize,
    batch_max: usize,
    sender: Mutex<Option<mpsc::Sender<Job>>>,
    /// Script calls out on this slot, sent directly or by the flush task.
    busy: Arc<AtomicU64>,
}

impl Queue {
    pub(super) fn new(slot: usize, batch_max: usize) -> Self {
        Queue {
            slot,
            batch_max,
            sender: Mutex::new(None),
            busy: Arc::new(AtomicU64::new(0)),
        }
    }

    fn sender(&self, shared: &Arc<Shared>) -> mpsc::Sender<Job> {
        let mut sender = lock(&self.sender);
        match &*sender {
            Some(tx) if !tx.is_closed() => tx.clone(),
            _ => {
                let (tx, rx) = mpsc::channel(QUEUE_CAPACITY);
                tokio::spawn(flush(
                    Arc::clone(shared),
                    self.slot,
                    self.batch_max,
                    Arc::clone(&self.busy),
                    rx,
                ));
                *sender = Some(tx.clone());
                tx
            }
        }
    }

    /// Sends `batch` at once if the slot has no call out, else queues it; waits for its outcome.
    pub(super) async fn submit(
        &self,
        shared: &Arc<Shared>,
        batch: &[Item],
        now: Option<u64>,
    ) -> Result<BatchOutcome, LimiterError> {
        if self.busy.load(Ordering::Relaxed) == 0 {
            let _busy = Gauge::enter(&self.busy);
            return shared.call_one(self.slot, batch, now).await;
        }
        let (reply, outcome) = oneshot::channel();
        let job = Job {
            items: batch.to_vec(),
            now,
            reply,
        };
        self.sender(shared).try_send(job).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => LimiterError::Overloaded,
            mpsc::error::TrySendError::Closed(_) => {
                LimiterError::Unavailable("redis batch queue closed".into())
            }
        })?;
        outcome
            .await
            .unwrap_or_else(|_| Err(LimiterError::Unavailable("redis batch task ended".into())))
    }
}

/// The flush task of one slot: ends when the limiter (every sender) is gone.
async fn flush(
    shared: Arc<Shared>,
    slot: usize,
    batch_max: usize,
    busy: Arc<AtomicU64>,
    mut queue: mpsc::Receiver<Job>,
) {
    let mut jobs: Vec<Job> = Vec::with_capacity(batch_max);
    while let Some(first) = queue.recv().await {
        jobs.push(first);
        while jobs.len() < batch_max {
            match queue.try_recv() {
                Ok(job) => jobs.push(job),
                Err(_) => break,
            }
        }
        jobs.retain(|job| !job.reply.is_closed());
        while !jobs.is_empty() {
            let now = jobs[0].now;
            let same_clock = jobs
                .iter()
                .position(|job| job.now != now)
                .unwrap_or(jobs.len());
            let call: Vec<Job> = jobs.drain(..same_clock).collect();
            let _busy = Gauge::enter(&busy);
            send(&shared, slot, call).await;
        }
    }
}

/// Sends `jobs` (same clock) as one call and answers each.
async fn send(shared: &Shared, slot: usize, jobs: Vec<Job>) {
    let now = jobs.first().and_then(|job| job.now);
    let mut fcall = shared.fcall(jobs.len());
    if let [job] = jobs.as_slice() {
        DecideCall::single(&job.items, now).write(&mut fcall);
    } else {
        DecideCall::batched(jobs.iter().map(|job| &job.items[..]).collect(), now).write(&mut fcall);
    }
    let reply = shared.call(slot, &mut fcall).await;
    let outcomes = reply.and_then(|value| {
        if let [job] = jobs.as_slice() {
            Ok(vec![super::decode_reply(&value, job.items.len())])
        } else {
            let sizes: Vec<usize> = jobs.iter().map(|job| job.items.len()).collect();
            decode_batched_reply(&value, &sizes)
        }
    });
    match outcomes {
        Ok(outcomes) => {
            for (job, outcome) in jobs.into_iter().zip(outcomes) {
                let _ = job.reply.send(outcome);
            }
        }
        Err(e) => {
            for job in jobs {
                let _ = job.reply.send(Err(e.clone()));
            }
        }
    }
}
