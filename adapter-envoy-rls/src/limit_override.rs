//! A descriptor's `limit` override, which Envoy's route configuration sets
//! (a trusted component, not the client): honoured only on a rule with
//! `allow_override`, as a fixed window of the override's size.
//!
//! Each effective limit is a policy of its own, `envoy-override.<n>-per-<unit>`,
//! operation-scoped and so keyed by the rule's operation and the
//! descriptor's subject as well: two overrides never share a counter, and
//! a refusal cached for one never answers another (envoyproxy/ratelimit's
//! `GenerateCacheKey` leaves the limit out of the key, so its do).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use shared_contract::{EdgeRateLimitPort, FixedWindow, MAX_COUNT, RateLimitPolicy};

use crate::rules::{Member, PreparedRule};
use crate::telemetry::MemberMetrics;

/// Builds a port that holds `policy` alone over the engine's store (the
/// memory provider's counters, the Redis connection), or `None` when the
/// provider cannot: the composition root's, which knows the provider.
pub type OverridePorts =
    Arc<dyn Fn(RateLimitPolicy) -> Option<Arc<dyn EdgeRateLimitPort>> + Send + Sync>;

/// The most effective limits (rule, requests, unit) one engine holds.
/// Each is a policy the provider keeps a namespace for and a metric label,
/// so their number is bounded: past it, a new one is ignored (the rule's
/// own policies apply, as without `allow_override`), counted and logged.
pub const MAX_HELD_OVERRIDES: usize = 1024;

/// The overrides of one engine: a port and a prepared rule per rule and
/// effective limit, built on first use.
pub(crate) struct LimitOverrides {
    ports: OverridePorts,
    held: Mutex<HashMap<(usize, u32, i32), Arc<Overridden>>>,
}

impl std::fmt::Debug for LimitOverrides {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LimitOverrides").finish_non_exhaustive()
    }
}

/// What an override comes to.
pub(crate) enum Override {
    /// The rule under its effective limit.
    Held(Arc<Overridden>),
    /// No window holds it: the descriptor is refused, as a blocking
    /// rule's is.
    Refused,
}

/// A rule under an effective limit: the port that holds it, and the rule
/// with its policy as the only member.
pub(crate) struct Overridden {
    pub(crate) port: Arc<dyn EdgeRateLimitPort>,
    pub(crate) rule: PreparedRule,
}

impl LimitOverrides {
    pub(crate) fn new(ports: OverridePorts) -> Self {
        Self { ports, held: Mutex::new(HashMap::new()) }
    }

    /// `rule` under `limit`: refused when no window holds it (0 requests,
    /// which envoyproxy/ratelimit answers `OVER_LIMIT` on every hit, or a
    /// unit Envoy does not define); `None`, the override ignored, when
    /// [`MAX_HELD_OVERRIDES`] are held or the provider cannot hold it.
    pub(crate) fn get(&self, rule: &PreparedRule, limit: &RateLimitOverride) -> Option<Override> {
        let key = (rule.index, limit.requests_per_unit, limit.unit);
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(found) = held.get(&key) {
            return Some(Override::Held(Arc::clone(found)));
        }
        let Some(policy) = policy(limit) else { return Some(Override::Refused) };
        if held.len() >= MAX_HELD_OVERRIDES {
            return None;
        }
        let port = (self.ports)(policy.clone())?;
        let id = policy.id().clone();
        let metrics = MemberMetrics::new(id.as_str(), Some(&policy));
        let member = Member { id, policy: Some(policy), metrics };
        let overridden = Arc::new(Overridden { port, rule: rule.with_member(member) });
        held.insert(key, Arc::clone(&overridden));
        Some(Override::Held(overridden))
    }
}

