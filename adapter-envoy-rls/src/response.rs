//! From the steps' answers to Envoy's `RateLimitResponse`: one status per
//! descriptor in request order, the overall code (never `UNKNOWN`), and
//! the same `RateLimit-Policy` / `RateLimit` / `Retry-After` headers the
//! HTTP edge sends. Shadow policies never show in the headers.

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::google::protobuf::Duration as ProtoDuration;
use shared_contract::{
    Clock, OperationDigest, RateLimitDecision, RateLimitPolicy, SetDecision, SubjectDigest,
    SystemClock, quota_window, whole_seconds_up_millis, write_limit_field, write_policy_field_at,
};

use crate::limit_override::unit_seconds;
use crate::rules::{Member, PreparedRule, Step};

/// What one step decided: admitted or not, and one decision per member of
/// the step, in its order.
pub(crate) type Answer = SetDecision;

/// The response being built.
pub(crate) struct Response<'e> {
    statuses: Vec<DescriptorStatus>,
    /// A step was denied: a wait lets it pass (`Retry-After`).
    over: bool,
    /// A descriptor was refused for what the call itself carries (a cost
    /// no policy of its rule admits, too many descriptors): no wait lets
    /// it pass, so no `Retry-After`.
    refused: bool,
    /// The enforced policies of the answered steps with their decisions,
    /// each id once, in order: what the headers list.
    shown: Vec<Shown<'e>>,
    /// The wait of a set the provider did not admit, if any (ms).
    wait_ms: u64,
}

/// A policy the headers list, the budget it describes and its state.
struct Shown<'e> {
    member: &'e Member,
    budget: (SubjectDigest, Option<OperationDigest>),
    decision: RateLimitDecision,
}

impl<'e> Response<'e> {
    /// Every descriptor `OK` without a limit until a step says otherwise:
    /// unmatched ones, shadow-only ones and those after a denial stay so.
    pub(crate) fn new(descriptors: usize) -> Self {
        let ok = DescriptorStatus { code: Code::Ok.into(), ..DescriptorStatus::default() };
        Self {
            statuses: vec![ok; descriptors],
            over: false,
            refused: false,
            shown: Vec::new(),
            wait_ms: 0,
        }
    }

    /// Every descriptor `OVER_LIMIT` without a limit: a call past
    /// `MAX_DESCRIPTORS`, which no provider call answers.
    pub(crate) fn refused(descriptors: usize) -> Self {
        let over = DescriptorStatus { code: Code::OverLimit.into(), ..DescriptorStatus::default() };
        Self {
            statuses: vec![over; descriptors],
            over: false,
            refused: true,
            shown: Vec::new(),
            wait_ms: 0,
        }
    }

    /// The descriptor at `index` matched an unlimited rule: `OK` with
    /// `limit_remaining` 4294967295, as envoyproxy/ratelimit answers it,
    /// which tells it apart from a descriptor no rule matched (0).
    pub(crate) fn unlimited(&mut self, index: usize) {
        self.statuses[index].limit_remaining = u32::MAX;
    }

    /// The descriptor at `index` matched a blocking rule: `OVER_LIMIT`,
    /// without a limit and without `Retry-After` (no wait lets it pass).
    pub(crate) fn block(&mut self, index: usize) {
        self.statuses[index].code = Code::OverLimit.into();
        self.refused = true;
    }

    /// The descriptor at `index` of `rule` carries a `cost` that an
    /// enforced policy of the rule cannot admit: `OVER_LIMIT`, nothing
    /// charged. Its limit is that policy (the one with the lowest maximum
    /// cost) with `limit_remaining` 0, as envoyproxy/ratelimit reports hits
    /// above a limit, and no `duration_until_reset`: no wait lets it pass.
    pub(crate) fn refuse_cost(&mut self, index: usize, rule: &PreparedRule, cost: u64) {
        let refusing = rule
            .members
            .iter()
            .filter(|member| member.enforced())
            .filter_map(|member| member.policy.as_ref())
            .filter(|policy| !policy.admits_cost(cost))
            .min_by_key(|policy| policy.maximum_cost());
        self.statuses[index] = DescriptorStatus {
            code: Code::OverLimit.into(),
            current_limit: refusing.map(current_limit),
            ..DescriptorStatus::default()
        };
        self.refused = true;
    }

