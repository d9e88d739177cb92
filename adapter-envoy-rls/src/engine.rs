//! `RlsEngine`: one `ShouldRateLimit` call, from the request's descriptors
//! to policy sets, the port's answers and the response.
//!
//! 1. Each descriptor is matched to the first rule of its domain that fits;
//!    one that matches none, or a rule without policies, is not limited
//!    (a blocking rule refuses the call before any set runs).
//! 2. Its subject is the pseudonym of the domain and the subject entries;
//!    its cost the descriptor's `hits_addend`, else the request's (0 = 1).
//! 3. Descriptors of one subject and one cost join one policy set, which
//!    the port evaluates as one atomic step. Two rules' operation-scoped
//!    policies cannot share a step (a request carries one operation), nor
//!    can more than [`MAX_POLICY_SET`] policies: such a descriptor starts a
//!    set of its own. A descriptor with `hits_addend` 0 is only looked at.
//! 4. The steps run in request order; the first one denied ends the call,
//!    so later steps are not charged.
//!
//! What a client's request alone decides never becomes an error status,
//! which Envoy's default (`failure_mode_deny: false`) would let through: a
//! cost above what an enforced policy admits, or more descriptors than
//! [`MAX_DESCRIPTORS`], is `OVER_LIMIT` before any provider call.

use std::sync::Arc;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::ratelimit::v3::{
    RateLimitRequest as EnvoyRequest, RateLimitResponse,
};
use shared_contract::{
    BudgetFailure, BudgetKey, Clock, EdgeRateLimitPort, EvaluationId, FRONT_ENVOY_RLS,
    IncompatibleCategory, LOG_LINE_EVERY, LogThrottle, MAX_COUNT, OperationDigest, PolicyId,
    PolicyMode, PolicySet, RateLimitDecision, RateLimitFailure, RateLimitOutcome,
    RateLimitOutcomeExt, RateLimitRequest, SETTLES_TOTAL, SetDecision, Settlement, SubjectDigest,
    SubjectPseudonymizer, UnavailableCategory, millis, settle_outcome_label,
};
use tonic::Status;
use tracing::Instrument;

use crate::error::RlsError;
use crate::limit_override::{LimitOverrides, Override, OverridePorts};
use crate::response::{Answer, Response};
use crate::rules::{
    Answered, DESCRIPTOR_SUBJECT_KIND, Match, Member, PreparedRule, Resolved, RlsRule, Rules, Step,
};
use crate::telemetry::{FrontMetrics, decision_span, record_decision};

/// What the engine runs with besides its rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RlsSettings {
    /// The longest an evaluation may take (`capabilities.rate-limit.
    /// evaluation-budget`); a shorter `grpc-timeout` wins.
    pub evaluation_budget: Duration,
}

/// The rules, prepared over one port: what a reload replaces whole.
#[derive(Debug)]
pub struct RlsEngine {
    /// `None` when rate limiting is off: every descriptor is answered `OK`.
    port: Option<Arc<dyn EdgeRateLimitPort>>,
    pseudonymizer: Arc<dyn SubjectPseudonymizer>,
    clock: Arc<dyn Clock>,
    settings: RlsSettings,
    rules: Rules,
    metrics: FrontMetrics,
    /// `None` unless the composition root gave the engine a way to hold
    /// the policy of a `limit` override ([`Self::with_overrides`]).
    overrides: Option<LimitOverrides>,
}

/// Where the budgets of one descriptor are kept, under the rules in force:
/// what an operator looks up to inspect or reset them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DescriptorSubject {
    /// The limited rule `rule` (its index in the configured list) matches
    /// first: the budgets are kept under `subject`, an operation-scoped
    /// policy's also under `operation`.
    Limited {
        /// The rule's index.
        rule: usize,
        /// The descriptor's subject, as a call carrying it is charged.
        subject: SubjectDigest,
        /// The rule's operation.
        operation: OperationDigest,
    },
    /// An `unlimited = true` rule (its index) matches first: no budget.
    Unlimited {
        /// The rule's index.
        rule: usize,
    },
    /// A rule that answers its descriptors without a budget (not limited,
    /// or blocked: see [`crate::RuleLimit`]) matches first.
    Unbudgeted {
        /// The rule's index.
        rule: usize,
        /// Whether it refuses every descriptor.
        blocked: bool,
    },
    /// No rule matches (or rate limiting is off): no budget.
    Unmatched,
}

