//! The operator listener: its own address and router, never the public
//! one, behind a bearer token. It answers "why is this customer blocked,
//! and unblock them now" through the port's operator calls:
//!
//! - `GET /admin/subjects/{pseudonym}/policies/{policy}[?operation=METHOD%20/route | ?rule=N]`:
//!   the budget as the provider holds it now, without charging (`rule`:
//!   the operation of `envoy-rls.rules.N`);
//! - `DELETE` on the same path: resets that budget (audited, one log line);
//! - `POST /admin/pseudonym` `{"kind", "identity"}`, or `{"kind":
//!   "descriptor", "domain", "entries"}`: the pseudonym the edge (or the
//!   Envoy RLS) counts that subject under, so support staff can find a
//!   customer's budget without the raw identity being stored (rate limited
//!   itself, logged without the identity);
//! - `POST /admin/reload`: reads the configuration again, as SIGHUP does,
//!   and answers the [`ReloadReport`] (audited).
//!
//! Every route takes [`AdminState`], so one more route is one more
//! `.route(..)` line in [`router`].

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use adapter_envoy_rls::{DescriptorSubject, RlsSwitch};
use adapter_memory::MemoryEdgeRateLimitAdapter;
use adapter_web::{
    ApiKeyProblem, BridgeSwitch, EdgeSettings, IdentityProblem, SubjectKind,
    VersionedPseudonymizer, canonical_identity, charged_digest, operation_digest,
};
use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{ConnectInfo, Path, Query, Request, State};
use axum::http::{HeaderValue, StatusCode, Uri, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use problem_details::ProblemDetails;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use shared_contract::{
    Algorithm, BudgetFailure, BudgetKey, BudgetState, Certainty, Clock, EdgeRateLimitPort,
    EvaluationId, OperationDigest, PolicyId, PolicySet, RateLimitFailure, RateLimitPolicy,
    RateLimitRequest, SubjectDigest,
};
use subtle::ConstantTimeEq;

use crate::config::SecretValue;
use crate::error::BootstrapError;
use crate::reload::{ReloadReport, Reloader};

/// Pseudonym lookups the whole listener answers per window: enough for
/// support staff, far too few to map identities to pseudonyms in bulk.
pub const PSEUDONYM_LOOKUPS: u64 = 30;
/// The window of [`PSEUDONYM_LOOKUPS`].
pub const PSEUDONYM_WINDOW: Duration = Duration::from_secs(60);
/// Longest identity a lookup accepts, in bytes (an API key is at most 256).
const MAX_IDENTITY_BYTES: usize = 1024;

/// Where the admin routes find the provider, the pseudonymizer and the
/// edge settings.
#[derive(Debug, Clone)]
pub enum AdminSource {
    /// The edge's bridge in force, taken once per admin request: its port
    /// (with the policy table of the latest reload), its pseudonymizer (the
    /// same key the edge counts under, generated or configured) and its
    /// settings.
    Edge(BridgeSwitch),
    /// `provider = "disabled"`: no budgets; lookups still answer.
    Disabled {
        /// The configured (or generated) pseudonymizer.
        pseudonymizer: Arc<VersionedPseudonymizer>,
        /// The edge settings of the configuration.
        edge: Arc<EdgeSettings>,
    },
}

/// What one admin request works with: the provider (none when disabled),
/// the pseudonymizer and the edge settings, all of one moment.
struct Now {
    port: Option<Arc<dyn EdgeRateLimitPort>>,
    pseudonymizer: Arc<VersionedPseudonymizer>,
    edge: EdgeSettings,
}

impl AdminSource {
    fn now(&self) -> Now {
        match self {
            Self::Edge(switch) => {
                let bridge = switch.current();
                Now {
                    port: Some(Arc::clone(bridge.port())),
                    pseudonymizer: Arc::clone(bridge.pseudonymizer()),
                    edge: bridge.settings().clone(),
                }
            }
            Self::Disabled { pseudonymizer, edge } => {
                Now { port: None, pseudonymizer: Arc::clone(pseudonymizer), edge: (**edge).clone() }
            }
        }
    }

    /// Where problem types start, without cloning the settings.
    fn problem_type_base(&self) -> String {
        match self {
            Self::Edge(switch) => switch.current().settings().problem_type_base.clone(),
            Self::Disabled { edge, .. } => edge.problem_type_base.clone(),
        }
    }
}

/// What every admin route needs. Cloned per request (every field is shared).
#[derive(Debug, Clone)]
pub struct AdminState {
    source: AdminSource,
    /// The token's SHA-256: compared in constant time, and the token itself
    /// is not kept in this state.
    token: [u8; 32],
    /// The pseudonym lookups' own budget, in process.
    lookups: Arc<LookupLimiter>,
    /// The operations the public router serves (`"GET /api/orders/{id}"`):
    /// the only ones a budget can be kept under.
    served: Arc<BTreeSet<String>>,
    /// What `POST /admin/reload` runs; none for a server built without
    /// configuration sources to read again.
    reloader: Option<Reloader>,
    /// The Envoy RLS engine in force (its rules and pseudonymizer), when
    /// `envoy-rls.listen` is set: descriptor lookups and `?rule=N`.
    rls: Option<RlsSwitch>,
}

impl AdminState {
    /// The state over `source`, the configured token and the operations
    /// the public router serves.
    pub fn new(
        source: AdminSource,
        token: &SecretValue,
        served: BTreeSet<String>,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, BootstrapError> {
        Ok(Self {
            source,
            token: Sha256::digest(token.expose().as_bytes()).into(),
            lookups: Arc::new(LookupLimiter::new(clock)?),
            served: Arc::new(served),
            reloader: None,
            rls: None,
        })
    }

    /// This state with the Envoy RLS engine of `rls` for descriptor
    /// subjects.
    #[must_use]
    pub fn with_rls(mut self, rls: Option<RlsSwitch>) -> Self {
        self.rls = rls;
        self
    }

    /// This state with `POST /admin/reload` running `reloader`.
    #[must_use]
    pub fn with_reloader(mut self, reloader: Option<Reloader>) -> Self {
        self.reloader = reloader;
        self
    }
}

/// The admin router: every route behind the bearer-token check (the
/// fallbacks too, so an unauthenticated caller learns nothing of the
/// routes). Every answer, a 405 included, is problem+json.
pub fn router(state: AdminState) -> Router {
    Router::new()
        .route("/admin/subjects/{pseudonym}/policies/{policy}", get(inspect).delete(reset))
        .route("/admin/pseudonym", post(pseudonym))
        .route("/admin/reload", post(reload))
        // After the routes: it applies to those already added.
        .method_not_allowed_fallback(method_not_allowed)
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(state.clone(), authorize))
        .with_state(state)
}

/// Lets a request through only with `Authorization: Bearer <token>`, the
/// scheme in any case (RFC 7235 section 2.1). The presented token's digest
/// is compared with the configured one's in constant time, so neither a
/// prefix nor the length leaks through timing. A request with more than one `Authorization` header is a `400`: which of
/// two credentials counts is never guessed.
async fn authorize(State(state): State<AdminState>, request: Request, next: Next) -> Response {
    let mut credentials = request.headers().get_all(header::AUTHORIZATION).iter();
    let first = credentials.next();
    if credentials.next().is_some() {
        return problem(
            &state,
            StatusCode::BAD_REQUEST,
            "duplicate-authorization",
            "Send one `Authorization: Bearer <token>` header, not several.",
        );
    }
    let presented = first.and_then(|value| value.to_str().ok()).and_then(bearer_token);
    let valid = presented.is_some_and(|token| {
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        bool::from(digest.ct_eq(&state.token))
    });
    if valid {
        return next.run(request).await;
    }
    let mut response = problem(
        &state,
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        "A valid `Authorization: Bearer <token>` header is required.",
    );
    response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    response
}

/// The credentials of a `Bearer` header: the scheme, one or more spaces,
/// the token.
fn bearer_token(credentials: &str) -> Option<&str> {
    let (scheme, token) = credentials.split_once(' ')?;
    scheme.eq_ignore_ascii_case("Bearer").then(|| token.trim_start_matches(' '))
}

#[derive(Debug, Deserialize)]
struct OperationQuery {
    operation: Option<String>,
    /// The index of an `envoy-rls.rules` entry: its operation.
    rule: Option<usize>,
}

#[allow(
    clippy::result_large_err,
    reason = "the refusal is the response answered as is, once per admin request"
)]
/// The path and query of a budget route, or the problem+json 400 that
/// refuses them (a segment that is not UTF-8, `operation` twice), where
/// axum's own rejection would be plain text.
fn budget_route(
    state: &AdminState,
    path: Result<Path<(String, String)>, PathRejection>,
    query: Result<Query<OperationQuery>, QueryRejection>,
) -> Result<(String, String, OperationQuery), Response> {
    let bad = |detail: &str| problem(state, StatusCode::BAD_REQUEST, "invalid-request", detail);
    let Path((pseudonym, policy)) =
        path.map_err(|_| bad("The pseudonym and the policy id are percent-encoded UTF-8."))?;
    let Query(query) =
        query.map_err(|_| {
            bad("The query is at most one operation=METHOD%20/route, or one rule=N (the index of an envoy-rls rule).")
        })?;
    Ok((pseudonym, policy, query))
}

