//! `ca-skeleton-import`: another rate limiter's configuration as this
//! service's TOML on stdout, a warning on stderr for each thing the TOML
//! cannot say. When it cannot convert, every problem of every file goes to
//! stderr, nothing to stdout, and the exit status is 1. It reads no
//! configuration of its own.

#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Prints another rate limiter's configuration as ca-skeleton's TOML
/// (warnings on stderr).
#[derive(Debug, Parser)]
#[command(name = "ca-skeleton-import", version)]
struct Cli {
    /// The format to read.
    #[command(subcommand)]
    format: Format,
}

/// The formats it reads.
#[derive(Debug, Subcommand)]
enum Format {
    /// envoyproxy/ratelimit's YAML (one domain a file) as `[[envoy-rls.rules]]`
    /// and fixed-window policies.
    EnvoyRatelimit {
        /// The YAML files, one domain each.
        #[arg(required = true, value_name = "FILE.yaml")]
        files: Vec<PathBuf>,
        /// Sets `allow-override = true` on every limited rule of DOMAIN: its
        /// descriptors' `limit` overrides, which Envoy's route
        /// configuration sets, are honoured (repeat for several domains).
        #[arg(long = "allow-override", value_name = "DOMAIN")]
        allow_override: Vec<String>,
    },
}

fn main() -> ExitCode {
    let Format::EnvoyRatelimit { files, allow_override } = Cli::parse().format;
    match import_envoy_ratelimit::convert_files(&files, &allow_override) {
        Ok(imported) => {
            for warning in &imported.warnings {
                eprintln!("warning: {warning}");
            }
            print!("{}", imported.toml);
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}