impl RlsEngine {
    /// Prepares `rules` over `port`: each policy as the port holds it now
    /// (a reload builds a new engine), each rule's operation digest.
    ///
    /// # Errors
    /// A rule the configuration layer should have refused.
    pub fn new(
        port: Arc<dyn EdgeRateLimitPort>,
        pseudonymizer: Arc<dyn SubjectPseudonymizer>,
        clock: Arc<dyn Clock>,
        settings: RlsSettings,
        rules: &[RlsRule],
    ) -> Result<Self, RlsError> {
        let rules = Rules::new(rules, &*port)?;
        let metrics = FrontMetrics::new();
        Ok(Self {
            port: Some(port),
            pseudonymizer,
            clock,
            settings,
            rules,
            metrics,
            overrides: None,
        })
    }

    /// An engine with rate limiting off (the `disabled` provider): every
    /// well-formed request is answered `OK`, each descriptor `OK` without a
    /// limit, and no rule is read.
    pub fn disabled(
        pseudonymizer: Arc<dyn SubjectPseudonymizer>,
        clock: Arc<dyn Clock>,
        settings: RlsSettings,
    ) -> Self {
        let (rules, metrics) = (Rules::default(), FrontMetrics::new());
        Self { port: None, pseudonymizer, clock, settings, rules, metrics, overrides: None }
    }

    /// Honours a descriptor's `limit` override on the rules that allow it,
    /// each effective limit through a port `ports` builds. Without this, an
    /// override is ignored (counted) on every rule.
    #[must_use]
    pub fn with_overrides(mut self, ports: OverridePorts) -> Self {
        self.overrides = Some(LimitOverrides::new(ports));
        self
    }

    /// The provider the engine asks; `None` when rate limiting is off.
    pub fn port(&self) -> Option<&Arc<dyn EdgeRateLimitPort>> {
        self.port.as_ref()
    }

    /// Where the budgets of the descriptor `entries` (key, value; all of
    /// them, as Envoy sends them) of `domain` are kept: the rule a call
    /// would match first and the subject it would be charged under.
    pub fn descriptor_subject(&self, domain: &str, entries: &[(&str, &str)]) -> DescriptorSubject {
        match self.rules.find(domain, entries) {
            Some(Match::Limited(rule)) => DescriptorSubject::Limited {
                rule: rule.index,
                subject: self.subject(rule, entries),
                operation: rule.operation,
            },
            Some(Match::Answered(rule, Answered::Unlimited)) => {
                DescriptorSubject::Unlimited { rule }
            }
            Some(Match::Answered(rule, answer)) => {
                DescriptorSubject::Unbudgeted { rule, blocked: answer == Answered::Blocked }
            }
            None => DescriptorSubject::Unmatched,
        }
    }

    /// The operation of the limited rule at `rule` (its index in the
    /// configured list), under which its operation-scoped policies count.
    pub fn rule_operation(&self, rule: usize) -> Option<OperationDigest> {
        self.rules.limited(rule).map(|rule| rule.operation)
    }

    /// Whether the limited rule at `rule` lists `policy`: only then is a
    /// call of the rule ever charged under it.
    pub fn rule_lists(&self, rule: usize, policy: &PolicyId) -> bool {
        self.rules.limited(rule).is_some_and(|rule| rule.policies.ids().contains(policy))
    }

