//! The provider-neutral contract suite on a Sentinel group (a master, one
//! replica, three sentinels; one group for this test binary, one key prefix
//! per scope), logged in on both sides as the least-privilege users with
//! exactly the rules `ca-skeleton redis-acl` prints: discovery, the role
//! check and the scripts need nothing beyond them.
//!
//! `acknowledged` runs the checks that never repeat an evaluation id again
//! with every charge acknowledged by the replica (`wait-replicas = 1`), as
//! a second user whose rules add `+wait`. The repeat checks are left out
//! there on purpose: with `WAIT` on, a replayed charge is `Indeterminate`
//! (docs/operations.md, "Replica-acknowledged charges"), which
//! `tests/wait.rs` pins.

mod support;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use adapter_redis::{RedisEdgeRateLimitAdapter, RedisSettings, Topology};
use async_trait::async_trait;
use contract_tests::{ProviderFactory, StoreScope};
use redis_fixture::RedisSentinel;
use shared_contract::{EdgeRateLimitPort, ManualClock, RateLimitPolicy};

/// The user of the acknowledged lane.
const WAITING_USER: &str = "ca-rate-limit-wait";

fn group() -> &'static RedisSentinel {
    static GROUP: OnceLock<RedisSentinel> = OnceLock::new();
    GROUP.get_or_init(|| {
        // The rules depend only on the topology and WAIT, not on addresses.
        let plain = RedisSettings { topology: Topology::Sentinel, ..RedisSettings::default() };
        let waiting = RedisSettings { wait_replicas: 1, ..plain.clone() };
        let waiting_rules = adapter_redis::acl::user_rules_for(&waiting);
        RedisSentinel::start_with_acl(
            &[
                support::data_user_line(&plain),
                support::acl_line(WAITING_USER, support::RATE_LIMIT_PASSWORD, &waiting_rules),
            ],
            &[support::sentinel_user_line()],
        )
    })
}

struct SentinelFactory {
    wait: bool,
}

#[async_trait]
impl ProviderFactory for SentinelFactory {
    async fn build(
        &self,
        scope: &StoreScope,
        clock: ManualClock,
        policies: Vec<RateLimitPolicy>,
    ) -> Arc<dyn EdgeRateLimitPort> {
        let mut settings = RedisSettings {
            key_prefix: support::scope_prefix(scope.as_str()),
            ..support::sentinel_settings(group())
        };
        if self.wait {
            settings.username = Some(WAITING_USER.to_owned());
            settings.wait_replicas = 1;
            settings.wait_timeout = Duration::from_secs(1);
        }
        match RedisEdgeRateLimitAdapter::new(settings, policies, Arc::new(clock)) {
            Ok(adapter) => Arc::new(adapter),
            Err(error) => panic!("the redis adapter rejected the check's settings: {error}"),
        }
    }
}

contract_tests::contract_suite!(SentinelFactory { wait: false });

mod acknowledged {
    use super::*;

    macro_rules! acknowledged {
        ($($check:ident),* $(,)?) => {$(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $check() {
                contract_tests::$check(&SentinelFactory { wait: true }).await;
            }
        )*};
    }

    acknowledged!(
        fixed_window_allows_exactly_the_limit,
        fixed_window_new_window_restores_the_budget,
        sliding_counter_worked_example,
        token_bucket_allows_capacity_then_denies,
        token_bucket_denial_still_moves_the_mark,
        clock_regression_beyond_the_bound_is_clock_unsafe_and_mutates_nothing,
        dedupe_disabled_charges_every_repeat,
        policy_set_is_admitted_only_when_every_enforced_policy_allows,
        policy_set_shadow_never_blocks_and_is_charged_only_on_its_own_allow,
        concurrent_evaluations_admit_exactly_the_limit,
    );

    // The lease checks that never repeat an evaluation id: a release sends
    // no WAIT (a release a failover loses holds its slot until the TTL).
    macro_rules! acknowledged_leases {
        ($($check:ident),* $(,)?) => {$(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $check() {
                contract_tests::checks::leases::$check(&SentinelFactory { wait: true }).await;
            }
        )*};
    }

    acknowledged_leases!(
        leases_admit_exactly_max_in_flight_under_concurrent_evaluates,
        leases_release_frees_a_slot_and_is_idempotent,
        leases_unreleased_are_reclaimed_after_their_ttl,
        leases_in_a_set_are_taken_atomically_with_rate_policies,
        leases_inspect_and_reset_of_a_concurrency_budget,
        leases_of_a_shadow_policy_are_real_but_never_deny,
        leases_of_an_old_revision_are_not_released_through_a_new_one,
        leases_release_leaves_every_other_lease_even_an_expired_one,
    );
}
