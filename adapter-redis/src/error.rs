//! The one error type of this crate: settings or policies the adapter
//! refuses to start with. Runtime failures never surface as errors; they
//! become typed outcomes (see `adapter.rs`).

use shared_contract::PolicyId;

/// Why [`crate::RedisEdgeRateLimitAdapter::new`] refused its input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RedisAdapterError {
    /// A setting is out of range; `field` is its kebab-case key under the
    /// `redis` configuration table.
    #[error("{field}: {problem}")]
    InvalidSettings {
        /// The kebab-case settings key.
        field: &'static str,
        /// What is wrong, for a human.
        problem: String,
    },
    /// Two policies share one id.
    #[error("policies: duplicate policy id {0}")]
    DuplicatePolicy(PolicyId),
}