    /// The descriptor at `index` of `rule` is in a set the provider did not
    /// admit (nothing charged): `OVER_LIMIT` with the rule's most
    /// restrictive enforced policy as its limit, `limit_remaining` 0 and
    /// `retry_after` until it may be tried again, which `Retry-After` takes.
    pub(crate) fn not_admitted(
        &mut self,
        index: usize,
        rule: &PreparedRule,
        retry_after: std::time::Duration,
    ) {
        let tightest = rule
            .members
            .iter()
            .filter(|member| member.enforced())
            .filter_map(|member| member.policy.as_ref())
            .min_by_key(|policy| policy.limit());
        let wait = shared_contract::millis(retry_after).max(1);
        self.statuses[index] = DescriptorStatus {
            code: Code::OverLimit.into(),
            current_limit: tightest.map(current_limit),
            duration_until_reset: Some(proto_duration(wait)),
            ..DescriptorStatus::default()
        };
        self.over = true;
        self.wait_ms = self.wait_ms.max(wait);
    }

    /// Takes in a step's answer; false when it was denied (nothing after
    /// it runs).
    pub(crate) fn add(&mut self, step: &Step<'e>, answer: &Answer) -> bool {
        let decided = |member: &Member| {
            let at = step.members.iter().position(|held| held.id == member.id)?;
            answer.decisions().get(at).copied()
        };
        for &(index, rule) in &step.descriptors {
            self.statuses[index] = status(rule, decided);
        }
        for (member, decision) in step.members.iter().zip(answer.decisions()) {
            if !member.enforced() {
                continue;
            }
            let budget = step.budget_of(member);
            match self.shown.iter_mut().find(|shown| shown.member.id == member.id) {
                // The same budget again (a look and a charge of it): the
                // later step saw it after the earlier one, so its state
                // is the call's result.
                Some(shown) if shown.budget == budget => shown.decision = *decision,
                // Another subject's budget of the policy: the header lists
                // a policy once, the first.
                Some(_) => {}
                None => self.shown.push(Shown { member, budget, decision: *decision }),
            }
        }
        if !answer.allowed() {
            self.over = true;
        }
        answer.allowed()
    }

    pub(crate) fn finish(self) -> RateLimitResponse {
        let overall = if self.over || self.refused { Code::OverLimit } else { Code::Ok };
        let mut headers = Vec::new();
        let policies = self.shown.iter().filter_map(|shown| shown.member.policy.as_ref());
        let mut policy = Vec::with_capacity(64);
        write_policy_field_at(&mut policy, policies, || SystemClock.epoch_millis());
        if !policy.is_empty() {
            headers.push(header("ratelimit-policy", policy));
            let mut limit = Vec::with_capacity(64);
            let decisions = self.shown.iter().map(|shown| (&shown.member.id, &shown.decision));
            write_limit_field(&mut limit, decisions);
            headers.push(header("ratelimit", limit));
        }
        if self.over {
            // The request passes only once every denying policy allows it.
            let decisions = self.shown.iter().map(|shown| shown.decision);
            let wait = decisions.filter(|d| !d.allowed).map(|d| d.retry_after_ms);
            let wait = wait.chain((self.wait_ms > 0).then_some(self.wait_ms)).max();
            let seconds = wait.map_or(1, whole_seconds_up_millis).max(1);
            headers.push(header(
                "retry-after",
                itoa::Buffer::new().format(seconds).as_bytes().to_vec(),
            ));
        }
        RateLimitResponse {
            overall_code: overall.into(),
            statuses: self.statuses,
            response_headers_to_add: headers,
            ..RateLimitResponse::default()
        }
    }
}