async fn inspect(
    State(state): State<AdminState>,
    path: Result<Path<(String, String)>, PathRejection>,
    query: Result<Query<OperationQuery>, QueryRejection>,
) -> Response {
    let (pseudonym, policy, query) = match budget_route(&state, path, query) {
        Ok(route) => route,
        Err(refusal) => return refusal,
    };
    let (port, key, held) = match budget(&state, &pseudonym, &policy, &query) {
        Ok(found) => found,
        Err(refusal) => return refusal,
    };
    match port.inspect(&key).await {
        Ok(budget) => {
            Json(describe(&key, query.operation.as_deref(), &held, &budget)).into_response()
        }
        Err(failure) => failure_response(&state, failure),
    }
}

async fn reset(
    State(state): State<AdminState>,
    ConnectInfo(caller): ConnectInfo<SocketAddr>,
    path: Result<Path<(String, String)>, PathRejection>,
    query: Result<Query<OperationQuery>, QueryRejection>,
) -> Response {
    let (pseudonym, policy, query) = match budget_route(&state, path, query) {
        Ok(route) => route,
        Err(refusal) => return refusal,
    };
    let (port, key, _) = match budget(&state, &pseudonym, &policy, &query) {
        Ok(found) => found,
        Err(refusal) => return refusal,
    };
    let result = port.reset(&key).await;
    let outcome = match result {
        Ok(()) => "reset",
        Err(failure) => failure.name(),
    };
    // The audit line: who reset what. A pseudonym and an operation route
    // are no raw subject.
    tracing::info!(
        target: "audit",
        pseudonym = %key.subject,
        policy = %key.policy,
        operation = query.operation.as_deref().unwrap_or(""),
        rule = query.rule,
        caller = %caller,
        outcome,
        "admin budget reset"
    );
    match result {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(failure) => failure_response(&state, failure),
    }
}

