//! `RedisEdgeRateLimitAdapter`: the port on top of the scripts and the
//! gateway, with the failure mapping of DESIGN section 3.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use secrecy::ExposeSecret;
use shared_contract::{
    Algorithm, Certainty, Clock, EdgeRateLimitPort, EvaluationDedupPolicy, EvaluationId,
    IncompatibleCategory, PolicyId, RateLimitDecision, RateLimitOutcome, RateLimitPolicy,
    RateLimitRequest, UnavailableCategory, millis,
};
use tokio::sync::Semaphore;
use tokio::time::Instant;

use crate::error::RedisAdapterError;
use crate::gateway::{ClusterGateway, GatewayFailure, RedisGateway, StandaloneGateway};
use crate::keys::RateLimitKeys;
use crate::reply::{ReplyStatus, ScriptReply};
use crate::scripts::{RateLimitScripts, ScriptKind};
use crate::settings::{RedisSettings, Topology};

/// The Redis provider of [`EdgeRateLimitPort`].
pub struct RedisEdgeRateLimitAdapter {
    policies: HashMap<PolicyId, PolicyEntry>,
    keys: RateLimitKeys,
    scripts: RateLimitScripts,
    gateway: Arc<dyn RedisGateway>,
    lane: Semaphore,
    clock: Arc<dyn Clock>,
    command_timeout: Duration,
    failure_retry_after: Duration,
}

impl fmt::Debug for RedisEdgeRateLimitAdapter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisEdgeRateLimitAdapter")
            .field("policies", &self.policies.keys().collect::<Vec<_>>())
            .field("keys", &self.keys)
            .field("gateway", &self.gateway)
            .field("lane_available", &self.lane.available_permits())
            .field("command_timeout", &self.command_timeout)
            .finish_non_exhaustive()
    }
}

/// A policy with the script and the script arguments it always sends.
#[derive(Debug)]
struct PolicyEntry {
    policy: RateLimitPolicy,
    script: ScriptKind,
    certainty: Certainty,
    dedup_enabled: bool,
    /// ARGV 3 to 6: regression bound, TTL slack, dedupe TTL, record capacity.
    bounds: [Vec<u8>; 4],
    /// ARGV 8 onwards: the algorithm's parameters.
    parameters: Vec<Vec<u8>>,
}

fn number(n: u64) -> Vec<u8> {
    n.to_string().into_bytes()
}

impl PolicyEntry {
    fn new(policy: RateLimitPolicy) -> Self {
        let dedup = policy.evaluation_dedup();
        let parameters = match *policy.algorithm() {
            Algorithm::FixedWindow { limit, window }
            | Algorithm::SlidingCounter { limit, window } => {
                vec![number(limit), number(millis(window))]
            }
            Algorithm::TokenBucket { capacity, refill_tokens, refill_period } => {
                vec![number(capacity), number(refill_tokens), number(millis(refill_period))]
            }
        };
        let certainty = policy.algorithm().certainty();
        let dedup_enabled = match dedup {
            EvaluationDedupPolicy::Disabled => false,
            EvaluationDedupPolicy::Enabled { .. } => true,
        };
        Self {
            script: ScriptKind::of(policy.algorithm()),
            certainty,
            dedup_enabled,
            bounds: [
                number(millis(policy.maximum_clock_regression())),
                number(policy.ttl_slack_millis()),
                number(dedup.ttl_millis()),
                number(u64::from(dedup.record_capacity())),
            ],
            parameters,
            policy,
        }
    }

