//! Differential check: random batch sequences give identical outcomes on every backend.
//! The memory backend's logic is the pure reference in `window.rs`, so this pins the Lua
//! transcription to it (standalone Redis, batched script calls, Redis Cluster), including
//! cases nobody thought to write by hand. Failing cases proptest found are kept in
//! `tests/proptest-regressions/differential.txt` and replayed first.

use crate::helpers;

use std::sync::Arc;

use helpers::limiter::{T, cluster_limiter, decide_at, log_item, redis_limiter};
use helpers::raw_connection;
use proptest::prelude::*;
use sluice::limiter::memory::MemoryLimiter;
use sluice::limiter::redis::cluster::key_slot;
use sluice::limiter::{Algorithm, Item, ItemKind, Limiter, OverLimit, SystemClock};

/// Each key has one algorithm, as the engine's keys do (the algorithm is part of the key).
fn algorithm_of(key: &str, burst: u64) -> Algorithm {
    match key {
        "q" => Algorithm::QuantizedLog { quantum_ms: 100 },
        "s" => Algorithm::SlidingCounter,
        "g" => Algorithm::Gcra { burst },
        "f" => Algorithm::FixedWindow,
        "i" => Algorithm::InFlight,
        _ => Algorithm::SlidingLog,
    }
}

/// Each key has one window, as the engine's keys do (the window is part of the key), and the
/// windows differ, so that no edge of the script holds for 1,000 ms only.
fn window_of(key: &str) -> u64 {
    match key {
        "b" => 2500,
        "c" | "f" => 700,
        "q" => 1500,
        "s" => 1200,
        "g" => 900,
        "i" => 800,
        _ => 1000,
    }
}

/// The keys of the generated traces; see [`algorithm_of`] and [`window_of`].
const KEYS: [&str; 8] = ["a", "b", "c", "q", "s", "g", "f", "i"];

fn arb_hit() -> impl Strategy<Value = Item> {
    let kind = prop_oneof![
        4 => Just(ItemKind::Consume),
        2 => Just(ItemKind::Shadow),
        1 => Just(ItemKind::Refund),
        2 => Just(ItemKind::Quota),
    ];
    // Small limits meet their edges often; large ones take weights of thousands.
    let limit = prop_oneof![4 => 0u64..6, 1 => 100u64..5000];
    let hits = prop_oneof![8 => 0u64..4, 1 => Just(u64::MAX), 2 => 5u64..2000];
    let over_limit = prop_oneof![
        2 => Just(OverLimit::Fill),
        1 => Just(OverLimit::Refuse),
        1 => Just(OverLimit::Record),
    ];
    // Few lease tokens, so that refunds name live leases and recordings renew them; 0 too.
    let lease = 0u64..5;
    // Held items (reservations) on the sliding-log keys, dated up to 1.5 windows ahead; the
    // other algorithms refuse a hold, so their items get none.
    let hold = prop_oneof![3 => Just(0u64), 1 => 1u64..1500];
    (
        prop::sample::select(KEYS.to_vec()),
        limit,
        hits,
        kind,
        0u64..6,
        over_limit,
        (lease, hold),
    )
        .prop_map(
            |(key, limit, hits, kind, burst, over_limit, (lease, hold))| {
                let algorithm = algorithm_of(key, burst);
                Item {
                    algorithm,
                    over_limit,
                    lease,
                    hold_ms: if algorithm == Algorithm::SlidingLog {
                        hold
                    } else {
                        0
                    },
                    ..log_item(key, limit, window_of(key), hits, kind)
                }
            },
        )
}

/// (time step in ms, may be negative: clocks of other instances lag; batch)
fn arb_steps() -> impl Strategy<Value = Vec<(i64, Vec<Item>)>> {
    prop::collection::vec(
        (-100i64..700, prop::collection::vec(arb_hit(), 0..4)),
        1..12,
    )
}

type Steps = Vec<(i64, Vec<Item>)>;

