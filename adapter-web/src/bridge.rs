//! `TransportBridge`: from an HTTP request to a pseudonymous
//! `RateLimitRequest` over the operation's policy set, and the port's
//! answer.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::HeaderValue;
use http::request::Parts;
use shared_contract::{
    Clock, EdgeRateLimitPort, Evaluation, EvaluationId, Lease, LogThrottle, PolicyId, PolicyMode,
    PolicySet, RateLimitDecision, RateLimitFailure, RateLimitOutcome, RateLimitOutcomeExt,
    RateLimitPolicy, RateLimitRequest, SubjectDigest, quota_window,
};
use tracing::{Instrument, Span};

use crate::cost::RateLimitCost;
use crate::lease::{LeaseGuard, LeaseReleases};
use crate::operation::Operations;
use crate::pseudonymizer::VersionedPseudonymizer;
use crate::ratelimit_headers::policy_header;
use crate::rejection::EdgeRejection;
use crate::settings::EdgeSettings;
use crate::subject::resolve_subject;
use crate::telemetry::{self, MemberMetrics, PolicyIds};

/// What the bridge learned about one request: the policy set it ran under,
/// each policy as the port holds it, and the port's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BridgeEvaluation {
    /// The operation's policy set (or the default set), in configured order.
    pub policies: PolicySet,
    /// Each policy of the set as the port holds it, in the set's order (for
    /// the `RateLimit-Policy` header and the mode); `None` for one the port
    /// does not know (the outcome then says `UnknownPolicy`). Shared with
    /// the bridge, which looked them up once.
    pub described: Arc<[Option<RateLimitPolicy>]>,
    /// The port's answer: a decided one holds one decision per policy of
    /// the set, in its order, and admits as its members' modes say
    /// ([`shared_contract::SetDecision::of_members`]).
    pub outcome: RateLimitOutcome,
    /// The set's `RateLimit-Policy` header (its enforced policies as the
    /// port holds them), made once per set: it never changes per request.
    pub(crate) policy_header: Option<HeaderValue>,
}

impl BridgeEvaluation {
    /// The mode of the policy at `index` of the set. A policy the port does
    /// not know counts as enforced, so the unknown fails closed.
    pub fn mode(&self, index: usize) -> PolicyMode {
        mode_of(self.described.get(index).and_then(Option::as_ref))
    }

    /// Whether any policy of the set can block. A set made only of shadow
    /// policies never does, not even when the provider fails.
    pub fn enforces(&self) -> bool {
        (0..self.policies.len()).any(|index| self.mode(index) == PolicyMode::Enforce)
    }

    /// Whether the handler runs: the set was admitted, or nothing in it is
    /// enforced.
    pub fn admits(&self) -> bool {
        self.outcome.is_allowed() || !self.enforces()
    }

    /// The enforced policies of the set with their decisions, in the set's
    /// order; empty unless the outcome is a decision. These are the
    /// policies a client sees in the `RateLimit` headers.
    pub fn enforced_decisions(&self) -> Vec<(&PolicyId, &RateLimitDecision)> {
        self.enforced().collect()
    }

    /// [`Self::enforced_decisions`] without collecting them.
    pub(crate) fn enforced(&self) -> impl Iterator<Item = (&PolicyId, &RateLimitDecision)> {
        self.enforced_limits().map(|(id, decision, _)| (id, decision))
    }

    /// The enforced members as the `RateLimit` header lists them (every
    /// allowed request's headers are made from it): id, decision, and
    /// whether the policy has a reset time to announce (`t`); a
    /// concurrency policy has none.
    pub(crate) fn enforced_limits(
        &self,
    ) -> impl Iterator<Item = (&PolicyId, &RateLimitDecision, bool)> {
        let decisions = match &self.outcome {
            Ok(set) => set.decisions(),
            Err(_) => &[],
        };
        self.policies
            .ids()
            .iter()
            .zip(decisions)
            .enumerate()
            .filter(|(index, _)| self.mode(*index) == PolicyMode::Enforce)
            .map(|(index, (id, decision))| {
                let policy = self.described.get(index).and_then(Option::as_ref);
                let resets = policy.is_none_or(|policy| quota_window(policy.algorithm()).is_some());
                (id, decision, resets)
            })
    }

    /// The enforced policies that denied the request, in the set's order:
    /// the `violated-policies` of a `429`.
    pub fn violated_policies(&self) -> Vec<(&PolicyId, &RateLimitDecision)> {
        let mut enforced = self.enforced_decisions();
        enforced.retain(|(_, decision)| !decision.allowed);
        enforced
    }
}

