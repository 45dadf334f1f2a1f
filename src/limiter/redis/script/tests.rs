//! Unit tests of script.rs: the generated header, the codes Rust sends, the reply decoding.

use super::*;
use crate::limiter::Algorithm;
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

/// The codes Rust sends ([`Algorithm::code`]) are the ones the Lua compares with.
#[test]
fn algorithm_codes_are_the_header_constants() {
    let all = [
        Algorithm::SlidingLog,
        Algorithm::QuantizedLog { quantum_ms: 100 },
        Algorithm::SlidingCounter,
        Algorithm::Gcra { burst: 5 },
        Algorithm::FixedWindow,
        Algorithm::InFlight,
    ];
    for algorithm in all {
        // Exhaustive: a new algorithm does not compile without its constant.
        let constant = match algorithm {
            Algorithm::SlidingLog => ALGORITHM_SLIDING_LOG,
            Algorithm::QuantizedLog { .. } => ALGORITHM_QUANTIZED_LOG,
            Algorithm::SlidingCounter => ALGORITHM_SLIDING_COUNTER,
            Algorithm::Gcra { .. } => ALGORITHM_GCRA,
            Algorithm::FixedWindow => ALGORITHM_FIXED_WINDOW,
            Algorithm::InFlight => ALGORITHM_IN_FLIGHT,
        };
        assert_eq!(algorithm.code(), constant, "{algorithm:?}");
    }
    let distinct: BTreeSet<_> = all.iter().map(|a| a.code()).collect();
    assert_eq!(distinct.len(), all.len());
}

/// The codes Rust sends ([`OverLimit::code`]) are the ones the Lua compares with.
#[test]
fn over_limit_codes_are_the_header_constants() {
    use crate::limiter::OverLimit;
    let all = [OverLimit::Refuse, OverLimit::Fill, OverLimit::Record];
    for over_limit in all {
        let constant = match over_limit {
            OverLimit::Refuse => OVER_LIMIT_REFUSE,
            OverLimit::Fill => OVER_LIMIT_FILL,
            OverLimit::Record => OVER_LIMIT_RECORD,
        };
        assert_eq!(over_limit.code(), constant, "{over_limit:?}");
    }
    let distinct: BTreeSet<_> = all.iter().map(|o| o.code()).collect();
    assert_eq!(distinct.len(), all.len());
}

/// An item takes [`ARGS_PER_ITEM`] arguments however it is sent.
#[test]
fn an_item_is_args_per_item_arguments() {
    let hit = Hit {
        key: "k".into(),
        limit: u64::MAX,
        window_ms: 60_000,
        hits: 1,
        kind: crate::limiter::HitKind::Quota,
        over_limit: crate::limiter::OverLimit::Record,
        algorithm: Algorithm::Gcra { burst: 3 },
        lease: 0,
    };
    let mut cmd = redis::cmd("EVALSHA");
    push_item_args(&mut cmd, item_args(&hit));
    let args: Vec<String> = cmd
        .args_iter()
        .map(|arg| match arg {
            redis::Arg::Simple(bytes) => String::from_utf8_lossy(bytes).into_owned(),
            other => panic!("not a plain argument: {other:?}"),
        })
        .collect();
    assert_eq!(args.len(), 1 + ARGS_PER_ITEM, "{args:?}");
    let limit = (MAX_EXACT - 1).to_string();
    assert_eq!(
        args[1..],
        [
            &limit,
            "60000",
            "1",
            KIND_QUOTA,
            ALGORITHM_GCRA,
            "3",
            OVER_LIMIT_RECORD
        ]
    );
}

/// Each script starts with its declaration line, exactly (Redis reads the flags from it).
#[test]
fn scripts_start_with_their_declaration() {
    assert_eq!(SCRIPT.lines().next(), Some(SCRIPT_SHEBANG));
    assert_eq!(COMPENSATE.lines().next(), Some(COMPENSATE_SHEBANG));
    assert!(!SCRIPT_SHEBANG.contains("allow-oom"));
}

/// luacheck reads each .lua file alone, so .luacheckrc lists the header's names; this keeps
/// the list equal to what script.rs generates.
#[test]
fn luacheckrc_lists_the_header() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/.luacheckrc");
    let rc = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let list = rc
        .split("local header = {")
        .nth(1)
        .and_then(|rest| rest.split('}').next())
        .expect("a `local header = {...}` list in .luacheckrc");
    let listed: BTreeSet<&str> = list
        .split(',')
        .map(|name| name.trim().trim_matches('"'))
        .filter(|name| !name.is_empty())
        .collect();
    assert_eq!(listed, header_names());
}

fn ints(v: &[i64]) -> Value {
    Value::Array(v.iter().map(|&n| Value::Int(n)).collect())
}

#[test]
fn decodes_a_two_item_reply() {
    let out = decode_reply(&ints(&[0, 1, 3, 250, 0, 5, 1000, 0, 0]), 2).expect("valid reply");
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
        ints(&[0, 0, 2, 500, 1, 3, 40, 0, 0]),
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
