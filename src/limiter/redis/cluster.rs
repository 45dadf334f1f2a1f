//! Redis Cluster backend: the same Lua and data layout as the standalone backend, spread over
//! the cluster's primaries by key slot.
//!
//! Why it looks like this: a limiter key is `sluice:{<body>}`, one hash tag, so one key lives in
//! one slot and its sorted set never spans nodes. A request's keys usually live in different
//! slots, and one script call can only touch one slot. Forcing every key of a domain into one
//! slot would make that slot (and its primary) the hot spot of the whole cluster, so instead:
//!
//! 1. the batch is split into slot groups (batch order kept inside each group); a request whose
//!    keys share a slot is one script call, exactly like the standalone backend;
//! 2. otherwise each group's consume, shadow and quota items are evaluated in parallel, each
//!    group atomically, and each call returns an undo token per item (for the log: the members
//!    it added and their score); the group's refund items ride along as check-only probes (they
//!    bring their key to `now` and report it, as one script call would on a rejection);
//! 3. if every group admitted, refunds (which never reject) are applied per group, the other
//!    items of a refunded key going along as probes so that they report the key after the
//!    refund;
//! 4. if any group rejected or failed, a compensation script takes back what the admitted
//!    groups recorded (log members by number and score, see `COMPENSATE`), and groups of
//!    refunds alone are probed.
//!
//! The outcomes are those one script call would report (the differential property test in
//! tests/it/differential.rs holds the cluster to the memory backend's reference models); where the
//! split cannot behave like one script is listed in docs/algorithms.md ("Redis Cluster").
//!
//! The guarantee (docs/redis.md): never over-admit, since each group checks its own limits
//! atomically and a request is admitted only when all groups admitted; a rejected request
//! leaves nothing behind once compensation ran; between a group's write and its compensation
//! its entries are visible to other requests, which can only make those extra rejections.
//! When compensation itself fails (a node went away), the leftover entries expire with their
//! window: again only extra rejections. redis-rs follows MOVED/ASK and re-reads the slot map;
//! a script call it retries after a lost reply may record twice, with the same consequence.

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use futures_util::future::join_all;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{ErrorKind, RedisError, Script, ServerErrorKind, Value};

use super::connect::{RedisOptions, SettingError, cluster_client};
use super::script::{
    COMPENSATE, CompensateCall, DecideCall, LIBRARY, MAX_EXACT, decode_reply_with_undo,
    is_function_missing,
};
use super::slot::{Slot, probe_within_timeout};
use super::{CONNECT_TIMEOUT, RESPONSE_TIMEOUT, map_error};
use crate::limiter::{Algorithm, BatchOutcome, Item, ItemKind, KeyOutcome, Limiter, LimiterError};

/// Number of hash slots in a Redis Cluster.
const SLOTS: u16 = 16384;

/// CRC16/XMODEM, the hash Redis Cluster uses for key slots.
fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in data {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The slot of `key`, honouring a `{hash tag}` like Redis does.
pub fn key_slot(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let tagged = bytes.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &bytes[open + 1..];
        rest.iter()
            .position(|&b| b == b'}')
            .filter(|&close| close > 0)
            .map(|close| &rest[..close])
    });
    crc16(tagged.unwrap_or(bytes)) % SLOTS
}

/// Batch indices grouped by slot, each group in batch order.
fn slot_groups(batch: &[Item]) -> Vec<Vec<usize>> {
    let mut groups: BTreeMap<u16, Vec<usize>> = BTreeMap::new();
    for (i, hit) in batch.iter().enumerate() {
        groups.entry(key_slot(&hit.key)).or_default().push(i);
    }
    groups.into_values().collect()
}

/// Extra attempts of a script call refused with a redirect or TRYAGAIN.
const REDIRECT_RETRIES: u64 = 8;

/// Errors the server sends before running anything (the slot is elsewhere or moving).
fn not_executed(e: &RedisError) -> bool {
    matches!(
        e.kind(),
        ErrorKind::Server(
            ServerErrorKind::Ask | ServerErrorKind::Moved | ServerErrorKind::TryAgain
        )
    )
}

/// `item`, reported by a part that was compensated afterwards, as the key is once `undone` of
/// its hits are taken back (its own recorded hits, which were all the part wrote to the key).
/// The count drops by exactly those hits for every algorithm. The reset is unchanged (the
/// compensated hits were the newest; a fixed or sliding window keeps its start), except that a
/// log, quantized log or GCRA key left empty reports a whole window, as an empty key does.
fn without_undone(item: KeyOutcome, hit: &Item, undone: u64) -> KeyOutcome {
    let count = item.count.saturating_sub(undone);
    let empty_resets = !matches!(
        hit.algorithm,
        Algorithm::FixedWindow | Algorithm::SlidingCounter
    );
    KeyOutcome {
        count,
        reset_ms: if undone > 0 && count == 0 && empty_resets {
            hit.window_ms
        } else {
            item.reset_ms
        },
        ..item
    }
}