fn mode_of(policy: Option<&RateLimitPolicy>) -> PolicyMode {
    policy.map_or(PolicyMode::Enforce, RateLimitPolicy::mode)
}

/// A policy set prepared once, when the bridge is built: each member as
/// the port holds it (the port's policies do not change under a running
/// bridge) and its metric handles.
#[derive(Debug)]
struct PreparedSet {
    policies: PolicySet,
    metrics: Box<[MemberMetrics]>,
    described: Arc<[Option<RateLimitPolicy>]>,
    policy_header: Option<HeaderValue>,
    /// Whether an enforced member's window length moves with the time (a
    /// calendar month): its header is then written per response.
    header_moves: bool,
    /// Whether a member is a concurrency policy (enforced or shadow: both
    /// take a real lease), so an admitted request holds a lease to give
    /// back. Only these sets pay for a guard.
    holds_leases: bool,
    /// Whether a member is a shadow policy, whose would-be denials are
    /// logged under the request's pseudonym.
    has_shadow: bool,
}

impl PreparedSet {
    fn new(policies: &PolicySet, port: &dyn EdgeRateLimitPort, clock: &dyn Clock) -> Self {
        let described: Arc<[_]> =
            policies.ids().iter().map(|id| port.policy(id).cloned()).collect();
        let metrics = policies
            .ids()
            .iter()
            .zip(described.iter())
            .map(|(id, policy)| MemberMetrics::new(id.as_str(), policy.as_ref()))
            .collect();
        // The policies the port described and enforces: those a client sees.
        let enforced =
            described.iter().flatten().filter(|policy| policy.mode() == PolicyMode::Enforce);
        let header_moves = enforced.clone().any(|policy| policy.algorithm().kind().window_moves());
        let policy_header = policy_header(enforced, || clock.epoch_millis());
        let holds_leases =
            described.iter().flatten().any(|policy| policy.algorithm().holds_leases());
        let has_shadow =
            described.iter().any(|policy| mode_of(policy.as_ref()) == PolicyMode::Shadow);
        Self {
            policies: policies.clone(),
            metrics,
            described,
            policy_header,
            header_moves,
            holds_leases,
            has_shadow,
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
    /// The configured operations' sets, as [`crate::operation::Operation::set`] indexes them.
    sets: Box<[PreparedSet]>,
    default_set: PreparedSet,
    /// The in-flight leases' releases, and their failure counter.
    releases: LeaseReleases,
    /// Holds the failure lines to one a second: while the provider is down
    /// every request fails alike (the metrics count each one).
    failures_logged: LogThrottle,
}

impl TransportBridge {
    /// A bridge over `port`. Check `settings` with
    /// [`EdgeSettings::validate`] first. The digest of every configured
    /// operation is computed here, once; any other operation's the first
    /// time a request has it.
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
        let releases = LeaseReleases::default();
        Self {
            port,
            pseudonymizer,
            clock,
            settings,
            operations,
            sets,
            default_set,
            releases,
            failures_logged: LogThrottle::default(),
        }
    }

    /// The bridge whose leases' releases run tracked by `releases`: a
    /// reload's new bridge takes the current one's, so the server's
    /// shutdown waits for them all.
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

    /// Evaluates one request against its operation's policy set.
    ///
    /// The subject comes from the request parts ([`crate::AuthenticatedPrincipal`]
    /// extension, then the API key header, then `ConnectInfo<SocketAddr>`
    /// and trusted forwarding headers, counted per network at the
    /// configured prefix); the operation is the method plus axum's
    /// `MatchedPath`, and it crosses the port only as its
    /// [`OperationDigest`]. Only the HMAC pseudonym of the subject crosses
    /// the port. The cost is the [`RateLimitCost`] extension, else 1. The
    /// evaluation id is fresh and server-made: no client header, not even
    /// `Idempotency-Key`, reaches it. `deadline = clock.monotonic() +
    /// evaluation_budget`.
    ///
    /// An in-flight lease the request took under a concurrency policy of
    /// its set is given back before this returns: the request is done when
    /// its caller has the answer. The layer instead holds it until the
    /// response body has been sent or dropped.
    pub async fn evaluate(&self, parts: &Parts) -> Result<BridgeEvaluation, EdgeRejection> {
        self.evaluate_holding(parts).await.map(|(evaluation, _lease)| evaluation)
    }

    /// [`Self::evaluate`], and the guard of the lease the request may hold
    /// (`None` when its set has no concurrency policy, or the port's answer
    /// says nothing was written): dropping it gives the lease back.
    pub(crate) async fn evaluate_holding(&self, parts: &Parts) -> Answer {
        match self.ask(parts) {
            Asked::Answered(answer) => answer,
            Asked::Waiting(waiting) => waiting.answer(self).await,
        }
    }

    /// Asks the port about one request: the answer when the port has it
    /// at once (no allocation and no poll), else what to wait for. The
    /// lease guard exists before the port is asked, so a request dropped
    /// while the port works (a client gone, a Redis round trip cut short)
    /// gives back whatever it may have taken; a release is idempotent.
    pub(crate) fn ask(&self, parts: &Parts) -> Asked {
        let found = self.operations.find(parts);
        let set = found.set;
        let prepared = self.prepared(set);
        let operation = &*found.id;
        let policies = prepared.policies.clone();
        let described = Arc::clone(&prepared.described);
        let subject = match resolve_subject(parts, &self.settings) {
            Ok(subject) => subject,
            Err(rejection) => {
                telemetry::record_rejection(&prepared.metrics, rejection.outcome_label());
                tracing::debug!(
                    operation, policies = %PolicyIds(policies.ids()), reason = rejection.category_name(),
                    "request refused before rate-limit evaluation"
                );
                return Asked::Answered(Err(rejection));
            }
        };
        let digest = self.pseudonymizer.pseudonymize(subject.kind, &subject.identity);
        let span = decision_span(operation, &policies, &digest);
        // Kept only when a shadow policy may need to log whose request it
        // would have denied; the pseudonym, never the raw subject.
        let shadow_subject = prepared.has_shadow.then_some(digest);
        // One reading for the deadline and the histogram's start.
        let started = self.clock.monotonic();
        // A budget too large for `Instant` can only be a configuration slip;
        // the present as deadline fails closed (AdmissionRejected).
        let deadline = started.checked_add(self.settings.evaluation_budget).unwrap_or(started);
        let cost = parts.extensions.get::<RateLimitCost>().copied().unwrap_or_default().0;
        let request = RateLimitRequest {
            policies: policies.clone(),
            subject: digest,
            operation: found.digest,
            cost,
            evaluation_id: EvaluationId::random(),
            deadline,
        };
        let lease = prepared.holds_leases.then(|| {
            LeaseGuard::new(Arc::clone(&self.port), Lease::of(&request), self.releases.clone())
        });
        // A provider answering at once decides inside this call: in the span.
        let evaluation = match &span {
            Some(span) => span.in_scope(|| self.port.evaluate(request)),
            None => self.port.evaluate(request),
        };
        let context = Context {
            set,
            operation: Cow::Borrowed(operation),
            policies,
            described,
            lease,
            span,
            started,
            shadow_subject,
        };
        match evaluation.into_ready() {
            Ok(outcome) => Asked::Answered(Ok(self.finish(context, outcome))),
            Err(evaluation) => {
                Asked::Waiting(Waiting { evaluation, context: context.into_owned() })
            }
        }
    }

    /// The prepared set at `index` of the configured ones, or the default.
    fn prepared(&self, index: Option<usize>) -> &PreparedSet {
        index.map_or(&self.default_set, |index| &self.sets[index])
    }

    /// The port's answer to the request `context` describes, counted and
    /// logged.
    fn finish(
        &self,
        context: Context<'_>,
        outcome: RateLimitOutcome,
    ) -> (BridgeEvaluation, Option<LeaseGuard>) {
        let Context { set, operation, policies, described, lease, span, started, shadow_subject } =
            context;
        let prepared = self.prepared(set);
        // The injected clock times the histogram too: the system's in
        // production, and a test's manual one reads what it was set to.
        let ended = self.clock.monotonic();
        let elapsed = ended.saturating_duration_since(started);
        let lease = lease.and_then(|lease| {
            if may_hold_lease(&outcome) {
                Some(lease)
            } else {
                lease.disarm();
                None
            }
        });
        telemetry::record_evaluation(&prepared.metrics, &outcome, elapsed);
        let policy_header = if prepared.header_moves {
            let enforced = described.iter().flatten();
            let enforced = enforced.filter(|policy| policy.mode() == PolicyMode::Enforce);
            policy_header(enforced, || self.clock.epoch_millis())
        } else {
            prepared.policy_header.clone()
        };
        let evaluation = BridgeEvaluation { policies, described, outcome, policy_header };
        if let Some(span) = span {
            record_decision(&span, &evaluation);
        }
        let failure_line = || self.failures_logged.admit(ended);
        log_outcome(&operation, &evaluation, shadow_subject.as_ref(), elapsed, failure_line);
        (evaluation, lease)
    }
}

/// The bridge's answer to one request, and the guard of the lease it may
/// hold.
pub(crate) type Answer = Result<(BridgeEvaluation, Option<LeaseGuard>), EdgeRejection>;

/// What [`TransportBridge::ask`] found.
pub(crate) enum Asked {
    /// Refused before the port was asked, or the port's answer at once.
    Answered(Answer),
    /// The port's answer is still to come.
    Waiting(Waiting),
}

/// A port answer still to come, and what finishing the request needs.
pub(crate) struct Waiting {
    evaluation: Evaluation,
    context: Context<'static>,
}

impl Waiting {
    /// Waits for the port's answer (in the decision span), then counts and
    /// logs it as `bridge` does every answer.
    pub(crate) async fn answer(self, bridge: &TransportBridge) -> Answer {
        let Self { evaluation, context } = self;
        let outcome = match &context.span {
            Some(span) => evaluation.instrument(span.clone()).await,
            None => evaluation.await,
        };
        Ok(bridge.finish(context, outcome))
    }
}

/// One request between asking the port and its answer.
struct Context<'o> {
    /// The index of its configured set; `None` for the default set.
    set: Option<usize>,
    /// The operation's id, for log lines; owned only while waiting.
    operation: Cow<'o, str>,
    policies: PolicySet,
    described: Arc<[Option<RateLimitPolicy>]>,
    lease: Option<LeaseGuard>,
    span: Option<Span>,
    started: Instant,
    shadow_subject: Option<SubjectDigest>,
}