/// A descriptor's status from its rule's enforced policies: `OVER_LIMIT`
/// when one of them denied, and the most restrictive one (a denying one
/// first, then the fewest remaining) as its limit. A rule of shadow
/// policies only shows the most restrictive of them, always `OK`, as
/// envoyproxy/ratelimit answers a `shadow_mode` descriptor
/// (`limiter/base_limiter.go`).
fn status(
    rule: &PreparedRule,
    decided: impl Fn(&Member) -> Option<RateLimitDecision>,
) -> DescriptorStatus {
    let limit = |member: &Member| member.policy.as_ref().map_or(0, RateLimitPolicy::limit);
    let tightest = |enforced: bool| {
        let members = rule.members.iter().filter(|member| member.enforced() == enforced);
        let decisions = members.filter_map(|member| Some((member, decided(member)?)));
        decisions.min_by_key(|&(member, d)| (d.allowed, d.remaining, limit(member)))
    };
    let (code, (member, decision)) = match (tightest(true), tightest(false)) {
        (Some(enforced), _) if !enforced.1.allowed => (Code::OverLimit, enforced),
        (Some(enforced), _) => (Code::Ok, enforced),
        (None, Some(shadow)) => (Code::Ok, shadow),
        (None, None) => {
            return DescriptorStatus { code: Code::Ok.into(), ..DescriptorStatus::default() };
        }
    };
    DescriptorStatus {
        code: code.into(),
        current_limit: member.policy.as_ref().map(current_limit),
        limit_remaining: u32::try_from(decision.remaining).unwrap_or(u32::MAX),
        duration_until_reset: Some(proto_duration(decision.reset_after_ms)),
        ..DescriptorStatus::default()
    }
}

/// The policy as Envoy's `RateLimit`. A window of one of Envoy's units is
/// that unit (a month is 30 days, a year 365, as envoyproxy/ratelimit
/// counts them); any other window (10 s, 3 days) is shown in the longest
/// unit not longer than it, a second at least, with the limit scaled to
/// that unit, rounded down and at least 1 (5 per 10 s shows 1 per second,
/// 7 per 3 days 2 per day). Envoy's `RateLimit` has no field for the
/// number of units. A concurrency policy has no window: `UNKNOWN`.
fn current_limit(policy: &RateLimitPolicy) -> RateLimit {
    let limit = policy.limit();
    let (unit, requests) = match quota_window(policy.algorithm()) {
        None => (Unit::Unknown, limit),
        Some(window) => {
            let window_ms = window.as_millis().max(1);
            let units = [Unit::Year, Unit::Month, Unit::Week, Unit::Day, Unit::Hour, Unit::Minute];
            let unit = units
                .into_iter()
                .find(|&unit| unit_seconds(unit).is_some_and(|s| u128::from(s) * 1000 <= window_ms))
                .unwrap_or(Unit::Second);
            let unit_ms = u128::from(unit_seconds(unit).unwrap_or(1)) * 1000;
            let scaled = u128::from(limit) * unit_ms / window_ms;
            (unit, u64::try_from(scaled).unwrap_or(u64::MAX).max(1))
        }
    };
    RateLimit {
        name: policy.id().as_str().to_owned(),
        requests_per_unit: u32::try_from(requests).unwrap_or(u32::MAX),
        unit: unit.into(),
    }
}

fn proto_duration(millis: u64) -> ProtoDuration {
    ProtoDuration {
        seconds: i64::try_from(millis / 1000).unwrap_or(i64::MAX),
        nanos: i32::try_from(millis % 1000 * 1_000_000).unwrap_or(0),
    }
}

fn header(key: &str, value: Vec<u8>) -> HeaderValue {
    // The fields are ASCII by construction (validated ids, digits).
    HeaderValue {
        key: key.to_owned(),
        value: String::from_utf8(value).unwrap_or_default(),
        ..HeaderValue::default()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use shared_contract::FixedWindow;

    use super::*;

    /// docs/envoy-rls.md, "The answer": Envoy's units exactly (a month 30
    /// days, a year 365), any other window in the longest unit not longer
    /// than it with the limit scaled down to it, at least 1.
    #[test]
    fn current_limit_is_the_unit_or_the_closest_shorter_unit_scaled() {
        const DAY: u64 = 86_400;
        let cases = [
            (5, 10, 1, Unit::Second),
            (7, 3 * DAY, 2, Unit::Day),
            (9, 30 * DAY, 9, Unit::Month),
            (4, 365 * DAY, 4, Unit::Year),
            (3, 60, 3, Unit::Minute),
            (600, 600, 60, Unit::Minute),
            (1, 2 * 3_600, 1, Unit::Hour),
            (14, 14 * DAY, 7, Unit::Week),
        ];
        for (limit, seconds, requests, unit) in cases {
            let window = FixedWindow { limit, window: Duration::from_secs(seconds) };
            let policy = RateLimitPolicy::builder("p", window).build().unwrap();
            let shown = current_limit(&policy);
            assert_eq!(
                (shown.requests_per_unit, shown.unit),
                (requests, unit as i32),
                "{limit}/{seconds}s"
            );
        }
    }
}