/// Whether `operation` (`METHOD /template`) names a route the router
/// serves under some method: the requests charged under it exist.
/// The method must be one an operation id can start with: an extension
/// method (`FOO`) is charged as `OTHER`, so `FOO /route` names no budget.
fn serves_route_of(served: &BTreeSet<String>, operation: &str) -> bool {
    let Some((method, wanted)) = operation.split_once(' ') else { return false };
    adapter_web::METHODS.contains(&method)
        && served
            .iter()
            .any(|served| served.split_once(' ').is_some_and(|(_, route)| route == wanted))
}

#[allow(
    clippy::result_large_err,
    reason = "the refusal is the response answered as is, once per admin request"
)]
/// The provider, the budget key and its policy of a budget route, or the
/// response that refuses it (400 for input that cannot name a budget, 404
/// for an operation the server does not serve or a policy the provider
/// does not hold).
fn budget(
    state: &AdminState,
    pseudonym: &str,
    policy: &str,
    query: &OperationQuery,
) -> Result<(Arc<dyn EdgeRateLimitPort>, BudgetKey, RateLimitPolicy), Response> {
    let bad = |detail: &str| problem(state, StatusCode::BAD_REQUEST, "invalid-request", detail);
    let operation = query.operation.as_deref();
    if operation.is_some() && query.rule.is_some() {
        return Err(bad("Name an HTTP operation or an envoy-rls rule, not both."));
    }
    let subject = SubjectDigest::parse(pseudonym)
        .map_err(|_| bad("The pseudonym is not of the form v<version>:<hex>."))?;
    let now = state.source.now();
    // A digest the edge cannot make (a truncated paste, an unknown key
    // version) names a budget no request is charged under: inspecting it
    // would show a fresh budget and resetting it would change nothing.
    if !now.pseudonymizer.could_make(&subject) {
        return Err(bad(
            "The server makes no such pseudonym: v<a configured key version>:<64 hex digits>.",
        ));
    }
    let id = PolicyId::new(policy)
        .map_err(|_| bad("The policy id is not 1 to 64 characters of [a-z0-9._-]."))?;
    let operation = operation
        .map(|text| {
            if !crate::config::is_operation(text) {
                return Err(bad("The operation is a method and a route template, like \"GET /api/orders/{id}\"."));
            }
            // A path in place of the template would name a budget no
            // request is ever charged under: a reset would change nothing.
            // Any method on a served route is charged (a method the route
            // does not take is a 405 under the default set), so its budget
            // can be inspected and reset too.
            if !serves_route_of(&state.served, text) {
                let served = state.served.iter().map(String::as_str).collect::<Vec<_>>();
                let detail = format!(
                    "The server serves no such route; it serves {} (any method on one of \
                     these routes is charged, a method it does not take as a 405, an \
                     extension method as OTHER).",
                    served.join(", ")
                );
                return Err(problem(state, StatusCode::NOT_FOUND, "unknown-operation", &detail));
            }
            // A HEAD spends the GET's budget, as the edge charges it.
            Ok(charged_digest(text))
        })
        .transpose()?;
    let operation = match query.rule {
        Some(rule) => Some(rls_rule_operation(state, rule, &id)?),
        None => operation,
    };
    let Some(port) = now.port else {
        return Err(problem(
            state,
            StatusCode::NOT_FOUND,
            "rate-limiting-disabled",
            "Rate limiting is disabled: there are no budgets.",
        ));
    };
    let held = port
        .policy(&id)
        .cloned()
        .ok_or_else(|| failure_response(state, BudgetFailure::UnknownPolicy))?;
    Ok((port, BudgetKey::new(subject, id, operation), held))
}