/// [`arb_steps`] without the cases in which the cluster backend cannot act like one script
/// (docs/algorithms.md, "Redis Cluster"), each narrowed as little as it takes:
///
/// 1. In a batch spanning slots, a refund item before a recording item of the same key. One
///    script (memory, standalone Redis, a single-slot batch) applies the refund to what the
///    key held before, then records; across slots the refund waits until every slot admitted
///    (it could not be taken back exactly if another slot rejected), so it takes back the
///    newest entries, the ones this batch just recorded: which entries remain differs, and
///    the count too when the refund exceeds what the key held. Such batches get their refund
///    items moved to the end, where both orders agree.
/// 2. A fixed-window, sliding-counter or GCRA key touched at a `now` before a batch spanning
///    slots that recorded on it. If that batch was rejected, its slot had already stored the
///    key brought to that batch's `now` (window rotated, GCRA refill applied) and the
///    compensation only takes the hits back: the same state later, but not earlier, where one
///    script (which stores nothing on a rejection) still sees the old window or less refill.
///    Such a batch runs at that later time instead.
/// 3. GCRA items of one key with different rates (`limit`) in one trace, for the same reason:
///    the refill up to the compensated batch's `now` was applied at that batch's rate, where
///    one script applies the next item's rate to the whole interval. Here a trace keeps the
///    first rate of its GCRA key (production keys keep their rate until a reload changes it).
/// 4. In a batch spanning slots, a shadow or quota item over its limit with `fill` (or `record`
///    cut at `MAX_COUNT`) after an item of the same key that recorded its hits. Its take is
///    measured after what the earlier item records: the admitted slot recorded both, and the
///    compensation takes the earlier item's hits back when another slot rejects, where one
///    script, rejecting, would have measured the take without them (so filled more). Such an
///    item becomes `refuse`, whose take never depends on the earlier items.
/// 5. An `in_flight` item that renews a live lease (records a token that holds one) in a batch
///    spanning slots that another slot rejects: the renewal moved the lease to the batch's
///    time, and compensation only takes back leases the batch added, where one script leaves
///    the lease where it was. The engine gives every request a fresh token, so here every
///    recording `in_flight` item gets a token of its own (refunds keep the generated ones,
///    which name those tokens or none).
/// 6. A held item (`hold_ms`) in a batch spanning slots that another slot rejects, on a key that
///    an item of the batch records on whatever the verdict (`record`, or `fill` over its limit).
///    The admitted slot dated that entry after the held one's (entries never go back in time),
///    and compensation takes only the held entry back, where one script, rejecting, dates it at
///    `now`; or the held entry stays and the entry compensation removed was the key's oldest, of
///    which the slot's reply still reports the reset. The Rate Limit Quota Service's
///    reservations, the only held items, are `refuse` and alone on their keys; here every item
///    of a held item's key in such a batch becomes `refuse`.
fn arb_steps_cluster() -> impl Strategy<Value = Steps> {
    arb_steps().prop_map(|steps| {
        let o1 = |h: &Item| {
            matches!(
                h.algorithm,
                Algorithm::FixedWindow | Algorithm::SlidingCounter | Algorithm::Gcra { .. }
            )
        };
        let records = |h: &Item| h.kind != ItemKind::Refund && h.hits > 0;
        let gcra_rate = steps
            .iter()
            .flat_map(|(_, b)| b)
            .find(|h| matches!(h.algorithm, Algorithm::Gcra { .. }))
            .map(|h| h.limit);
        // Latest `now` of a batch spanning slots that recorded on each O(1) key (rule 2).
        let mut settled: std::collections::HashMap<String, u64> = Default::default();
        let (mut now, mut shifted) = (T, T);
        let mut out = Vec::with_capacity(steps.len());
        let mut fresh = 4;
        for (step, mut batch) in steps {
            for h in batch.iter_mut() {
                if h.algorithm != Algorithm::InFlight {
                    continue;
                }
                if h.kind != ItemKind::Refund {
                    fresh += 1; // rule 5
                    h.lease = fresh;
                } else if h.lease > 0 {
                    h.lease = fresh + 1 - h.lease; // one of the last four tokens given
                }
            }
            now = now.saturating_add_signed(step);
            let spans_slots = batch
                .iter()
                .any(|h| key_slot(&h.key) != key_slot(&batch[0].key));
            if spans_slots {
                // Rule 1. Stable: the order among refunds and among the rest is kept.
                batch.sort_by_key(|h| h.kind == ItemKind::Refund);
                // Rule 6.
                let held: Vec<String> = batch
                    .iter()
                    .filter(|h| h.hold_ms > 0)
                    .map(|h| h.key.clone())
                    .collect();
                for h in batch.iter_mut().filter(|h| held.contains(&h.key)) {
                    h.over_limit = OverLimit::Refuse;
                }
                // Rule 4.
                for i in 0..batch.len() {
                    let after_a_record = batch[..i].iter().any(|e| {
                        e.key == batch[i].key && records(e) && e.over_limit != OverLimit::Record
                    });
                    if after_a_record && matches!(batch[i].kind, ItemKind::Shadow | ItemKind::Quota)
                    {
                        batch[i].over_limit = OverLimit::Refuse;
                    }
                }
            }
            for h in batch.iter_mut() {
                if let (Algorithm::Gcra { .. }, Some(rate)) = (h.algorithm, gcra_rate) {
                    h.limit = rate; // rule 3
                }
            }
            let at = batch
                .iter()
                .filter_map(|h| settled.get(&h.key))
                .fold(now, |at, &s| at.max(s)); // rule 2
            if spans_slots {
                for h in batch.iter().filter(|h| o1(h) && records(h)) {
                    settled.insert(h.key.clone(), at);
                }
            }
            out.push((at as i64 - shifted as i64, batch));
            shifted = at;
        }
        out
    })
}

