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

/// The most effective limits held at once. Past it the table starts
/// over: the counters live in the provider's store under the policy id, so
/// a port built again finds them; only the next call of each pays the build.
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

    /// `rule` under `limit`, or `None` when no window holds it: 0 requests
    /// (envoyproxy/ratelimit then answers every hit `OVER_LIMIT`), a unit
    /// Envoy does not define, or a provider that holds no override. The
    /// caller refuses the descriptor then: fail-closed.
    pub(crate) fn get(
        &self,
        rule: &PreparedRule,
        limit: &RateLimitOverride,
    ) -> Option<Arc<Overridden>> {
        let key = (rule.index, limit.requests_per_unit, limit.unit);
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(found) = held.get(&key) {
            return Some(Arc::clone(found));
        }
        let policy = policy(limit)?;
        let port = (self.ports)(policy.clone())?;
        let id = policy.id().clone();
        let metrics = MemberMetrics::new(id.as_str(), Some(&policy));
        let member = Member { id, policy: Some(policy), metrics };
        let overridden = Arc::new(Overridden { port, rule: rule.with_member(member) });
        if held.len() >= MAX_HELD_OVERRIDES {
            held.clear();
        }
        held.insert(key, Arc::clone(&overridden));
        Some(overridden)
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