#[allow(
    clippy::result_large_err,
    reason = "the refusal is the response answered as is, once per admin request"
)]
/// The operation of the limited rule `envoy-rls.rules.{rule}` in force,
/// or the 404 that says there is none, or that the rule does not list
/// `policy` (no call is ever charged under that budget, so a reset of it
/// would change nothing).
fn rls_rule_operation(
    state: &AdminState,
    rule: usize,
    policy: &PolicyId,
) -> Result<OperationDigest, Response> {
    let Some(rls) = &state.rls else {
        return Err(rls_off(state));
    };
    let engine = rls.current();
    let Some(operation) = engine.rule_operation(rule) else {
        let detail = format!("envoy-rls.rules.{rule} is not a rule with policies in force.");
        return Err(problem(state, StatusCode::NOT_FOUND, "unknown-rule", &detail));
    };
    if !engine.rule_lists(rule, policy) {
        let detail = format!(
            "envoy-rls.rules.{rule} does not list the policy {}: no call is charged under this budget.",
            policy.as_str()
        );
        return Err(problem(state, StatusCode::NOT_FOUND, "unknown-rule", &detail));
    }
    Ok(operation)
}

fn rls_off(state: &AdminState) -> Response {
    problem(
        state,
        StatusCode::NOT_FOUND,
        "envoy-rls-off",
        "The Envoy RLS listener is off (envoy-rls.listen): no descriptor has a budget.",
    )
}

/// The JSON of an inspected budget.
fn describe(
    key: &BudgetKey,
    operation: Option<&str>,
    policy: &RateLimitPolicy,
    budget: &BudgetState,
) -> serde_json::Value {
    let millis = |duration: Duration| u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
    serde_json::json!({
        "pseudonym": key.subject.to_string(),
        "policy": key.policy.as_str(),
        "revision": policy.revision(),
        "operation": operation,
        "operation-digest": key.operation.as_ref().map(OperationDigest::to_string),
        "algorithm": policy.algorithm().name(),
        "limit": budget.limit,
        "remaining": budget.remaining,
        "debt": budget.debt,
        "reset-after-ms": millis(budget.reset_after),
        "retry-after-ms": millis(budget.retry_after),
        "mark": budget.mark,
        "approximate": match budget.certainty {
            Certainty::Certain => false,
            Certainty::ApproximateAlgorithm => true,
        },
    })
}