/// How [`ClusterLimiter::eval`] sends a group's items.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// As they are: the whole request in one slot.
    AsIs,
    /// Phase 1 of a request spanning slots: quota items as shadow items and refund items as
    /// probes (see `eval`).
    Check,
    /// Phase 2 of an admitted request spanning slots: refund items as they are, the other items
    /// (already checked and recorded in phase 1) as zero-hit probes that record nothing.
    Refund,
}

/// One group's evaluated part: batch indices, outcome, undo token per item.
struct Part {
    indices: Vec<usize>,
    outcome: BatchOutcome,
    undo: Vec<u64>,
}

pub struct ClusterLimiter {
    client: ClusterClient,
    /// The one cluster connection (it keeps a connection per node itself).
    conn: Slot<ClusterConnection>,
    compensate: Script,
}

impl std::fmt::Debug for ClusterLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterLimiter").finish_non_exhaustive()
    }
}

impl ClusterLimiter {
    /// Builds the client for a `redis+cluster://` setting (`pool_size` and `batch_max` do not
    /// apply); connects on first use. Fails only on an invalid setting.
    pub fn open(options: &RedisOptions) -> Result<Self, SettingError> {
        Ok(ClusterLimiter {
            client: cluster_client(options, CONNECT_TIMEOUT, RESPONSE_TIMEOUT)?,
            conn: Slot::default(),
            compensate: Script::new(COMPENSATE),
        })
    }

    /// Like [`ClusterLimiter::open`] but fails unless the cluster is reachable now.
    pub async fn connect(options: &RedisOptions) -> Result<Self, LimiterError> {
        let limiter = Self::open(options)?;
        limiter.connection().await?;
        Ok(limiter)
    }

    async fn connection(&self) -> Result<ClusterConnection, LimiterError> {
        self.conn
            .connection("redis cluster", || self.client.get_async_connection())
            .await
    }

    /// Maps an error; the cluster connection repairs itself (slot map refresh, per-node
    /// reconnects), so it is only dropped when redis-rs says it cannot be used again.
    fn fail(&self, e: &RedisError) -> LimiterError {
        if e.is_unrecoverable_error() {
            self.conn.disconnect();
        }
        map_error(e)
    }

    /// One script call for the items at `indices` (all in one slot).
    async fn eval(
        &self,
        conn: &ClusterConnection,
        batch: &[Item],
        indices: Vec<usize>,
        now: Option<u64>,
        mode: Mode,
    ) -> Result<Part, LimiterError> {
        let mut hits: Vec<Item> = indices.iter().map(|&i| batch[i].clone()).collect();
        if mode == Mode::Refund {
            for hit in hits.iter_mut().filter(|h| h.kind != ItemKind::Refund) {
                hit.kind = ItemKind::Shadow;
                hit.hits = 0;
            }
        }
        if mode == Mode::Check {
            for hit in hits.iter_mut() {
                match hit.kind {
                    // "At least one quota item passes" spans every group: here each quota item
                    // is checked and recorded like a shadow item, and `run` applies the rule to
                    // them all.
                    ItemKind::Quota => hit.kind = ItemKind::Shadow,
                    // A refund may only apply once every group admitted, and cannot be taken
                    // back exactly; here it is a check-only probe that records nothing but
                    // brings the key to `now` (log evictions persist, as in one script) and
                    // reports its state, which is the refund's outcome if the request is
                    // rejected.
                    ItemKind::Refund => {
                        hit.kind = ItemKind::Shadow;
                        hit.hits = 0;
                    }
                    ItemKind::Consume | ItemKind::Shadow => {}
                }
            }
        }
        let mut conn = conn.clone();
        let fcall = DecideCall::single(&hits, now).fcall();
        let (mut attempt, mut loaded) = (0, false);
        let reply: Value = loop {
            match fcall.query_async(&mut conn).await {
                Ok(reply) => break reply,
                // A node that does not hold the function (restarted without persistence, new in
                // the cluster, `FUNCTION FLUSH`): it did not run. redis-rs sends `FUNCTION LOAD`
                // to every primary.
                Err(e) if !loaded && is_function_missing(&e) => {
                    loaded = true;
                    LIBRARY
                        .load()
                        .query_async::<Value>(&mut conn)
                        .await
                        .map_err(|e| self.fail(&e))?;
                }
                // A redirect or TRYAGAIN reply means the script did not run, so sending it again
                // cannot record twice. redis-rs follows them itself, but under concurrent traffic
                // during a slot migration the ASKING it sends can be consumed by another command
                // on the shared connection; a few quick retries ride the migration out.
                Err(e) if attempt < REDIRECT_RETRIES && not_executed(&e) => {
                    attempt += 1;
                    tokio::time::sleep(Duration::from_millis(2 * attempt)).await;
                }
                Err(e) => return Err(self.fail(&e)),
            }
        };
        let (mut outcome, undo) = decode_reply_with_undo(&reply, hits.len())?;
        for (item, &i) in outcome.items.iter_mut().zip(&indices) {
            // A refund item passes whatever its probe saw.
            item.passed |= batch[i].kind == ItemKind::Refund;
        }
        Ok(Part {
            indices,
            outcome,
            undo,
        })
    }

