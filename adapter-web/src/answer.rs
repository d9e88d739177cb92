//! What the edge answers a request: the bridge's evaluation, the
//! `RateLimit` headers that describe it (the table in docs/http-edge.md),
//! and the one `Refusal` type of every answer the handler does not give,
//! as problem+json, reshaped by the service's hook if it set one. Shadow
//! policies never show and never refuse. The bottom of the crate: it
//! imports none of its modules.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::response::IntoResponse;
use http::header::RETRY_AFTER;
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode, Uri};
use problem_details::{ProblemDetails, ProblemType};
use shared_contract::{
    IncompatibleCategory, PolicyId, PolicyMode, PolicySet, RateLimitDecision, RateLimitFailure,
    RateLimitOutcome, RateLimitOutcomeExt, RateLimitPolicy, UnavailableCategory, quota_window,
    whole_seconds_up, whole_seconds_up_millis, write_limit_item, write_policy_field_at,
};

/// What the bridge learned about one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BridgeEvaluation {
    /// The operation's policy set (or the default set), in configured order.
    pub policies: PolicySet,
    /// Each policy of the set as the port holds it; `None` for one it does not know.
    pub described: Arc<[Option<RateLimitPolicy>]>,
    /// The port's answer: one decision per policy of the set, in order.
    pub outcome: RateLimitOutcome,
    /// The set's `RateLimit-Policy` header.
    pub(crate) policy_header: Option<HeaderValue>,
}

impl BridgeEvaluation {
    /// Whether the policy at `index` can block (see [`enforcing`]).
    pub(crate) fn enforced_at(&self, index: usize) -> bool {
        enforcing(self.described.get(index).and_then(Option::as_ref))
    }

    /// Whether any policy of the set can block (a shadow-only set never does).
    pub fn enforces(&self) -> bool {
        (0..self.policies.len()).any(|index| self.enforced_at(index))
    }

    /// Whether the handler runs: admitted, or nothing in the set enforced.
    pub fn admits(&self) -> bool {
        self.outcome.is_allowed() || !self.enforces()
    }

    /// The enforced policies with their decisions as `RateLimit` lists them, and
    /// whether each has a reset time (a concurrency policy has none).
    pub fn enforced_decisions(
        &self,
    ) -> impl Iterator<Item = (&PolicyId, &RateLimitDecision, bool)> {
        let decisions = self.outcome.as_ref().map_or(&[][..], |set| set.decisions());
        let members = self.policies.ids().iter().zip(decisions).enumerate();
        members.filter(|(index, _)| self.enforced_at(*index)).map(|(index, (id, decision))| {
            let policy = self.described.get(index).and_then(Option::as_ref);
            (id, decision, policy.is_none_or(|policy| quota_window(policy.algorithm()).is_some()))
        })
    }

    /// The enforced policies that denied, in order: a `429`'s `violated-policies`.
    pub fn violated_policies(&self) -> Vec<(&PolicyId, &RateLimitDecision)> {
        let enforced = self.enforced_decisions().filter(|(_, decision, _)| !decision.allowed);
        enforced.map(|(id, decision, _)| (id, decision)).collect()
    }
}

/// Whether a policy can block: enforced, or unknown to the port (it fails closed).
pub(crate) fn enforcing(policy: Option<&RateLimitPolicy>) -> bool {
    policy.is_none_or(|policy| policy.mode() == PolicyMode::Enforce)
}

/// The policies the port described and enforces: those a client sees.
pub(crate) fn enforced(
    described: &[Option<RateLimitPolicy>],
) -> impl Iterator<Item = &RateLimitPolicy> {
    described.iter().flatten().filter(|policy| policy.mode() == PolicyMode::Enforce)
}

