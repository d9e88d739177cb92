//! The `ca-skeleton` command line: `serve` (default), `check-config`,
//! `redis-acl` and `bench`, each over the same layered configuration.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use humantime_serde::re::humantime;
use tracing_subscriber::layer::{Layer, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Registry};

use crate::acl::acl_rules;
use crate::bench::{self, BenchOptions};
use crate::config::{AppConfig, CONFIG_FILE_ENV, ConfigSources, ProviderConfig};
use crate::error::BootstrapError;
use crate::server::{Application, Signals};
use crate::telemetry::{Tracing, WithTraceIds};

/// The edge rate limiter service skeleton.
#[derive(Debug, Parser)]
#[command(name = "ca-skeleton", version, about)]
pub struct Cli {
    /// TOML configuration file; `CA_SKELETON_*` variables override it.
    #[arg(long, global = true, env = CONFIG_FILE_ENV, value_name = "PATH")]
    pub config: Option<PathBuf>,
    /// Log line format (logs go to stderr; `RUST_LOG` sets the filter).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Human)]
    pub log_format: LogFormat,
    /// What to do; `serve` when omitted.
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Human,
    /// One JSON object per line.
    Json,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the demo API behind the rate limiter (the default).
    Serve,
    /// Print the resolved configuration, secrets redacted; exit non-zero
    /// with every problem listed when it is invalid.
    CheckConfig,
    /// Print the ACL SETUSER rule of a least-privilege Redis user.
    RedisAcl,
    /// Drive the configured provider and print one JSON line of results.
    Bench(BenchArgs),
}

/// `bench` options.
#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// Concurrent callers.
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    /// Distinct subjects the callers spread over.
    #[arg(long, default_value_t = 1_000)]
    pub subjects: usize,
    /// How long to run, like "10s" or "1m" (at most a day).
    #[arg(long, default_value = "10s", value_parser = bench_duration)]
    pub duration: Duration,
    /// Policy to evaluate (default: capabilities.rate-limit.default-policy).
    #[arg(long)]
    pub policy: Option<String>,
    /// The async runtime the callers and the provider run on:
    /// `multi-thread` as `serve` runs, or `current-thread`, so the runtime's
    /// share of client CPU shows apart from the provider's.
    #[arg(long, value_enum, default_value_t = RuntimeFlavor::MultiThread)]
    pub runtime: RuntimeFlavor,
}

/// A tokio runtime flavor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RuntimeFlavor {
    /// A worker thread per CPU (what every command but `bench --runtime` uses).
    MultiThread,
    /// Everything on the thread that runs the command.
    CurrentThread,
}

impl RuntimeFlavor {
    /// Kebab-case name, as the option spells it.
    pub const fn name(self) -> &'static str {
        match self {
            Self::MultiThread => "multi-thread",
            Self::CurrentThread => "current-thread",
        }
    }
}

/// The longest `bench --duration`; a longer one would overflow the run's
/// end instant long before it made sense.
const MAX_BENCH_DURATION: Duration = Duration::from_secs(24 * 3600);

fn bench_duration(text: &str) -> Result<Duration, String> {
    let duration = humantime::parse_duration(text).map_err(|error| error.to_string())?;
    if duration > MAX_BENCH_DURATION {
        return Err(format!("at most {}", humantime::format_duration(MAX_BENCH_DURATION)));
    }
    Ok(duration)
}

/// Installs the global `tracing` subscriber, writing to stderr so stdout
/// carries only command output (`check-config`, `redis-acl`, `bench`).
/// With `tracing`, spans are also exported and JSON lines carry the
/// active span's `trace_id` and `span_id`. Only the first call installs.
pub fn init_logging(format: LogFormat, tracing: Option<&Tracing>) {
    // Spans too (they exist only when traces are exported): a JSON line
    // written inside one names it and its fields under `span`, and the
    // spans it runs in under `spans`, beside `trace_id` and `span_id`. No
    // span holds a raw subject (docs/operations.md, "Traces").
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // Colour codes only help a terminal; in files and log shippers they are noise.
    let lines = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    let mut layers: Vec<Box<dyn Layer<Registry> + Send + Sync>> = Vec::new();
    if let Some(tracing) = tracing {
        // Spans only (log lines stay log lines), and only this workspace's
        // at info: `RUST_LOG` filters log lines, never what is traced.
        let ours = tracing_subscriber::filter::filter_fn(|metadata| {
            metadata.is_span()
                && *metadata.level() <= tracing::Level::INFO
                && [
                    "app_bootstrap",
                    "adapter_web",
                    "adapter_envoy_rls",
                    "adapter_redis",
                    "adapter_memory",
                ]
                .iter()
                .any(|crate_name| metadata.target().starts_with(crate_name))
        });
        layers.push(tracing.layer().with_filter(ours).boxed());
    }
    let lines = match (format, tracing.is_some()) {
        (LogFormat::Human, _) => lines.with_filter(filter).boxed(),
        (LogFormat::Json, false) => lines.json().with_filter(filter).boxed(),
        (LogFormat::Json, true) => {
            let json = tracing_subscriber::fmt::format().json();
            lines.json().event_format(WithTraceIds(json)).with_filter(filter).boxed()
        }
    };
    layers.push(lines);
    let _ = tracing_subscriber::registry().with(layers).try_init();
}

impl Cli {
    /// Whether the command is `serve` (also when none is given).
    pub fn serves(&self) -> bool {
        matches!(self.command, None | Some(Command::Serve))
    }

