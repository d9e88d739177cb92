//! The checks, one module per rule family. Each check is a `pub async fn`
//! taking a [`crate::ProviderFactory`] and panicking on the first answer
//! that differs from docs/algorithms.md. A check runs in every provider's
//! suite once it is on the list in `suite.rs`; a test there fails for a
//! check left off it.

pub mod admin;
pub mod calendar_window;
pub mod clock_regression;
pub mod concurrency;
pub mod evaluation_dedup;
pub mod fixed_window;
pub mod gcra;
pub mod invariants;
pub mod isolation;
pub mod leases;
pub mod lifetime;
pub mod policy_sets;
pub mod rejection;
pub mod settle;
pub mod sliding_counter;
pub mod token_bucket;
