//! Unit tests of script.rs: the generated header, the codes Rust sends, the reply decoding.

use super::*;
use crate::limiter::{Algorithm, Item, ItemKind, OverLimit};
use std::collections::BTreeSet;

/// Each line of the generated header is `local NAME = <Lua literal>`: an integer the scripts
/// compute exactly or a quoted lowercase code. (A Rust literal with a suffix or underscores,
/// or an expression, would not be Lua.)
#[test]
fn the_lua_header_is_plain_lua_literals() {
    let mut names = 0;
    for line in LUA_HEADER.lines().filter(|line| !line.starts_with("--")) {
        let (name, value) = line
            .strip_prefix("local ")
            .and_then(|rest| rest.split_once(" = "))
            .unwrap_or_else(|| panic!("not a Lua constant: {line}"));
        assert!(
            name.chars().all(|c| c.is_ascii_uppercase() || c == '_'),
            "{line}"
        );
        let number = value.parse::<u64>().is_ok_and(|n| n <= MAX_EXACT);
        let code = value
            .strip_prefix('"')
            .and_then(|v| v.strip_suffix('"'))
            .is_some_and(|v| !v.is_empty() && v.chars().all(|c| c.is_ascii_lowercase()));
        assert!(number || code, "{line}");
        names += 1;
    }
    assert_eq!(names, header_names().len());
    assert!(LUA_HEADER.contains(&format!("local ARGS_PER_ITEM = {ARGS_PER_ITEM}\n")));
    assert!(LUA_HEADER.contains(&format!("local KIND_REFUND = \"{KIND_REFUND}\"\n")));
}

fn header_names() -> BTreeSet<&'static str> {
    LUA_HEADER
        .lines()
        .filter_map(|line| line.strip_prefix("local ")?.split(" = ").next())
        .collect()
}

/// Every algorithm, over limit and kind has a code of its own (the Lua tells them apart).
#[test]
fn codes_are_distinct() {
    let algorithms = [
        Algorithm::SlidingLog,
        Algorithm::QuantizedLog { quantum_ms: 100 },
        Algorithm::SlidingCounter,
        Algorithm::Gcra { burst: 5 },
        Algorithm::FixedWindow,
        Algorithm::InFlight,
    ];
    let codes: BTreeSet<_> = algorithms.into_iter().map(algorithm_code).collect();
    assert_eq!(codes.len(), algorithms.len());
    let over_limits = [OverLimit::Refuse, OverLimit::Fill, OverLimit::Record];
    let codes: BTreeSet<_> = over_limits.into_iter().map(over_limit_code).collect();
    assert_eq!(codes.len(), over_limits.len());
    let kinds = [
        ItemKind::Consume,
        ItemKind::Shadow,
        ItemKind::Refund,
        ItemKind::Quota,
    ];
    let codes: BTreeSet<_> = kinds.into_iter().map(kind_code).collect();
    assert_eq!(codes.len(), kinds.len());
}

fn gcra_quota() -> Item {
    Item {
        key: "k".into(),
        limit: u64::MAX,
        window_ms: 60_000,
        hits: 1,
        kind: ItemKind::Quota,
        over_limit: OverLimit::Record,
        algorithm: Algorithm::Gcra { burst: 3 },
        lease: 9,
        hold_ms: 0,
    }
}

/// The parameter is the algorithm's: the quantum, the burst, the lease token; 0 otherwise.
#[test]
fn the_parameter_is_the_algorithms() {
    let with = |algorithm| {
        ItemArgs::of(&Item {
            algorithm,
            ..gcra_quota()
        })
        .param
    };
    assert_eq!(with(Algorithm::QuantizedLog { quantum_ms: 250 }), 250);
    assert_eq!(with(Algorithm::Gcra { burst: 7 }), 7);
    assert_eq!(with(Algorithm::InFlight), 9, "the lease token");
    assert_eq!(with(Algorithm::SlidingLog), 0);
    assert_eq!(with(Algorithm::FixedWindow), 0);
}