    /// How long a call may take: the evaluation budget, or the call's
    /// `grpc-timeout` when that is shorter.
    pub fn evaluation_deadline(&self, timeout: Option<Duration>) -> Duration {
        timeout.map_or(self.settings.evaluation_budget, |timeout| {
            timeout.min(self.settings.evaluation_budget)
        })
    }

    /// Answers one `ShouldRateLimit`. `timeout` is the call's
    /// `grpc-timeout`, if it sent one.
    ///
    /// # Errors
    /// `INVALID_ARGUMENT` for no domain or no descriptor;
    /// `UNAVAILABLE` when the provider gave no decision
    /// (`Unavailable`, `Indeterminate`, `ClockUnsafe`: Envoy's
    /// `failure_mode_deny` decides); `FAILED_PRECONDITION` for
    /// `Incompatible` other than a cost above a policy's maximum (which is
    /// `OVER_LIMIT`: the client chose the cost).
    pub async fn should_rate_limit(
        &self,
        request: &EnvoyRequest,
        timeout: Option<Duration>,
    ) -> Result<RateLimitResponse, Status> {
        validate(request)?;
        let Some(port) = &self.port else {
            return Ok(Response::new(request.descriptors.len()).finish());
        };
        if request.descriptors.len() > MAX_DESCRIPTORS {
            if let Some(suppressed) = REFUSED_LOGGED.admit(std::time::Instant::now()) {
                tracing::warn!(
                    descriptors = request.descriptors.len(),
                    suppressed,
                    "envoy rls call with more descriptors than MAX_DESCRIPTORS; answered OVER_LIMIT"
                );
            }
            return Ok(Response::refused(request.descriptors.len()).finish());
        }
        let now = self.clock.monotonic();
        let budget = self.evaluation_deadline(timeout);
        // A budget too large for `Instant` fails closed (AdmissionRejected).
        let deadline = now.checked_add(budget).unwrap_or(now);
        let request_cost = u64::from(request.hits_addend.max(1));
        let mut steps: Vec<Step<'_>> = Vec::new();
        let mut response = Response::new(request.descriptors.len());
        let (mut refused, mut blocked) = (false, false);
        let mut entries = Vec::new();
        let mut charges = Vec::new();
        let matched = if self.rules.replacing() { self.matched(request) } else { Vec::new() };
        // Before the loop, which borrows the rules they are prepared from.
        let overridden = self.overridden(request, &matched);
        for (index, descriptor) in request.descriptors.iter().enumerate() {
            let honoured = overridden.get(index).is_some_and(Option::is_some);
            if descriptor.limit.is_some() && !honoured {
                self.metrics.overrides.increment(1);
            }
            entries.clear();
            entries.extend(descriptor.entries.iter().map(|e| (e.key.as_str(), e.value.as_str())));
            let found = self.rules.find(&request.domain, &entries);
            // Replaced by another rule this call matched: answered as no rule.
            let found = found.filter(|found| !self.rules.replaced(found.index(), &matched));
            let rule = match found {
                Some(Match::Limited(rule)) => rule,
                Some(Match::Answered(_, Answered::Unlimited)) => {
                    self.metrics.unlimited.increment(1);
                    response.unlimited(index);
                    continue;
                }
                Some(Match::Answered(_, Answered::NotLimited)) => {
                    self.metrics.unmatched.increment(1);
                    continue;
                }
                Some(Match::Answered(_, Answered::Blocked)) => {
                    self.metrics.blocked.increment(1);
                    blocked = true;
                    response.block(index);
                    continue;
                }
                None => {
                    self.metrics.unmatched.increment(1);
                    continue;
                }
            };
            // An override the rule allows: its own policy, through its port;
            // one no window holds refuses the call, as a blocking rule does.
            let (rule, override_port) = match overridden.get(index) {
                Some(Some(Override::Held(held))) => (&held.rule, Some(&*held.port)),
                Some(Some(Override::Refused)) => {
                    self.metrics.blocked.increment(1);
                    blocked = true;
                    response.block(index);
                    continue;
                }
                Some(None) | None => (rule, None),
            };
            let cost = descriptor.hits_addend.as_ref().map_or(request_cost, |hits| hits.value);
            if rule.charge_always && descriptor.hits_addend.as_ref().is_none_or(|h| h.value > 0) {
                // Usage already spent: charged whatever remains, answered OK.
                charges.push((index, self.subject(rule, &entries), rule, cost));
                continue;
            }
            let members = match admitting(rule, cost) {
                Ok(members) => members,
                Err(()) => {
                    refused = true;
                    response.refuse_cost(index, rule, cost);
                    continue;
                }
            };
            if members.is_empty() {
                // Shadow policies only, none of which can take the cost.
                continue;
            }
            let subject = self.subject(rule, &entries);
            let resolved = Resolved { rule, subject, cost, members, port: override_port };
            match steps.iter_mut().find(|step| step.admits(&resolved)) {
                Some(step) => {
                    step.operation_bound |= resolved.rule.operation_scoped;
                    if resolved.rule.operation_scoped {
                        step.rule = resolved.rule;
                    }
                    for member in resolved.members {
                        if !step.holds(&member.id) {
                            step.members.push(member);
                        }
                    }
                    step.descriptors.push((index, resolved.rule));
                }
                None => steps.push(Step {
                    port: resolved.port,
                    subject: resolved.subject,
                    cost: resolved.cost,
                    rule: resolved.rule,
                    operation_bound: resolved.rule.operation_scoped,
                    members: resolved.members,
                    descriptors: vec![(index, resolved.rule)],
                }),
            }
        }
        // Usage already spent is charged whatever the sets answer, each in its
        // place among them: a set before it sees the budget without it.
        let mut charges = charges.into_iter().peekable();
        if refused || blocked {
            for (_, subject, rule, cost) in charges {
                charge_always(&**port, rule, subject, cost, deadline).await;
            }
            // Known before any set runs: the call is refused, nothing charged.
            let logged = || REFUSED_LOGGED.admit(std::time::Instant::now());
            if let Some(suppressed) = refused.then(logged).flatten() {
                tracing::warn!(
                    suppressed,
                    "envoy rls hits_addend above a policy's maximum-cost; answered OVER_LIMIT"
                );
            }
            return Ok(response.finish());
        }
        let mut stopped = false;
        for step in &steps {
            let first = step.descriptors.first().map_or(0, |&(index, _)| index);
            while let Some((_, subject, rule, cost)) = charges.next_if(|charge| charge.0 < first) {
                charge_always(&**port, rule, subject, cost, deadline).await;
            }
            if stopped {
                continue;
            }
            let step_port = step.port.unwrap_or(&**port);
            let evaluated = if step.cost == 0 {
                look(step_port, step).await
            } else {
                evaluate(step_port, step, deadline).await
            };
            let evaluated = match evaluated {
                Ok(evaluated) => evaluated,
                Err(status) => {
                    for (_, subject, rule, cost) in charges {
                        charge_always(&**port, rule, subject, cost, deadline).await;
                    }
                    return Err(status);
                }
            };
            stopped = match evaluated {
                Evaluated::Passed => false,
                Evaluated::CostRefused => {
                    for &(index, rule) in &step.descriptors {
                        response.refuse_cost(index, rule, step.cost);
                    }
                    true
                }
                Evaluated::Answer(answer) => !response.add(step, &answer),
                Evaluated::NotAdmitted(retry_after) => {
                    for &(index, rule) in &step.descriptors {
                        response.not_admitted(index, rule, retry_after);
                    }
                    true
                }
            };
        }
        for (_, subject, rule, cost) in charges {
            charge_always(&**port, rule, subject, cost, deadline).await;
        }
        Ok(response.finish())
    }

