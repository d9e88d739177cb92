//! The checks, one module per rule family. Each check is a `pub async fn`
//! taking a [`crate::ProviderFactory`] and panicking on the first answer
//! that differs from docs/algorithms.md.

pub(crate) mod clock_regression;
pub(crate) mod concurrency;
pub(crate) mod evaluation_dedup;
pub(crate) mod fixed_window;
pub(crate) mod invariants;
pub(crate) mod isolation;
pub(crate) mod lifetime;
pub(crate) mod rejection;
pub(crate) mod sliding_counter;
pub(crate) mod token_bucket;