    /// Takes back what an admitted part recorded (per algorithm: [`COMPENSATE`]).
    async fn undo(
        &self,
        conn: &ClusterConnection,
        batch: &[Item],
        part: &Part,
        now: Option<u64>,
    ) -> Result<(), LimiterError> {
        let mut call = CompensateCall::new(now);
        for (&i, &token) in part.indices.iter().zip(&part.undo) {
            if token > 0 {
                call.undo(&batch[i], token);
            }
        }
        if call.is_empty() {
            return Ok(());
        }
        let mut conn = conn.clone();
        let _: Value = call
            .invocation(&self.compensate)
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.fail(&e))?;
        Ok(())
    }

    /// Decides `batch`: one script call when its keys share a slot, else the phases of the
    /// module doc.
    async fn run(&self, batch: &[Item], now: Option<u64>) -> Result<BatchOutcome, LimiterError> {
        if batch.is_empty() {
            return Ok(BatchOutcome::from_backend(true, Vec::new()));
        }
        let conn = self.connection().await?;
        let groups = slot_groups(batch);
        if groups.len() == 1 {
            let all = (0..batch.len()).collect();
            return Ok(self.eval(&conn, batch, all, now, Mode::AsIs).await?.outcome);
        }
        let (checked, admitted) = self.check(&conn, batch, &groups, now).await;
        let items = if admitted {
            self.finish_admitted(&conn, batch, &groups, checked, now)
                .await?
        } else {
            self.finish_rejected(&conn, batch, &groups, checked, now)
                .await?
        };
        let items = items
            .into_iter()
            .collect::<Option<Vec<KeyOutcome>>>()
            .ok_or_else(|| LimiterError::Protocol("cluster batch item without outcome".into()))?;
        Ok(BatchOutcome::from_backend(admitted, items))
    }

    /// Phase 1: every group with a checking item, in parallel (its refunds as probes). Returns
    /// the parts and whether the request is admitted.
    async fn check(
        &self,
        conn: &ClusterConnection,
        batch: &[Item],
        groups: &[Vec<usize>],
        now: Option<u64>,
    ) -> (Vec<Result<Part, LimiterError>>, bool) {
        let checking = groups.iter().filter(|g| !only_refunds(batch, g));
        let parts =
            join_all(checking.map(|g| self.eval(conn, batch, g.clone(), now, Mode::Check))).await;
        let mut admitted = parts
            .iter()
            .all(|r| r.as_ref().is_ok_and(|p| p.outcome.admitted));
        // quota_mode across groups: some quota item must have passed somewhere. None passed
        // means none recorded, so the compensation only undoes the consume items.
        if admitted && batch.iter().any(|h| h.kind == ItemKind::Quota) {
            admitted = parts.iter().flatten().any(|p| {
                p.indices
                    .iter()
                    .zip(&p.outcome.items)
                    .any(|(&i, item)| batch[i].kind == ItemKind::Quota && item.passed)
            });
        }
        (parts, admitted)
    }

    /// Phase 2 of an admitted request: refunds never reject; they apply only once every group
    /// admitted. The other items of a refunded key go along as probes, so that they report the
    /// key as the request left it, as one script call would. Returns each item's outcome.
    async fn finish_admitted(
        &self,
        conn: &ClusterConnection,
        batch: &[Item],
        groups: &[Vec<usize>],
        checked: Vec<Result<Part, LimiterError>>,
        now: Option<u64>,
    ) -> Result<Vec<Option<KeyOutcome>>, LimiterError> {
        let refunds = groups.iter().filter(|g| has_refunds(batch, g)).map(|g| {
            let refunded = |key: &str| {
                g.iter()
                    .any(|&j| batch[j].kind == ItemKind::Refund && batch[j].key == key)
            };
            let idx: Vec<usize> = g
                .iter()
                .copied()
                .filter(|&i| refunded(&batch[i].key))
                .collect();
            self.eval(conn, batch, idx, now, Mode::Refund)
        });
        let refunded = join_all(refunds).await;
        let mut items: Vec<Option<KeyOutcome>> = vec![None; batch.len()];
        for part in checked.into_iter().chain(refunded) {
            let part = part?;
            for (k, &i) in part.indices.iter().enumerate() {
                let mut item = part.outcome.items[k];
                if let Some(checked) = items[i] {
                    // A probe of phase 2: the check was phase 1's.
                    item.passed = checked.passed;
                }
                items[i] = Some(item);
            }
        }
        Ok(items)
    }

    /// A rejected request: takes back what the admitted parts recorded and probes the groups
    /// of refunds alone, which phase 1 did not send (other slots, so neither sees the other).
    /// Returns each item's outcome, as the keys are once the compensation ran.
    async fn finish_rejected(
        &self,
        conn: &ClusterConnection,
        batch: &[Item],
        groups: &[Vec<usize>],
        checked: Vec<Result<Part, LimiterError>>,
        now: Option<u64>,
    ) -> Result<Vec<Option<KeyOutcome>>, LimiterError> {
        let admitted_parts = checked
            .iter()
            .filter_map(|r| r.as_ref().ok())
            .filter(|p| p.outcome.admitted);
        let probes = groups
            .iter()
            .filter(|g| only_refunds(batch, g))
            .map(|g| self.eval(conn, batch, g.clone(), now, Mode::Check));
        let (undone, probed) = futures_util::future::join(
            join_all(admitted_parts.map(|p| self.undo(conn, batch, p, now))),
            join_all(probes),
        )
        .await;
        for err in undone.into_iter().filter_map(Result::err) {
            tracing::warn!(error = %err, "cluster compensation failed; entries expire with their window");
        }
        let mut items: Vec<Option<KeyOutcome>> = vec![None; batch.len()];
        for part in checked.into_iter().chain(probed) {
            let part = part?;
            for (k, &i) in part.indices.iter().enumerate() {
                let mut item = part.outcome.items[k];
                if part.outcome.admitted {
                    // What the key holds once this part's own entries are gone again.
                    let undone: u64 = part
                        .indices
                        .iter()
                        .zip(&part.undo)
                        .filter(|&(&j, &token)| token > 0 && batch[j].key == batch[i].key)
                        .map(|(&j, _)| batch[j].counted_hits().min(MAX_EXACT))
                        .sum();
                    item = without_undone(item, &batch[i], undone);
                }
                items[i] = Some(item);
            }
        }
        Ok(items)
    }
}