impl Context<'_> {
    /// The same, owning the operation's id: it waits beyond the request's
    /// borrow of the bridge.
    fn into_owned(self) -> Context<'static> {
        let Self { set, operation, policies, described, lease, span, started, shadow_subject } =
            self;
        let operation = Cow::Owned(operation.into_owned());
        Context { set, operation, policies, described, lease, span, started, shadow_subject }
    }
}

/// Whether the port's answer leaves a lease behind: an admitted set holds one, and an `Indeterminate` answer may
/// have taken one. A refused set writes nothing (docs/algorithms.md,
/// "Policy sets"), and `Unavailable` and `Incompatible` touch no state.
fn may_hold_lease(outcome: &RateLimitOutcome) -> bool {
    match outcome {
        Ok(set) => set.allowed(),
        Err(RateLimitFailure::Indeterminate { .. }) => true,
        Err(RateLimitFailure::Unavailable { .. } | RateLimitFailure::Incompatible { .. }) => false,
    }
}

/// The `rate_limit.decision` span of one evaluation, a child of the span
/// the request runs in; `None` when it runs in none (traces are off), so
/// an untraced request pays one look-up and no span. It names the subject
/// by its pseudonym only; the raw subject never reaches a span.
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

/// The decision's attributes: its outcome category, whether the handler
/// runs, and whether the provider answered from its denial cache.
fn record_decision(span: &Span, evaluation: &BridgeEvaluation) {
    let cached = evaluation.outcome.as_ref().is_ok_and(|set| set.cached());
    span.record("rate_limit.outcome", evaluation.outcome.category_name());
    span.record("rate_limit.admitted", evaluation.admits());
    span.record("rate_limit.cached", cached);
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
    match outcome {
        Ok(set) => {
            tracing::trace!(operation, %policies, outcome = category, ?elapsed, "rate-limit decision");
            let members = evaluation.policies.ids().iter().zip(set.decisions()).enumerate();
            for (index, (policy, decision)) in members {
                if evaluation.mode(index) == PolicyMode::Shadow && !decision.allowed {
                    // The one line a shadow rollout is watched by: who (as
                    // a pseudonym an operator can look up) would have been
                    // refused, where and by which policy.
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
        Err(_) => {
            // `suppressed`: the failures not logged since the line before.
            let Some(suppressed) = failure_line() else { return };
            if evaluation.enforces() {
                tracing::warn!(
                    operation, %policies, outcome = category, suppressed,
                    "rate limit failed closed"
                );
            } else {
                tracing::warn!(
                    operation, %policies, outcome = category, suppressed,
                    "rate limit failed; the set is shadow only, so the request passes"
                );
            }
        }
    }
}
