//! `TransportBridge`: from an HTTP request to a pseudonymous
//! `RateLimitRequest` and the port's answer.

use std::sync::Arc;
use std::time::Instant;

use http::request::Parts;
use shared_contract::{
    Clock, EdgeRateLimitPort, EvaluationId, PolicyId, RateLimitOutcome, RateLimitPolicy,
    RateLimitRequest,
};

use crate::operation::operation_id;
use crate::pseudonymizer::VersionedPseudonymizer;
use crate::rejection::EdgeRejection;
use crate::settings::EdgeSettings;
use crate::subject::resolve_subject;
use crate::telemetry;

/// What the bridge learned about one request: the policy it ran under and
/// the port's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BridgeEvaluation {
    /// The policy the operation maps to.
    pub policy_id: PolicyId,
    /// That policy as the port holds it (for the `RateLimit-Policy` header);
    /// `None` when the port does not know it (the outcome then says
    /// `UnknownPolicy`).
    pub policy: Option<RateLimitPolicy>,
    /// The port's answer.
    pub outcome: RateLimitOutcome,
}

/// Resolves, pseudonymizes and asks the port, one request at a time.
#[derive(Debug)]
pub struct TransportBridge {
    port: Arc<dyn EdgeRateLimitPort>,
    pseudonymizer: Arc<VersionedPseudonymizer>,
    clock: Arc<dyn Clock>,
    settings: EdgeSettings,
}

impl TransportBridge {
    /// A bridge over `port`. Check `settings` with
    /// [`EdgeSettings::validate`] first.
    pub fn new(
        port: Arc<dyn EdgeRateLimitPort>,
        pseudonymizer: Arc<VersionedPseudonymizer>,
        clock: Arc<dyn Clock>,
        settings: EdgeSettings,
    ) -> Self {
        Self { port, pseudonymizer, clock, settings }
    }

    /// The settings the bridge runs with.
    pub fn settings(&self) -> &EdgeSettings {
        &self.settings
    }

    /// Evaluates one request with cost 1.
    ///
    /// The subject comes from the request parts ([`crate::AuthenticatedPrincipal`]
    /// extension, then the API key header, then `ConnectInfo<SocketAddr>`
    /// and trusted forwarding headers); the operation is the method plus
    /// axum's `MatchedPath`. Only the HMAC pseudonym crosses the port. The
    /// evaluation id is fresh and server-made: no client header, not even
    /// `Idempotency-Key`, reaches it. `deadline = clock.monotonic() +
    /// evaluation_budget`.
    pub async fn evaluate(&self, parts: &Parts) -> Result<BridgeEvaluation, EdgeRejection> {
        let operation = operation_id(parts);
        let policy_id = self
            .settings
            .operations
            .get(&operation)
            .unwrap_or(&self.settings.default_policy)
            .clone();
        let subject = match resolve_subject(parts, &self.settings) {
            Ok(subject) => subject,
            Err(rejection) => {
                let policy = self.port.policy(&policy_id);
                telemetry::record_rejection(&policy_id, policy, rejection.outcome_label());
                tracing::debug!(
                    operation, policy = %policy_id, reason = rejection.category_name(),
                    "request refused before rate-limit evaluation"
                );
                return Err(rejection);
            }
        };
        let digest = self.pseudonymizer.pseudonymize(subject.kind, &subject.identity, &operation);
        let now = self.clock.monotonic();
        // A budget too large for `Instant` can only be a configuration slip;
        // the present as deadline fails closed (AdmissionRejected).
        let deadline = now.checked_add(self.settings.evaluation_budget).unwrap_or(now);
        let request = RateLimitRequest {
            policy_id: policy_id.clone(),
            subject: digest,
            cost: 1,
            evaluation_id: EvaluationId::random(),
            deadline,
        };
        // Wall time for the histogram only; decisions use the injected clock.
        let started = Instant::now();
        let outcome = self.port.evaluate(request).await;
        let elapsed = started.elapsed();
        let policy = self.port.policy(&policy_id).cloned();
        telemetry::record_evaluation(&policy_id, policy.as_ref(), &outcome, elapsed);
        log_outcome(&operation, &policy_id, &outcome);
        Ok(BridgeEvaluation { policy_id, policy, outcome })
    }
}

fn log_outcome(operation: &str, policy_id: &PolicyId, outcome: &RateLimitOutcome) {
    let category = outcome.category_name();
    match outcome {
        RateLimitOutcome::Evaluated(_) => {
            tracing::trace!(operation, policy = %policy_id, outcome = category, "rate-limit decision");
        }
        RateLimitOutcome::Unavailable { .. }
        | RateLimitOutcome::Incompatible { .. }
        | RateLimitOutcome::Indeterminate { .. } => {
            tracing::warn!(operation, policy = %policy_id, outcome = category, "rate limit failed closed");
        }
    }
}

#[cfg(test)]
mod tests;