/// 200 with the report when the reload applied or found nothing to apply,
/// 422 with it when the configuration was refused (the table in force
/// stays), 409 when there is nothing to read again.
async fn reload(
    State(state): State<AdminState>,
    ConnectInfo(caller): ConnectInfo<SocketAddr>,
) -> Response {
    let Some(reloader) = &state.reloader else {
        return problem(
            &state,
            StatusCode::CONFLICT,
            "reload-unavailable",
            "This server was built without configuration sources to read again.",
        );
    };
    let report = reloader.reload().await;
    tracing::info!(target: "audit", caller = %caller, result = report.result(), "admin reload");
    let status = match report {
        ReloadReport::Applied { .. } | ReloadReport::Unchanged { .. } => StatusCode::OK,
        ReloadReport::Rejected { .. } => StatusCode::UNPROCESSABLE_ENTITY,
    };
    (status, Json(report)).into_response()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LookupBody {
    kind: String,
    /// An HTTP subject's identity.
    identity: Option<String>,
    /// A descriptor's domain.
    domain: Option<String>,
    /// A descriptor's entries, all of them, in order, as Envoy sends them.
    entries: Option<Vec<LookupEntry>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LookupEntry {
    key: String,
    value: String,
}

/// What a lookup names: an HTTP subject, or an Envoy descriptor.
enum Lookup {
    Http(SubjectKind, String),
    Descriptor(String, Vec<LookupEntry>),
}

const LOOKUP_SHAPE: &str = "The body is JSON {\"kind\": \"api-key\" | \"ip\" | \"principal\", \"identity\": \"...\"} or {\"kind\": \"descriptor\", \"domain\": \"...\", \"entries\": [{\"key\": \"...\", \"value\": \"...\"}, ...]}.";

impl LookupBody {
    /// The lookup, or what is wrong with the body, in the caller's terms.
    fn lookup(self) -> Result<Lookup, String> {
        let kind = match self.kind.as_str() {
            "descriptor" => None,
            kind => Some(kind.parse::<SubjectKind>().map_err(|_| {
                "kind is one of \"api-key\", \"ip\", \"principal\", \"descriptor\".".to_owned()
            })?),
        };
        let (lookup, bytes) = match (kind, self.identity, self.domain, self.entries) {
            (Some(kind), Some(identity), None, None) => {
                let bytes = identity.len();
                (Lookup::Http(kind, identity), bytes)
            }
            (None, None, Some(domain), Some(entries)) => {
                if entries.is_empty() || entries.iter().any(|entry| entry.key.is_empty()) {
                    return Err(
                        "entries is a non-empty list, each with a non-empty key.".to_owned()
                    );
                }
                let bytes = domain.len()
                    + entries
                        .iter()
                        .map(|entry| entry.key.len() + entry.value.len())
                        .sum::<usize>();
                (Lookup::Descriptor(domain, entries), bytes)
            }
            _ => return Err(LOOKUP_SHAPE.to_owned()),
        };
        if bytes > MAX_IDENTITY_BYTES {
            return Err(format!("identity is at most {MAX_IDENTITY_BYTES} bytes."));
        }
        Ok(lookup)
    }
}

async fn pseudonym(
    State(state): State<AdminState>,
    ConnectInfo(caller): ConnectInfo<SocketAddr>,
    body: Result<Json<LookupBody>, JsonRejection>,
) -> Response {
    let bad = |detail: String| problem(&state, StatusCode::BAD_REQUEST, "invalid-request", &detail);
    let lookup =
        match body.map_err(|_| LOOKUP_SHAPE.to_owned()).and_then(|Json(body)| body.lookup()) {
            Ok(lookup) => lookup,
            Err(detail) => return bad(detail),
        };
    if let Some(refusal) = state.lookups.admit(&state).await {
        return refusal;
    }
    let (kind, pseudonym, rule) = match lookup {
        Lookup::Http(kind, identity) => {
            let now = state.source.now();
            let identity = match canonical_identity(kind, &identity, &now.edge) {
                Ok(identity) => identity,
                Err(problem) => return bad(identity_detail(problem).to_owned()),
            };
            (kind.name(), now.pseudonymizer.pseudonymize(kind, &identity), None)
        }
        Lookup::Descriptor(domain, entries) => {
            let Some(rls) = &state.rls else {
                return rls_off(&state);
            };
            let entries: Vec<(&str, &str)> =
                entries.iter().map(|entry| (entry.key.as_str(), entry.value.as_str())).collect();
            // The rule a call with this descriptor matches, and the subject
            // it is charged under, exactly as the RLS computes them.
            match rls.current().descriptor_subject(&domain, &entries) {
                DescriptorSubject::Limited { rule, subject, .. } => {
                    (DESCRIPTOR_KIND, subject, Some(rule))
                }
                DescriptorSubject::Unlimited { rule } => {
                    let detail = format!(
                        "The descriptor matches envoy-rls.rules.{rule}, which is unlimited: it has no budget."
                    );
                    return problem(&state, StatusCode::NOT_FOUND, "not-limited", &detail);
                }
                DescriptorSubject::Unbudgeted { rule, blocked } => {
                    let answer = if blocked { "refuses it" } else { "does not limit it" };
                    let detail = format!(
                        "The descriptor matches envoy-rls.rules.{rule}, which {answer}: it has no budget."
                    );
                    return problem(&state, StatusCode::NOT_FOUND, "not-limited", &detail);
                }
                DescriptorSubject::Unmatched => {
                    let detail = "No envoy-rls rule matches the descriptor: it has no budget.";
                    return problem(&state, StatusCode::NOT_FOUND, "not-limited", detail);
                }
            }
        }
    };
    // Never the identity: only that a lookup happened, of which kind, by whom.
    tracing::info!(target: "audit", kind, caller = %caller, "admin pseudonym lookup");
    let mut answer = serde_json::json!({ "kind": kind, "pseudonym": pseudonym.to_string() });
    if let Some(rule) = rule {
        // The rule whose operation `?rule=N` names, for its operation-scoped policies.
        answer["rule"] = rule.into();
    }
    let headers = [(header::CACHE_CONTROL, "no-store")];
    (headers, Json(answer)).into_response()
}

/// The `kind` of a descriptor lookup: the subject kind the RLS frames.
const DESCRIPTOR_KIND: &str = adapter_envoy_rls::DESCRIPTOR_SUBJECT_KIND;

const fn identity_detail(problem: IdentityProblem) -> &'static str {
    match problem {
        IdentityProblem::InvalidApiKey(ApiKeyProblem::Empty) => "The API key is empty.",
        IdentityProblem::InvalidApiKey(ApiKeyProblem::TooLong) => "The API key is too long.",
        IdentityProblem::InvalidApiKey(
            ApiKeyProblem::NotVisibleAscii | ApiKeyProblem::Repeated,
        ) => "The API key holds a character outside visible ASCII.",
        IdentityProblem::NotAnIpAddress => "The identity is not an IPv4 or IPv6 address.",
        IdentityProblem::EmptyPrincipal => "The principal is empty.",
    }
}

/// The pseudonym lookups' budget: [`PSEUDONYM_LOOKUPS`] per
/// [`PSEUDONYM_WINDOW`] for the whole listener, counted by the memory
/// provider (the same algorithms, no new code).
#[derive(Debug)]
struct LookupLimiter {
    provider: MemoryEdgeRateLimitAdapter,
    clock: Arc<dyn Clock>,
    policies: PolicySet,
    subject: SubjectDigest,
    operation: OperationDigest,
}

impl LookupLimiter {
    fn new(clock: Arc<dyn Clock>) -> Result<Self, BootstrapError> {
        let wiring = |error: &dyn std::fmt::Display| BootstrapError::Wiring {
            component: "the admin pseudonym limiter",
            reason: error.to_string(),
        };
        let algorithm = Algorithm::FixedWindow(shared_contract::FixedWindow {
            limit: PSEUDONYM_LOOKUPS,
            window: PSEUDONYM_WINDOW,
        });
        let policy = RateLimitPolicy::builder("admin-pseudonym", algorithm)
            .build()
            .map_err(|error| wiring(&error))?;
        let id = policy.id().clone();
        let provider = MemoryEdgeRateLimitAdapter::new([policy], Arc::clone(&clock))
            .map_err(|error| wiring(&error))?;
        // One budget for every caller: the token holder is one operator.
        let subject = SubjectDigest::from_tag(0, &[0; 16]).map_err(|error| wiring(&error))?;
        Ok(Self {
            provider,
            clock,
            policies: PolicySet::single(id),
            subject,
            operation: operation_digest("POST /admin/pseudonym"),
        })
    }

    /// `None` when a lookup may run now, else the 429 to answer.
    async fn admit(&self, state: &AdminState) -> Option<Response> {
        let request = RateLimitRequest {
            policies: self.policies.clone().into(),
            subject: self.subject,
            operation: self.operation,
            cost: 1,
            evaluation_id: EvaluationId::random(),
            deadline: self.clock.monotonic() + Duration::from_secs(1),
        };
        let outcome = self.provider.evaluate(request).await;
        let retry_after = match outcome {
            Ok(set) if set.allowed() => return None,
            Ok(set) => set.decisions().first().map_or(PSEUDONYM_WINDOW, |decision| {
                Duration::from_millis(decision.retry_after_ms)
            }),
            Err(
                RateLimitFailure::Unavailable { retry_after, .. }
                | RateLimitFailure::Indeterminate { retry_after },
            ) => retry_after,
            Err(RateLimitFailure::Incompatible { .. }) => PSEUDONYM_WINDOW,
        };
        let mut response = problem(
            state,
            StatusCode::TOO_MANY_REQUESTS,
            "too-many-lookups",
            &format!("At most {PSEUDONYM_LOOKUPS} pseudonym lookups per minute."),
        );
        let seconds = retry_after.as_millis().div_ceil(1000).max(1);
        if let Ok(value) = HeaderValue::from_str(&seconds.to_string()) {
            response.headers_mut().insert(header::RETRY_AFTER, value);
        }
        Some(response)
    }
}

async fn method_not_allowed(State(state): State<AdminState>) -> Response {
    problem(
        &state,
        StatusCode::METHOD_NOT_ALLOWED,
        "method-not-allowed",
        "This admin route does not take this method; see the Allow header.",
    )
}

async fn not_found(State(state): State<AdminState>) -> Response {
    problem(&state, StatusCode::NOT_FOUND, "not-found", "No admin route has this method and path.")
}

/// A port failure as HTTP: an unknown policy is 404, a budget key that
/// does not fit the policy's scope 400, a provider that could not answer
/// 503.
fn failure_response(state: &AdminState, failure: BudgetFailure) -> Response {
    let (status, detail) = match failure {
        BudgetFailure::UnknownPolicy => {
            (StatusCode::NOT_FOUND, "The provider holds no policy of this id.")
        }
        BudgetFailure::OperationRequired => (
            StatusCode::BAD_REQUEST,
            "The policy is operation-scoped: add ?operation=METHOD%20/route.",
        ),
        BudgetFailure::OperationNotApplicable => {
            (StatusCode::BAD_REQUEST, "The policy is subject-scoped: its budget has no operation.")
        }
        BudgetFailure::StateIncompatible => (
            StatusCode::SERVICE_UNAVAILABLE,
            "The stored state cannot be read as this policy's; a reset clears it.",
        ),
        BudgetFailure::Unavailable => {
            (StatusCode::SERVICE_UNAVAILABLE, "The rate limit store could not be reached.")
        }
        BudgetFailure::Indeterminate => (
            StatusCode::SERVICE_UNAVAILABLE,
            "The rate limit store did not answer in time; a reset may have happened (asking again is safe).",
        ),
    };
    problem(state, status, failure.name(), detail)
}

/// A problem+json response of `type` `<problem-type-base>admin/<category>`.
fn problem(state: &AdminState, status: StatusCode, category: &str, detail: &str) -> Response {
    let mut problem = ProblemDetails::from_status_code(status).with_detail(detail);
    problem.r#type = format!("{}admin/{category}", state.source.problem_type_base())
        .parse::<Uri>()
        .ok()
        .map(Into::into);
    problem.into_response()
}
