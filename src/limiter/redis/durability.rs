//! `--redis-wait-replicas`: a script call's decisions are answered only once enough replicas
//! hold its writes.
//!
//! Why: Redis replicates asynchronously. When a primary dies, the entries it recorded in the
//! last moments before (admissions already answered OK) may not have reached the replica that
//! Sentinel promotes, and the new primary then admits them again: over-admission, once, up to
//! what was lost (measured in docs/redis.md, "Sentinel"). `WAIT n timeout` after the script
//! blocks until `n` replicas acknowledged every write this connection made so far; a decision
//! answered after it is on `n` replicas.
//!
//! How: `WAIT` is pipelined behind the script call (one write, one round trip from sluice's
//! side; the extra time is the replicas' acknowledgement). Fewer than `n` acknowledgements
//! within the timeout fail the call as an outage (the failure policy answers): the script did
//! run on the primary, so at worst its entries count although the request got the policy's
//! answer, which only makes later requests more likely to be rejected.
//!
//! Cost: every script call waits for the replicas, and the connection carries nothing else
//! while it waits (`WAIT` blocks the connection inside Redis). A replica that is down makes
//! every decision fail until it is back (or `n` is lowered): durability asked for, durability
//! enforced.

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{ErrorKind, RedisError, RedisResult, Value};

use super::connect::RedisOptions;

/// The `WAIT` sent after every script call, if any.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Durability {
    /// Replicas that must acknowledge; 0 sends no `WAIT`.
    replicas: u32,
    timeout_ms: u64,
}

impl Durability {
    pub(super) fn new(options: &RedisOptions) -> Self {
        Durability {
            replicas: options.wait_replicas,
            // `WAIT 0` would block forever: never less than 1 ms.
            timeout_ms: (options.wait_timeout.as_millis() as u64).max(1),
        }
    }

    /// Sends `cmd`, followed by `WAIT` when replicas must acknowledge it. The reply is `cmd`'s.
    pub(super) async fn query(
        &self,
        conn: &mut MultiplexedConnection,
        cmd: &redis::Cmd,
    ) -> RedisResult<Value> {
        if self.replicas == 0 {
            return top_level_error(conn.req_packed_command(cmd).await?);
        }
        let mut pipe = redis::pipe();
        pipe.add_command(cmd.clone())
            .cmd("WAIT")
            .arg(self.replicas)
            .arg(self.timeout_ms);
        let mut replies = conn.req_packed_commands(&pipe, 0, 2).await?.into_iter();
        let (Some(reply), Some(wait)) = (replies.next(), replies.next()) else {
            return Err(RedisError::from((
                ErrorKind::Parse,
                "a script call and its WAIT answered with fewer than two replies",
            )));
        };
        let reply = top_level_error(reply)?;
        let acknowledged: u64 = redis::from_redis_value(top_level_error(wait)?)?;
        if acknowledged < u64::from(self.replicas) {
            return Err(RedisError::from((
                ErrorKind::Client,
                "too few replicas acknowledged the decision",
                format!(
                    "WAIT {} {}: {acknowledged} replica(s) acknowledged in time",
                    self.replicas, self.timeout_ms
                ),
            )));
        }
        Ok(reply)
    }
}

/// A reply that is an error is an error; an error element inside an array reply stays in the
/// array. (`Cmd::query_async` turns any nested error into an error of the whole reply, which
/// would fail every request of a batched call for one request's refusal.)
fn top_level_error(reply: Value) -> RedisResult<Value> {
    match reply {
        Value::ServerError(e) => Err(e.into()),
        reply => Ok(reply),
    }
}