/// The `ARGV` values of a call (after `FCALL`, the function's name and the key count, and the
/// keys).
fn argv(cmd: &redis::Cmd, keys: usize) -> Vec<String> {
    cmd.args_iter()
        .skip(3 + keys)
        .map(|arg| match arg {
            redis::Arg::Simple(bytes) => String::from_utf8_lossy(bytes).into_owned(),
            other => panic!("not a plain argument: {other:?}"),
        })
        .collect()
}

/// An item is [`ARGS_PER_ITEM`] arguments, each at its `ARG_*` offset, capped for Lua.
#[test]
fn an_item_is_its_named_arguments() {
    let hit = gcra_quota();
    let args = argv(&DecideCall::single(&[hit], Some(5)).fcall(), 1);
    assert_eq!(args.len(), 1 + ARGS_PER_ITEM, "{args:?}");
    let at = |offset: usize| args[offset].as_str();
    assert_eq!(at(0), "5", "the clock");
    assert_eq!(at(ARG_LIMIT), (MAX_EXACT - 1).to_string());
    assert_eq!(at(ARG_WINDOW_MS), "60000");
    assert_eq!(at(ARG_HITS), "1");
    assert_eq!(at(ARG_KIND), KIND_QUOTA);
    assert_eq!(at(ARG_ALGORITHM), ALGORITHM_GCRA);
    assert_eq!(at(ARG_PARAM), "3");
    assert_eq!(at(ARG_OVER_LIMIT), OVER_LIMIT_RECORD);
}

/// A batched call: the marker, the clock, the request count and sizes, then every item.
#[test]
fn a_batched_call_lists_its_requests() {
    let one = [gcra_quota()];
    let two = [gcra_quota(), gcra_quota()];
    let cmd = DecideCall::batched(vec![&one, &two], None).fcall();
    let args = argv(&cmd, 3);
    assert_eq!(args[..5], [BATCHED, "", "2", "1", "2"]);
    assert_eq!(args.len(), 5 + 3 * ARGS_PER_ITEM);
    assert!(
        matches!(cmd.args_iter().nth(2), Some(redis::Arg::Simple(b"3"))),
        "the key count"
    );
}

/// The library and the compensation script start with their declaration lines, exactly (Redis
/// reads the library's name and the script's flags from them); the function's name is the one
/// `FCALL` sends, and the library registers it without flags (no `allow-oom`).
#[test]
fn the_lua_starts_with_its_declaration() {
    let mut lines = LIBRARY.source.lines();
    let name = lines
        .next()
        .and_then(|line| line.strip_prefix("#!lua name=sluice_"));
    let hash = name.expect("the library's declaration line");
    assert_eq!(hash.len(), 16);
    assert_eq!(LIBRARY.decide, format!("sluice_decide_{hash}"));
    assert_eq!(
        lines.next(),
        Some(format!("local DECIDE_FUNCTION = '{}'", LIBRARY.decide).as_str())
    );
    assert!(LIBRARY.source.contains(
        "redis.register_function{function_name = DECIDE_FUNCTION, callback = decide_call}"
    ));
    let fcall = LIBRARY.fcall();
    let mut args = fcall.args_iter();
    assert!(matches!(args.next(), Some(redis::Arg::Simple(b"FCALL"))));
    assert!(matches!(args.next(), Some(redis::Arg::Simple(f)) if f == LIBRARY.decide.as_bytes()));
    assert_eq!(COMPENSATE.lines().next(), Some(COMPENSATE_SHEBANG));
}

/// luacheck reads each .lua file alone, so .luacheckrc reads the header's names from this
/// file's source, as scripts/bench/assemble-script.py does: every `NAME: type = value;` line
/// inside `shared_with_lua! {`. This keeps that reading equal to what script.rs generates.
#[test]
fn the_header_names_can_be_read_from_the_source() {
    let source = include_str!("../script.rs");
    let block = source
        .split("\nshared_with_lua! {\n")
        .nth(1)
        .and_then(|rest| rest.split("\n}\n").next())
        .expect("a `shared_with_lua! {...}` block in script.rs");
    let listed: BTreeSet<&str> = block
        .lines()
        .filter_map(|line| line.trim_start().split_once(": "))
        .map(|(name, _)| name)
        .filter(|name| name.chars().all(|c| c.is_ascii_uppercase() || c == '_'))
        .collect();
    assert_eq!(listed, header_names());
    let rc = include_str!("../../../../.luacheckrc");
    assert!(rc.contains("src/limiter/redis/script.rs"), "{rc}");
}

