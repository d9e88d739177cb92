//! The provider-neutral contract suite for `EdgeRateLimitPort` providers.
//!
//! Every check is a `pub async fn(&dyn ProviderFactory)` that builds a
//! provider over a fresh [`StoreScope`] with a [`shared_contract::ManualClock`]
//! at `T0 = 1_800_000_000_000`, drives it, and panics on the first answer
//! that differs from docs/algorithms.md. A provider runs all of them with one
//! line in its own `tests/`: `contract_tests::contract_suite!(factory)`.
//! Expected numbers are worked out by hand from the spec, next to each check.
//!
//! ```text
//! // tests/contract.rs of a provider crate
//! struct MyFactory { /* e.g. one store per StoreScope */ }
//!
//! #[async_trait::async_trait]
//! impl contract_tests::ProviderFactory for MyFactory {
//!     async fn build(&self, scope: &StoreScope, clock: ManualClock,
//!                    policies: Vec<RateLimitPolicy>) -> Arc<dyn EdgeRateLimitPort> {
//!         // same scope -> same store; a new scope -> an empty one
//!     }
//! }
//!
//! contract_tests::contract_suite!(MyFactory::new());
//! ```
//!
//! `tests/example_provider.rs` is a whole provider over a compare-and-set
//! store that passes the suite this way (docs/adding-a-provider.md).
//! A new check is a `pub async fn` in a module of `src/checks/` plus one line
//! on the list in `src/suite.rs`; a test fails for a check left off it.
//!
//! This crate depends on `shared-contract` only: it must never import a
//! provider (adapter-memory, adapter-redis), adapter-web, app-bootstrap, or
//! an async runtime (tokio comes from the caller's dev-dependencies).

#![forbid(unsafe_code)]

pub mod checks;
mod factory;
mod rig;
mod scope;
mod suite;

// Every check also answers at the crate root (`contract_tests::<check>`), so
// a provider can run one check alone; a glob per module, not a list per fn.
pub use checks::{
    admin::*, clock_regression::*, concurrency::*, evaluation_dedup::*, fixed_window::*,
    invariants::*, isolation::*, lifetime::*, policy_sets::*, rejection::*, settle::*,
    sliding_counter::*, token_bucket::*,
};
pub use factory::ProviderFactory;
pub use scope::{MAX_SCOPE_LEN, StoreScope};
pub use suite::CHECK_NAMES;