    /// Per descriptor: what its `limit` override comes to, `None` when it
    /// is not honoured (none sent, its rule does not allow it, or
    /// `MAX_HELD_OVERRIDES` are held). Empty when no descriptor carries one.
    fn overridden(&self, request: &EnvoyRequest, matched: &[usize]) -> Vec<Option<Override>> {
        let Some(overrides) = &self.overrides else { return Vec::new() };
        if request.descriptors.iter().all(|descriptor| descriptor.limit.is_none()) {
            return Vec::new();
        }
        let descriptors = request.descriptors.iter().map(|descriptor| {
            let limit = descriptor.limit.as_ref()?;
            let entries: Vec<(&str, &str)> =
                descriptor.entries.iter().map(|e| (e.key.as_str(), e.value.as_str())).collect();
            let found = self.rules.find(&request.domain, &entries);
            match found.filter(|found| !self.rules.replaced(found.index(), matched)) {
                Some(Match::Limited(rule)) if rule.allow_override => {
                    let found = overrides.get(rule, limit);
                    if found.is_none()
                        && let Some(suppressed) = REFUSED_LOGGED.admit(Instant::now())
                    {
                        tracing::warn!(
                            suppressed,
                            held = crate::MAX_HELD_OVERRIDES,
                            "envoy rls limit override ignored: as many effective limits as \
                             an engine holds are held, or the provider holds none; the rule's \
                             own policies apply"
                        );
                    }
                    found
                }
                _ => None,
            }
        });
        descriptors.collect()
    }