/// The log keys of the traces: sliding logs and the quantized log.
const LOG_KEYS: [&str; 4] = ["a", "b", "c", "q"];

/// A backend under test and what the differential check reads from its Redis.
struct UnderTest<'a> {
    limiter: &'a Arc<dyn Limiter>,
    /// Empties every node.
    flush: &'a dyn Fn(),
    /// The keys Redis has expired on its own clock so far, summed over the nodes.
    expired: &'a dyn Fn() -> u64,
    /// The entries the backend holds for a log key.
    stored: Option<&'a dyn Fn(&str) -> usize>,
    /// The leases the backend holds for the `in_flight` key, as (time, token).
    held: Option<&'a dyn Fn() -> Vec<(u64, u64)>>,
}

/// Feeds each generated trace to a fresh memory limiter and to `backend` (emptied by `flush`
/// first) at the same virtual times, and requires the same outcome for every batch. With
/// `stored`, also the same entries after every batch: one per recording item for a sliding log,
/// one per bucket for a quantized log; with `held`, the same leases.
///
/// The traces run on the explicit clock, but Redis expires keys on its own: a TTL the script
/// sets from the explicit clock runs out after that many real milliseconds. Virtual time runs
/// far ahead of real time in a trace, so that mostly costs nothing (Redis drops keys whose
/// entries the explicit clock has already retired), except when a key's TTL is shorter than
/// the real time to its next use (a few ms on a loaded machine) while the next batch comes
/// sooner on the explicit clock: Redis has dropped a key the reference still counts. The script
/// is deterministic on the explicit clock, so a disagreement is replayed: one that comes back
/// fails; one that does not, in a case where Redis expired a key on its own (INFO's
/// `expired_keys` rose), was Redis's clock and the case is discarded; one that does not
/// without such an expiry fails too.
fn agrees_with_memory(
    rt: &tokio::runtime::Runtime,
    backend: UnderTest,
    steps: impl Strategy<Value = Steps>,
    cases: u32,
) {
    let config = ProptestConfig {
        cases,
        ..ProptestConfig::default()
    };
    proptest!(config, |(steps in steps)| {
        let expired_before = (backend.expired)();
        let Err(first) = run_trace(rt, &backend, &steps) else {
            return Ok(());
        };
        let expired = (backend.expired)() != expired_before;
        if let Err(again) = run_trace(rt, &backend, &steps) {
            prop_assert!(false, "{}", again);
        }
        prop_assume!(!expired, "Redis expired a key on its own clock");
        prop_assert!(
            false,
            "{}\n(the replay agreed, and Redis expired no key: not its clock)",
            first
        );
    });
}

/// Runs one trace on a fresh reference and on the emptied backend; the first disagreement,
/// described, if any.
fn run_trace(
    rt: &tokio::runtime::Runtime,
    backend: &UnderTest,
    steps: &Steps,
) -> Result<(), String> {
    (backend.flush)();
    let reference = Arc::new(MemoryLimiter::new(Arc::new(SystemClock)));
    let memory: Arc<dyn Limiter> = reference.clone();
    let mut now = T;
    for (step, batch) in steps {
        now = now.saturating_add_signed(*step);
        let m = rt.block_on(decide_at(&memory, batch, now));
        let r = rt.block_on(decide_at(backend.limiter, batch, now));
        if m != r {
            return Err(format!(
                "batch {batch:?} at {now}: memory {m:?}, backend {r:?}"
            ));
        }
        if let Some(stored) = backend.stored {
            for key in LOG_KEYS {
                let (m, r) = (reference.log_entries(key), stored(key));
                if m != r {
                    return Err(format!(
                        "entries of {key} after {batch:?} at {now}: memory {m}, backend {r}"
                    ));
                }
            }
        }
        if let Some(held) = backend.held {
            let (m, r) = (reference.leases("i"), held());
            if m != r {
                return Err(format!(
                    "leases after {batch:?} at {now}: memory {m:?}, backend {r:?}"
                ));
            }
        }
    }
    Ok(())
}