/// `RateLimit-Policy` header name.
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit` header name.
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// The `RateLimit-Policy` and `RateLimit` headers of the enforced policies; none for a failure.
pub(crate) fn decision_headers(evaluation: &BridgeEvaluation) -> DecisionHeaders {
    let mut enforced = evaluation.enforced_decisions().peekable();
    if enforced.peek().is_none() {
        return DecisionHeaders::default();
    }
    DecisionHeaders { policy: evaluation.policy_header.clone(), limit: limit_header(enforced) }
}

/// A decision's two headers, held as values until the response is there: no
/// header map of their own to allocate and merge.
#[derive(Debug, Default)]
pub(crate) struct DecisionHeaders {
    policy: Option<HeaderValue>,
    limit: Option<HeaderValue>,
}

impl DecisionHeaders {
    /// Sets them on `headers`, replacing any of the same name.
    pub(crate) fn apply(self, headers: &mut HeaderMap) {
        if let Some(value) = self.policy {
            headers.insert(RATELIMIT_POLICY, value);
        }
        if let Some(value) = self.limit {
            headers.insert(RATELIMIT, value);
        }
    }
}

/// `"<policy id>";q=<limit>;w=<window seconds>` for each policy, in order;
/// `now` (epoch ms) is read only for a window that moves.
pub(crate) fn policy_header<'a>(
    policies: impl IntoIterator<Item = &'a RateLimitPolicy>,
    now: impl Fn() -> u64,
) -> Option<HeaderValue> {
    let mut text = Vec::with_capacity(64);
    write_policy_field_at(&mut text, policies, now);
    header(text)
}

/// `"<policy id>";r=<remaining>;t=<seconds until whole>` for each policy,
/// in order (no `t` when `resets` is false).
pub(crate) fn limit_header<'a>(
    decisions: impl IntoIterator<Item = (&'a PolicyId, &'a RateLimitDecision, bool)>,
) -> Option<HeaderValue> {
    let mut text = Vec::with_capacity(64);
    for (policy_id, decision, resets) in decisions {
        write_limit_item(&mut text, policy_id, decision, resets);
    }
    header(text)
}

/// Written by hand, not through `sfv`: made per request, and a validated
/// policy id needs no escapes (tests compare them); `None` when empty.
fn header(text: Vec<u8>) -> Option<HeaderValue> {
    HeaderValue::from_maybe_shared(Bytes::from(text)).ok().filter(|value| !value.is_empty())
}

/// Why the edge answered instead of the handler: every refusal, before
/// evaluation or after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal<'a> {
    /// The port's answer was not an allowed decision (`429` or `503`).
    Outcome(&'a BridgeEvaluation),
    /// The API key header is unusable (`400`); nothing was charged.
    InvalidApiKey(ApiKeyProblem),
    /// No socket peer address (`ConnectInfo`) reached the edge: a wiring
    /// fault (`500`); nothing was charged.
    MissingPeerAddress,
}

/// Longest API key accepted, in bytes.
pub const MAX_API_KEY_BYTES: usize = 256;

/// What is wrong with an API key. The key itself is never kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiKeyProblem {
    /// The header is present but empty.
    Empty,
    /// Longer than [`MAX_API_KEY_BYTES`].
    TooLong,
    /// A byte outside visible ASCII (`0x21..=0x7E`).
    NotVisibleAscii,
    /// The header appears more than once.
    Repeated,
}

/// Why an identity an operator typed cannot name a subject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdentityProblem {
    /// Not an API key the edge would accept from a client.
    InvalidApiKey(ApiKeyProblem),
    /// Not an IPv4 or IPv6 address.
    NotAnIpAddress,
    /// An empty principal.
    EmptyPrincipal,
}

impl ApiKeyProblem {
    /// A sentence for the client, free of the rejected value.
    const fn detail(self) -> &'static str {
        match self {
            Self::Empty => "The API key header is empty.",
            // `MAX_API_KEY_BYTES` written out (a const text cannot format it); a test checks it.
            Self::TooLong => "The API key is longer than 256 bytes.",
            Self::NotVisibleAscii => "The API key may only contain visible ASCII characters.",
            Self::Repeated => "The API key header must appear only once.",
        }
    }
}

impl Refusal<'static> {
    /// One refusal of each kind decided before evaluation.
    pub(crate) const BEFORE_EVALUATION: [Self; 2] =
        [Self::InvalidApiKey(ApiKeyProblem::Empty), Self::MissingPeerAddress];
}

impl Refusal<'_> {
    /// Kebab-case name: the problem `type` suffix.
    pub fn category_name(&self) -> &'static str {
        match self {
            Self::Outcome(evaluation) => evaluation.outcome.category_name(),
            Self::InvalidApiKey(_) => "invalid-api-key",
            Self::MissingPeerAddress => "client-address-unavailable",
        }
    }

    /// The metrics `outcome` label of a refusal before evaluation:
    /// `bad-request` for client errors.
    pub(crate) const fn outcome_label(&self) -> &'static str {
        match self {
            Self::InvalidApiKey(_) => "bad-request",
            Self::Outcome(_) | Self::MissingPeerAddress => "client-address-unavailable",
        }
    }

    /// The problem+json answer, with `Retry-After` and any decision headers.
    pub(crate) fn response(
        self,
        problem_base: &str,
        failure_retry_after: Duration,
    ) -> Response<Body> {
        let problem = |status| problem(problem_base, status, self.category_name());
        let evaluation = match self {
            Self::InvalidApiKey(key) => {
                let problem = problem(StatusCode::BAD_REQUEST).with_title("Invalid API Key");
                return problem.with_detail(key.detail()).into_response();
            }
            Self::MissingPeerAddress => {
                return problem(StatusCode::INTERNAL_SERVER_ERROR)
                    .with_title("Client Address Unavailable")
                    .with_detail("The server could not determine the client address.")
                    .into_response();
            }
            Self::Outcome(evaluation) => evaluation,
        };
        let failure_seconds = whole_seconds_up(failure_retry_after);
        let (mut response, retry_after) = match &evaluation.outcome {
            Ok(_) => {
                let violated = evaluation.violated_policies();
                // The request passes only once every denying policy allows it.
                let wait = violated.iter().map(|(_, decision)| decision.retry_after_ms).max();
                let seconds = wait.map_or(failure_seconds, whole_seconds_up_millis);
                let names: Vec<&str> = violated.iter().map(|(id, _)| id.as_str()).collect();
                let quoted: Vec<String> = names.iter().map(|name| format!("\"{name}\"")).collect();
                let detail = format!(
                    "Too many requests under rate limit {} {}; retry after {seconds} s.",
                    if names.len() == 1 { "policy" } else { "policies" },
                    quoted.join(", "),
                );
                let response = problem(StatusCode::TOO_MANY_REQUESTS)
                    .with_title("Too Many Requests")
                    .with_detail(detail)
                    .with_extensions(BTreeMap::from([("violated-policies", names)]))
                    .into_response();
                (response, seconds)
            }
            Err(failure) => {
                let response = problem(StatusCode::SERVICE_UNAVAILABLE)
                    .with_title("Rate Limit Unavailable")
                    .with_detail(failure_detail(failure))
                    .into_response();
                (response, failure_seconds)
            }
        };
        let headers = response.headers_mut();
        headers.insert(RETRY_AFTER, HeaderValue::from(retry_after));
        decision_headers(evaluation).apply(headers);
        response
    }
}
const fn failure_detail(failure: &RateLimitFailure) -> &'static str {
    use {IncompatibleCategory as I, UnavailableCategory as U};
    match failure {
        RateLimitFailure::Unavailable { category: U::AdmissionRejected, .. } => {
            "The rate limiter could not take the request before its deadline."
        }
        RateLimitFailure::Unavailable { category: U::UnavailableBeforeSend, .. } => {
            "The rate limit store could not be reached."
        }
        RateLimitFailure::Unavailable { category: U::ClockUnsafe, .. } => {
            "This server's clock disagrees with the rate limit store beyond the allowed skew; the request was not counted."
        }
        RateLimitFailure::Incompatible { category: I::UnknownPolicy } => {
            "The rate limit policy of this operation is not configured."
        }
        RateLimitFailure::Incompatible { category: I::CostExceedsMaximum } => {
            "The request costs more than its rate limit policy allows."
        }
        RateLimitFailure::Incompatible { category: I::StateIncompatible } => {
            "The stored rate limit state cannot be read by this server."
        }
        RateLimitFailure::Indeterminate { .. } => {
            "The rate limit decision could not be confirmed; the request was not served."
        }
    }
}

/// The default [`crate::EdgeSettings::problem_type_base`].
pub const DEFAULT_PROBLEM_TYPE_BASE: &str = "https://ca-skeleton.invalid/problems/";

/// A problem+json body with its status and `type`.
fn problem(base: &str, status: StatusCode, category: &str) -> ProblemDetails {
    // A bridge built from unvalidated settings still answers with a usable type.
    let r#type =
        problem_type(base, category).or_else(|| problem_type(DEFAULT_PROBLEM_TYPE_BASE, category));
    let mut problem = ProblemDetails::from_status_code(status);
    problem.r#type = r#type;
    problem
}

/// Every problem type suffix the edge can produce.
pub(crate) fn problem_type_names() -> impl Iterator<Item = &'static str> {
    let before = Refusal::BEFORE_EVALUATION.map(|refusal| refusal.category_name());
    RateLimitFailure::outcome_names().chain(before)
}

/// `base + category` as a problem type, if it is a URI.
pub(crate) fn problem_type(base: &str, category: &str) -> Option<ProblemType> {
    format!("{base}{category}").parse::<Uri>().ok().map(ProblemType::from)
}

type ShapeFn = dyn Fn(Refusal<'_>, Response<Body>) -> Response<Body> + Send + Sync;

/// Rewrites the default problem+json refusal; it cannot admit the request.
#[derive(Clone)]
pub(crate) struct RefusalShaper(pub(crate) Arc<ShapeFn>);

impl fmt::Debug for RefusalShaper {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("RefusalShaper(..)")
    }
}

#[cfg(test)]
mod refusal_tests {
    use super::*;

    #[test]
    fn every_refusal_before_evaluation_has_its_category_listed() {
        for refusal in
            [Refusal::InvalidApiKey(ApiKeyProblem::Repeated), Refusal::MissingPeerAddress]
        {
            // Exhaustive: a new refusal fails to compile until it is listed.
            match refusal {
                Refusal::Outcome(_) | Refusal::InvalidApiKey(_) | Refusal::MissingPeerAddress => {}
            }
            let listed = Refusal::BEFORE_EVALUATION
                .iter()
                .find(|r| r.category_name() == refusal.category_name());
            assert_eq!(listed.map(Refusal::outcome_label), Some(refusal.outcome_label()));
        }
    }

    #[test]
    fn the_too_long_detail_states_the_limit_in_force() {
        let detail = ApiKeyProblem::TooLong.detail();
        assert!(detail.contains(&format!("than {MAX_API_KEY_BYTES} bytes")), "{detail}");
    }
}

#[cfg(test)]
mod ratelimit_headers_tests {
    use std::time::Duration;

    use sfv::{Integer, KeyRef, ListSerializer, StringRef};
    use shared_contract::{Algorithm, SF_INTEGER_MAX, whole_seconds_up, whole_seconds_up_millis};

    use super::*;

    /// A structured-field List of string items with integer parameters
    /// (RFC 9651) as `sfv` writes it: what the hand-written fields must equal.
    fn list<'a, P: IntoIterator<Item = (&'static str, u64)>>(
        entries: impl Iterator<Item = (&'a PolicyId, P)>,
    ) -> Option<HeaderValue> {
        let mut list = ListSerializer::new();
        for (policy_id, parameters) in entries {
            let mut entry = list.bare_item(StringRef::from_str(policy_id.as_str()).ok()?);
            for (key, value) in parameters {
                let value = Integer::try_from(value).unwrap_or(Integer::MAX);
                entry = entry.parameter(KeyRef::from_str(key).ok()?, value);
            }
        }
        HeaderValue::try_from(list.finish()?).ok()
    }

    /// Any time: no window here moves with it.
    const T0: u64 = 1_800_000_000_000;

    fn policy(algorithm: Algorithm) -> RateLimitPolicy {
        RateLimitPolicy::builder("orders.read", algorithm).build().unwrap()
    }

    #[test]
    fn policy_header_names_limit_and_window_in_seconds() {
        let fixed = policy(Algorithm::FixedWindow(shared_contract::FixedWindow {
            limit: 100,
            window: Duration::from_secs(60),
        }));
        assert_eq!(policy_header([&fixed], || T0).unwrap(), r#""orders.read";q=100;w=60"#);
        // A 1.5 s window is announced as 2 s: never promise more than holds.
        let sliding = policy(Algorithm::SlidingCounter(shared_contract::SlidingCounter {
            limit: 10,
            window: Duration::from_millis(1500),
        }));
        assert_eq!(policy_header([&sliding], || T0).unwrap(), r#""orders.read";q=10;w=2"#);
        // Five tokens, two per 100 ms: three periods fill it, 300 ms -> 1 s.
        let bucket = policy(Algorithm::TokenBucket(shared_contract::TokenBucket {
            capacity: 5,
            refill_tokens: 2,
            refill_period: Duration::from_millis(100),
        }));
        assert_eq!(policy_header([&bucket], || T0).unwrap(), r#""orders.read";q=5;w=1"#);
        // GCRA: q is the burst, w the burst's cells at T = 1 s / 10 = 0.5 s,
        // rounded up to 1; 3 per second with a burst of 7: T = 333334 us,
        // 2.333338 s, 3 on the wire.
        let gcra = |limit, burst| {
            policy(Algorithm::Gcra(shared_contract::Gcra {
                limit,
                period: Duration::from_secs(1),
                burst,
            }))
        };
        assert_eq!(policy_header([&gcra(10, 5)], || T0).unwrap(), r#""orders.read";q=5;w=1"#);
        assert_eq!(policy_header([&gcra(3, 7)], || T0).unwrap(), r#""orders.read";q=7;w=3"#);
        assert_eq!(policy_header([&gcra(1, 30)], || T0).unwrap(), r#""orders.read";q=30;w=30"#);
        // README's example: 3 x 333334 us is 1.000002 s, rounded up to 2.
        assert_eq!(policy_header([&gcra(3, 3)], || T0).unwrap(), r#""orders.read";q=3;w=2"#);
    }

    #[test]
    fn limit_header_rounds_the_reset_up() {
        let decision = RateLimitDecision {
            allowed: true,
            remaining: 7,
            retry_after_ms: 0,
            reset_after_ms: 1001,
            replayed: false,
        };
        let id = PolicyId::new("orders.read").unwrap();
        assert_eq!(limit_header([(&id, &decision, true)]).unwrap(), r#""orders.read";r=7;t=2"#);
        let full = RateLimitDecision { reset_after_ms: 0, ..decision };
        assert_eq!(limit_header([(&id, &full, true)]).unwrap(), r#""orders.read";r=7;t=0"#);
    }

    #[test]
    fn a_concurrency_policy_shows_its_slots_without_a_window_or_a_reset() {
        let exports = policy(Algorithm::Concurrency(shared_contract::Concurrency {
            max_in_flight: 2,
            lease_ttl: Duration::from_secs(30),
            retry_after: Duration::from_secs(1),
        }));
        assert_eq!(policy_header([&exports], || T0).unwrap(), r#""orders.read";q=2"#);
        // One slot of two taken; no reset time, not even `t=0` ("whole now").
        let held = RateLimitDecision {
            allowed: true,
            remaining: 1,
            retry_after_ms: 0,
            reset_after_ms: 0,
            replayed: false,
        };
        let window = RateLimitDecision { reset_after_ms: 60_000, ..held };
        let hourly = PolicyId::new("hourly").unwrap();
        assert_eq!(
            limit_header([(exports.id(), &held, false), (&hourly, &window, true)]).unwrap(),
            r#""orders.read";r=1, "hourly";r=1;t=60"#
        );
    }

    #[test]
    fn a_set_is_one_list_in_the_order_given_and_no_policy_is_no_header() {
        // The burst + sustained pair of docs/algorithms.md, with its expected values.
        let burst = RateLimitPolicy::builder(
            "orders-burst",
            Algorithm::FixedWindow(shared_contract::FixedWindow {
                limit: 10,
                window: Duration::from_secs(1),
            }),
        )
        .build()
        .unwrap();
        let hourly = RateLimitPolicy::builder(
            "orders-hourly",
            Algorithm::FixedWindow(shared_contract::FixedWindow {
                limit: 1000,
                window: Duration::from_secs(3600),
            }),
        )
        .build()
        .unwrap();
        assert_eq!(
            policy_header([&burst, &hourly], || T0).unwrap(),
            r#""orders-burst";q=10;w=1, "orders-hourly";q=1000;w=3600"#
        );
        let decision = |remaining, reset_secs: u64| RateLimitDecision {
            allowed: true,
            remaining,
            retry_after_ms: 0,
            reset_after_ms: reset_secs * 1000,
            replayed: false,
        };
        let (first, second) = (decision(9, 1), decision(999, 3540));
        assert_eq!(
            limit_header([(burst.id(), &first, true), (hourly.id(), &second, true)]).unwrap(),
            r#""orders-burst";r=9;t=1, "orders-hourly";r=999;t=3540"#
        );
        assert_eq!(policy_header([], || T0), None);
    }

    /// docs/algorithms.md "Calendar window", worked numbers (b): a month in
    /// Berlin is January's 31 days at its last half second and February's
    /// 28 from its first instant; `w` follows the time given.
    #[test]
    fn a_calendar_windows_w_is_the_period_of_the_time_given() {
        let monthly = RateLimitPolicy::builder(
            "orders.read",
            Algorithm::CalendarWindow(shared_contract::CalendarWindow {
                limit: 3,
                period: shared_contract::CalendarPeriod::Month,
                time_zone: "Europe/Berlin".parse().unwrap(),
            }),
        )
        .build()
        .unwrap();
        let at = |now: u64| policy_header([&monthly], move || now).unwrap();
        assert_eq!(at(1_801_436_399_500), r#""orders.read";q=3;w=2678400"#);
        assert_eq!(at(1_801_436_400_000), r#""orders.read";q=3;w=2419200"#);
        assert_eq!(limit_header([]), None);
    }

    /// The `sfv` serialization the hand-written header must equal.
    fn limit_header_by_sfv<'a>(
        decisions: impl IntoIterator<Item = (&'a PolicyId, &'a RateLimitDecision, bool)>,
    ) -> Option<HeaderValue> {
        list(decisions.into_iter().map(|(policy_id, decision, resets)| {
            let reset = resets.then(|| ("t", whole_seconds_up_millis(decision.reset_after_ms)));
            (policy_id, [Some(("r", decision.remaining)), reset].into_iter().flatten())
        }))
    }

    #[test]
    fn the_shared_policy_field_is_what_sfv_writes() {
        let ids = ["a", "orders.read", "x-1_2.3"];
        let policies: Vec<RateLimitPolicy> = ids
            .iter()
            .map(|id| {
                let window = Duration::from_millis(1500);
                RateLimitPolicy::builder(
                    *id,
                    Algorithm::FixedWindow(shared_contract::FixedWindow { limit: 7, window }),
                )
                .build()
                .unwrap()
            })
            .collect();
        let by_sfv = list(policies.iter().map(|policy| {
            let window = policy.algorithm().quota_window(|| T0).map(whole_seconds_up);
            (
                policy.id(),
                [Some(("q", policy.limit())), window.map(|w| ("w", w))].into_iter().flatten(),
            )
        }));
        assert_eq!(policy_header(&policies, || T0), by_sfv);
    }

    #[test]
    fn the_hand_written_limit_header_is_what_sfv_writes() {
        let ids: Vec<PolicyId> = ["a", "orders.read", "x-1_2.3", &"z".repeat(64)]
            .iter()
            .map(|id| PolicyId::new(*id).unwrap())
            .collect();
        let values = [0, 1, 9, 10, 99, 12_345, SF_INTEGER_MAX, SF_INTEGER_MAX + 1, u64::MAX];
        let mut decisions = Vec::new();
        for (n, &remaining) in values.iter().enumerate() {
            let reset_after_ms = [0, 1, 999, 1000, 1001, u64::MAX][n % 6];
            decisions.push(RateLimitDecision {
                allowed: true,
                remaining,
                retry_after_ms: 0,
                reset_after_ms,
                replayed: false,
            });
        }
        for len in 1..=ids.len() {
            for start in 0..decisions.len() {
                let set: Vec<_> = ids[..len]
                    .iter()
                    .enumerate()
                    // Every third member has no reset (a concurrency policy).
                    .map(|(i, id)| (id, &decisions[(start + i) % decisions.len()], i % 3 != 1))
                    .collect();
                let by_hand = limit_header(set.iter().copied());
                assert_eq!(by_hand, limit_header_by_sfv(set.iter().copied()), "{set:?}");
                assert!(by_hand.is_some());
            }
        }
    }
}
