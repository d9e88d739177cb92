//! The one list of checks, and what is generated from it: [`CHECK_NAMES`]
//! and the tests [`crate::contract_suite!`] writes into a provider's crate.
//!
//! Adding a check: write its `pub async fn` in a module of `src/checks/`,
//! then add `<module>::<fn>,` to the list below. A name in the list that is
//! not a check fails to compile (both expansions refer to the fn by path);
//! a check left off the list fails `every_check_in_the_sources_is_listed`.

/// Holds the list of every check and hands it, with a mode, to
/// `__contract_expand!`. Not public API.
#[doc(hidden)]
#[macro_export]
macro_rules! __contract_checks {
    ($($mode:tt)*) => {
        $crate::__contract_expand! {
            [$($mode)*]
            fixed_window::fixed_window_allows_exactly_the_limit,
            fixed_window::fixed_window_new_window_restores_the_budget,
            fixed_window::fixed_window_retry_after_counts_down_to_the_window_end,
            fixed_window::fixed_window_cost_above_one_charges_its_cost,
            sliding_counter::sliding_counter_allows_exactly_the_limit_in_one_window,
            sliding_counter::sliding_counter_worked_example,
            sliding_counter::sliding_counter_estimate_floors_at_elapsed_fractions,
            sliding_counter::sliding_counter_cost_above_one_retries_inside_the_window,
            sliding_counter::sliding_counter_retry_after_falls_in_the_next_window,
            sliding_counter::sliding_counter_retry_after_two_windows_later,
            sliding_counter::sliding_counter_forgets_both_counts_two_windows_later,
            token_bucket::token_bucket_allows_capacity_then_denies,
            token_bucket::token_bucket_refill_keeps_partial_periods,
            token_bucket::token_bucket_full_bucket_restarts_its_refill_clock,
            token_bucket::token_bucket_cost_above_one,
            token_bucket::token_bucket_denial_still_moves_the_mark,
            gcra::gcra_allows_the_burst_then_one_cell_per_interval,
            gcra::gcra_worked_numbers,
            gcra::gcra_rounds_its_interval_and_every_wait_up,
            gcra::gcra_denial_leaves_the_mark_where_it_was,
            gcra::gcra_in_a_refused_set_is_charged_nothing,
            calendar_window::calendar_window_restarts_on_the_first_of_the_month,
            calendar_window::calendar_window_days_follow_the_zones_clock_changes,
            calendar_window::calendar_window_months_years_and_weeks_end_where_the_calendar_says,
            rejection::unknown_policy_is_incompatible,
            rejection::cost_zero_is_incompatible_and_touches_nothing,
            rejection::cost_above_maximum_is_incompatible_and_touches_nothing,
            rejection::expired_deadline_is_admission_rejected_and_touches_nothing,
            rejection::policy_lookup_returns_the_held_policies,
            rejection::readiness_probe_consumes_nothing,
            rejection::rejections_follow_the_evaluation_order,
            isolation::subjects_are_isolated,
            isolation::policies_are_isolated,
            isolation::policy_revisions_are_isolated,
            isolation::algorithm_change_without_a_new_revision_is_state_incompatible,
            clock_regression::clock_regression_within_the_bound_uses_the_mark,
            clock_regression::clock_regression_within_the_bound_applies_to_every_algorithm,
            clock_regression::clock_regression_beyond_the_bound_is_clock_unsafe_and_mutates_nothing,
            clock_regression::clock_regression_is_checked_before_replay,
            evaluation_dedup::dedupe_replays_a_repeat_without_charging,
            evaluation_dedup::dedupe_replay_works_for_every_algorithm,
            evaluation_dedup::dedupe_disabled_charges_every_repeat,
            evaluation_dedup::dedupe_record_expires_after_its_ttl,
            evaluation_dedup::dedupe_evicts_the_oldest_beyond_max_entries,
            evaluation_dedup::dedupe_evicts_the_oldest_beyond_max_stored_bytes,
            evaluation_dedup::dedupe_does_not_record_a_denial,
            evaluation_dedup::dedupe_record_survives_a_denial_and_a_step_back,
            evaluation_dedup::dedupe_records_are_per_subject_and_policy,
            evaluation_dedup::dedupe_replay_writes_nothing,
            evaluation_dedup::dedupe_concurrent_repeats_charge_once,
            invariants::decisions_report_limit_and_certainty,
            invariants::retry_after_is_zero_when_allowed_and_minimal_when_denied,
            lifetime::long_idle_state_acts_fresh,
            lifetime::key_lifetime_covers_the_state_and_live_records,
            policy_sets::policy_set_is_admitted_only_when_every_enforced_policy_allows,
            policy_sets::policy_set_refusal_takes_no_token,
            policy_sets::policy_set_subject_scope_is_shared_across_operations,
            policy_sets::policy_set_shadow_never_blocks_and_is_charged_only_on_its_own_allow,
            policy_sets::policy_set_repeat_replays_the_whole_set,
            policy_sets::policy_set_cost_fits_every_policy,
            policy_sets::policy_set_clock_unsafe_on_any_key_changes_no_key,
            policy_sets::policy_set_with_an_unknown_policy_is_incompatible,
            concurrency::concurrent_evaluations_admit_exactly_the_limit,
            leases::leases_admit_exactly_max_in_flight_under_concurrent_evaluates,
            leases::leases_release_frees_a_slot_and_is_idempotent,
            leases::leases_unreleased_are_reclaimed_after_their_ttl,
            leases::leases_release_leaves_every_other_lease_even_an_expired_one,
            leases::leases_hold_against_a_clock_ahead_inside_the_bound,
            leases::leases_in_a_set_are_taken_atomically_with_rate_policies,
            leases::leases_replay_of_an_evaluation_returns_the_same_lease,
            leases::leases_inspect_and_reset_of_a_concurrency_budget,
            leases::leases_of_a_shadow_policy_are_real_but_never_deny,
            leases::leases_of_an_old_revision_are_not_released_through_a_new_one,
            admin::inspect_never_charges,
            admin::inspect_of_an_exhausted_budget_reports_its_retry_after,
            admin::inspect_follows_the_clock_without_writing,
            admin::reset_restores_the_full_budget,
            admin::reset_of_an_absent_budget_is_fine,
            admin::budget_operation_must_fit_the_policy_scope,
            admin::reset_forgets_the_dedupe_records,
            settle::settle_fixed_window_worked_numbers,
            settle::settle_sliding_counter_debt_weighs_in_the_next_window,
            settle::settle_token_bucket_debt_and_refund,
            settle::settle_gcra_moves_the_schedule,
            settle::settle_calendar_window_refund_after_the_month_gives_nothing,
            settle::settle_of_an_unknown_reservation_changes_nothing,
            settle::settle_without_a_reservation_charges_past_the_limit_once,
            settle::settle_of_exactly_the_reservation_is_recorded,
            settle::settle_concurrent_repeats_apply_once,
            settle::settle_in_a_set_leaves_a_concurrency_key_alone,
            settle::settle_refusals_touch_nothing,
            settle::settle_admitted_usage_stays_within_the_bound,
        }
    };
}

