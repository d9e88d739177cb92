//! `TransportBridge`: from an HTTP request (its operation, subject and
//! cost) to a pseudonymous `RateLimitRequest` over the operation's policy
//! set, and the port's answer.

use std::collections::HashMap;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, Instant};

use axum::extract::MatchedPath;
use http::request::Parts;
use http::{HeaderValue, Method};
use sha2::{Digest, Sha256};
use shared_contract::{
    Clock, EdgeRateLimitPort, Evaluation, EvaluationId, Lease, LogThrottle, OperationDigest,
    PolicySet, RateLimitOutcome, RateLimitOutcomeExt, RateLimitPolicy, RateLimitRequest,
    SetDecision, SubjectDigest,
};
use tracing::{Instrument, Span};

use crate::answer::{BridgeEvaluation, Refusal, enforced, enforcing, policy_header};
use crate::identity::{VersionedPseudonymizer, resolve_subject};
use crate::lease::{LeaseGuard, LeaseReleases};
use crate::settings::EdgeSettings;
use crate::telemetry::{self, MemberMetrics, PolicyIds};
use crate::usage::Reservation;

/// A policy set prepared when the bridge is built (the port's policies do
/// not change under a running bridge).
#[derive(Debug)]
struct PreparedSet {
    policies: PolicySet,
    metrics: Box<[MemberMetrics]>,
    described: Arc<[Option<RateLimitPolicy>]>,
    policy_header: Option<HeaderValue>,
    /// An enforced window moves (a calendar month): the header is made per response.
    header_moves: bool,
    /// A member holds leases: only these sets pay for a guard.
    holds_leases: bool,
    has_shadow: bool,
}

impl PreparedSet {
    fn new(policies: &PolicySet, port: &dyn EdgeRateLimitPort, clock: &dyn Clock) -> Self {
        let ids = policies.ids();
        let described: Arc<[_]> = ids.iter().map(|id| port.policy(id).cloned()).collect();
        let metrics = ids.iter().zip(described.iter());
        let metrics = metrics.map(|(id, policy)| MemberMetrics::new(id.as_str(), policy.as_ref()));
        let moves = enforced(&described).any(|policy| policy.algorithm().kind().window_moves());
        let holds_leases =
            described.iter().flatten().any(|policy| policy.algorithm().holds_leases());
        Self {
            policies: policies.clone(),
            metrics: metrics.collect(),
            header_moves: moves,
            policy_header: policy_header(enforced(&described), || clock.epoch_millis()),
            holds_leases,
            has_shadow: !described.iter().all(|policy| enforcing(policy.as_ref())),
            described,
        }
    }
}

/// Resolves, pseudonymizes and asks the port, one request at a time.
#[derive(Debug)]
pub struct TransportBridge {
    port: Arc<dyn EdgeRateLimitPort>,
    pseudonymizer: Arc<VersionedPseudonymizer>,
    clock: Arc<dyn Clock>,
    settings: EdgeSettings,
    operations: Operations,
    /// Indexed by [`Operation::set`].
    sets: Box<[PreparedSet]>,
    default_set: PreparedSet,
    releases: LeaseReleases,
    /// One failure line a second: while the provider is down every request fails alike.
    failures_logged: LogThrottle,
}

impl TransportBridge {
    /// A bridge over `port`.
    pub fn new(
        port: Arc<dyn EdgeRateLimitPort>,
        pseudonymizer: Arc<VersionedPseudonymizer>,
        clock: Arc<dyn Clock>,
        settings: EdgeSettings,
    ) -> Self {
        let configured: Vec<(&String, &PolicySet)> = settings.operations.iter().collect();
        let operations = Operations::new(
            configured.iter().enumerate().map(|(index, (id, _))| (id.as_str(), index)),
        );
        let sets =
            configured.iter().map(|(_, set)| PreparedSet::new(set, &*port, &*clock)).collect();
        let default_set = PreparedSet::new(&settings.default_policies, &*port, &*clock);
        Self {
            port,
            pseudonymizer,
            clock,
            settings,
            operations,
            sets,
            default_set,
            releases: LeaseReleases::default(),
            failures_logged: LogThrottle::default(),
        }
    }

    /// Tracks its lease releases with `releases` (a reload's new bridge takes
    /// the current one's), so shutdown waits for them all.
    #[must_use]
    pub fn with_lease_releases(mut self, releases: LeaseReleases) -> Self {
        self.releases = releases;
        self
    }

    /// The releases of the leases this bridge's requests hold.
    pub fn lease_releases(&self) -> &LeaseReleases {
        &self.releases
    }

