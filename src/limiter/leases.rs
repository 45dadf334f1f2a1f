//! One `in_flight` key's leases: the pure data structure the memory backend and the algorithm
//! model keep (the Redis script keeps the same leases in a sorted set, `redis/lua/models.lua`).
//!
//! Why leases rather than a count: a request in flight is counted until it says it is done, but
//! a request whose "done" is lost (its proxy crashed, the refund call failed) must not be counted
//! forever. So each admitted request holds a lease named by its token, recorded at the time it
//! was admitted, and the lease ends either when a release names that token or when it has been
//! held for `lease_ms`, whichever comes first. Releasing by name is what makes every lease end
//! with its own request: a release never ends another request's lease (one that is still in
//! flight stays counted until its own lease runs out), a release that comes late (its lease
//! already expired) ends nothing, and a lost release costs one slot for at most `lease_ms`.
//!
//! Conventions, as the sliding log's ([`super::window`]): a lease recorded at `t` counts while
//! `now - t < lease_ms`; leases are recorded at `max(now, newest)`, so their times never
//! decrease even if the clock steps back. One lease per token: recording a token that already
//! holds a live lease renews it (moves it to the new time) instead of adding a second one.

use std::collections::VecDeque;

/// One key's live leases, oldest first: `(time recorded, token)`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Leases {
    entries: VecDeque<(u64, u64)>,
}

impl Leases {
    pub fn new() -> Self {
        Self::default()
    }

    /// Drops the leases held for `lease_ms` or longer at `now`.
    pub fn evict(&mut self, now: u64, lease_ms: u64) {
        while let Some(&(t, _)) = self.entries.front() {
            if t.saturating_add(lease_ms) > now {
                break;
            }
            self.entries.pop_front();
        }
    }

    /// Live leases (call [`Leases::evict`] first).
    pub fn count(&self) -> u64 {
        self.entries.len() as u64
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Time of the newest lease.
    pub fn newest(&self) -> Option<u64> {
        self.entries.back().map(|&(t, _)| t)
    }

    /// Milliseconds until the oldest lease expires; `lease_ms` when there is none.
    pub fn reset_ms(&self, now: u64, lease_ms: u64) -> u64 {
        match self.entries.front() {
            Some(&(t, _)) => t.saturating_add(lease_ms).saturating_sub(now),
            None => lease_ms,
        }
    }

    /// Records the lease `token` at `max(now, newest)`, renewing it if it is live already.
    pub fn record(&mut self, now: u64, token: u64) {
        let t = self.newest().map_or(now, |newest| newest.max(now));
        self.release(token);
        self.entries.push_back((t, token));
    }

    /// Ends the lease `token`, if it is live; returns whether it was.
    pub fn release(&mut self, token: u64) -> bool {
        match self.entries.iter().position(|&(_, held)| held == token) {
            Some(i) => {
                self.entries.remove(i);
                true
            }
            None => false,
        }
    }

    /// The live leases' tokens, oldest first.
    pub fn tokens(&self) -> impl Iterator<Item = u64> + '_ {
        self.entries.iter().map(|&(_, token)| token)
    }

    /// The live leases as `(time recorded, token)`, oldest first.
    pub fn held(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.entries.iter().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_ends_at_t_plus_lease_or_by_its_own_release() {
        let mut leases = Leases::new();
        leases.record(1000, 7);
        leases.record(1500, 8);
        leases.evict(1999, 1000);
        assert_eq!(leases.count(), 2);
        assert_eq!(leases.reset_ms(1999, 1000), 1);
        // Releasing the newest leaves the oldest to run out on its own time, and vice versa:
        // each lease ends with its own token.
        assert!(leases.release(7));
        assert!(
            !leases.release(7),
            "a second release of one token ends nothing"
        );
        assert_eq!(leases.reset_ms(1999, 1000), 501);
        leases.evict(2499, 1000);
        assert_eq!(leases.count(), 1);
        leases.evict(2500, 1000);
        assert!(leases.is_empty());
        assert_eq!(leases.reset_ms(2500, 1000), 1000);
    }

    #[test]
    fn recording_a_live_token_renews_it() {
        let mut leases = Leases::new();
        leases.record(100, 1);
        leases.record(200, 2);
        leases.record(300, 1);
        assert_eq!(leases.count(), 2);
        assert_eq!(leases.tokens().collect::<Vec<_>>(), [2, 1]);
        // A clock that steps back never records before the newest lease.
        leases.record(50, 3);
        assert_eq!(leases.newest(), Some(300));
        assert_eq!(
            leases.held().collect::<Vec<_>>(),
            [(200, 2), (300, 1), (300, 3)]
        );
        leases.evict(1200, 1000);
        assert_eq!(leases.tokens().collect::<Vec<_>>(), [1, 3]);
    }
}