/// The entries a standalone Redis holds for a log key of the traces.
async fn stored_entries(conn: &redis::aio::MultiplexedConnection, key: &str) -> usize {
    use sluice::limiter::redis::script::LOG_TOTAL_MEMBER;
    let mut conn = conn.clone();
    if key == "q" {
        let buckets: usize = redis::cmd("HLEN")
            .arg(key)
            .query_async(&mut conn)
            .await
            .expect("hlen");
        return buckets;
    }
    let members: usize = redis::cmd("ZCARD")
        .arg(key)
        .query_async(&mut conn)
        .await
        .expect("zcard");
    let total: Option<String> = redis::cmd("ZSCORE")
        .arg(key)
        .arg(LOG_TOTAL_MEMBER)
        .query_async(&mut conn)
        .await
        .expect("zscore");
    members - usize::from(total.is_some())
}

/// The leases a standalone Redis holds for the `in_flight` key, as (time, token), sorted.
async fn held_leases(conn: &redis::aio::MultiplexedConnection) -> Vec<(u64, u64)> {
    let members: Vec<(u64, u64)> = redis::cmd("ZRANGE")
        .arg("i")
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query_async(&mut conn.clone())
        .await
        .expect("zrange");
    let mut leases: Vec<(u64, u64)> = members.into_iter().map(|(m, s)| (s, m)).collect();
    leases.sort_unstable();
    leases
}

/// The keys Redis has expired on its own clock since it started (INFO's `expired_keys`).
async fn expired_keys(conn: &redis::aio::MultiplexedConnection) -> u64 {
    helpers::info_number(conn, "stats", "expired_keys").await
}

async fn flushall(conn: &redis::aio::MultiplexedConnection) {
    let _: () = redis::cmd("FLUSHALL")
        .query_async(&mut conn.clone())
        .await
        .expect("flushall");
}

#[test]
fn memory_and_redis_agree() {
    let server = helpers::RedisServer::start();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let redis_limiter = rt.block_on(redis_limiter(&server));
    let raw = rt.block_on(raw_connection(&server.url()));
    let flush = || rt.block_on(flushall(&raw));
    let stored = |key: &str| rt.block_on(stored_entries(&raw, key));
    let held = || rt.block_on(held_leases(&raw));
    let expired = || rt.block_on(expired_keys(&raw));
    let backend = UnderTest {
        limiter: &redis_limiter,
        flush: &flush,
        expired: &expired,
        stored: Some(&stored),
        held: Some(&held),
    };
    agrees_with_memory(&rt, backend, arb_steps(), 500);
}

/// A Redis of its own with sluice's function library loaded, the runtime and a connection to it.
fn redis_with_library() -> (
    helpers::RedisServer,
    tokio::runtime::Runtime,
    redis::aio::MultiplexedConnection,
) {
    let server = helpers::RedisServer::start();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let db = rt.block_on(raw_connection(&server.url()));
    let _: redis::Value = rt
        .block_on(
            sluice::limiter::redis::script::LIBRARY
                .load()
                .query_async(&mut db.clone()),
        )
        .expect("FUNCTION LOAD");
    (server, rt, db)
}

/// A batched call (several requests in one `FCALL`, sharing one `now`) answers every
/// request exactly as separate calls in the same order do: same replies, undo tokens
/// included, on every algorithm. The batched call works on the generator's keys, the separate
/// calls on the same keys under a `separate:` prefix, each round of requests at its own time.
/// Both go in one MULTI/EXEC: the keys' TTLs run on Redis's own clock, and calls a few
/// milliseconds apart could otherwise see a key expire between them that the explicit clock
/// still counts (Redis 7 samples the time once for a transaction).
#[test]
fn batched_call_equals_separate_calls() {
    use sluice::limiter::redis::script::DecideCall;
    let (_server, rt, db) = redis_with_library();
    let rounds = prop::collection::vec(
        (
            0i64..700,
            prop::collection::vec(prop::collection::vec(arb_hit(), 1..4), 1..6),
        ),
        1..8,
    );
    let config = ProptestConfig {
        cases: 300,
        ..ProptestConfig::default()
    };
    proptest!(config, |(rounds in rounds)| {
        rt.block_on(flushall(&db));
        let mut now = T;
        for (step, requests) in rounds {
            now += step as u64;
            let mut pipe = redis::pipe();
            pipe.atomic();
            let batched: Vec<&[Item]> = requests.iter().map(Vec::as_slice).collect();
            pipe.add_command(DecideCall::batched(batched, Some(now)).fcall());
            for request in &requests {
                let separate: Vec<Item> = request
                    .iter()
                    .map(|hit| Item {
                        key: format!("separate:{}", hit.key),
                        ..hit.clone()
                    })
                    .collect();
                pipe.add_command(DecideCall::single(&separate, Some(now)).fcall());
            }
            let mut replies: Vec<redis::Value> = rt
                .block_on(pipe.query_async(&mut db.clone()))
                .expect("batched and separate calls");
            prop_assert_eq!(replies.len(), 1 + requests.len());
            let separate = replies.split_off(1);
            let redis::Value::Array(batched) = replies.remove(0) else {
                panic!("batched reply is not an array: {replies:?}");
            };
            prop_assert_eq!(batched.len(), requests.len());
            for ((request, batched_reply), separate) in requests.iter().zip(batched).zip(separate) {
                prop_assert_eq!(&batched_reply, &separate, "request {:?} at {}", request, now);
            }
        }
    });
}