    /// The settings the bridge runs with.
    pub fn settings(&self) -> &EdgeSettings {
        &self.settings
    }

    /// The provider the bridge asks.
    pub fn port(&self) -> &Arc<dyn EdgeRateLimitPort> {
        &self.port
    }

    /// The pseudonymizer the bridge names subjects with.
    pub fn pseudonymizer(&self) -> &Arc<VersionedPseudonymizer> {
        &self.pseudonymizer
    }

    /// The clock the bridge sets deadlines by.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// Evaluates one request against its operation's policy set: only the
    /// subject's pseudonym crosses the port, with a fresh server-made
    /// evaluation id. A lease taken is given back before this returns.
    pub async fn evaluate(&self, parts: &Parts) -> Result<BridgeEvaluation, Refusal<'static>> {
        let answer = match self.ask(parts) {
            Asked::Answered(answer) => answer,
            Asked::Waiting(waiting) => waiting.answer(self).await,
        };
        answer.map(|(evaluation, _held)| evaluation)
    }

    /// Asks the port: its answer when it has one at once, else what to wait for.
    pub(crate) fn ask(&self, parts: &Parts) -> Asked {
        let operation = self.operations.find(parts);
        let prepared = self.prepared(operation.set);
        let policies = &prepared.policies;
        let subject = match resolve_subject(parts, &self.settings) {
            Ok(subject) => subject,
            Err(rejection) => {
                telemetry::record_rejection(&prepared.metrics, rejection.outcome_label());
                tracing::debug!(
                    operation = &*operation.id, policies = %PolicyIds(policies.ids()), reason = rejection.category_name(),
                    "request refused before rate-limit evaluation"
                );
                return Asked::Answered(Err(rejection));
            }
        };
        let digest = self.pseudonymizer.pseudonymize(subject.kind, &subject.identity);
        let span = decision_span(&operation.id, policies, &digest);
        // For a shadow policy's log line: the pseudonym, never the subject.
        let shadow_subject = prepared.has_shadow.then_some(digest);
        // One reading for the deadline and the histogram's start.
        let started = self.clock.monotonic();
        // A budget too large for `Instant` fails closed (AdmissionRejected).
        let deadline = started.checked_add(self.settings.evaluation_budget).unwrap_or(started);
        let reserved = parts.extensions.get::<RateLimitCost>().copied();
        // A reservation may be settled: its id must leave a record to find.
        let evaluation_id =
            if reserved.is_some() { EvaluationId::random() } else { EvaluationId::once() };
        let request = RateLimitRequest {
            policies: policies.into(),
            subject: digest,
            operation: operation.digest,
            cost: reserved.unwrap_or_default().0,
            evaluation_id,
            deadline,
        };
        let lease = prepared.holds_leases.then(|| {
            LeaseGuard::new(Arc::clone(&self.port), Lease::of(&request), self.releases.clone())
        });
        let reservation = reserved.map(|_| Reservation {
            port: Arc::clone(&self.port),
            request: request.clone().into_owned(),
            clock: Arc::clone(&self.clock),
            budget: self.settings.evaluation_budget,
            tasks: self.releases.clone(),
        });
        // A provider answering at once decides inside this call: in the span.
        let evaluation = match &span {
            Some(span) => span.in_scope(|| self.port.evaluate(request)),
            None => self.port.evaluate(request),
        };
        let context = Context { operation, lease, reservation, span, started, shadow_subject };
        match evaluation.into_ready() {
            Ok(outcome) => Asked::Answered(Ok(self.finish(context, outcome))),
            Err(evaluation) => Asked::Waiting(Waiting(evaluation, context)),
        }
    }

    /// The prepared set at `index` of the configured ones, or the default.
    fn prepared(&self, index: Option<usize>) -> &PreparedSet {
        index.map_or(&self.default_set, |index| &self.sets[index])
    }

    /// The port's answer, counted and logged.
    fn finish(&self, context: Context, outcome: RateLimitOutcome) -> (BridgeEvaluation, Held) {
        let Context { operation, lease, reservation, span, started, shadow_subject } = context;
        let prepared = self.prepared(operation.set);
        // The injected clock times the histogram too.
        let ended = self.clock.monotonic();
        let elapsed = ended.saturating_duration_since(started);
        let lease = lease.and_then(|lease| lease.if_held(&outcome));
        let reservation = reservation.filter(|_| outcome.as_ref().is_ok_and(SetDecision::allowed));
        telemetry::record_evaluation(&prepared.metrics, &outcome, elapsed);
        let described = Arc::clone(&prepared.described);
        let policy_header = if prepared.header_moves {
            policy_header(enforced(&described), || self.clock.epoch_millis())
        } else {
            prepared.policy_header.clone()
        };
        let policies = prepared.policies.clone();
        let evaluation = BridgeEvaluation { policies, described, outcome, policy_header };
        if let Some(span) = span {
            let cached = evaluation.outcome.as_ref().is_ok_and(|set| set.cached());
            span.record("rate_limit.outcome", evaluation.outcome.category_name());
            span.record("rate_limit.admitted", evaluation.admits());
            span.record("rate_limit.cached", cached);
        }
        let failure_line = || self.failures_logged.admit(ended);
        log_outcome(&operation.id, &evaluation, shadow_subject.as_ref(), elapsed, failure_line);
        (evaluation, Held { lease, reservation })
    }
}

