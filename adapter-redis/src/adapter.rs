//! `RedisEdgeRateLimitAdapter`: the port on top of the scripts and the
//! gateway, with the failure mapping of docs/operations.md#what-each-redis-failure-becomes.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use secrecy::ExposeSecret;
use shared_contract::{
    Arguments, BudgetFailure, BudgetKey, BudgetState, Clock, EdgeRateLimitPort, Evaluation,
    EvaluationDedupPolicy, IncompatibleCategory, Lease, MAX_POLICY_SET, PolicyId, PolicyMode,
    RateLimitDecision, RateLimitFailure, RateLimitOutcome, RateLimitPolicy, RateLimitRequest,
    Releasing, SetDecision, SetEntries, Settlement, Settling, SubjectDigest, UnavailableCategory,
    millis,
};
use tokio::sync::{Semaphore, TryAcquireError};
use tokio::time::Instant;
use tracing::Instrument;

use crate::acknowledge;
use crate::deny_cache::DenyCache;
use crate::error::RedisAdapterError;
use crate::gateway::{
    ClusterGateway, GatewayFailure, RedisGateway, SentinelGateway, StandaloneGateway, WaitFor,
};
use crate::keys::RateLimitKeys;
use crate::reply::SetReply;
use crate::scripts::{RateLimitScripts, ScriptKind};
use crate::settings::{RedisSettings, Topology};

/// The Redis provider of [`EdgeRateLimitPort`]. A handle: its clones share
/// one provider, so an evaluation that waits for Redis owns one
/// ([`shared_contract::PortAnswer::pending`] takes only what it owns).
#[derive(Clone)]
pub struct RedisEdgeRateLimitAdapter(Arc<Provider>);

/// What a [`RedisEdgeRateLimitAdapter`] handle shares; its methods reach
/// these fields through `Deref`.
pub struct Provider {
    policies: HashMap<PolicyId, PolicyEntry>,
    keys: RateLimitKeys,
    scripts: RateLimitScripts,
    gateway: Arc<dyn RedisGateway>,
    lane: Arc<Semaphore>,
    clock: Arc<dyn Clock>,
    command_timeout: Duration,
    failure_retry_after: Duration,
    /// `WAIT` after every script, when `wait-replicas` > 0.
    wait: Option<WaitFor>,
    /// `None` when `deny-cache.enabled` is false.
    deny_cache: Option<DenyCache>,
}

impl fmt::Debug for RedisEdgeRateLimitAdapter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl fmt::Debug for Provider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisEdgeRateLimitAdapter")
            .field("policies", &self.policies.keys().collect::<Vec<_>>())
            .field("keys", &self.keys)
            .field("gateway", &self.gateway)
            .field("lane_available", &self.lane.available_permits())
            .field("command_timeout", &self.command_timeout)
            .field("wait", &self.wait)
            .field("deny_cache", &self.deny_cache)
            .finish_non_exhaustive()
    }
}

impl std::ops::Deref for RedisEdgeRateLimitAdapter {
    type Target = Provider;

    fn deref(&self) -> &Provider {
        &self.0
    }
}

/// A policy with the script arguments it always sends.
#[derive(Debug)]
struct PolicyEntry {
    policy: RateLimitPolicy,
    /// The script of a set of this policy alone.
    script: ScriptKind,
    dedup_enabled: bool,
    /// A concurrency policy: an admitted request holds a lease in its key.
    holds_leases: bool,
    /// The head of the policy's ARGV block, built once (layout at the top
    /// of `lua/policy-set.lua`): kind, regression bound, TTL slack, dedupe
    /// TTL, record capacity; the algorithm's arguments follow at each call.
    block: Vec<Arc<[u8]>>,
    /// The algorithm's arguments as computed when the entry was built, and
    /// their text: sent as they are while a call's arguments equal them
    /// (always, for an algorithm whose arguments do not move with time).
    arguments: (Arguments, Vec<Arc<[u8]>>),
}

impl PolicyEntry {
    /// Appends the algorithm's arguments at caller time `now` to `args`.
    fn push_arguments(&self, now: u64, args: &mut Vec<Arc<[u8]>>) {
        let arguments = self.policy.algorithm().arguments(now);
        let (built, text) = &self.arguments;
        if arguments == *built {
            args.extend(text.iter().cloned());
        } else {
            args.extend(arguments.as_slice().iter().map(|&n| number(n)));
        }
    }
}

