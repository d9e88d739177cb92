//! The embedded in-process rate-limit provider: fixed window, sliding
//! counter and token bucket over a sharded, bounded in-memory store, with
//! the same clock-regression and evaluation-dedupe semantics as every other
//! provider (`docs/algorithms.md`). It is the default for a single instance.
//! The decisions themselves are `shared_contract::evaluate_set`; this crate
//! adds the store: sharding, expiry sweeps and memory bounds.
//!
//! This crate imports `shared-contract` only: never redis, axum, tokio (a
//! dev-dependency for tests alone) or another adapter. Expired keys are
//! reclaimed by amortized sweeps during evaluation and by
//! [`MemoryStore::purge_expired`]. That alone does not bound memory (a
//! 24 h window keeps each subject a day): the store holds at most
//! `max_keys` keys ([`DEFAULT_MAX_KEYS`] unless told otherwise). Full, it
//! drops the keys that are expired or whole again, then refuses a request
//! needing a new key (`Unavailable(AdmissionRejected)`, fail-closed); a key
//! in use is never dropped, so an exhausted subject stays refused.

#![forbid(unsafe_code)]

mod adapter;
mod entry;
mod error;
mod map;
mod store;

/// Every unit test's clock starts here (epoch ms), a multiple of every
/// window the tests use; `tests/support` has the same for the integration
/// tests.
#[cfg(test)]
const T0: u64 = 1_800_000_000_000;

pub use adapter::MemoryEdgeRateLimitAdapter;
pub use error::MemoryAdapterError;
pub use store::{DEFAULT_MAX_KEYS, MAX_SHARDS, MemoryStore};
