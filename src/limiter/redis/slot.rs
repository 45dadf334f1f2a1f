//! One reconnecting connection slot: the connection, if any, re-established lazily and spaced
//! by [`RECONNECT_BACKOFF`] while Redis is unreachable.
//!
//! Why one place: the standalone backend keeps a few slots round-robin and the cluster backend
//! one, and both must behave alike when Redis goes away: a burst of requests makes one connect
//! attempt, not one each, and requests fail fast between attempts instead of queueing on them.
//! What differs (how a connection is made, which errors drop it) stays with each backend. Both
//! bound their readiness probe the same way too ([`probe_within_timeout`]).

use std::future::Future;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use redis::RedisError;

use super::{Gauge, PING_TIMEOUT, RECONNECT_BACKOFF, map_error};
use crate::limiter::LimiterError;
use crate::sync::lock;

pub(super) struct Slot<C> {
    conn: Mutex<Option<C>>,
    /// When connecting last failed, and why, while it has not succeeded since.
    failed_at: Mutex<Option<(Instant, String)>>,
    /// Serializes reconnects of this slot so a burst of requests makes one attempt, not many.
    connecting: tokio::sync::Mutex<()>,
    /// Calls waiting for this slot's (re)connect.
    waiting: AtomicU64,
}

impl<C> Default for Slot<C> {
    fn default() -> Self {
        Slot {
            conn: Mutex::new(None),
            failed_at: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
            waiting: AtomicU64::new(0),
        }
    }
}

impl<C: Clone> Slot<C> {
    /// The slot's connection, made with `connect` if it has none. `backend` names the backend
    /// in the error of a call refused while reconnects back off.
    pub(super) async fn connection<F, Fut>(
        &self,
        backend: &str,
        connect: F,
    ) -> Result<C, LimiterError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<C, RedisError>>,
    {
        if let Some(conn) = lock(&self.conn).clone() {
            return Ok(conn);
        }
        let _connecting = {
            let _waiting = Gauge::enter(&self.waiting);
            self.connecting.lock().await
        };
        if let Some(conn) = lock(&self.conn).clone() {
            return Ok(conn);
        }
        if let Some((at, why)) = &*lock(&self.failed_at)
            && at.elapsed() < RECONNECT_BACKOFF
        {
            return Err(LimiterError::Unavailable(format!(
                "{backend} unreachable (reconnect backing off; last attempt: {why})"
            )));
        }
        match connect().await {
            Ok(conn) => {
                *lock(&self.failed_at) = None;
                *lock(&self.conn) = Some(conn.clone());
                Ok(conn)
            }
            Err(e) => {
                let err = map_error(&e);
                let why = match &err {
                    LimiterError::Unavailable(why) => why.clone(),
                    other => other.to_string(),
                };
                *lock(&self.failed_at) = Some((Instant::now(), why));
                Err(err)
            }
        }
    }
}

/// Runs a readiness probe within [`PING_TIMEOUT`], so that a frozen Redis makes the probe
/// fail instead of hang.
pub(super) async fn probe_within_timeout(
    probe: impl Future<Output = Result<(), LimiterError>>,
) -> Result<(), LimiterError> {
    tokio::time::timeout(PING_TIMEOUT, probe)
        .await
        .map_err(|_| LimiterError::Timeout(PING_TIMEOUT.as_millis() as u64))?
}

impl<C> Slot<C> {
    /// Forgets the connection; the next call on the slot makes a new one.
    pub(super) fn disconnect(&self) {
        *lock(&self.conn) = None;
    }

    pub(super) fn is_connected(&self) -> bool {
        lock(&self.conn).is_some()
    }

    pub(super) fn waiting(&self) -> u64 {
        self.waiting.load(Ordering::Relaxed)
    }
}