/// The decimal text of `n` as a script argument, in one allocation (a
/// `String` first would be a second one, per call for time and cost).
fn number(n: u64) -> Arc<[u8]> {
    Arc::from(itoa::Buffer::new().format(n).as_bytes())
}

/// ARGV before the first policy block: caller time, cost, evaluation id.
const SET_ARGS: usize = 3;
/// The most arguments an algorithm adds to its block.
const ARGUMENTS: usize = Arguments::MAX;

impl PolicyEntry {
    fn new(policy: RateLimitPolicy) -> Self {
        let dedup = policy.evaluation_dedup();
        // The algorithm's tag byte; lower case marks a shadow policy.
        let tag = policy.algorithm().kind().tag();
        let kind = match policy.mode() {
            PolicyMode::Enforce => tag,
            PolicyMode::Shadow => tag.to_ascii_lowercase(),
        };
        let block = vec![
            Arc::from([kind]),
            number(millis(policy.maximum_clock_regression())),
            number(policy.ttl_slack_millis()),
            number(dedup.ttl_millis()),
            number(u64::from(dedup.record_capacity())),
        ];
        let dedup_enabled = match dedup {
            EvaluationDedupPolicy::Disabled => false,
            EvaluationDedupPolicy::Enabled { .. } => true,
        };
        let built = policy.algorithm().arguments(0);
        let text = built.as_slice().iter().map(|&n| number(n)).collect();
        Self {
            arguments: (built, text),
            script: ScriptKind::of(policy.algorithm()),
            dedup_enabled,
            holds_leases: policy.algorithm().holds_leases(),
            block,
            policy,
        }
    }
}

fn policy_entries(
    policies: impl IntoIterator<Item = RateLimitPolicy>,
) -> Result<HashMap<PolicyId, PolicyEntry>, RedisAdapterError> {
    let mut entries = HashMap::new();
    for policy in policies {
        let id = policy.id().clone();
        if entries.insert(id.clone(), PolicyEntry::new(policy)).is_some() {
            return Err(RedisAdapterError::DuplicatePolicy(id));
        }
    }
    Ok(entries)
}

/// The policies of one request, in the set's order.
type Resolved<'a> = SetEntries<'a, PolicyEntry>;

