//! The one error type of this crate: a value that breaks a contract rule.

/// A value that breaks a rule of the contract.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ContractError {
    /// A policy failed validation; every broken rule is listed.
    #[error("invalid rate-limit policy: {}", join(.0))]
    InvalidPolicy(Vec<PolicyViolation>),
    /// A policy id outside `[a-z0-9._-]{1,64}`.
    #[error("invalid policy id: {0}")]
    InvalidPolicyId(String),
    /// A subject digest that is not `v<version>:<hex>` of at least 128 bits.
    #[error("invalid subject digest: {0}")]
    InvalidSubjectDigest(String),
    /// A policy set that is empty, too long or names a policy twice.
    #[error("invalid policy set: {0}")]
    InvalidPolicySet(String),
}

impl ContractError {
    /// The policy violations, empty for other errors.
    pub fn violations(&self) -> &[PolicyViolation] {
        match self {
            Self::InvalidPolicy(violations) => violations,
            _ => &[],
        }
    }
}

fn join(violations: &[PolicyViolation]) -> String {
    violations.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
}

/// One broken policy rule, naming the field it concerns.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: {problem}", field.key())]
pub struct PolicyViolation {
    /// The field that holds the bad value.
    pub field: PolicyField,
    /// What is wrong with it, for a human.
    pub problem: String,
}

/// A key of a policy's configuration table, spelt once ([`PolicyField::key`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PolicyField {
    /// The policy id (the table's own name, not a key in it).
    Id,
    /// Which algorithm counts.
    Algorithm,
    /// The policy revision.
    Revision,
    /// A parameter of the policy's algorithm, by its key.
    Parameter(&'static str),
    /// The largest cost one request may carry.
    MaximumCost,
    /// Extra key lifetime after state stops mattering.
    CleanupGrace,
    /// How far a caller clock may run backwards before `ClockUnsafe`.
    MaximumClockRegression,
    /// What a provider failure does to a request.
    FailurePolicy,
    /// Per subject and operation, or per subject.
    Scope,
    /// Enforce or shadow.
    Mode,
    /// The dedupe table.
    EvaluationDedup,
    /// Whether dedupe is on.
    DedupEnabled,
    /// Dedupe record lifetime.
    DedupTtl,
    /// Dedupe records kept per key.
    DedupMaxEntries,
    /// Dedupe record payload bytes kept per key.
    DedupMaxStoredBytes,
}

/// An algorithm's parameter, by its key.
impl From<&'static str> for PolicyField {
    fn from(key: &'static str) -> Self {
        Self::Parameter(key)
    }
}

impl PolicyField {
    /// The kebab-case key path inside a policy's configuration table.
    pub const fn key(self) -> &'static str {
        match self {
            Self::Id => "id",
            Self::Algorithm => "algorithm",
            Self::Revision => "revision",
            Self::Parameter(key) => key,
            Self::MaximumCost => "maximum-cost",
            Self::CleanupGrace => "cleanup-grace",
            Self::MaximumClockRegression => "maximum-clock-regression",
            Self::FailurePolicy => "failure-policy",
            Self::Scope => "scope",
            Self::Mode => "mode",
            Self::EvaluationDedup => "evaluation-dedup",
            Self::DedupEnabled => "evaluation-dedup.enabled",
            Self::DedupTtl => "evaluation-dedup.ttl",
            Self::DedupMaxEntries => "evaluation-dedup.max-entries",
            Self::DedupMaxStoredBytes => "evaluation-dedup.max-stored-bytes",
        }
    }

    /// The key inside the table that holds it: `ttl` for `evaluation-dedup.ttl`.
    pub fn leaf(self) -> &'static str {
        let key = self.key();
        key.rsplit_once('.').map_or(key, |(_, leaf)| leaf)
    }
}
