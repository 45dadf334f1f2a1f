//! How much Redis memory a window key takes, from its entry count: the figures behind the
//! `sluice_redis_memory_estimate_bytes` gauge.
//!
//! Why next to the Redis code: the numbers depend on how the script stores a window (a sorted
//! set of 7-digit integer members with millisecond scores, one key per limiter key, with a TTL)
//! and on Redis's encodings, so they must change with the script, not with the metrics.
//! Measured on redis-server 7.0 (docs/metrics.md has the commands and the table).

/// Redis memory held per window key: the key with its dict and expire entries.
pub const KEY_OVERHEAD_BYTES: u64 = 160;
/// Per entry while a sorted set is a listpack (up to `zset-max-listpack-entries`, default 128).
pub const LISTPACK_ENTRY_BYTES: u64 = 16;
/// Per entry once it is a skiplist (over 128 members).
pub const SKIPLIST_ENTRY_BYTES: u64 = 114;
/// Redis's default `zset-max-listpack-entries`: above it a sorted set becomes a skiplist.
pub const LISTPACK_MAX_ENTRIES: u64 = 128;

/// Estimated bytes of one window key holding `entries` entries, by its encoding. A single
/// bytes-per-entry figure would be off by 5x on one side of the encoding switch. The set holds
/// one member more than its entries, the total (`script::LOG_TOTAL_MEMBER`), so it turns into a
/// skiplist at 128 entries already.
pub fn key_bytes(entries: u64) -> u64 {
    let members = entries.saturating_add(1);
    let per_entry = if members > LISTPACK_MAX_ENTRIES {
        SKIPLIST_ENTRY_BYTES
    } else {
        LISTPACK_ENTRY_BYTES
    };
    KEY_OVERHEAD_BYTES.saturating_add(entries.saturating_mul(per_entry))
}

/// Estimated bytes of window keys holding these entry counts.
pub fn keys_bytes(entry_counts: &[u64]) -> u64 {
    entry_counts
        .iter()
        .map(|&n| key_bytes(n))
        .fold(0u64, u64::saturating_add)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_estimate_follows_the_encoding() {
        assert_eq!(key_bytes(127), 160 + 127 * 16, "still a listpack");
        assert_eq!(
            key_bytes(128),
            160 + 128 * 114,
            "a skiplist, with the total"
        );
        assert_eq!(keys_bytes(&[5, 1000]), (160 + 5 * 16) + (160 + 1000 * 114));
        assert_eq!(keys_bytes(&[]), 0);
        assert_eq!(key_bytes(u64::MAX), u64::MAX, "saturates");
    }
}