impl RedisEdgeRateLimitAdapter {
    /// Validates settings and picks the gateway of `settings.topology`
    /// (standalone, or Redis Cluster over the seed `urls`); connects lazily
    /// (first evaluate / is_ready), so a service can start while Redis is
    /// down and /readyz reports it; reconnects by itself after Redis
    /// restarts or a cluster fails over.
    pub fn new(
        settings: RedisSettings,
        policies: impl IntoIterator<Item = RateLimitPolicy>,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, RedisAdapterError> {
        settings.validate()?;
        let username = settings.username.as_deref();
        let password = settings.password.as_ref().map(|password| password.expose_secret());
        // WAIT mode's own connections, so a blocked WAIT holds one of them.
        let wait_connections = (settings.wait_replicas > 0).then_some(settings.wait_connections);
        let gateway: Result<Arc<dyn RedisGateway>, _> = match settings.topology {
            Topology::Standalone => StandaloneGateway::new(
                &settings.urls[0],
                username,
                password,
                settings.connect_timeout,
            )
            .map(|gateway| match wait_connections {
                Some(size) => gateway.with_wait_connections(size),
                None => gateway,
            })
            .map(|gateway| Arc::new(gateway) as Arc<dyn RedisGateway>),
            Topology::Cluster => ClusterGateway::new(
                &settings.urls,
                username,
                password,
                settings.connect_timeout,
                settings.command_timeout,
            )
            .map(|gateway| match wait_connections {
                Some(size) => gateway.with_wait_connections(size),
                None => gateway,
            })
            .map(|gateway| Arc::new(gateway) as Arc<dyn RedisGateway>),
            Topology::Sentinel => SentinelGateway::new(
                &settings.sentinels,
                &settings.master_name,
                crate::gateway::Logins {
                    username,
                    password,
                    sentinel_username: settings.sentinel_username.as_deref(),
                    sentinel_password: settings
                        .sentinel_password
                        .as_ref()
                        .map(|password| password.expose_secret()),
                },
                settings.connect_timeout,
                // Asked again as often as a command may take.
                settings.command_timeout,
            )
            .map(|gateway| match wait_connections {
                Some(size) => gateway.with_wait_connections(size),
                None => gateway,
            })
            .map(|gateway| Arc::new(gateway) as Arc<dyn RedisGateway>),
        };
        let gateway = gateway.map_err(|error| RedisAdapterError::InvalidSettings {
            field: match settings.topology {
                Topology::Standalone | Topology::Cluster => "urls",
                Topology::Sentinel => "sentinels",
            },
            // The URL may hold a password: name the problem, not the URL.
            problem: format!("not a valid redis URL ({})", error.category()),
        })?;
        Self::with_gateway(settings, policies, clock, gateway)
    }

    /// Like [`Self::new`] over a gateway of the crate's choosing (the mock
    /// of the failure-mapping tests).
    pub(crate) fn with_gateway(
        settings: RedisSettings,
        policies: impl IntoIterator<Item = RateLimitPolicy>,
        clock: Arc<dyn Clock>,
        gateway: Arc<dyn RedisGateway>,
    ) -> Result<Self, RedisAdapterError> {
        settings.validate()?;
        Ok(Self(Arc::new(Provider {
            policies: policy_entries(policies)?,
            keys: RateLimitKeys::new(settings.key_prefix),
            scripts: RateLimitScripts::new(),
            gateway,
            lane: Arc::new(Semaphore::new(settings.script_lane.max_in_flight)),
            clock,
            command_timeout: settings.command_timeout,
            failure_retry_after: settings.failure_retry_after,
            wait: (settings.wait_replicas > 0).then(|| WaitFor {
                replicas: settings.wait_replicas,
                timeout_ms: u64::try_from(settings.wait_timeout.as_millis()).unwrap_or(u64::MAX),
            }),
            deny_cache: settings.deny_cache.enabled.then(|| {
                DenyCache::new(settings.deny_cache.max_entries, settings.deny_cache.max_age)
            }),
        })))
    }

    /// This provider over another policy table (a reload): it shares this
    /// adapter's connection and script lane, so a reload neither reconnects
    /// nor lets more scripts run at once than `script-lane.max-in-flight`.
    ///
    /// # Errors
    /// [`RedisAdapterError::DuplicatePolicy`] when two policies share an id.
    pub fn with_policies(
        &self,
        policies: impl IntoIterator<Item = RateLimitPolicy>,
    ) -> Result<Self, RedisAdapterError> {
        Ok(Self(Arc::new(Provider {
            policies: policy_entries(policies)?,
            keys: self.keys.clone(),
            // A fresh digest cache: one SCRIPT LOAD per script at most.
            scripts: RateLimitScripts::new(),
            gateway: Arc::clone(&self.gateway),
            lane: Arc::clone(&self.lane),
            clock: Arc::clone(&self.clock),
            command_timeout: self.command_timeout,
            failure_retry_after: self.failure_retry_after,
            wait: self.wait,
            // Empty: a policy may have turned shadow under its revision, and
            // a cached refusal of it would still block.
            deny_cache: self.deny_cache.as_ref().map(DenyCache::emptied),
        })))
    }

    /// Forgets this instance's cached refusals of `subject`, so its next
    /// request asks Redis (after an admin reset of its budget; other
    /// instances' cached refusals run out by their retry-after or
    /// `deny-cache.max-age`, whichever is sooner). Returns
    /// how many were dropped; 0 when the cache is off.
    pub fn forget_cached_denials(&self, subject: &SubjectDigest) -> usize {
        self.deny_cache.as_ref().map_or(0, |cache| cache.forget(subject))
    }

    /// The key builder in use.
    pub fn keys(&self) -> &RateLimitKeys {
        &self.keys
    }

    fn unavailable(&self, category: UnavailableCategory) -> RateLimitOutcome {
        Err(RateLimitFailure::Unavailable { category, retry_after: self.failure_retry_after })
    }

    async fn run_script(
        &self,
        set: &Resolved<'_>,
        kind: ScriptKind,
        keys: &[String],
        args: &[Arc<[u8]>],
        deadline: Instant,
    ) -> RateLimitOutcome {
        let result = self
            .scripts
            .evaluate_then_wait(
                &*self.gateway,
                kind,
                keys,
                args,
                self.wait,
                self.command_timeout,
                deadline,
            )
            .await;
        let first = set.iter().next().map(|entry| entry.policy.id());
        let failure = match result {
            Ok(sent) => match SetReply::decode(&sent.reply, set.len()) {
                Ok(reply) => {
                    let wanted = self.wait.map_or(0, |wait| wait.replicas);
                    if let Some(short) = acknowledge::shortfall(&reply, sent.replicas, wanted) {
                        tracing::warn!(policy = ?first, ?short, "charge not acknowledged by replicas");
                        return Err(RateLimitFailure::Indeterminate {
                            retry_after: self.failure_retry_after,
                        });
                    }
                    return self.outcome_of(set, reply);
                }
                Err(error) => {
                    tracing::warn!(policy = ?first, ?error, "undecodable script reply");
                    return Err(RateLimitFailure::Indeterminate {
                        retry_after: self.failure_retry_after,
                    });
                }
            },
            Err(failure) => failure,
        };
        tracing::debug!(policy = ?first, ?failure, "rate-limit script failed");
        Err(self.failure_of(failure))
    }

    /// What a script call that failed in the gateway answers, a decision's
    /// or a settle's.
    fn failure_of(&self, failure: GatewayFailure) -> RateLimitFailure {
        match failure {
            GatewayFailure::NotSent | GatewayFailure::Refused | GatewayFailure::NoScript => {
                RateLimitFailure::Unavailable {
                    category: UnavailableCategory::UnavailableBeforeSend,
                    retry_after: self.failure_retry_after,
                }
            }
            GatewayFailure::WrongType | GatewayFailure::ScriptError => {
                RateLimitFailure::Incompatible { category: IncompatibleCategory::StateIncompatible }
            }
            // Like an undecodable script reply: the script may have run.
            GatewayFailure::TimedOut
            | GatewayFailure::ConnectionLost
            | GatewayFailure::UnexpectedReply => {
                RateLimitFailure::Indeterminate { retry_after: self.failure_retry_after }
            }
        }
    }

    fn outcome_of(&self, set: &Resolved<'_>, reply: SetReply) -> RateLimitOutcome {
        match reply {
            // The set's admission is the one its members' decisions give
            // (the script's verdict by the same rule; `SetReply::decode`
            // checked there is one decision per member).
            SetReply::Decided { answers, len, .. } => {
                let members = set.iter().zip(&answers[..len]).map(|(entry, answer)| {
                    let retry_after_ms =
                        if answer.allowed { 0 } else { answer.retry_after_ms.max(1) };
                    let decision = RateLimitDecision {
                        allowed: answer.allowed,
                        remaining: answer.remaining,
                        retry_after_ms,
                        reset_after_ms: answer.reset_after_ms,
                        replayed: answer.replayed,
                    };
                    (entry.policy.mode(), decision)
                });
                Ok(SetDecision::of_members(members))
            }
            SetReply::ClockUnsafe { retry_after_ms } => Err(RateLimitFailure::Unavailable {
                category: UnavailableCategory::ClockUnsafe,
                retry_after: Duration::from_millis(retry_after_ms.max(1)),
            }),
            SetReply::Corrupt => Err(RateLimitFailure::Incompatible {
                category: IncompatibleCategory::StateIncompatible,
            }),
        }
    }
}

/// The outcome of a retry of an indeterminate first attempt: only a
/// decision settles it. A retry that never ran (say, the master died and
/// its replica is not promoted yet) proves nothing about the first
/// attempt, which may have charged.
fn retried_or(retried: RateLimitOutcome, first: RateLimitOutcome) -> RateLimitOutcome {
    match retried {
        decided @ Ok(_) => decided,
        Err(_) => first,
    }
}

/// The `redis.script` span of one evaluation's script call (its retry
/// included), a child of the decision span; `None` when the call runs in
/// no span (traces are off). Its attributes are the script, the key count,
/// the attempts and the time taken (integers are signed: the OpenTelemetry
/// layer turns an unsigned value into text), never a key: a key holds the subject's
/// pseudonym, which the parent span carries already.
fn script_span(kind: ScriptKind, keys: usize) -> Option<tracing::Span> {
    // `is_known` would be true for "no span" too: the id says there is one.
    let traced =
        tracing::dispatcher::get_default(|dispatch| dispatch.current_span().id().is_some());
    traced.then(|| {
        tracing::info_span!(
            "redis.script",
            otel.kind = "client",
            db.system.name = "redis",
            redis.script = kind.name(),
            redis.keys = i64::try_from(keys).unwrap_or(i64::MAX),
            redis.attempts = tracing::field::Empty,
            redis.duration_us = tracing::field::Empty,
        )
    })
}

/// Signed, as every integer attribute: the OpenTelemetry layer turns an
/// unsigned value into text.
fn micros(elapsed: Duration) -> i64 {
    i64::try_from(elapsed.as_micros()).unwrap_or(i64::MAX)
}

/// The set's policies, inline, for the denial cache's key.
fn cache_key_policies<'a>(set: &Resolved<'a>) -> [Option<&'a RateLimitPolicy>; MAX_POLICY_SET] {
    let mut policies = [None; MAX_POLICY_SET];
    for (slot, entry) in policies.iter_mut().zip(set.iter()) {
        *slot = Some(&entry.policy);
    }
    policies
}

