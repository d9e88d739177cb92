//! The one error type of this crate.

use std::net::SocketAddr;

use crate::config::ConfigProblems;

/// Why the application could not start or a command could not finish.
#[derive(Debug, thiserror::Error)]
pub enum BootstrapError {
    /// The configuration breaks rules; every problem is listed with its key.
    #[error("{0}")]
    InvalidConfig(ConfigProblems),
    /// The configuration file or environment could not be read or parsed.
    #[error("cannot read the configuration: {0}")]
    ConfigSource(String),
    /// A provider, the pseudonymizer or the edge could not be built.
    #[error("cannot build {component}: {reason}")]
    Wiring {
        /// What was being built.
        component: &'static str,
        /// Why it failed.
        reason: String,
    },
    /// The listener could not bind.
    #[error("cannot listen on {address}: {source}")]
    Bind {
        /// The configured address.
        address: SocketAddr,
        /// The operating system's reason.
        source: std::io::Error,
    },
    /// The server stopped with an I/O error.
    #[error("server error: {0}")]
    Serve(std::io::Error),
    /// A command's arguments do not fit the configuration.
    #[error("{0}")]
    Usage(String),
}
