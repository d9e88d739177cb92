//! The embedded in-process rate-limit provider: every algorithm over a
//! sharded, bounded in-memory store, with the clock-regression and dedupe
//! semantics of every provider (`docs/algorithms.md`). The decisions are
//! `shared_contract::evaluate_set`; this crate adds sharding, expiry sweeps
//! and the `max_keys` bound, which fails closed when full.
//!
//! This crate imports `shared-contract` only: never redis, axum, tokio (a
//! dev-dependency for tests alone) or another adapter.

#![forbid(unsafe_code)]

mod adapter;
mod entry;
mod error;
mod map;
mod store;

/// Every unit test's clock starts here (epoch ms), a multiple of every window.
#[cfg(test)]
const T0: u64 = 1_800_000_000_000;

pub use adapter::MemoryEdgeRateLimitAdapter;
pub use error::MemoryAdapterError;
pub use store::{DEFAULT_MAX_KEYS, MemoryStore};