    /// The indexes of the rules the call's descriptors match.
    fn matched(&self, request: &EnvoyRequest) -> Vec<usize> {
        let matches = request.descriptors.iter().filter_map(|descriptor| {
            let entries: Vec<(&str, &str)> =
                descriptor.entries.iter().map(|e| (e.key.as_str(), e.value.as_str())).collect();
            self.rules.find(&request.domain, &entries).map(|found| found.index())
        });
        matches.collect()
    }

    /// The descriptor subject: kind, domain, then each subject entry's key
    /// and value, each a frame of the pseudonymizer's framing.
    fn subject(&self, rule: &PreparedRule, entries: &[(&str, &str)]) -> SubjectDigest {
        let parts = rule.subject.iter().flat_map(|&at| {
            let (key, value) = entries[at];
            [key, value]
        });
        let mut frames = [DESCRIPTOR_SUBJECT_KIND, &rule.domain].into_iter().chain(parts);
        self.pseudonymizer.pseudonymize_frames(&mut frames)
    }
}

/// The members of `rule` that take part in a charge of `cost`, or `Err`
/// when an enforced one cannot admit it (its `maximum-cost` is below):
/// such a descriptor can never pass. A shadow member that cannot admit it
/// is left out, counted `cost-exceeds-maximum`; so is each enforced one
/// that refuses. A policy the port does not hold stays in: the port
/// answers `UnknownPolicy`, which fails closed.
fn admitting(rule: &PreparedRule, cost: u64) -> Result<Vec<&Member>, ()> {
    if cost == 0 {
        // A look charges nothing: every member is read.
        return Ok(rule.members.iter().collect());
    }
    let admits = |member: &Member| member.policy.as_ref().is_none_or(|p| p.admits_cost(cost));
    let outcome =
        Err(RateLimitFailure::Incompatible { category: IncompatibleCategory::CostExceedsMaximum });
    let mut members = Vec::with_capacity(rule.members.len());
    let mut refused = false;
    for member in rule.members.iter() {
        if admits(member) {
            members.push(member);
        } else {
            member.metrics.record(&outcome, 0);
            refused |= member.enforced();
        }
    }
    if refused { Err(()) } else { Ok(members) }
}

