//! `ca-skeleton`: the binary. It only catches SIGTERM, SIGINT and SIGHUP
//! for `serve` (first thing), parses the command line and hands over to the library, which
//! installs logging; any error is printed (with every configuration
//! problem) and the exit code is non-zero.

use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;

use app_bootstrap::cli::{Cli, RuntimeFlavor, run};
use app_bootstrap::server::Signals;

fn main() -> ExitCode {
    // Before the command line, the runtime, the configuration and the
    // port: from here on a SIGHUP only asks `serve` to reload and a SIGTERM
    // or SIGINT to stop, whenever they come (the other commands release
    // them below).
    let signals = Signals::catch();
    let cli = Cli::parse();
    let signals = if cli.serves() {
        Some(signals)
    } else {
        signals.release();
        None
    };
    match start(cli, signals) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            // `{:#}` keeps the chain on one report without a backtrace.
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn start(cli: Cli, signals: Option<Signals>) -> anyhow::Result<()> {
    let mut builder = match cli.runtime_flavor() {
        RuntimeFlavor::MultiThread => tokio::runtime::Builder::new_multi_thread(),
        RuntimeFlavor::CurrentThread => tokio::runtime::Builder::new_current_thread(),
    };
    let runtime = builder.enable_all().build().context("cannot start the async runtime")?;
    runtime.block_on(run(cli, signals))?;
    Ok(())
}
