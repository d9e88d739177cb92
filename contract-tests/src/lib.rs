//! The provider-neutral contract suite for `EdgeRateLimitPort` providers.
//!
//! Every check is a `pub async fn(&dyn ProviderFactory)` that builds a
//! provider over a fresh [`StoreScope`] with a [`shared_contract::ManualClock`]
//! at `T0 = 1_800_000_000_000`, drives it, and panics on the first answer
//! that differs from docs/algorithms.md. A provider runs all of them with one
//! line in its own `tests/`: `contract_tests::contract_suite!(factory)`.
//! Expected numbers are worked out by hand from the spec, next to each check.
//!
//! ```text
//! // tests/contract.rs of a provider crate
//! struct MyFactory { /* e.g. one store per StoreScope */ }
//!
//! #[async_trait::async_trait]
//! impl contract_tests::ProviderFactory for MyFactory {
//!     async fn build(&self, scope: &StoreScope, clock: ManualClock,
//!                    policies: Vec<RateLimitPolicy>) -> Arc<dyn EdgeRateLimitPort> {
//!         // same scope -> same store; a new scope -> an empty one
//!     }
//! }
//!
//! contract_tests::contract_suite!(MyFactory::new());
//! ```
//!
//! This crate depends on `shared-contract` only: it must never import a
//! provider (adapter-memory, adapter-redis), adapter-web, app-bootstrap, or
//! an async runtime (tokio comes from the caller's dev-dependencies).

#![forbid(unsafe_code)]

mod checks;
mod factory;
mod rig;
mod scope;
mod suite;

pub use checks::clock_regression::{
    clock_regression_beyond_the_bound_is_clock_unsafe_and_mutates_nothing,
    clock_regression_is_checked_before_replay,
    clock_regression_within_the_bound_applies_to_every_algorithm,
    clock_regression_within_the_bound_uses_the_mark,
};
pub use checks::concurrency::concurrent_evaluations_admit_exactly_the_limit;
pub use checks::evaluation_dedup::{
    dedupe_concurrent_repeats_charge_once, dedupe_disabled_charges_every_repeat,
    dedupe_does_not_record_a_denial, dedupe_evicts_the_oldest_beyond_max_entries,
    dedupe_evicts_the_oldest_beyond_max_stored_bytes, dedupe_record_expires_after_its_ttl,
    dedupe_record_survives_a_denial_and_a_step_back, dedupe_records_are_per_subject_and_policy,
    dedupe_replay_works_for_every_algorithm, dedupe_replay_writes_nothing,
    dedupe_replays_a_repeat_without_charging,
};
pub use checks::fixed_window::{
    fixed_window_allows_exactly_the_limit, fixed_window_cost_above_one_charges_its_cost,
    fixed_window_new_window_restores_the_budget,
    fixed_window_retry_after_counts_down_to_the_window_end,
};
pub use checks::invariants::{
    decisions_report_limit_and_certainty, retry_after_is_zero_when_allowed_and_minimal_when_denied,
};
pub use checks::isolation::{
    algorithm_change_without_a_new_revision_is_state_incompatible, policies_are_isolated,
    policy_revisions_are_isolated, subjects_are_isolated,
};
pub use checks::lifetime::{
    key_lifetime_covers_the_state_and_live_records, long_idle_state_acts_fresh,
};
pub use checks::rejection::{
    cost_above_maximum_is_incompatible_and_touches_nothing,
    cost_zero_is_incompatible_and_touches_nothing,
    expired_deadline_is_admission_rejected_and_touches_nothing,
    policy_lookup_returns_the_held_policies, readiness_probe_consumes_nothing,
    rejections_follow_the_evaluation_order, unknown_policy_is_incompatible,
};
pub use checks::sliding_counter::{
    sliding_counter_allows_exactly_the_limit_in_one_window,
    sliding_counter_cost_above_one_retries_inside_the_window,
    sliding_counter_estimate_floors_at_elapsed_fractions,
    sliding_counter_forgets_both_counts_two_windows_later,
    sliding_counter_retry_after_falls_in_the_next_window,
    sliding_counter_retry_after_two_windows_later, sliding_counter_worked_example,
};
pub use checks::token_bucket::{
    token_bucket_allows_capacity_then_denies, token_bucket_cost_above_one,
    token_bucket_denial_still_moves_the_mark, token_bucket_full_bucket_restarts_its_refill_clock,
    token_bucket_refill_keeps_partial_periods,
};
pub use factory::ProviderFactory;
pub use scope::{MAX_SCOPE_LEN, StoreScope};
pub use suite::CHECK_NAMES;