/// Expands the check list in one mode: `[names]` gives the names as a
/// `&[&str]` (naming each fn, so a stale name does not compile);
/// `[tests <factory>]` gives one tokio test per check. Not public API.
#[doc(hidden)]
#[macro_export]
macro_rules! __contract_expand {
    ([names] $($module:ident::$check:ident,)*) => {
        &[$({
            let _ = $crate::checks::$module::$check;
            ::core::stringify!($check)
        }),*]
    };
    ([tests $factory:expr] $($module:ident::$check:ident,)*) => {
        $(
            #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $check() {
                let factory = $factory;
                $crate::checks::$module::$check(&factory).await;
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

    /// Every `pub async fn` in `src/checks/*.rs`, read from the sources at
    /// test time, so a new module file is scanned too.
    fn checks_in_the_sources() -> Vec<String> {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src/checks");
        let mut found = Vec::new();
        for file in std::fs::read_dir(dir).expect("src/checks is readable") {
            let path = file.expect("a directory entry").path();
            if path.extension().is_none_or(|ext| ext != "rs") {
                continue;
            }
            let source = std::fs::read_to_string(&path).expect("a check module is readable");
            for line in source.lines() {
                if let Some(rest) = line.trim_start().strip_prefix("pub async fn ") {
                    let name = rest.split(['(', '<']).next().unwrap_or(rest).trim();
                    found.push(name.to_owned());
                }
            }
        }
        found
    }

    #[test]
    fn every_check_in_the_sources_is_listed() {
        let listed: HashSet<&str> = CHECK_NAMES.iter().copied().collect();
        let found = checks_in_the_sources();
        let missing: Vec<&String> =
            found.iter().filter(|name| !listed.contains(name.as_str())).collect();
        assert!(
            missing.is_empty(),
            "add these checks to the list in contract-tests/src/suite.rs, or they never run: {missing:?}"
        );
        // The scan itself works: it finds every listed check, and only once.
        assert_eq!(found.len(), CHECK_NAMES.len(), "found {found:?}");
    }
}
