//! The behaviours every provider must give through the RLS, written once
//! and run on the memory provider, Redis standalone and Redis Cluster.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use async_trait::async_trait;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use shared_contract::{
    BudgetFailure, BudgetKey, BudgetState, EdgeRateLimitPort, Evaluation, Lease, ManualClock,
    PolicyId, PolicyMode, PolicyScope, RateLimitPolicy, RateLimitRequest, Releasing,
};

use super::*;

/// Builds a provider holding `policies` on `clock`.
pub type PortFactory = dyn Fn(Vec<RateLimitPolicy>, ManualClock) -> Arc<dyn EdgeRateLimitPort>;

/// A port that counts the calls that reach it and keeps the last deadline.
#[derive(Debug)]
pub struct Counting {
    pub inner: Arc<dyn EdgeRateLimitPort>,
    pub evaluations: AtomicUsize,
    pub deadline: std::sync::Mutex<Option<Instant>>,
}

impl Counting {
    pub fn new(inner: Arc<dyn EdgeRateLimitPort>) -> Arc<Self> {
        Arc::new(Self { inner, evaluations: AtomicUsize::new(0), deadline: Default::default() })
    }

    pub fn calls(&self) -> usize {
        self.evaluations.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl EdgeRateLimitPort for Counting {
    fn evaluate(&self, request: RateLimitRequest) -> Evaluation {
        self.evaluations.fetch_add(1, Ordering::SeqCst);
        *self.deadline.lock().unwrap() = Some(request.deadline);
        self.inner.evaluate(request)
    }
    fn policy(&self, id: &PolicyId) -> Option<&RateLimitPolicy> {
        self.inner.policy(id)
    }
    async fn is_ready(&self) -> bool {
        self.inner.is_ready().await
    }
    async fn inspect(&self, key: &BudgetKey) -> Result<BudgetState, BudgetFailure> {
        self.inner.inspect(key).await
    }
    async fn reset(&self, key: &BudgetKey) -> Result<(), BudgetFailure> {
        self.inner.reset(key).await
    }
    fn release(&self, lease: &Lease) -> Releasing {
        self.inner.release(lease)
    }
}

/// per-ip: 2 a minute per subject across rules; checkout: 5 a minute per
/// (subject, rule); trial: a shadow policy that would deny after 1.
pub fn policies() -> Vec<RateLimitPolicy> {
    let trial = RateLimitPolicy::builder(
        "trial",
        shared_contract::Algorithm::FixedWindow(shared_contract::FixedWindow {
            limit: 1,
            window: std::time::Duration::from_secs(60),
        }),
    )
    .mode(PolicyMode::Shadow)
    .build()
    .unwrap();
    vec![
        fixed("per-ip", 2, 60, PolicyScope::Subject),
        fixed("checkout", 5, 60, PolicyScope::Operation),
        fixed("bulk", 10, 60, PolicyScope::Operation),
        trial,
    ]
}

pub fn rules() -> Vec<RlsRule> {
    vec![
        rule("edge", &["remote_address"], None, &["per-ip"]),
        rule(
            "edge",
            &["generic_key=checkout", "remote_address"],
            Some(&["remote_address"]),
            &["checkout"],
        ),
        rule("edge", &["generic_key=bulk", "remote_address"], Some(&["remote_address"]), &["bulk"]),
        rule("edge", &["generic_key=trial", "user"], None, &["trial"]),
    ]
}

pub fn clock() -> ManualClock {
    ManualClock::new(1_700_000_000_000)
}

async fn start(factory: &PortFactory) -> (Rls, Arc<Counting>) {
    let clock = clock();
    let port = Counting::new(factory(policies(), clock.clone()));
    let rls = Rls::start(engine(port.clone(), Arc::new(clock), &rules())).await;
    (rls, port)
}

fn ip(address: &str) -> RateLimitDescriptor {
    descriptor(&[("remote_address", address)], None)
}

fn checkout(address: &str, hits: Option<u64>) -> RateLimitDescriptor {
    descriptor(&[("generic_key", "checkout"), ("remote_address", address)], hits)
}

/// The common Envoy shape: a per-IP descriptor and a per-IP-per-route one,
/// one subject, one atomic step. Once per-ip is spent, the request is
/// refused and checkout is not charged.
pub async fn two_descriptors_of_one_subject_are_one_atomic_step(factory: &PortFactory) {
    let (mut rls, port) = start(factory).await;
    let both = || request("edge", vec![ip("10.0.0.1"), checkout("10.0.0.1", None)], 0);
    for remaining in [(1, 4), (0, 3)] {
        let answer = rls.ok(both()).await;
        assert_eq!(overall(&answer), Code::Ok);
        assert_eq!(
            summary(&answer),
            [
                (Code::Ok, remaining.0, Some("per-ip".to_owned())),
                (Code::Ok, remaining.1, Some("checkout".to_owned()))
            ]
        );
    }
    // One provider call per request: the two descriptors were one set.
    assert_eq!(port.calls(), 2);
    let refused = rls.ok(both()).await;
    assert_eq!(overall(&refused), Code::OverLimit);
    assert_eq!(
        summary(&refused),
        [
            (Code::OverLimit, 0, Some("per-ip".to_owned())),
            (Code::Ok, 3, Some("checkout".to_owned()))
        ]
    );
    let limit = refused.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!((limit.requests_per_unit, Unit::try_from(limit.unit).unwrap()), (2, Unit::Minute));
    let reset = refused.statuses[0].duration_until_reset.as_ref().unwrap();
    assert!(reset.seconds > 0 && reset.seconds <= 60, "{reset:?}");
    assert_eq!(
        header(&refused, "ratelimit-policy"),
        Some(r#""per-ip";q=2;w=60, "checkout";q=5;w=60"#)
    );
    let limit_header = header(&refused, "ratelimit").unwrap();
    assert!(limit_header.starts_with(r#""per-ip";r=0;t="#), "{limit_header}");
    assert!(limit_header.contains(r#", "checkout";r=3;t="#), "{limit_header}");
    let retry: u64 = header(&refused, "retry-after").unwrap().parse().unwrap();
    assert!((1..=60).contains(&retry), "{retry}");
    // The denial charged no unit of checkout: alone (a set of its own
    // subject and rule), it has 5 - 2 - 1 left, not 5 - 3 - 1.
    let alone = rls.ok(request("edge", vec![checkout("10.0.0.1", None)], 0)).await;
    assert_eq!(summary(&alone), [(Code::Ok, 2, Some("checkout".to_owned()))]);
    assert_eq!(header(&alone, "retry-after"), None);
}

/// `hits_addend` of a descriptor wins; 0 looks without charging; the
/// request's applies when the descriptor has none, 0 meaning 1.
pub async fn hits_addend_zero_n_and_unset(factory: &PortFactory) {
    let (mut rls, port) = start(factory).await;
    let one = |hits: Option<u64>, request_hits: u32| {
        request("edge", vec![checkout("10.0.0.2", hits)], request_hits)
    };
    // Unset everywhere: 1.
    assert_eq!(summary(&rls.ok(one(None, 0)).await)[0].1, 4);
    // The request's 2.
    assert_eq!(summary(&rls.ok(one(None, 2)).await)[0].1, 2);
    // Look only, twice: the same 2, nothing charged, no evaluation.
    let calls = port.calls();
    for _ in 0..2 {
        let look = rls.ok(one(Some(0), 3)).await;
        assert_eq!(overall(&look), Code::Ok);
        assert_eq!(summary(&look), [(Code::Ok, 2, Some("checkout".to_owned()))]);
    }
    assert_eq!(port.calls(), calls);
    // The descriptor's 2 beats the request's 1: all that is left.
    assert_eq!(summary(&rls.ok(one(Some(2), 1)).await)[0].1, 0);
    // Spent: a look now reports the denial, still charging nothing.
    let look = rls.ok(one(Some(0), 0)).await;
    assert_eq!(overall(&look), Code::OverLimit);
    assert_eq!(summary(&look), [(Code::OverLimit, 0, Some("checkout".to_owned()))]);
    // More than is left is denied and charges nothing either.
    let bulk =
        |hits| descriptor(&[("generic_key", "bulk"), ("remote_address", "10.0.0.2")], Some(hits));
    assert_eq!(summary(&rls.ok(request("edge", vec![bulk(1)], 0)).await)[0].1, 9);
    let refused = rls.ok(request("edge", vec![bulk(10)], 0)).await;
    assert_eq!(summary(&refused), [(Code::OverLimit, 9, Some("bulk".to_owned()))]);
    assert_eq!(summary(&rls.ok(request("edge", vec![bulk(9)], 0)).await)[0].1, 0);
}

/// A descriptor whose `hits_addend` is above what a policy of its rule
/// admits (its `maximum-cost`, here the limit) is `OVER_LIMIT` and charges
/// nothing, as envoyproxy/ratelimit refuses hits above the limit: an error
/// status would let the request through at Envoy's default
/// `failure_mode_deny: false`. No other descriptor of the call is charged
/// either, and no wait makes it pass, so no `Retry-After`.
pub async fn a_cost_above_what_a_policy_admits_is_over_limit_and_charges_nothing(
    factory: &PortFactory,
) {
    let (mut rls, port) = start(factory).await;
    let bulk =
        |hits| descriptor(&[("generic_key", "bulk"), ("remote_address", "10.0.0.10")], Some(hits));
    for hits in [11, 12, u64::from(u32::MAX) + 1, u64::MAX] {
        let refused = rls.ok(request("edge", vec![bulk(hits)], 0)).await;
        assert_eq!(overall(&refused), Code::OverLimit, "{hits}");
        assert_eq!(summary(&refused), [(Code::OverLimit, 0, Some("bulk".to_owned()))]);
        let limit = refused.statuses[0].current_limit.as_ref().unwrap();
        assert_eq!(
            (limit.requests_per_unit, Unit::try_from(limit.unit).unwrap()),
            (10, Unit::Minute)
        );
        assert_eq!(refused.statuses[0].duration_until_reset, None);
        assert_eq!(header(&refused, "retry-after"), None);
    }
    // The request's own hits_addend counts the same way.
    let request_hits =
        descriptor(&[("generic_key", "bulk"), ("remote_address", "10.0.0.10")], None);
    let refused = rls.ok(request("edge", vec![request_hits], 11)).await;
    assert_eq!(summary(&refused), [(Code::OverLimit, 0, Some("bulk".to_owned()))]);
    assert_eq!(port.calls(), 0, "refused before any provider call");
    // Nothing was charged: the whole budget is there.
    let after = rls.ok(request("edge", vec![bulk(1)], 0)).await;
    assert_eq!(summary(&after), [(Code::Ok, 9, Some("bulk".to_owned()))]);
    // Beside another subject's descriptor, the call is refused before either
    // is charged.
    let mixed = rls.ok(request("edge", vec![ip("10.0.0.11"), bulk(11)], 0)).await;
    assert_eq!(overall(&mixed), Code::OverLimit);
    assert_eq!(
        summary(&mixed),
        [(Code::Ok, 0, None), (Code::OverLimit, 0, Some("bulk".to_owned()))]
    );
    let alone = rls.ok(request("edge", vec![ip("10.0.0.11")], 0)).await;
    assert_eq!(summary(&alone), [(Code::Ok, 1, Some("per-ip".to_owned()))]);
    assert_eq!(port.calls(), 2);
}

/// A call that looks at a budget (`hits_addend` 0) and charges it: each
/// status is its descriptor's view, the headers the state after the call,
/// whichever comes first.
pub async fn a_look_and_a_charge_of_one_budget_show_the_state_after_the_call(
    factory: &PortFactory,
) {
    let (mut rls, _) = start(factory).await;
    let (look, charge) = (checkout("10.0.0.9", Some(0)), checkout("10.0.0.9", None));
    let first = rls.ok(request("edge", vec![look.clone(), charge.clone()], 0)).await;
    assert_eq!(
        summary(&first),
        [(Code::Ok, 5, Some("checkout".to_owned())), (Code::Ok, 4, Some("checkout".to_owned()))]
    );
    let limit = header(&first, "ratelimit").unwrap();
    assert!(limit.starts_with(r#""checkout";r=4;t="#), "{limit}");
    let second = rls.ok(request("edge", vec![charge, look], 0)).await;
    assert_eq!(
        summary(&second),
        [(Code::Ok, 3, Some("checkout".to_owned())), (Code::Ok, 3, Some("checkout".to_owned()))]
    );
    let limit = header(&second, "ratelimit").unwrap();
    assert!(limit.starts_with(r#""checkout";r=3;t="#), "{limit}");
}

/// Unknown domains, unknown patterns and unmatched fixed values are not
/// limited: `OK`, no limit, no provider call.
pub async fn unmatched_descriptors_pass_without_a_provider_call(factory: &PortFactory) {
    let (mut rls, port) = start(factory).await;
    let unmatched = [
        request("other", vec![ip("10.0.0.3")], 0),
        request(
            "edge",
            vec![descriptor(&[("generic_key", "nope"), ("remote_address", "1")], None)],
            0,
        ),
        request("edge", vec![descriptor(&[("remote_address", "1"), ("path", "/")], None)], 0),
        request(
            "edge",
            vec![descriptor(&[("remote_address", "1"), ("generic_key", "checkout")], None)],
            0,
        ),
    ];
    for ask in unmatched {
        for _ in 0..3 {
            let answer = rls.ok(ask.clone()).await;
            assert_eq!(overall(&answer), Code::Ok);
            assert_eq!(summary(&answer), [(Code::Ok, 0, None)]);
            assert!(answer.response_headers_to_add.is_empty());
        }
    }
    assert_eq!(port.calls(), 0);
    // Mixed with a matched one, only that one is asked about.
    let mixed =
        rls.ok(request("edge", vec![descriptor(&[("x", "y")], None), ip("10.0.0.3")], 0)).await;
    assert_eq!(summary(&mixed), [(Code::Ok, 0, None), (Code::Ok, 1, Some("per-ip".to_owned()))]);
    assert_eq!(port.calls(), 1);
}

/// A descriptor of an `unlimited` rule is `OK` without a provider call,
/// and a later rule it also fits is never reached; a descriptor the
/// unlimited pattern does not fit goes on to that later rule.
pub async fn unlimited_rules_pass_without_a_provider_call(factory: &PortFactory) {
    let clock = clock();
    let port = Counting::new(factory(policies(), clock.clone()));
    let rules = [
        unlimited("edge", &["generic_key=internal", "remote_address"]),
        rule("edge", &["generic_key", "remote_address"], Some(&["remote_address"]), &["per-ip"]),
    ];
    let mut rls = Rls::start(engine(port.clone(), Arc::new(clock), &rules)).await;
    let keyed =
        |key: &str| descriptor(&[("generic_key", key), ("remote_address", "10.0.0.9")], None);
    for _ in 0..4 {
        let answer = rls.ok(request("edge", vec![keyed("internal")], 0)).await;
        assert_eq!(overall(&answer), Code::Ok);
        // envoyproxy/ratelimit's unlimited status: the largest remaining.
        assert_eq!(summary(&answer), [(Code::Ok, u32::MAX, None)]);
        assert!(answer.response_headers_to_add.is_empty());
    }
    assert_eq!(port.calls(), 0);
    // per-ip allows 2 a minute: the unlimited calls above charged none.
    for expected in [Code::Ok, Code::Ok, Code::OverLimit] {
        let answer = rls.ok(request("edge", vec![keyed("public")], 0)).await;
        assert_eq!(overall(&answer), expected);
    }
    assert_eq!(port.calls(), 3);
    // Beside a limited descriptor of the same subject, only that one is asked.
    let both = rls.ok(request("edge", vec![keyed("internal"), keyed("public")], 0)).await;
    assert_eq!(
        summary(&both),
        [(Code::Ok, u32::MAX, None), (Code::OverLimit, 0, Some("per-ip".to_owned()))]
    );
    assert_eq!(port.calls(), 4);
}

/// A GCRA policy through the RLS, as docs/envoy-rls.md and
/// docs/algorithms.md say: `current_limit` is its burst `b` per `b x T`
/// (in the longest unit not longer than it, the limit scaled to it:
/// docs/envoy-rls.md, "The answer"), `limit_remaining`
/// the cells that conform now, `duration_until_reset` when the next cell
/// beyond them conforms; the headers are the HTTP edge's for GCRA.
pub async fn gcra_statuses_and_headers(factory: &PortFactory) {
    use std::time::Duration;
    let gcra = |id: &str, limit: u64, burst: u64| {
        let period = Duration::from_secs(1);
        let algorithm =
            shared_contract::Algorithm::Gcra(shared_contract::Gcra { limit, period, burst });
        RateLimitPolicy::builder(id, algorithm).build().unwrap()
    };
    let clock = clock();
    let mut policies = policies();
    // 10 a second, T = 100 ms, 5 at once: b x T = 500 ms. 2 a second,
    // T = 500 ms, 2 at once: b x T = 1 s.
    policies.extend([gcra("gcra-burst", 10, 5), gcra("gcra-second", 2, 2)]);
    let port = Counting::new(factory(policies, clock.clone()));
    let rules = [
        rule("gcra", &["user"], None, &["gcra-burst"]),
        rule("gcra", &["team"], None, &["gcra-second"]),
    ];
    let mut rls = Rls::start(engine(port, Arc::new(clock.clone()), &rules)).await;
    let user = || request("gcra", vec![descriptor(&[("user", "u1")], None)], 0);
    let until_reset = |answer: &RateLimitResponse| {
        let reset = answer.statuses[0].duration_until_reset.unwrap();
        Duration::new(reset.seconds.try_into().unwrap(), reset.nanos.try_into().unwrap())
    };
    // The burst of 5 at one instant: each cell leaves one less, and the
    // next cell beyond them conforms T = 100 ms later.
    for remaining in [4, 3, 2, 1, 0] {
        let answer = rls.ok(user()).await;
        assert_eq!(overall(&answer), Code::Ok);
        assert_eq!(summary(&answer), [(Code::Ok, remaining, Some("gcra-burst".to_owned()))]);
        let limit = answer.statuses[0].current_limit.as_ref().unwrap();
        // 5 per 500 ms: 10 per second.
        assert_eq!((limit.requests_per_unit, limit.unit), (10, Unit::Second as i32));
        assert_eq!(until_reset(&answer), Duration::from_millis(100));
        // q = b, w = b x T = 0.5 s rounded up; t = 100 ms rounded up.
        assert_eq!(header(&answer, "ratelimit-policy"), Some(r#""gcra-burst";q=5;w=1"#));
        let expected = format!(r#""gcra-burst";r={remaining};t=1"#);
        assert_eq!(header(&answer, "ratelimit"), Some(expected.as_str()));
        assert_eq!(header(&answer, "retry-after"), None);
    }
    // The sixth does not conform: OVER_LIMIT until T has passed.
    let refused = rls.ok(user()).await;
    assert_eq!(overall(&refused), Code::OverLimit);
    assert_eq!(summary(&refused), [(Code::OverLimit, 0, Some("gcra-burst".to_owned()))]);
    assert_eq!(until_reset(&refused), Duration::from_millis(100));
    assert_eq!(header(&refused, "retry-after"), Some("1"));
    assert_eq!(header(&refused, "ratelimit"), Some(r#""gcra-burst";r=0;t=1"#));
    clock.advance(Duration::from_millis(100));
    assert_eq!(summary(&rls.ok(user()).await), [(Code::Ok, 0, Some("gcra-burst".to_owned()))]);
    assert_eq!(overall(&rls.ok(user()).await), Code::OverLimit);
    // b x T of exactly one second is reported as SECOND.
    let team = rls.ok(request("gcra", vec![descriptor(&[("team", "t1")], None)], 0)).await;
    assert_eq!(summary(&team), [(Code::Ok, 1, Some("gcra-second".to_owned()))]);
    let limit = team.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!((limit.requests_per_unit, limit.unit), (2, Unit::Second as i32));
    assert_eq!(until_reset(&team), Duration::from_millis(500));
    assert_eq!(header(&team, "ratelimit-policy"), Some(r#""gcra-second";q=2;w=1"#));
}

/// Different subjects are separate sets in request order; the first denied
/// ends the call, so a later subject is not charged.
pub async fn the_first_denied_set_stops_the_later_ones(factory: &PortFactory) {
    let (mut rls, port) = start(factory).await;
    for _ in 0..2 {
        rls.ok(request("edge", vec![ip("10.0.0.4")], 0)).await;
    }
    let calls = port.calls();
    let answer = rls.ok(request("edge", vec![ip("10.0.0.4"), ip("10.0.0.5")], 0)).await;
    assert_eq!(overall(&answer), Code::OverLimit);
    assert_eq!(
        summary(&answer),
        [(Code::OverLimit, 0, Some("per-ip".to_owned())), (Code::Ok, 0, None)]
    );
    assert_eq!(port.calls(), calls + 1, "the second subject was never asked");
    // 10.0.0.5 still has its whole budget: 2 - 1.
    let later = rls.ok(request("edge", vec![ip("10.0.0.5")], 0)).await;
    assert_eq!(summary(&later), [(Code::Ok, 1, Some("per-ip".to_owned()))]);
}

/// A shadow policy never denies and never shows in the headers; its
/// descriptor's status is envoyproxy/ratelimit's for `shadow_mode`: `OK`,
/// with the limit and what remains (trial allows 1: none after the first).
pub async fn shadow_policies_never_deny_and_never_show_in_the_headers(factory: &PortFactory) {
    let (mut rls, port) = start(factory).await;
    let trial =
        || request("edge", vec![descriptor(&[("generic_key", "trial"), ("user", "u1")], None)], 0);
    for _ in 0..3 {
        let answer = rls.ok(trial()).await;
        assert_eq!(overall(&answer), Code::Ok);
        assert_eq!(summary(&answer), [(Code::Ok, 0, Some("trial".to_owned()))]);
        assert!(answer.response_headers_to_add.is_empty(), "{answer:?}");
    }
    assert_eq!(port.calls(), 3, "a shadow policy is still evaluated");
}

/// What the request's shape alone decides, before any provider call. No
/// descriptor at all is `INVALID_ARGUMENT`: nothing could be limited. More
/// than the cap is `OVER_LIMIT` for every descriptor, never an error that
/// Envoy's default lets through. A descriptor without entries, or with an
/// empty key, matches no rule (none can have either), so it is `OK` and
/// the others of the call are still limited.
pub async fn malformed_requests_never_pass_a_limited_descriptor(factory: &PortFactory) {
    let (mut rls, port) = start(factory).await;
    let status = rls.ask(request("edge", vec![], 0)).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("at least one descriptor"), "{status:?}");
    // No domain names no rules: refused as envoyproxy/ratelimit refuses it.
    let status = rls.ask(request("", vec![ip("10.0.0.6")], 0)).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("a domain"), "{status:?}");
    // One past the cap, each a different subject (one atomic step each).
    let too_many: Vec<_> = (0..=adapter_envoy_rls::MAX_DESCRIPTORS)
        .map(|index| ip(&format!("10.1.{}.{}", index / 256, index % 256)))
        .collect();
    let refused = rls.ok(request("edge", too_many, 0)).await;
    assert_eq!(overall(&refused), Code::OverLimit);
    assert_eq!(refused.statuses.len(), adapter_envoy_rls::MAX_DESCRIPTORS + 1);
    assert!(refused.statuses.iter().all(|status| code(status) == Code::OverLimit));
    assert_eq!(header(&refused, "retry-after"), None);
    assert_eq!(port.calls(), 0);
    // per-ip allows 2 a minute: a malformed neighbour does not let a third through.
    let empty_key = descriptor(&[("", "10.0.0.6")], None);
    let no_entry = descriptor(&[], None);
    for expected in [Code::Ok, Code::Ok, Code::OverLimit] {
        let answer = rls
            .ok(request("edge", vec![ip("10.0.0.6"), empty_key.clone(), no_entry.clone()], 0))
            .await;
        assert_eq!(overall(&answer), expected);
        assert_eq!(&summary(&answer)[1..], [(Code::Ok, 0, None), (Code::Ok, 0, None)]);
    }
    assert_eq!(port.calls(), 3);
}

/// A descriptor's `limit` override does not change the configured limit.
pub async fn a_limit_override_is_ignored(factory: &PortFactory) {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
    let (mut rls, _) = start(factory).await;
    let mut loose = ip("10.0.0.7");
    loose.limit = Some(RateLimitOverride { requests_per_unit: 1000, unit: 2 });
    let mut answers = Vec::new();
    for _ in 0..3 {
        answers.push(overall(&rls.ok(request("edge", vec![loose.clone()], 0)).await));
    }
    assert_eq!(answers, [Code::Ok, Code::Ok, Code::OverLimit]);
}

/// A descriptor's `limit` override on a rule with `allow_override`
/// (docs/envoy-rls.md, "Rules"): a fixed window of the override's size,
/// `envoy-override.<n>-per-<unit>`, keyed by the effective limit, so 3 a
/// minute and 4 a minute of one address never share a counter and a
/// refusal of one never answers the other; the rule's own policy is left
/// whole. 0 requests or an unknown unit refuse the call without a provider
/// call (envoyproxy/ratelimit answers 0 `OVER_LIMIT`). A rule without it
/// ignores the override.
pub async fn a_limit_override_runs_under_its_own_budget_where_the_rule_allows_it(
    factory: &PortFactory,
) {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
    let clock = clock();
    let port = Counting::new(factory(policies(), clock.clone()));
    // The ports of the two effective limits, built ahead (the factory is
    // borrowed): each holds exactly the policy the docs name.
    let mut held = std::collections::HashMap::new();
    for count in [3, 4] {
        let id = format!("envoy-override.{count}-per-minute");
        let window = shared_contract::FixedWindow {
            limit: count,
            window: std::time::Duration::from_secs(60),
        };
        let policy = RateLimitPolicy::builder(&id, window).maximum_cost(count).build().unwrap();
        held.insert(id, (policy.clone(), Counting::new(factory(vec![policy], clock.clone()))));
    }
    let ports = held.clone();
    let overrides: adapter_envoy_rls::OverridePorts = Arc::new(move |policy| {
        let (expected, port) = ports.get(policy.id().as_str())?;
        assert_eq!(&policy, expected, "the override's policy is the one the docs name");
        Some(port.clone() as Arc<dyn EdgeRateLimitPort>)
    });
    let rules = [
        RlsRule { allow_override: true, ..rule("edge", &["remote_address"], None, &["per-ip"]) },
        rule("edge", &["generic_key=checkout", "remote_address"], None, &["checkout"]),
    ];
    let engine = engine(port.clone(), Arc::new(clock), &rules).with_overrides(overrides);
    let mut rls = Rls::start(engine).await;
    let at = |count: u32, unit: i32| {
        let mut ip = ip("10.0.9.1");
        ip.limit = Some(RateLimitOverride { requests_per_unit: count, unit });
        ip
    };
    let minute = Unit::Minute as i32;
    let mut codes = Vec::new();
    for _ in 0..4 {
        let answer = rls.ok(request("edge", vec![at(3, minute)], 0)).await;
        let status = &answer.statuses[0];
        let limit = status.current_limit.as_ref().unwrap();
        assert_eq!(limit.name, "envoy-override.3-per-minute");
        assert_eq!((limit.requests_per_unit, limit.unit), (3, minute));
        codes.push(overall(&answer));
    }
    assert_eq!(codes, [Code::Ok, Code::Ok, Code::Ok, Code::OverLimit]);
    let mut codes = Vec::new();
    for _ in 0..5 {
        codes.push(overall(&rls.ok(request("edge", vec![at(4, minute)], 0)).await));
    }
    assert_eq!(codes, [Code::Ok, Code::Ok, Code::Ok, Code::Ok, Code::OverLimit]);
    assert_eq!(port.calls(), 0, "the rule's own port was not asked");
    assert_eq!(held["envoy-override.3-per-minute"].1.calls(), 4);
    // The rule's own per-ip budget (2 a minute) is whole.
    let mut codes = Vec::new();
    for _ in 0..3 {
        codes.push(overall(&rls.ok(request("edge", vec![ip("10.0.9.1")], 0)).await));
    }
    assert_eq!(codes, [Code::Ok, Code::Ok, Code::OverLimit]);
    // 0 requests, an unknown unit: refused, no provider asked, no wait.
    for refused in [at(0, minute), at(10, Unit::Unknown as i32), at(10, 99)] {
        let answer = rls.ok(request("edge", vec![refused], 0)).await;
        assert_eq!(summary(&answer), [(Code::OverLimit, 0, None)]);
        assert_eq!(header(&answer, "retry-after"), None);
    }
    assert_eq!(port.calls(), 3);
    // A rule without `allow_override`: checkout's 5 a minute, not 1000.
    let mut loose = checkout("10.0.9.2", None);
    loose.limit = Some(RateLimitOverride { requests_per_unit: 1000, unit: minute });
    let mut codes = Vec::new();
    for _ in 0..6 {
        codes.push(overall(&rls.ok(request("edge", vec![loose.clone()], 0)).await));
    }
    assert_eq!(codes, [[Code::Ok; 5].as_slice(), &[Code::OverLimit]].concat());
}

/// The provider's readiness is the health status.
pub async fn health_is_serving_while_the_provider_is_ready(rls: &Rls, serving: bool) {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_check_response::ServingStatus;
    let mut health = rls.health().await;
    let expected = if serving { ServingStatus::Serving } else { ServingStatus::NotServing };
    for service in ["", adapter_envoy_rls::RATE_LIMIT_SERVICE_NAME] {
        let answer = health
            .check(HealthCheckRequest { service: service.to_owned() })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(ServingStatus::try_from(answer.status).unwrap(), expected, "{service:?}");
    }
    let unknown = health.check(HealthCheckRequest { service: "other".to_owned() }).await;
    assert_eq!(unknown.unwrap_err().code(), tonic::Code::NotFound);
}

/// A wildcard value (docs/envoy-rls.md, "Rules"): an exact rule before it
/// answers its own value; every other value it matches has a budget of
/// its own, or one budget for all when the rule's subject leaves it out
/// (envoyproxy/ratelimit's `share_threshold`). checkout allows 5 a minute.
pub async fn wildcard_values_count_per_value_or_together(factory: &PortFactory) {
    let clock = clock();
    let port = Counting::new(factory(policies(), clock.clone()));
    let rules = [
        unlimited("files", &["path=/api/health"]),
        rule("files", &["path=/api/*"], None, &["checkout"]),
        rule("files", &["bucket=b*", "user"], Some(&["user"]), &["checkout"]),
    ];
    let mut rls = Rls::start(engine(port.clone(), Arc::new(clock), &rules)).await;
    let codes = |answer: &RateLimitResponse| summary(answer).into_iter().map(|(code, ..)| code);
    let path = |value: &str| descriptor(&[("path", value)], None);
    let health = rls.ok(request("files", vec![path("/api/health")], 0)).await;
    assert_eq!(summary(&health), [(Code::Ok, u32::MAX, None)]);
    // Per value: five each for /api/a and /api/b, the sixth of each refused.
    for value in ["/api/a", "/api/b"] {
        for expected in [[Code::Ok]; 5].into_iter().chain([[Code::OverLimit]]) {
            let answer = rls.ok(request("files", vec![path(value)], 0)).await;
            assert_eq!(codes(&answer).collect::<Vec<_>>(), expected, "{value}");
        }
    }
    // No match: not limited.
    let other = rls.ok(request("files", vec![path("/static/x")], 0)).await;
    assert_eq!(summary(&other), [(Code::Ok, 0, None)]);
    // Shared: b1, b2 and b3 of one user spend one budget of five.
    let bucket = |value: &str| descriptor(&[("bucket", value), ("user", "u1")], None);
    let mut seen = Vec::new();
    for value in ["b1", "b2", "b3", "b1", "b2", "b3"] {
        let answer = rls.ok(request("files", vec![bucket(value)], 0)).await;
        seen.extend(codes(&answer));
    }
    assert_eq!(seen, [[Code::Ok; 5].as_slice(), &[Code::OverLimit]].concat());
    assert_eq!(port.calls(), 12 + 6);
}

/// A rule that does not limit ends the search as envoyproxy/ratelimit's
/// lookup does, answered as no rule (`OK`, remaining 0, no limit); a
/// blocking rule (its `requests_per_unit: 0`) refuses the whole call before
/// any set runs, so the call's other descriptors are not charged.
pub async fn rules_without_policies_stop_or_block_without_a_provider_call(factory: &PortFactory) {
    let clock = clock();
    let port = Counting::new(factory(policies(), clock.clone()));
    let rules = [
        answered("edge", &["tier=free", "remote_address"], RuleLimit::NotLimited),
        answered("edge", &["tier=banned", "remote_address"], RuleLimit::Blocked),
        rule("edge", &["tier", "remote_address"], Some(&["remote_address"]), &["per-ip"]),
    ];
    let mut rls = Rls::start(engine(port.clone(), Arc::new(clock), &rules)).await;
    let tier = |tier: &str| descriptor(&[("tier", tier), ("remote_address", "10.0.7.1")], None);
    for _ in 0..3 {
        let free = rls.ok(request("edge", vec![tier("free")], 0)).await;
        assert_eq!(summary(&free), [(Code::Ok, 0, None)]);
    }
    assert_eq!(port.calls(), 0, "the later per-ip rule is never reached");
    let banned = rls.ok(request("edge", vec![tier("gold"), tier("banned")], 0)).await;
    assert_eq!(overall(&banned), Code::OverLimit);
    assert_eq!(summary(&banned), [(Code::Ok, 0, None), (Code::OverLimit, 0, None)]);
    assert_eq!(header(&banned, "retry-after"), None);
    assert_eq!(port.calls(), 0, "nothing of a blocked call is charged");
    // per-ip allows 2 a minute: both are still there for gold.
    for expected in [Code::Ok, Code::Ok, Code::OverLimit] {
        assert_eq!(overall(&rls.ok(request("edge", vec![tier("gold")], 0)).await), expected);
    }
}

/// envoyproxy/ratelimit's README example 7 (`replaces`): a call matching
/// both rules is checked and charged by the replacing one only (bulk, 10 a
/// minute), and the replaced one's budget (checkout, 5) is left whole for
/// the calls that match it alone.
pub async fn a_replacing_rule_drops_the_one_it_replaces_from_the_call(factory: &PortFactory) {
    let clock = clock();
    let port = Counting::new(factory(policies(), clock.clone()));
    let specific = RlsRule {
        name: Some("specific_limit".to_owned()),
        ..rule("example7", &["key_1=value_1", "user=bkthomps"], None, &["checkout"])
    };
    let replacing = RlsRule {
        replaces: vec!["specific_limit".to_owned()],
        ..rule("example7", &["key_2=value_2", "user=bkthomps"], None, &["bulk"])
    };
    let mut rls = Rls::start(engine(port.clone(), Arc::new(clock), &[specific, replacing])).await;
    let one = descriptor(&[("key_1", "value_1"), ("user", "bkthomps")], None);
    let two = descriptor(&[("key_2", "value_2"), ("user", "bkthomps")], None);
    for n in 1..=11 {
        let answer = rls.ok(request("example7", vec![one.clone(), two.clone()], 0)).await;
        let expected = if n <= 10 { Code::Ok } else { Code::OverLimit };
        assert_eq!(overall(&answer), expected, "call {n}");
        assert_eq!(summary(&answer)[0], (Code::Ok, 0, None), "replaced: as no rule");
    }
    for n in 1..=6 {
        let answer = rls.ok(request("example7", vec![one.clone()], 0)).await;
        let expected = if n <= 5 { Code::Ok } else { Code::OverLimit };
        assert_eq!(overall(&answer), expected, "alone, call {n}");
    }
}

/// Every scenario that needs only a working provider.
pub async fn all(factory: &PortFactory) {
    two_descriptors_of_one_subject_are_one_atomic_step(factory).await;
    hits_addend_zero_n_and_unset(factory).await;
    a_look_and_a_charge_of_one_budget_show_the_state_after_the_call(factory).await;
    unmatched_descriptors_pass_without_a_provider_call(factory).await;
    unlimited_rules_pass_without_a_provider_call(factory).await;
    gcra_statuses_and_headers(factory).await;
    the_first_denied_set_stops_the_later_ones(factory).await;
    shadow_policies_never_deny_and_never_show_in_the_headers(factory).await;
    a_cost_above_what_a_policy_admits_is_over_limit_and_charges_nothing(factory).await;
    malformed_requests_never_pass_a_limited_descriptor(factory).await;
    a_limit_override_is_ignored(factory).await;
    a_limit_override_runs_under_its_own_budget_where_the_rule_allows_it(factory).await;
    wildcard_values_count_per_value_or_together(factory).await;
    rules_without_policies_stop_or_block_without_a_provider_call(factory).await;
    a_replacing_rule_drops_the_one_it_replaces_from_the_call(factory).await;
    let (rls, _) = start(factory).await;
    health_is_serving_while_the_provider_is_ready(&rls, true).await;
}