/// What a step's evaluation gave.
enum Evaluated {
    /// The decisions.
    Answer(Answer),
    /// A failure of a set that holds no enforced policy: it passes (as on
    /// HTTP).
    Passed,
    /// The port refused the cost (its policy is not the one the rules were
    /// prepared with): refused as the rules' own check refuses it.
    CostRefused,
    /// The provider would not take the set now (`AdmissionRejected`: the
    /// in-process store full of live keys, the script lane full), nothing
    /// charged: `OVER_LIMIT` until the wait given, since an error status
    /// would let Envoy's default admit what the callers' own load refused.
    NotAdmitted(Duration),
}

/// One policy set through the port.
async fn evaluate(
    port: &dyn EdgeRateLimitPort,
    step: &Step<'_>,
    deadline: Instant,
) -> Result<Evaluated, Status> {
    // The common case, one rule's policies: its prepared set, not a copy.
    let own = step.rule.policies.ids();
    let policies = if own.len() == step.members.len()
        && own.iter().zip(&step.members).all(|(id, member)| *id == member.id)
    {
        step.rule.policies.clone()
    } else {
        PolicySet::new(step.members.iter().map(|member| member.id.clone()))
            .map_err(|_| Status::internal("the policy set of the descriptors is invalid"))?
    };
    let request = RateLimitRequest {
        policies: policies.into(),
        subject: step.subject,
        operation: step.rule.operation,
        cost: step.cost,
        evaluation_id: EvaluationId::once(),
        deadline,
    };
    let mut pending = Unrecorded::new(step, decision_span(&request));
    // A provider answering at once decides inside this call: in the span,
    // and with nothing to poll.
    let evaluation = match &pending.span {
        Some(span) => span.in_scope(|| port.evaluate(request)),
        None => port.evaluate(request),
    };
    let outcome = match evaluation.into_ready() {
        Ok(outcome) => outcome,
        Err(waiting) => match &pending.span {
            Some(span) => waiting.instrument(span.clone()).await,
            None => waiting.await,
        },
    };
    pending.record(&outcome);
    match outcome {
        Ok(set) => Ok(Evaluated::Answer(set)),
        Err(_) if !step.enforces() => {
            if let Some(suppressed) = SHADOW_PASSED_LOGGED.admit(std::time::Instant::now()) {
                tracing::warn!(
                    outcome = outcome.category_name(),
                    suppressed,
                    "rate limit failed; the set is shadow only, so the descriptors pass"
                );
            }
            Ok(Evaluated::Passed)
        }
        Err(RateLimitFailure::Unavailable {
            category: UnavailableCategory::AdmissionRejected,
            retry_after,
        }) => {
            if let Some(suppressed) = FAILED_CLOSED_LOGGED.admit(std::time::Instant::now()) {
                tracing::warn!(
                    suppressed,
                    "envoy rls set not admitted by the provider (store or lane full); answered \
                     OVER_LIMIT"
                );
            }
            Ok(Evaluated::NotAdmitted(retry_after))
        }
        Err(RateLimitFailure::Incompatible {
            category: IncompatibleCategory::CostExceedsMaximum,
        }) => {
            if let Some(suppressed) = REFUSED_LOGGED.admit(std::time::Instant::now()) {
                tracing::warn!(
                    suppressed,
                    "envoy rls hits_addend above a policy's maximum-cost; answered OVER_LIMIT"
                );
            }
            Ok(Evaluated::CostRefused)
        }
        Err(RateLimitFailure::Unavailable { .. } | RateLimitFailure::Indeterminate { .. }) => {
            if let Some(suppressed) = FAILED_CLOSED_LOGGED.admit(std::time::Instant::now()) {
                tracing::warn!(
                    outcome = outcome.category_name(),
                    suppressed,
                    "envoy rls failed closed"
                );
            }
            Err(Status::unavailable(format!("rate limit unavailable: {}", outcome.category_name())))
        }
        Err(RateLimitFailure::Incompatible { .. }) => {
            if let Some(suppressed) = FAILED_CLOSED_LOGGED.admit(std::time::Instant::now()) {
                tracing::warn!(
                    outcome = outcome.category_name(),
                    suppressed,
                    "envoy rls failed closed"
                );
            }
            Err(Status::failed_precondition(format!(
                "rate limit incompatible: {}",
                outcome.category_name()
            )))
        }
    }
}

