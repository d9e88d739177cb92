//! The one list of checks, and what is generated from it: [`CHECK_NAMES`]
//! and the tests [`crate::contract_suite!`] writes into a provider's crate.
//! A check added to the list appears in both; a name in the list that is
//! not a check fails to compile (the names expansion refers to each fn).

/// Holds the list of every check and hands it, with a mode, to
/// `__contract_expand!`. Not public API.
#[doc(hidden)]
#[macro_export]
macro_rules! __contract_checks {
    ($($mode:tt)*) => {
        $crate::__contract_expand! {
            [$($mode)*]
            fixed_window_allows_exactly_the_limit,
            fixed_window_new_window_restores_the_budget,
            fixed_window_retry_after_counts_down_to_the_window_end,
            fixed_window_cost_above_one_charges_its_cost,
            sliding_counter_allows_exactly_the_limit_in_one_window,
            sliding_counter_worked_example,
            sliding_counter_estimate_floors_at_elapsed_fractions,
            sliding_counter_cost_above_one_retries_inside_the_window,
            sliding_counter_retry_after_falls_in_the_next_window,
            sliding_counter_retry_after_two_windows_later,
            sliding_counter_forgets_both_counts_two_windows_later,
            token_bucket_allows_capacity_then_denies,
            token_bucket_refill_keeps_partial_periods,
            token_bucket_full_bucket_restarts_its_refill_clock,
            token_bucket_cost_above_one,
            token_bucket_denial_still_moves_the_mark,
            unknown_policy_is_incompatible,
            cost_zero_is_incompatible_and_touches_nothing,
            cost_above_maximum_is_incompatible_and_touches_nothing,
            expired_deadline_is_admission_rejected_and_touches_nothing,
            policy_lookup_returns_the_held_policies,
            readiness_probe_consumes_nothing,
            rejections_follow_the_evaluation_order,
            subjects_are_isolated,
            policies_are_isolated,
            policy_revisions_are_isolated,
            algorithm_change_without_a_new_revision_is_state_incompatible,
            clock_regression_within_the_bound_uses_the_mark,
            clock_regression_within_the_bound_applies_to_every_algorithm,
            clock_regression_beyond_the_bound_is_clock_unsafe_and_mutates_nothing,
            clock_regression_is_checked_before_replay,
            dedupe_replays_a_repeat_without_charging,
            dedupe_replay_works_for_every_algorithm,
            dedupe_disabled_charges_every_repeat,
            dedupe_record_expires_after_its_ttl,
            dedupe_evicts_the_oldest_beyond_max_entries,
            dedupe_evicts_the_oldest_beyond_max_stored_bytes,
            dedupe_does_not_record_a_denial,
            dedupe_record_survives_a_denial_and_a_step_back,
            dedupe_records_are_per_subject_and_policy,
            dedupe_replay_writes_nothing,
            dedupe_concurrent_repeats_charge_once,
            decisions_report_limit_and_certainty,
            retry_after_is_zero_when_allowed_and_minimal_when_denied,
            long_idle_state_acts_fresh,
            key_lifetime_covers_the_state_and_live_records,
            concurrent_evaluations_admit_exactly_the_limit,
        }
    };
}

/// Expands the check list in one mode: `[names]` gives the names as a
/// `&[&str]` (naming each fn, so a stale name does not compile);
/// `[tests <factory>]` gives one tokio test per check. Not public API.
#[doc(hidden)]
#[macro_export]
macro_rules! __contract_expand {
    ([names] $($check:ident,)*) => {
        &[$({
            let _ = $crate::$check;
            ::core::stringify!($check)
        }),*]
    };
    ([tests $factory:expr] $($check:ident,)*) => {
        $(
            #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $check() {
                let factory = $factory;
                $crate::$check(&factory).await;
            }
        )*
    };
}

/// Writes one `#[tokio::test]` per contract check into the calling module,
/// each named after its check and calling it with a new value of the
/// factory expression (any type implementing [`crate::ProviderFactory`]).
///
/// ```text
/// // tests/contract.rs of a provider crate (tokio as a dev-dependency):
/// contract_tests::contract_suite!(MyFactory::default());
/// ```
///
/// The tests run on a two-worker multi-thread runtime, so a provider that
/// does real I/O works. To run the suite twice (say standalone and
/// cluster), call the macro in two modules.
#[macro_export]
macro_rules! contract_suite {
    ($factory:expr $(,)?) => {
        $crate::__contract_checks! { tests $factory }
    };
}

/// The name of every check, in the order [`crate::contract_suite!`] writes
/// them.
pub const CHECK_NAMES: &[&str] = crate::__contract_checks!(names);

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn there_are_at_least_thirty_distinct_checks() {
        let distinct: HashSet<&str> = CHECK_NAMES.iter().copied().collect();
        assert_eq!(distinct.len(), CHECK_NAMES.len(), "a check is listed twice");
        assert!(CHECK_NAMES.len() >= 30, "only {} checks", CHECK_NAMES.len());
    }
}
