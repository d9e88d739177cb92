//! The Redis rate-limit provider: an [`EdgeRateLimitPort`] that runs the three
//! algorithms of `docs/algorithms.md` as Lua scripts on a Redis server.
//!
//! One key per (policy, revision, subject pseudonym) holds the state,
//! the clock-regression mark and the dedupe records; scripts are registered
//! with `SCRIPT LOAD` and run with `EVALSHA` only (never `EVAL`). Every
//! failure becomes a typed [`shared_contract::RateLimitOutcome`].
//!
//! Topologies: a standalone server, Redis Cluster through the `redis`
//! crate's async cluster client (the key's `{...}` hash tag keeps every key
//! of one subject in one slot), or a master found through Redis Sentinel.
//! With `wait_replicas` set, every charge must be acknowledged by that many
//! replicas (`WAIT`) or the answer is `Indeterminate`.
//! [`acl::required_commands`] names the Redis commands the provider needs
//! of each, for a least-privilege ACL user.
//!
//! This crate must never import `adapter-web`, `adapter-memory` or
//! `app-bootstrap`, and no raw subject (IP, API key, principal) ever reaches
//! it: keys are built from [`shared_contract::SubjectDigest`] only.
//!
//! [`EdgeRateLimitPort`]: shared_contract::EdgeRateLimitPort

#![forbid(unsafe_code)]

mod acknowledge;
pub mod acl;
mod adapter;
mod deny_cache;
mod error;
mod eviction;
mod gateway;
mod keys;
mod reply;
mod scripts;
mod settings;

/// Every unit test's clock starts here (epoch ms), a multiple of every
/// window the tests use; `tests/support` has the same for the integration
/// tests.
#[cfg(test)]
const T0: u64 = 1_800_000_000_000;

pub use adapter::RedisEdgeRateLimitAdapter;
pub use error::RedisAdapterError;
pub use keys::RateLimitKeys;
pub use scripts::ScriptKind;
pub use settings::{
    DenyCacheSettings, MAX_DENY_CACHE_ENTRIES, MAX_DENY_CACHE_MAX_AGE, MAX_KEY_PREFIX_BYTES,
    MAX_SCRIPT_LANE, MAX_WAIT_CONNECTIONS, RedisField, RedisSettings, ScriptLaneSettings,
    SettingsProblem, Topology,
};

/// Fuzzing hook (feature `fuzzing`, used by the `fuzz/` crate only; not an
/// API): the first byte picks how many keys the set had (1 to 8), the rest
/// is parsed as one RESP reply, as the connection would, and decoded as the
/// set script's reply. `None` when either step rejects it, else the decoded
/// reply's `Debug` text. The decoder stays crate-private; this is the
/// narrowest door that lets libFuzzer reach it.
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub fn fuzz_decode_script_reply(bytes: &[u8]) -> Option<String> {
    let (&first, rest) = bytes.split_first()?;
    let keys = usize::from(first % 8) + 1;
    let value = redis::parse_redis_value(rest).ok()?;
    reply::SetReply::decode(&value, keys).ok().map(|reply| format!("{reply:?}"))
}
