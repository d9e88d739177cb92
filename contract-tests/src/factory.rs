//! `ProviderFactory`: how the suite gets a provider to check.

use std::sync::Arc;

use async_trait::async_trait;
use shared_contract::{EdgeRateLimitPort, ManualClock, RateLimitPolicy};

use crate::scope::StoreScope;

/// Builds the provider under test. A provider crate implements this once in
/// its `tests/` and hands it to [`crate::contract_suite!`].
#[async_trait]
pub trait ProviderFactory: Send + Sync {
    /// Builds a provider holding `policies`, reading time from `clock`, over
    /// the store `scope`. Two builds with the same scope MUST share state (a
    /// check rebuilds a provider to change the policies it holds); a scope
    /// never used before MUST be empty. Building is part of the test set-up,
    /// so a factory may panic when it cannot build.
    async fn build(
        &self,
        scope: &StoreScope,
        clock: ManualClock,
        policies: Vec<RateLimitPolicy>,
    ) -> Arc<dyn EdgeRateLimitPort>;
}

// Lets a caller share one factory (one server, one connection pool) as an Arc.
#[async_trait]
impl<F: ProviderFactory + ?Sized> ProviderFactory for Arc<F> {
    async fn build(
        &self,
        scope: &StoreScope,
        clock: ManualClock,
        policies: Vec<RateLimitPolicy>,
    ) -> Arc<dyn EdgeRateLimitPort> {
        (**self).build(scope, clock, policies).await
    }
}