impl RedisEdgeRateLimitAdapter {
    /// The denial cache, for a set it may answer: only sets whose refusals
    /// stay refusals are ever cached (deny_cache.rs says why); the others
    /// skip the cache's hashing altogether.
    fn deny_cache_for(&self, set: &Resolved<'_>) -> Option<&DenyCache> {
        self.deny_cache
            .as_ref()
            .filter(|_| set.iter().all(|entry| entry.policy.algorithm().refusal_stays()))
    }

    /// The answer needing no round trip, if there is one: a set this
    /// provider cannot evaluate, a deadline already passed, or a refusal
    /// the denial cache holds.
    fn answer_at_once(&self, request: &RateLimitRequest) -> Option<RateLimitOutcome> {
        let set = match request.resolve(|id| self.policies.get(id), |entry| &entry.policy) {
            Ok(set) => set,
            Err(refused) => return Some(Err(refused)),
        };
        if request.deadline <= self.clock.monotonic() {
            return Some(self.unavailable(UnavailableCategory::AdmissionRejected));
        }
        let cache = self.deny_cache_for(&set)?;
        let policies = cache_key_policies(&set);
        let now = self.clock.epoch_millis();
        let refused = cache.lookup(request, policies.iter().flatten().copied(), now)?;
        Some(Ok(refused))
    }