/// Whether the group at `indices` has a refund item.
fn has_refunds(batch: &[Item], indices: &[usize]) -> bool {
    indices.iter().any(|&i| batch[i].kind == ItemKind::Refund)
}

/// Whether the group at `indices` has refund items only (phase 1 does not send it).
fn only_refunds(batch: &[Item], indices: &[usize]) -> bool {
    indices.iter().all(|&i| batch[i].kind == ItemKind::Refund)
}

#[async_trait]
impl Limiter for ClusterLimiter {
    async fn decide(
        &self,
        batch: &[Item],
        now_ms: Option<u64>,
    ) -> Result<BatchOutcome, LimiterError> {
        crate::limiter::check_holds(batch)?;
        self.run(batch, now_ms).await
    }

    async fn ping(&self) -> Result<(), LimiterError> {
        probe_within_timeout(async {
            let mut conn = self.connection().await?;
            let _: Value = redis::cmd("PING")
                .query_async(&mut conn)
                .await
                .map_err(|e| self.fail(&e))?;
            Ok(())
        })
        .await
    }

    fn name(&self) -> &'static str {
        "redis-cluster"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_match_redis() {
        // Values from `CLUSTER KEYSLOT` on a real server.
        assert_eq!(key_slot("foo"), 12182);
        assert_eq!(key_slot("bar"), 5061);
        assert_eq!(key_slot("{user1000}.following"), key_slot("user1000"));
        // An empty tag `{}` hashes the whole key; the first `{`...`}` pair decides.
        assert_eq!(key_slot("foo{}{bar}"), 8363);
        assert_ne!(key_slot("foo{}{bar}"), key_slot("bar"));
        assert_eq!(key_slot("foo{{bar}}zap"), 4015);
        assert_eq!(key_slot("foo{bar}{zap}"), 5061);
        assert_eq!(key_slot("bar}"), 6624);
        assert_eq!(key_slot("sluice:{a}"), 15495);
    }

    #[test]
    fn groups_keep_batch_order() {
        let hit = |key: &str| Item {
            key: key.into(),
            limit: 1,
            window_ms: 1,
            hits: 1,
            kind: ItemKind::Consume,
            over_limit: crate::limiter::OverLimit::default(),
            algorithm: crate::limiter::Algorithm::SlidingLog,
            lease: 0,
            hold_ms: 0,
        };
        let batch = [hit("sluice:{a}"), hit("sluice:{b}"), hit("sluice:{a}")];
        let mut groups = slot_groups(&batch);
        groups.sort();
        assert_eq!(groups, vec![vec![0, 2], vec![1]]);
    }
}
