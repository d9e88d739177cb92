//! `app-bootstrap`: the composition root of the workspace. It reads the
//! configuration (figment: built-in defaults, a TOML file, `CA_SKELETON_*`
//! variables), switches the rate-limit capability between the providers,
//! wires the HTTP edge, and holds the `ca-skeleton` binary (`serve`,
//! `check-config`, `redis-acl`, `bench`).
//!
//! It is the only crate that knows every provider; nothing imports it.
//! Library code returns [`BootstrapError`]; `anyhow` stays in `main`.

#![forbid(unsafe_code)]

pub mod acl;
pub mod admin;
pub mod bench;
pub mod capability;
pub mod cli;
pub mod config;
pub mod degraded;
mod error;
mod listener;
pub mod reload;
pub mod routes;
pub mod server;
pub mod telemetry;

pub use capability::RateLimitCapability;
pub use config::{AppConfig, ConfigSources};
pub use error::BootstrapError;
pub use reload::{ReloadReport, Reloader};
pub use server::Application;