fn ints(v: &[i64]) -> Value {
    Value::Array(v.iter().map(|&n| Value::Int(n)).collect())
}

#[test]
fn decodes_a_two_item_reply() {
    let out = decode_reply(&ints(&[0, 1, 3, 250, 0, 0, 5, 1000, 0]), 2).expect("valid reply");
    assert_eq!(
        out,
        BatchOutcome {
            admitted: false,
            items: vec![
                KeyOutcome {
                    passed: true,
                    count: 3,
                    reset_ms: 250
                },
                KeyOutcome {
                    passed: false,
                    count: 5,
                    reset_ms: 1000
                },
            ],
            answered_by: crate::limiter::AnsweredBy::Backend,
        }
    );
}

#[test]
fn decodes_each_items_undo_token() {
    let reply = ints(&[1, 1, 3, 250, 7, 1, 5, 1000, 0]);
    let (out, undo) = decode_reply_with_undo(&reply, 2).expect("valid reply");
    assert!(out.admitted);
    assert_eq!(undo, [7, 0]);
    assert_eq!(out.items[1].count, 5);
}

#[test]
fn decodes_an_empty_batch() {
    let out = decode_reply(&ints(&[1]), 0).expect("valid reply");
    assert!(out.admitted);
    assert!(out.items.is_empty());
}

#[test]
fn decodes_batched_replies_per_group() {
    // A group the script refused arrives as an error inside the array, as Redis sends it.
    let refused = redis::parse_redis_value(b"-ERR sluice: bad kind in item 1\r\n")
        .expect("an error reply parses");
    assert!(matches!(refused, Value::ServerError(_)), "{refused:?}");
    let reply = Value::Array(vec![
        ints(&[1, 1, 1, 999, 7]),
        ints(&[0, 0, 2, 500, 0, 1, 3, 40, 0]),
        refused,
    ]);
    let groups = decode_batched_reply(&reply, &[1, 2, 0]).expect("valid batched reply");
    assert_eq!(groups.len(), 3);
    let first = groups[0].as_ref().expect("group 1");
    assert!(first.admitted);
    assert_eq!(first.items[0].count, 1);
    let second = groups[1].as_ref().expect("group 2");
    assert!(!second.admitted);
    assert_eq!(second.items[1].reset_ms, 40);
    assert!(matches!(groups[2], Err(LimiterError::Protocol(_))));
    // A group whose size does not match its reply fails alone.
    let groups = decode_batched_reply(&reply, &[2, 2, 0]).expect("outer shape is fine");
    assert!(groups[0].is_err() && groups[1].is_ok());
    assert!(decode_batched_reply(&reply, &[1, 2]).is_err());
    assert!(decode_batched_reply(&Value::Nil, &[1]).is_err());
}

#[test]
fn rejects_malformed_replies() {
    let bad = [
        (Value::Nil, 0),
        (Value::Int(1), 0),
        (ints(&[1, 1, 0]), 1),
        (ints(&[1, 1, 0, 0]), 1),
        (ints(&[1, 1, 0, 0, 9, 9]), 1),
        (ints(&[2, 1, 0, 0, 0]), 1),
        (ints(&[1, 7, 0, 0, 0]), 1),
        (ints(&[1, 1, -1, 0, 0]), 1),
        (ints(&[1, 1, 1, 0, -5]), 1),
        (
            Value::Array(vec![
                Value::Int(1),
                Value::BulkString(b"1".to_vec()),
                Value::Int(0),
                Value::Int(0),
                Value::Int(0),
            ]),
            1,
        ),
    ];
    for (value, items) in bad {
        match decode_reply(&value, items) {
            Err(LimiterError::Protocol(_)) => {}
            other => panic!("{value:?} decoded to {other:?}"),
        }
    }
}