/// One evaluation whose outcome is not recorded yet. A `grpc-timeout`
/// that ends the call drops the evaluation mid-way (the answer is given
/// outside it, see `answered_by`); the provider may have charged, so the
/// drop records `Indeterminate`: counted under its category, observed in
/// the histogram and written on the decision span, as an answered failure.
struct Unrecorded<'s, 'e> {
    step: &'s Step<'e>,
    span: Option<tracing::Span>,
    /// Wall time, not the injected clock: the histogram measures the port.
    started: Instant,
    recorded: bool,
}

impl<'s, 'e> Unrecorded<'s, 'e> {
    fn new(step: &'s Step<'e>, span: Option<tracing::Span>) -> Self {
        Self { step, span, started: Instant::now(), recorded: false }
    }

    /// Records `outcome` in the metrics and the decision span, once.
    fn record(&mut self, outcome: &RateLimitOutcome) {
        if std::mem::replace(&mut self.recorded, true) {
            return;
        }
        let elapsed = self.started.elapsed();
        if let Some(span) = &self.span {
            record_decision(span, outcome, self.step.enforces());
        }
        for (index, member) in self.step.members.iter().enumerate() {
            member.metrics.record(outcome, index);
            member.metrics.observe(elapsed);
        }
    }
}

impl Drop for Unrecorded<'_, '_> {
    fn drop(&mut self) {
        self.record(&Err(RateLimitFailure::Indeterminate { retry_after: Duration::ZERO }));
    }
}

/// Holds this front's failed-closed lines to one a second: while the
/// provider is down every call fails alike (the metrics count each one).
/// One per process, as the front is.
static FAILED_CLOSED_LOGGED: LogThrottle = LogThrottle::new(LOG_LINE_EVERY);

/// Holds the lines of shadow-only sets that failed and passed to one a
/// second, each count its own.
static SHADOW_PASSED_LOGGED: LogThrottle = LogThrottle::new(LOG_LINE_EVERY);

/// Holds the lines of calls refused for their shape (a cost no policy of
/// the rule admits, too many descriptors) to one a second: an Envoy that
/// sends them sends them on every request.
static REFUSED_LOGGED: LogThrottle = LogThrottle::new(LOG_LINE_EVERY);

/// A look (`hits_addend` 0): each enforced policy's budget as it stands,
/// charging nothing. Denied when a request of cost 1 would not pass.
/// Charges `cost` hits reported after the fact to `rule`'s policies, past
/// the limit if need be (a settle of no reservation). The call is answered
/// `OK` whatever comes of it: the work is done, and a refusal of it would
/// block nothing. A failure is counted and logged.
async fn charge_always(
    port: &dyn EdgeRateLimitPort,
    rule: &PreparedRule,
    subject: SubjectDigest,
    cost: u64,
    deadline: Instant,
) {
    let request = RateLimitRequest {
        policies: (&rule.policies).into(),
        subject,
        operation: rule.operation,
        cost: 0,
        evaluation_id: EvaluationId::once(),
        deadline,
    };
    // Beyond a counter's range, the most a settle charges: never less.
    let outcome = port.settle(Settlement { request, used: cost.min(MAX_COUNT) }).await;
    if let Err(failure) = &outcome
        && let Some(suppressed) = FAILED_CLOSED_LOGGED.admit(std::time::Instant::now())
    {
        tracing::warn!(
            failure = failure.category_name(),
            suppressed,
            "envoy rls hits reported after the fact were not charged"
        );
    }
    let outcome = settle_outcome_label(&outcome);
    metrics::counter!(SETTLES_TOTAL, "outcome" => outcome, "front" => FRONT_ENVOY_RLS).increment(1);
}

