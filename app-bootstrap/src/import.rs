//! `ca-skeleton import`: another rate limiter's configuration turned into
//! this service's TOML, printed for an operator to review and keep.

pub mod envoy_ratelimit;