    /// The full ARGV of one evaluation (layout in the scripts' prelude).
    fn args(&self, now_millis: u64, cost: u64, evaluation_id: &EvaluationId) -> Vec<Vec<u8>> {
        let mut args = Vec::with_capacity(7 + self.parameters.len());
        args.push(number(now_millis));
        args.push(number(cost));
        args.extend(self.bounds.iter().cloned());
        args.push(evaluation_id.as_bytes().to_vec());
        args.extend(self.parameters.iter().cloned());
        args
    }
}

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
        let gateway: Result<Arc<dyn RedisGateway>, _> = match settings.topology {
            Topology::Standalone => StandaloneGateway::new(
                &settings.urls[0],
                username,
                password,
                settings.connect_timeout,
            )
            .map(|gateway| Arc::new(gateway) as Arc<dyn RedisGateway>),
            Topology::Cluster => ClusterGateway::new(
                &settings.urls,
                username,
                password,
                settings.connect_timeout,
                settings.command_timeout,
            )
            .map(|gateway| Arc::new(gateway) as Arc<dyn RedisGateway>),
        };
        let gateway = gateway.map_err(|error| RedisAdapterError::InvalidSettings {
            field: "urls",
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
        let mut entries = HashMap::new();
        for policy in policies {
            let id = policy.id().clone();
            if entries.insert(id.clone(), PolicyEntry::new(policy)).is_some() {
                return Err(RedisAdapterError::DuplicatePolicy(id));
            }
        }
        Ok(Self {
            policies: entries,
            keys: RateLimitKeys::new(settings.key_prefix),
            scripts: RateLimitScripts::new(),
            gateway,
            lane: Semaphore::new(settings.script_lane_max_in_flight),
            clock,
            command_timeout: settings.command_timeout,
            failure_retry_after: settings.failure_retry_after,
        })
    }

    /// The key builder in use.
    pub fn keys(&self) -> &RateLimitKeys {
        &self.keys
    }

    fn unavailable(&self, category: UnavailableCategory) -> RateLimitOutcome {
        RateLimitOutcome::Unavailable { category, retry_after: self.failure_retry_after }
    }

    async fn run_script(
        &self,
        entry: &PolicyEntry,
        key: &str,
        args: &[Vec<u8>],
        deadline: Instant,
    ) -> RateLimitOutcome {
        let result = self
            .scripts
            .evaluate(&*self.gateway, entry.script, key, args, self.command_timeout, deadline)
            .await;
        let failure = match result {
            Ok(value) => match ScriptReply::decode(&value) {
                Ok(reply) => return self.outcome_of(entry, reply),
                Err(error) => {
                    tracing::warn!(policy = %entry.policy.id(), ?error, "undecodable script reply");
                    return RateLimitOutcome::Indeterminate {
                        retry_after: self.failure_retry_after,
                    };
                }
            },
            Err(failure) => failure,
        };
        tracing::debug!(policy = %entry.policy.id(), ?failure, "rate-limit script failed");
        match failure {
            GatewayFailure::NotSent | GatewayFailure::Refused | GatewayFailure::NoScript => {
                self.unavailable(UnavailableCategory::UnavailableBeforeSend)
            }
            GatewayFailure::WrongType | GatewayFailure::ScriptError => {
                RateLimitOutcome::Incompatible { category: IncompatibleCategory::StateIncompatible }
            }
            // Like an undecodable script reply: the script may have run.
            GatewayFailure::TimedOut
            | GatewayFailure::ConnectionLost
            | GatewayFailure::UnexpectedReply => {
                RateLimitOutcome::Indeterminate { retry_after: self.failure_retry_after }
            }
        }
    }

    fn outcome_of(&self, entry: &PolicyEntry, reply: ScriptReply) -> RateLimitOutcome {
        let decision = |allowed: bool, retry_after: Duration| {
            RateLimitOutcome::Evaluated(RateLimitDecision {
                allowed,
                limit: entry.policy.limit(),
                remaining: reply.remaining,
                retry_after,
                reset_after: Duration::from_millis(reply.reset_after_ms),
                certainty: entry.certainty,
                replayed: reply.replayed,
            })
        };
        match reply.status {
            ReplyStatus::Allowed => decision(true, Duration::ZERO),
            ReplyStatus::Denied => {
                decision(false, Duration::from_millis(reply.retry_after_ms.max(1)))
            }
            ReplyStatus::ClockUnsafe => RateLimitOutcome::Unavailable {
                category: UnavailableCategory::ClockUnsafe,
                retry_after: Duration::from_millis(reply.retry_after_ms.max(1)),
            },
            ReplyStatus::Corrupt => {
                RateLimitOutcome::Incompatible { category: IncompatibleCategory::StateIncompatible }
            }
        }
    }
}

#[async_trait]
impl EdgeRateLimitPort for RedisEdgeRateLimitAdapter {
    async fn evaluate(&self, request: RateLimitRequest) -> RateLimitOutcome {
        let Some(entry) = self.policies.get(&request.policy_id) else {
            return RateLimitOutcome::Incompatible {
                category: IncompatibleCategory::UnknownPolicy,
            };
        };
        if request.cost == 0 || request.cost > entry.policy.maximum_cost() {
            return RateLimitOutcome::Incompatible {
                category: IncompatibleCategory::CostExceedsMaximum,
            };
        }
        // The deadline is on the injected clock; from here on count the time
        // left on tokio's clock, which timers understand.
        let left = request.deadline.saturating_duration_since(self.clock.monotonic());
        if left.is_zero() {
            return self.unavailable(UnavailableCategory::AdmissionRejected);
        }
        let deadline = Instant::now() + left;
        let Ok(Ok(_permit)) = tokio::time::timeout_at(deadline, self.lane.acquire()).await else {
            return self.unavailable(UnavailableCategory::AdmissionRejected);
        };
        let key = self.keys.counter_key(&entry.policy, &request.subject);
        let args = entry.args(self.clock.epoch_millis(), request.cost, &request.evaluation_id);
        let outcome = self.run_script(entry, &key, &args, deadline).await;
        match outcome {
            // The same evaluation id replays a charge that did happen, so one
            // retry turns an ambiguous failure into a definite answer.
            RateLimitOutcome::Indeterminate { .. }
                if entry.dedup_enabled && Instant::now() < deadline =>
            {
                match self.run_script(entry, &key, &args, deadline).await {
                    decided @ RateLimitOutcome::Evaluated(_) => decided,
                    // Only a decision settles it: a retry that never ran (say,
                    // the master died and its replica is not promoted yet)
                    // proves nothing about the first attempt, which may have
                    // charged.
                    RateLimitOutcome::Unavailable { .. }
                    | RateLimitOutcome::Incompatible { .. }
                    | RateLimitOutcome::Indeterminate { .. } => outcome,
                }
            }
            RateLimitOutcome::Evaluated(_)
            | RateLimitOutcome::Unavailable { .. }
            | RateLimitOutcome::Incompatible { .. }
            | RateLimitOutcome::Indeterminate { .. } => outcome,
        }
    }

    fn policy(&self, id: &PolicyId) -> Option<&RateLimitPolicy> {
        self.policies.get(id).map(|entry| &entry.policy)
    }

    async fn is_ready(&self) -> bool {
        self.gateway.ping(self.command_timeout).await.is_ok()
    }
}

#[cfg(test)]
mod tests;
