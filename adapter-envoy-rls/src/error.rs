//! `RlsError`: why a rule table cannot be built, or the listener failed.

use thiserror::Error;

/// Everything that can go wrong in this crate outside a request (a
/// request's failures are gRPC statuses).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RlsError {
    /// A rule's domain is empty.
    #[error("rule {rule}: the domain is empty")]
    EmptyDomain {
        /// The rule's index.
        rule: usize,
    },
    /// A rule's pattern names no entry.
    #[error("rule {rule}: the descriptor pattern is empty")]
    EmptyPattern {
        /// The rule's index.
        rule: usize,
    },
    /// An entry key of a pattern is empty.
    #[error("rule {rule}: entry {entry} has an empty key")]
    EmptyKey {
        /// The rule's index.
        rule: usize,
        /// The entry's index in the pattern.
        entry: usize,
    },
    /// A subject key is not an entry of the pattern, or has a fixed value.
    #[error("rule {rule}: subject {key:?} is not an entry without a fixed value")]
    BadSubject {
        /// The rule's index.
        rule: usize,
        /// The key.
        key: String,
    },
    /// A rule replaces an empty name or its own.
    #[error("rule {rule}: replaces {name:?}, which is empty or its own name")]
    BadReplaces {
        /// The rule's index.
        rule: usize,
        /// The name it replaces.
        name: String,
    },
    /// Two rules have the same domain and pattern.
    #[error("rule {rule}: the same domain and pattern as rule {first}")]
    DuplicateRule {
        /// The later rule's index.
        rule: usize,
        /// The earlier one's.
        first: usize,
    },
    /// The gRPC server stopped with an error.
    #[error("the Envoy RLS listener failed: {0}")]
    Transport(String),
}