/// A request of one item, and the same item followed by a zero-hit shadow probe of a fresh key
/// (which changes neither the verdict nor the item's outcome), get the same verdict and item
/// outcome after the same steps. The Lua decides the first without its general path when it can
/// (`decide_one` in decide.lua: a sliding-log consume item that fits, nothing expired) and the
/// second always on it, so this holds the two paths to the same replies and the same writes (each
/// on keys of its own, the pair in one MULTI/EXEC so that both see one Redis clock).
#[test]
fn one_item_alone_equals_the_general_path() {
    use sluice::limiter::redis::script::{DecideCall, REPLY_HEAD, REPLY_PER_ITEM};
    let (_server, rt, db) = redis_with_library();
    let steps = prop::collection::vec((0i64..700, arb_hit()), 1..30);
    let config = ProptestConfig {
        cases: 300,
        ..ProptestConfig::default()
    };
    proptest!(config, |(steps in steps)| {
        rt.block_on(flushall(&db));
        let mut now = T;
        for (n, (step, hit)) in steps.iter().enumerate() {
            now += *step as u64;
            let alone = [hit.clone()];
            let probe = log_item(&format!("probe:{n}"), 1, 1000, 0, ItemKind::Shadow);
            let general = [
                Item {
                    key: format!("general:{}", hit.key),
                    ..hit.clone()
                },
                probe,
            ];
            let mut pipe = redis::pipe();
            pipe.atomic();
            pipe.add_command(DecideCall::single(&alone, Some(now)).fcall());
            pipe.add_command(DecideCall::single(&general, Some(now)).fcall());
            let replies: Vec<redis::Value> = rt
                .block_on(pipe.query_async(&mut db.clone()))
                .expect("the two calls");
            let (redis::Value::Array(alone), redis::Value::Array(general)) =
                (&replies[0], &replies[1])
            else {
                panic!("replies are not arrays: {replies:?}");
            };
            let one = REPLY_HEAD + REPLY_PER_ITEM;
            prop_assert_eq!(&alone[..], &general[..one], "{:?} at {}", hit, now);
        }
    });
}

/// The same traces against a 3-primary cluster. Every key of the generator hashes to its own
/// slot and the slots spread over all three primaries, so any batch with two keys is a
/// multi-slot request: parallel per-slot scripts, and compensation when one slot rejects.
#[test]
fn memory_and_redis_cluster_agree() {
    let cluster = helpers::RedisCluster::start();
    let slots: std::collections::BTreeSet<u16> = KEYS.iter().map(|k| key_slot(k)).collect();
    assert_eq!(slots.len(), KEYS.len(), "every key in its own slot");
    let owners: std::collections::BTreeSet<usize> =
        slots.iter().map(|&s| cluster.owner(s)).collect();
    assert_eq!(owners.len(), 3, "keys on every primary");

    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let limiter: Arc<dyn Limiter> = Arc::new(rt.block_on(cluster_limiter(&cluster)));
    let nodes: Vec<_> = cluster
        .nodes
        .iter()
        .map(|n| rt.block_on(raw_connection(&n.url())))
        .collect();
    let flush = || {
        rt.block_on(async {
            for node in &nodes {
                flushall(node).await;
            }
        })
    };
    let expired = || {
        rt.block_on(async {
            let mut sum = 0;
            for node in &nodes {
                sum += expired_keys(node).await;
            }
            sum
        })
    };
    let backend = UnderTest {
        limiter: &limiter,
        flush: &flush,
        expired: &expired,
        stored: None,
        held: None,
    };
    agrees_with_memory(&rt, backend, arb_steps_cluster(), 1000);
}