    /// The evaluation by a script, once [`Self::answer_at_once`] found no
    /// answer.
    async fn evaluate_in_redis(&self, request: RateLimitRequest<'static>) -> RateLimitOutcome {
        let set = request.resolve(|id| self.policies.get(id), |entry| &entry.policy)?;
        // The deadline is on the injected clock; from here on count the time
        // left on tokio's clock, which timers understand.
        let left = request.deadline.saturating_duration_since(self.clock.monotonic());
        if left.is_zero() {
            return self.unavailable(UnavailableCategory::AdmissionRejected);
        }
        let policies = cache_key_policies(&set);
        let policies = policies.iter().flatten().copied();
        let deny_cache = self.deny_cache_for(&set);
        let deadline = Instant::now() + left;
        // A free permit is taken without a timer; only a full lane waits,
        // and never past the deadline.
        let _permit = match self.lane.try_acquire() {
            Ok(permit) => permit,
            Err(TryAcquireError::NoPermits | TryAcquireError::Closed) => {
                let Ok(Ok(permit)) = tokio::time::timeout_at(deadline, self.lane.acquire()).await
                else {
                    return self.unavailable(UnavailableCategory::AdmissionRejected);
                };
                permit
            }
        };
        // A retry with the same evaluation id is safe when it replays what
        // the first attempt did: a dedupe record, or a lease (a live lease
        // of this id replays the whole set, docs/algorithms.md), which an
        // admitted set surely took under an enforced concurrency policy (a
        // shadow one that refused took none).
        let replays = set.iter().any(|entry| {
            entry.dedup_enabled
                || (entry.holds_leases && entry.policy.mode() == PolicyMode::Enforce)
        });
        // The counter keys in the set's order (the KEYS layout of
        // `lua/policy-set.lua`); a key with dedupe on holds its records.
        let keys: Vec<String> = set
            .iter()
            .map(|entry| self.keys.counter_key(&entry.policy, &request.subject, &request.operation))
            .collect();
        let now_millis = self.clock.epoch_millis();
        let now = number(now_millis);
        let cost = number(request.cost);
        let id: Arc<[u8]> = Arc::from(&request.evaluation_id.as_bytes()[..]);
        let mut args = Vec::with_capacity(
            SET_ARGS + set.iter().map(|entry| entry.block.len() + ARGUMENTS).sum::<usize>(),
        );
        args.extend([now, cost, id]);
        for entry in set.iter() {
            args.extend(entry.block.iter().cloned());
            // The algorithm's own arguments, at this call's time: a window
            // may move with it.
            entry.push_arguments(now_millis, &mut args);
        }
        let kind = match set.iter().next() {
            Some(only) if set.len() == 1 => only.script,
            Some(_) | None => ScriptKind::PolicySet,
        };
        let span = script_span(kind, keys.len());
        // The clock is read only for a traced call.
        let started = span.as_ref().map(|_| std::time::Instant::now());
        let script = async {
            let outcome = self.run_script(&set, kind, &keys, &args, deadline).await;
            let outcome = match outcome {
                // The same evaluation id replays a charge that did happen, so one
                // retry turns an ambiguous failure into a definite answer.
                // With WAIT on, a retry could only replay the charge, and a
                // replay cannot be acknowledged (see `acknowledge`).
                Err(RateLimitFailure::Indeterminate { .. })
                    if replays && self.wait.is_none() && Instant::now() < deadline =>
                {
                    let retried = self.run_script(&set, kind, &keys, &args, deadline).await;
                    return (retried_or(retried, outcome), 2);
                }
                Ok(_) | Err(_) => outcome,
            };
            (outcome, 1_u32)
        };
        let (outcome, attempts) = match &span {
            Some(span) => script.instrument(span.clone()).await,
            None => script.await,
        };
        if let Some((span, started)) = span.zip(started) {
            span.record("redis.attempts", i64::from(attempts));
            span.record("redis.duration_us", micros(started.elapsed()));
        }
        if let Some(cache) = deny_cache {
            cache.learn(&request, policies, now_millis, &outcome);
        }
        outcome
    }
}

