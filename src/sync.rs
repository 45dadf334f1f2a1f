//! The one way sluice takes a std mutex.
//!
//! Why poison-tolerant: every mutex here guards plain values (a limiter log shard, a connection
//! slot, the rejection cache, metrics state) that each update leaves consistent, and none is held
//! across an await. A lock poisoned by a panic elsewhere therefore still holds a valid value, and
//! refusing every later request because of it would turn one bug into an outage.

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, recovering the value of a poisoned lock.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