async fn look(port: &dyn EdgeRateLimitPort, step: &Step<'_>) -> Result<Evaluated, Status> {
    let mut decisions = Vec::with_capacity(step.members.len());
    for member in &step.members {
        if !member.enforced() {
            // Not looked at, and its mode keeps it from refusing the step.
            let unseen = RateLimitDecision {
                remaining: 0,
                retry_after_ms: 0,
                reset_after_ms: 0,
                allowed: false,
                replayed: false,
            };
            decisions.push((PolicyMode::Shadow, unseen));
            continue;
        }
        let (subject, operation) = step.budget_of(member);
        let key = BudgetKey::new(subject, member.id.clone(), operation);
        let mut pending = UnrecordedLook(Some(member));
        let state = port.inspect(&key).await.map_err(|failure| {
            if let Some(suppressed) = FAILED_CLOSED_LOGGED.admit(std::time::Instant::now()) {
                tracing::warn!(
                    failure = failure.name(),
                    suppressed,
                    "envoy rls look failed closed"
                );
            }
            look_status(failure)
        });
        // Answered, so not dropped mid-way: the guard has nothing to count.
        pending.0 = None;
        let state = state?;
        let passes = state.retry_after.is_zero() && state.remaining > 0;
        member.metrics.record_look(passes);
        let decision = RateLimitDecision {
            allowed: passes,
            remaining: state.remaining,
            retry_after_ms: millis(state.retry_after),
            reset_after_ms: millis(state.reset_after),
            replayed: false,
        };
        decisions.push((PolicyMode::Enforce, decision));
    }
    // Denied when an enforced budget would not pass a request of cost 1.
    Ok(Evaluated::Answer(SetDecision::of_members(decisions)))
}

/// A look at `.0`'s budget not answered yet: dropped mid-way (the call's
/// `grpc-timeout` ended it), the look is counted `indeterminate`, as an
/// evaluation dropped mid-way (see [`Unrecorded`]).
struct UnrecordedLook<'m>(Option<&'m Member>);

impl Drop for UnrecordedLook<'_> {
    fn drop(&mut self) {
        if let Some(member) = self.0 {
            let outcome = Err(RateLimitFailure::Indeterminate { retry_after: Duration::ZERO });
            member.metrics.record(&outcome, 0);
        }
    }
}

/// Most descriptors one call may carry. Each subject is one atomic step
/// (one Redis round trip), run in order: an unbounded list would let one
/// call charge hundreds of budgets before its deadline ends it. A call
/// past it is `OVER_LIMIT`, every descriptor, with no provider call (an
/// error status would let the request through at Envoy's default). Envoy
/// sends one descriptor per `rate_limits` action list.
pub const MAX_DESCRIPTORS: usize = 64;

/// A call with no descriptor has nothing to limit, and one without a
/// domain names no rules: `INVALID_ARGUMENT`, as envoyproxy/ratelimit
/// refuses both (whatever Envoy then does, no limit is passed). A descriptor without
/// entries, or with an empty key, needs no check: no rule can have either,
/// so it matches none and is not limited, while the call's other
/// descriptors still are.
fn validate(request: &EnvoyRequest) -> Result<(), Status> {
    if request.domain.is_empty() {
        return Err(Status::invalid_argument("a rate limit request needs a domain"));
    }
    if request.descriptors.is_empty() {
        return Err(Status::invalid_argument("a rate limit request needs at least one descriptor"));
    }
    Ok(())
}

fn look_status(failure: BudgetFailure) -> Status {
    match failure {
        BudgetFailure::Unavailable | BudgetFailure::Indeterminate => {
            Status::unavailable(format!("rate limit unavailable: {}", failure.name()))
        }
        BudgetFailure::UnknownPolicy
        | BudgetFailure::StateIncompatible
        | BudgetFailure::OperationRequired
        | BudgetFailure::OperationNotApplicable => {
            Status::failed_precondition(format!("rate limit incompatible: {}", failure.name()))
        }
    }
}