/// The fixed window of `limit`, `None` when there is none. The units are
/// envoyproxy/ratelimit's (`UnitToDivider`, `src/utils/utilities.go`): a
/// month is 30 days, a year 365. A count above [`MAX_COUNT`] is held at it.
fn policy(limit: &RateLimitOverride) -> Option<RateLimitPolicy> {
    let unit = Unit::try_from(limit.unit).ok()?;
    let seconds = unit_seconds(unit)?;
    let count = u64::from(limit.requests_per_unit).min(MAX_COUNT);
    if count == 0 {
        return None;
    }
    let id = format!("envoy-override.{count}-per-{}", unit.as_str_name().to_ascii_lowercase());
    let window = FixedWindow { limit: count, window: Duration::from_secs(seconds) };
    RateLimitPolicy::builder(id, window).maximum_cost(count).build().ok()
}

/// A unit's length in seconds, as envoyproxy/ratelimit counts it.
pub(crate) fn unit_seconds(unit: Unit) -> Option<u64> {
    Some(match unit {
        Unit::Unknown => return None,
        Unit::Second => 1,
        Unit::Minute => 60,
        Unit::Hour => 3_600,
        Unit::Day => 86_400,
        Unit::Week => 7 * 86_400,
        Unit::Month => 30 * 86_400,
        Unit::Year => 365 * 86_400,
    })
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use adapter_memory::{MemoryEdgeRateLimitAdapter, MemoryStore};
    use shared_contract::{ManualClock, PolicyId, PolicySet};

    use super::*;
    use crate::rules::{RlsRule, RuleLimit, Rules};

    /// The effective limits one engine holds are bounded: the next new one
    /// is ignored (`None`), one held already is still served, and one no
    /// window holds is refused whatever is held.
    #[test]
    fn at_most_max_held_overrides_are_held_and_the_next_new_one_is_ignored() {
        let clock = Arc::new(ManualClock::new(0));
        let store = MemoryStore::new();
        let built = Arc::new(AtomicUsize::new(0));
        let ports: OverridePorts = {
            let (store, clock, built) = (store.clone(), Arc::clone(&clock), Arc::clone(&built));
            Arc::new(move |policy| {
                built.fetch_add(1, Ordering::SeqCst);
                let port = MemoryEdgeRateLimitAdapter::with_store(
                    store.clone(),
                    [policy],
                    Arc::clone(&clock) as _,
                );
                Some(Arc::new(port.ok()?) as Arc<dyn EdgeRateLimitPort>)
            })
        };
        let own = RateLimitPolicy::builder(
            "own",
            FixedWindow { limit: 1, window: Duration::from_secs(1) },
        )
        .build()
        .unwrap();
        let port = MemoryEdgeRateLimitAdapter::with_store(store, [own], clock).unwrap();
        let rule = RlsRule {
            domain: "d".to_owned(),
            pattern: vec![("ip".to_owned(), None)],
            subject: None,
            limit: RuleLimit::Policies(PolicySet::single(PolicyId::new("own").unwrap())),
            name: None,
            replaces: Vec::new(),
            allow_override: true,
            charge_always: false,
        };
        let rules = Rules::new(&[rule], &port).unwrap();
        let Some(crate::rules::Match::Limited(rule)) = rules.find("d", &[("ip", "x")]) else {
            panic!("the rule matches");
        };
        let overrides = LimitOverrides::new(ports);
        let minute = Unit::Minute as i32;
        let at = |count: u32, unit: i32| RateLimitOverride { requests_per_unit: count, unit };
        for count in 1..=u32::try_from(MAX_HELD_OVERRIDES).unwrap() {
            assert!(matches!(overrides.get(rule, &at(count, minute)), Some(Override::Held(_))));
        }
        assert!(overrides.get(rule, &at(5_000, minute)).is_none(), "full: ignored");
        assert!(matches!(overrides.get(rule, &at(7, minute)), Some(Override::Held(_))));
        assert!(matches!(overrides.get(rule, &at(0, minute)), Some(Override::Refused)));
        assert!(matches!(overrides.get(rule, &at(7, 0)), Some(Override::Refused)));
        assert_eq!(built.load(Ordering::SeqCst), MAX_HELD_OVERRIDES, "each built once");
    }
}
