//! `StoreScope`: which backing store one check's providers share.

use std::fmt;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Names a backing store for one check. Providers built with the same scope
/// share state; a scope never used before is empty.
///
/// The name holds only `[a-z0-9-]` and at most 32 characters, so a Redis
/// provider can put it in a key prefix as it is.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct StoreScope(String);

/// Longest scope name, so a key prefix built from it stays short.
pub const MAX_SCOPE_LEN: usize = 32;

impl StoreScope {
    /// A scope no other call in any process has made: `c<pid>-<start>-<n>`,
    /// each part in base 36. The process start time guards against a
    /// recycled pid meeting the leftovers of an earlier run in a long-lived
    /// store; the counter separates the scopes of one process.
    pub fn fresh() -> Self {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        static STARTED: OnceLock<u64> = OnceLock::new();
        let started = *STARTED.get_or_init(|| {
            SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, shared_contract::millis)
        });
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        // 1 + 7 (u32 pid) + 1 + 9 (ms until year 5000) + 1 + 13 (u64) = 32 at most.
        Self(format!(
            "c{}-{}-{}",
            base36(u64::from(std::process::id())),
            base36(started),
            base36(n)
        ))
    }

    /// The scope name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for StoreScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn base36(mut value: u64) -> String {
    const DIGITS: &[u8; 36] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut out = Vec::new();
    loop {
        out.push(DIGITS[(value % 36) as usize]);
        value /= 36;
        if value == 0 {
            break;
        }
    }
    out.reverse();
    String::from_utf8(out).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn base36_writes_the_digits_of_known_values() {
        assert_eq!(base36(0), "0");
        assert_eq!(base36(35), "z");
        assert_eq!(base36(36), "10");
        // 36^2 - 1 = 1295 is the largest two-digit number.
        assert_eq!(base36(1295), "zz");
        // u64::MAX needs 13 base-36 digits (36^12 < 2^64 < 36^13).
        assert_eq!(base36(u64::MAX).len(), 13);
        // u32::MAX needs 7 (36^6 < 2^32 < 36^7).
        assert_eq!(base36(u64::from(u32::MAX)).len(), 7);
    }

    #[test]
    fn fresh_scopes_are_unique_short_and_key_safe() {
        let scopes: Vec<StoreScope> = (0..1000).map(|_| StoreScope::fresh()).collect();
        let distinct: HashSet<&str> = scopes.iter().map(StoreScope::as_str).collect();
        assert_eq!(distinct.len(), scopes.len());
        for scope in &scopes {
            let name = scope.as_str();
            assert!(name.len() <= MAX_SCOPE_LEN, "{name} is longer than {MAX_SCOPE_LEN}");
            assert!(name.starts_with('c'));
            assert!(
                name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'),
                "{name} holds a character outside [a-z0-9-]"
            );
            assert_eq!(scope.to_string(), name);
        }
    }

    #[test]
    fn the_longest_possible_name_still_fits() {
        // Year 5000 in epoch milliseconds is below 36^9, so the start takes at most 9 digits.
        let year_5000_ms: u64 = 95_617_584_000_000;
        assert!(base36(year_5000_ms).len() <= 9);
        let longest = format!(
            "c{}-{}-{}",
            base36(u64::from(u32::MAX)),
            base36(year_5000_ms),
            base36(u64::MAX)
        );
        assert!(longest.len() <= MAX_SCOPE_LEN, "{longest}");
    }
}