#[async_trait]
impl EdgeRateLimitPort for RedisEdgeRateLimitAdapter {
    /// At once when no round trip is needed ([`Self::answer_at_once`]);
    /// else a script call, owning a handle of this provider.
    fn evaluate(&self, request: RateLimitRequest) -> Evaluation {
        if let Some(outcome) = self.answer_at_once(&request) {
            return Evaluation::ready(outcome);
        }
        let (provider, request) = (self.clone(), request.into_owned());
        Evaluation::pending(async move { provider.evaluate_in_redis(request).await })
    }

    fn policy(&self, id: &PolicyId) -> Option<&RateLimitPolicy> {
        self.policies.get(id).map(|entry| &entry.policy)
    }

    async fn is_ready(&self) -> bool {
        self.gateway.ping(self.command_timeout).await.is_ok()
    }

    async fn inspect(&self, key: &BudgetKey) -> Result<BudgetState, BudgetFailure> {
        self.inspect_budget(key).await
    }

    async fn reset(&self, key: &BudgetKey) -> Result<(), BudgetFailure> {
        let reset = self.reset_budget(key).await;
        // After the DEL, not before: a refusal learned in between would
        // outlive the reset. Forgetting is safe whatever the reset did (the
        // next request only asks Redis).
        self.forget_cached_denials(&key.subject);
        reset
    }

    fn release(&self, lease: &Lease) -> Releasing {
        let (provider, lease) = (self.clone(), lease.clone());
        Releasing::pending(async move { provider.release_lease(&lease).await })
    }

    /// At once when no round trip is needed ([`Self::settle_at_once`]);
    /// else a script call, owning a handle of this provider.
    fn settle(&self, settlement: Settlement<'_>) -> Settling {
        if let Some(outcome) = self.settle_at_once(&settlement) {
            return Settling::ready(outcome);
        }
        let (provider, settlement) = (self.clone(), settlement.into_owned());
        Settling::pending(async move { provider.settle_in_redis(settlement).await })
    }
}

mod budget;
mod release;
mod settle;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod wait_tests;
