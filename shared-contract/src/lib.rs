//! The provider-neutral rate-limit contract: what a policy is, what a caller
//! asks, what every provider answers, the [`EdgeRateLimitPort`] they all
//! implement, and the decision step they share ([`evaluate_set`]), so a
//! provider over any compare-and-set store gives the same numbers.
//!
//! The workspace's API boundary: it knows nothing about I/O, tokio, redis,
//! axum or any adapter, and depends on none of them.

#![forbid(unsafe_code)]

mod algorithm;
mod bounds;
mod budget;
mod clock;
mod dedup;
mod error;
mod evaluation;
mod headers;
mod lease;
mod leases;
mod log_throttle;
mod name;
mod outcome;
mod policy;
mod port;
mod request;
mod settle;
mod step;
mod subject;

// Every registered algorithm's type and state: registering one takes no line here.
pub use algorithm::*;
pub use bounds::{MAX_COUNT, MAX_IN_FLIGHT, MAX_PERIOD, MAX_POLICY_SET, millis};
pub use budget::{BudgetFailure, BudgetKey, BudgetState};
pub use clock::{Clock, ManualClock, SystemClock};
pub use dedup::{DEDUP_RECORD_BYTES, EvaluationDedupPolicy};
pub use error::{ContractError, PolicyField, PolicyViolation};
pub use evaluation::EvaluationId;
pub use headers::{
    SF_INTEGER_MAX, quota_window, whole_seconds_up, whole_seconds_up_millis, write_limit_field,
    write_limit_item, write_policy_field_at,
};
pub use lease::{HELD_LEASE_BYTES, Lease, ReleaseOutcome};
pub use leases::{HeldLease, Leases};
pub use log_throttle::{LOG_LINE_EVERY, LogThrottle};
pub use name::{
    DECISIONS_TOTAL, EVALUATION_SECONDS, FRONT_ENVOY_RLS, FRONT_HTTP, Named, SETTLES_TOTAL,
    UnknownName, parse_name, settle_outcome_label,
};
pub use outcome::{
    Certainty, DEFAULT_FAILURE_RETRY_AFTER, DecisionSource, IncompatibleCategory, PolicyMode,
    RateLimitDecision, RateLimitFailure, RateLimitOutcome, RateLimitOutcomeExt, SetDecision,
    UnavailableCategory,
};
pub use policy::{
    DedupKeys, FailurePolicy, PolicyId, PolicyKeys, PolicyScope, RateLimitPolicy,
    RateLimitPolicyBuilder,
};
pub use port::{EdgeRateLimitPort, Evaluation, PortAnswer, Releasing, Settling};
pub use request::{OperationDigest, PolicySet, RateLimitRequest, SetEntries};
pub use settle::{SettleOutcome, Settled, Settlement};
pub use step::{
    DedupRecord, DedupRecords, KeyRules, KeyState, KeyWrite, SetMember, SetVerdict, SettleVerdict,
    evaluate_set, inspect_key, settle_set,
};
pub use subject::{SubjectDigest, SubjectPseudonymizer};