/// What an admitted request holds until its response body ends: its lease,
/// and the reservation its usage report settles.
#[derive(Debug, Default)]
pub(crate) struct Held {
    pub(crate) lease: Option<LeaseGuard>,
    pub(crate) reservation: Option<Reservation>,
}

/// The bridge's answer to one request, and what it holds.
pub(crate) type Answer = Result<(BridgeEvaluation, Held), Refusal<'static>>;

/// What [`TransportBridge::ask`] found.
pub(crate) enum Asked {
    /// Refused before the port was asked, or the port's answer at once.
    Answered(Answer),
    /// The port's answer is still to come.
    Waiting(Waiting),
}

/// A port answer still to come, and what finishing the request needs.
pub(crate) struct Waiting(Evaluation, Context);

impl Waiting {
    /// Waits for the port's answer in the decision span, then finishes it.
    pub(crate) async fn answer(self, bridge: &TransportBridge) -> Answer {
        let Self(evaluation, context) = self;
        let outcome = match &context.span {
            Some(span) => evaluation.instrument(span.clone()).await,
            None => evaluation.await,
        };
        Ok(bridge.finish(context, outcome))
    }
}

/// One request between asking the port and its answer.
struct Context {
    operation: Arc<Operation>,
    lease: Option<LeaseGuard>,
    reservation: Option<Reservation>,
    span: Option<Span>,
    started: Instant,
    shadow_subject: Option<SubjectDigest>,
}

/// The `rate_limit.decision` span, a child of the request's; `None` when
/// there is none, so an untraced request pays no span.
fn decision_span(operation: &str, policies: &PolicySet, digest: &SubjectDigest) -> Option<Span> {
    // `is_known` would be true for "no span" too: the id says there is one.
    let traced =
        tracing::dispatcher::get_default(|dispatch| dispatch.current_span().id().is_some());
    traced.then(|| {
        let subject = digest.to_string();
        tracing::info_span!(
            "rate_limit.decision",
            rate_limit.operation = operation,
            rate_limit.policies = %PolicyIds(policies.ids()),
            rate_limit.subject = subject.as_str(),
            rate_limit.outcome = tracing::field::Empty,
            rate_limit.admitted = tracing::field::Empty,
            rate_limit.cached = tracing::field::Empty,
        )
    })
}

fn log_outcome(
    operation: &str,
    evaluation: &BridgeEvaluation,
    shadow_subject: Option<&SubjectDigest>,
    elapsed: Duration,
    failure_line: impl FnOnce() -> Option<u64>,
) {
    let policies = PolicyIds(evaluation.policies.ids());
    let outcome = &evaluation.outcome;
    let category = outcome.category_name();
    let Ok(set) = outcome else {
        // `suppressed`: the failures not logged since the line before.
        let Some(suppressed) = failure_line() else { return };
        let message = if evaluation.enforces() {
            "rate limit failed closed"
        } else {
            "rate limit failed; the set is shadow only, so the request passes"
        };
        tracing::warn!(operation, %policies, outcome = category, suppressed, "{message}");
        return;
    };
    tracing::trace!(operation, %policies, outcome = category, ?elapsed, "rate-limit decision");
    let members = evaluation.policies.ids().iter().zip(set.decisions()).enumerate();
    for (index, (policy, decision)) in members {
        if !evaluation.enforced_at(index) && !decision.allowed {
            // The line a shadow rollout is watched by.
            let subject = shadow_subject.map(ToString::to_string);
            tracing::info!(
                subject = subject.as_deref(),
                policy = %policy,
                operation,
                "shadow policy would deny"
            );
        }
    }
}

/// Route placeholder of a request no route matched: raw paths never make
/// buckets, so every unmatched request of a method shares one operation.
pub const UNMATCHED_ROUTE: &str = "<unmatched>";