    /// The runtime the command runs on: multi-thread but for `bench
    /// --runtime current-thread`.
    pub fn runtime_flavor(&self) -> RuntimeFlavor {
        match &self.command {
            Some(Command::Bench(args)) => args.runtime,
            None | Some(Command::Serve | Command::CheckConfig | Command::RedisAcl) => {
                RuntimeFlavor::MultiThread
            }
        }
    }
}

/// Runs the chosen command; `serve` reloads on the SIGHUPs and stops on the
/// SIGTERMs and SIGINTs `signals` has caught since before the runtime
/// started (the binary's `main` catches them first thing; without them it
/// catches from now).
/// Logging is installed here (once): `serve` first reads its
/// configuration, which says whether spans are exported too.
pub async fn run(cli: Cli, signals: Option<Signals>) -> Result<(), BootstrapError> {
    let sources = ConfigSources::new(cli.config);
    let command = cli.command.unwrap_or(Command::Serve);
    if !matches!(command, Command::Serve) {
        init_logging(cli.log_format, None);
    }
    match command {
        Command::Serve => {
            serve(&sources, cli.log_format, signals.unwrap_or_else(Signals::catch)).await
        }
        Command::CheckConfig => check_config(&sources),
        Command::RedisAcl => {
            let rules = acl_rules(&AppConfig::load_redis(&sources)?);
            for note in rules.notes {
                eprintln!("{note}");
            }
            for command in rules.commands {
                println!("{command}");
            }
            Ok(())
        }
        Command::Bench(args) => {
            let config = AppConfig::load(&sources)?;
            let options = BenchOptions {
                concurrency: args.concurrency,
                subjects: args.subjects,
                duration: args.duration,
                policy: args.policy,
                runtime: args.runtime.name(),
            };
            let report = bench::run(&config, &options).await?;
            let line = serde_json::to_string(&report).map_err(|error| {
                BootstrapError::Usage(format!("cannot encode the report: {error}"))
            })?;
            println!("{line}");
            Ok(())
        }
    }
}

async fn serve(
    sources: &ConfigSources,
    log_format: LogFormat,
    signals: Signals,
) -> Result<(), BootstrapError> {
    // hyper writes every response's `Date` from the wall clock and panics on
    // a time before 1970, on every connection: such a clock is refused here.
    if std::time::SystemTime::now() < std::time::UNIX_EPOCH {
        init_logging(log_format, None);
        let reason = "the system clock reads a time before 1970, and HTTP `Date` headers \
                      cannot be written: set the clock and start again";
        return Err(BootstrapError::Wiring { component: "the listeners", reason: reason.into() });
    }
    // The route check `Application::build` makes again, here with sources.
    let served = crate::routes::api();
    let loaded = AppConfig::load(sources).and_then(|config| {
        config.check_operations_from(served.operations(), sources).map(|()| config)
    });
    let config = match loaded {
        Ok(config) => config,
        Err(error) => {
            init_logging(log_format, None);
            return Err(error);
        }
    };
    let tracing = Tracing::start(&config.telemetry.otlp);
    init_logging(log_format, tracing.as_ref().ok().and_then(Option::as_ref));
    let tracing = tracing?;
    match &tracing {
        Some(tracing) => tracing.log_variables(),
        None if config.telemetry.otlp.endpoint.is_some() => {
            if let Some(variable) = crate::telemetry::export_switched_off_by() {
                tracing::warn!(
                    variable,
                    "traces are not exported although telemetry.otlp.endpoint is set: the \
                     variable switches export off"
                );
            }
        }
        None => {}
    }
    let rate_limit = &config.capabilities.rate_limit;
    let application = Application::build(&config)
        .await?
        .reload_from(sources.clone())
        .reload_on(signals.hangups)
        .stop_on(signals.terminations)
        .trace_with(tracing);
    tracing::info!(
        address = %application.local_addr(),
        provider = rate_limit.provider.name(),
        default_policy = ?rate_limit.default_policy,
        policies = rate_limit.policies.len(),
        config_file = ?sources.file(),
        "ca-skeleton listening"
    );
    if let Some(admin) = application.admin_addr() {
        tracing::info!(address = %admin, "admin listener on");
    }
    if let Some(rls) = application.rls_addr() {
        tracing::info!(address = %rls, "envoy rls listener on");
    }
    if let Some(endpoint) = &config.telemetry.otlp.endpoint {
        tracing::info!(
            endpoint,
            sample_ratio = config.telemetry.otlp.sample_ratio,
            trust_remote_parent = config.telemetry.otlp.trust_remote_parent,
            "exporting traces over OTLP/HTTP"
        );
    }
    application.run_until_stopped().await?;
    tracing::info!("stopped");
    Ok(())
}

fn check_config(sources: &ConfigSources) -> Result<(), BootstrapError> {
    let config = AppConfig::load(sources)?;
    // The same route check `serve` makes, against the routes it would serve.
    config.check_operations_from(crate::routes::api().operations(), sources)?;
    print!("{}", config.to_redacted_toml()?);
    let memory_without_key = config.capabilities.rate_limit.provider == ProviderConfig::Memory
        && config.pseudonymizer.keys.is_empty();
    if memory_without_key {
        eprintln!(
            "# note: no pseudonymizer key configured; `serve` generates a random one at start"
        );
    }
    eprintln!("# configuration is valid");
    Ok(())
}
