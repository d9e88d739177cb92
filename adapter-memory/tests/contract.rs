//! Runs the provider-neutral contract suite against the memory provider.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use adapter_memory::{MemoryEdgeRateLimitAdapter, MemoryStore};
use async_trait::async_trait;
use contract_tests::{ProviderFactory, StoreScope};
use shared_contract::{EdgeRateLimitPort, ManualClock, RateLimitPolicy};

/// Maps each scope to one store, so providers built over the same scope
/// share counters and a new scope starts empty.
#[derive(Default)]
struct MemoryFactory {
    stores: Mutex<HashMap<String, MemoryStore>>,
}

#[async_trait]
impl ProviderFactory for MemoryFactory {
    async fn build(
        &self,
        scope: &StoreScope,
        clock: ManualClock,
        policies: Vec<RateLimitPolicy>,
    ) -> Arc<dyn EdgeRateLimitPort> {
        let store = {
            let mut stores = self.stores.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            stores.entry(scope.as_str().to_owned()).or_default().clone()
        };
        match MemoryEdgeRateLimitAdapter::with_store(store, policies, Arc::new(clock)) {
            Ok(adapter) => Arc::new(adapter),
            Err(error) => panic!("the memory adapter rejected the check's policies: {error}"),
        }
    }
}

contract_tests::contract_suite!(MemoryFactory::default());