/// `"<METHOD> <route template>"`; an extension method is `OTHER`.
#[cfg(test)]
pub(crate) fn operation_id(parts: &Parts) -> String {
    format!("{} {}", METHODS[method_index(&parts.method)], route(parts))
}

fn route(parts: &Parts) -> &str {
    parts.extensions.get::<MatchedPath>().map_or(UNMATCHED_ROUTE, MatchedPath::as_str)
}

/// One operation: its id (for log lines), digest and configured set.
#[derive(Debug)]
pub(crate) struct Operation {
    pub(crate) id: Box<str>,
    pub(crate) digest: OperationDigest,
    /// The index of its configured set; `None` for the default set.
    pub(crate) set: Option<usize>,
}

impl Operation {
    fn new(id: String, set: Option<usize>) -> Self {
        Self { digest: charged_digest(&id), id: id.into_boxed_str(), set }
    }
}

/// Operations by method and route template, so a request's id is not
/// hashed again: the configured ones, and up to [`MAX_SEEN_OPERATIONS`]
/// others kept from the first time one is seen.
#[derive(Debug)]
pub(crate) struct Operations {
    configured: [Routes; METHODS.len()],
    seen: RwLock<[Routes; METHODS.len()]>,
}

/// Operations of one method by route template. foldhash, not SipHash: the
/// keys are the router's templates, never a client's text.
type Routes = HashMap<Box<str>, Arc<Operation>, foldhash::fast::RandomState>;

const MAX_SEEN_OPERATIONS: usize = 4096;

impl Operations {
    /// The table of `configured` operation ids with their set's index; an
    /// id no request can have is left out.
    pub(crate) fn new<'a>(configured: impl IntoIterator<Item = (&'a str, usize)>) -> Self {
        let mut table: [Routes; METHODS.len()] = Default::default();
        for (id, set) in configured {
            let Some((method, route)) = id.split_once(' ') else { continue };
            if let Some(index) = METHODS.iter().position(|known| *known == method) {
                table[index]
                    .insert(route.into(), Arc::new(Operation::new(id.to_owned(), Some(set))));
            }
        }
        Self { configured: table, seen: RwLock::default() }
    }

    /// The operation of a request: the method plus axum's `MatchedPath`.
    pub(crate) fn find(&self, parts: &Parts) -> Arc<Operation> {
        let route = route(parts);
        let method = match method_index(&parts.method) {
            HEAD if !self.configured[HEAD].contains_key(route) => GET,
            method => method,
        };
        let known = self.configured[method].get(route).cloned().or_else(|| {
            self.seen.read().unwrap_or_else(PoisonError::into_inner)[method].get(route).cloned()
        });
        if let Some(operation) = known {
            return operation;
        }
        let operation = Arc::new(Operation::new(format!("{} {route}", METHODS[method]), None));
        let mut seen = self.seen.write().unwrap_or_else(PoisonError::into_inner);
        let count: usize = seen.iter().map(HashMap::len).sum();
        if count < MAX_SEEN_OPERATIONS && !seen[method].contains_key(route) {
            seen[method].insert(route.into(), Arc::clone(&operation));
        }
        operation
    }

    #[cfg(test)]
    fn seen(&self) -> usize {
        self.seen.read().unwrap_or_else(PoisonError::into_inner).iter().map(HashMap::len).sum()
    }
}

/// The digest of an operation id: the first 8 bytes of SHA-256 over its
/// UTF-8 text as a big-endian 64-bit number, printed as 16 hex digits
/// (`"GET /api/orders/{id}"` gives `6979b49c614fd4c4`).
pub fn operation_digest(operation: &str) -> OperationDigest {
    let hash: [u8; 32] = Sha256::digest(operation.as_bytes()).into();
    let (first, _) = hash.split_first_chunk::<8>().unwrap_or((&[0; 8], &[]));
    OperationDigest::from_u64(u64::from_be_bytes(*first))
}

/// The digest a request of `operation` is charged under: its own, but a
/// HEAD's is its route's GET's, even when it is mapped to a set of its own.
pub fn charged_digest(operation: &str) -> OperationDigest {
    match operation.strip_prefix("HEAD ") {
        Some(route) => operation_digest(&format!("GET {route}")),
        None => operation_digest(operation),
    }
}

/// The indexes of the two methods a HEAD is found between, and of `OTHER`.
const GET: usize = 0;
const HEAD: usize = 5;
const OTHER: usize = 9;

/// The method names an operation id can start with, by [`method_index`].
pub const METHODS: [&str; 10] =
    ["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS", "CONNECT", "TRACE", "OTHER"];

fn method_index(method: &Method) -> usize {
    METHODS[..OTHER].iter().position(|known| *known == method.as_str()).unwrap_or(OTHER)
}

/// The cost of a request (1 without it), a request extension set by a layer
/// before the rate-limit layer; 0 or above a policy's `maximum-cost` is
/// answered `Incompatible(CostExceedsMaximum)` (a `503`). A request that
/// carries one reserves it: a [`crate::RateLimitUsage`] its handler reports
/// settles what it used against it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RateLimitCost(pub u64);

impl Default for RateLimitCost {
    fn default() -> Self {
        Self(1)
    }
}

#[cfg(test)]
mod operation_tests {
    use http::Request;

    use super::*;

    #[test]
    fn without_a_matched_route_the_path_is_not_used() {
        let (parts, ()) = Request::get("/api/orders/123").body(()).unwrap().into_parts();
        assert_eq!(operation_id(&parts), "GET <unmatched>");
        let custom = Method::from_bytes(b"BREW").unwrap();
        let (parts, ()) = Request::builder().method(custom).body(()).unwrap().into_parts();
        assert_eq!(operation_id(&parts), "OTHER <unmatched>");
    }

    #[test]
    fn an_unconfigured_operation_is_kept_once_with_its_digest_and_the_default_set() {
        let operations = Operations::new([("POST <unmatched>", 3), ("BREW <unmatched>", 4)]);
        let (get, ()) = Request::get("/api/orders/123").body(()).unwrap().into_parts();
        for _ in 0..3 {
            let found = operations.find(&get);
            assert_eq!((&*found.id, found.set), ("GET <unmatched>", None));
            assert_eq!(found.digest.to_string(), "8c13b2e43046bcc7");
        }
        assert_eq!(operations.seen(), 1);
        let (post, ()) = Request::post("/").body(()).unwrap().into_parts();
        let found = operations.find(&post);
        assert_eq!((&*found.id, found.set), ("POST <unmatched>", Some(3)));
        assert_eq!(found.digest, operation_digest("POST <unmatched>"));
        // An extension method is OTHER, never the configured "BREW" id.
        let brew = Method::from_bytes(b"BREW").unwrap();
        let (brew, ()) = Request::builder().method(brew).body(()).unwrap().into_parts();
        let found = operations.find(&brew);
        assert_eq!((&*found.id, found.set), ("OTHER <unmatched>", None));
        assert_eq!(operations.seen(), 2);
    }

    #[test]
    fn a_head_is_the_get_of_its_route_unless_mapped_itself_and_always_charged_as_it() {
        let get = || Request::get("/x").body(()).unwrap().into_parts().0;
        let head = || Request::head("/x").body(()).unwrap().into_parts().0;
        let operations = Operations::new([("GET <unmatched>", 1)]);
        let found = operations.find(&head());
        assert_eq!((&*found.id, found.set), ("GET <unmatched>", Some(1)));
        assert_eq!(found.digest, operation_digest("GET <unmatched>"));
        // Mapped itself: its own set, the GET's budget key.
        let operations = Operations::new([("GET <unmatched>", 1), ("HEAD <unmatched>", 2)]);
        let found = operations.find(&head());
        assert_eq!((&*found.id, found.set), ("HEAD <unmatched>", Some(2)));
        assert_eq!(found.digest, operation_digest("GET <unmatched>"));
        assert_eq!(operations.find(&get()).set, Some(1));
        // Neither configured: one seen operation for both methods.
        let operations = Operations::new([]);
        assert_eq!(operations.find(&head()).digest, operations.find(&get()).digest);
        assert_eq!(operations.seen(), 1);
        assert_eq!(
            charged_digest("HEAD /api/orders/{id}"),
            operation_digest("GET /api/orders/{id}")
        );
        assert_eq!(charged_digest("POST /api/orders"), operation_digest("POST /api/orders"));
    }

    #[test]
    fn digests_match_vectors_computed_with_python_hashlib() {
        // python3 -c 'import hashlib; print(hashlib.sha256(OPERATION.encode()).hexdigest()[:16])'
        for (operation, expected) in [
            ("GET /api/orders/{id}", "6979b49c614fd4c4"),
            ("GET <unmatched>", "8c13b2e43046bcc7"),
            ("POST /api/orders", "6b48c5c57a698e41"),
        ] {
            assert_eq!(operation_digest(operation).to_string(), expected, "{operation}");
        }
    }
}
