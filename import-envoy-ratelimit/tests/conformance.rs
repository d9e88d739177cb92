//! envoyproxy/ratelimit's own configurations (`tests/envoyproxy/`, copied
//! from its repository) against envoyproxy/ratelimit's own answers: each
//! accepted configuration is imported, served by the real server (memory
//! provider, a manual clock, so no window ends during a table) and its
//! table of calls (`tests/conformance/*.toml`) replayed over gRPC; each
//! configuration envoyproxy/ratelimit refuses must be refused by the import
//! too, naming file, line and key.
//!
//! A table's `code` and `statuses` are envoyproxy/ratelimit's answers, each
//! case citing where they come from. Where this service answers otherwise
//! on purpose, the call also holds `ours_code` / `ours` and the case a
//! `why` naming the class of the difference; the test asserts ours then.
//!
//! A status is written `CODE`, `CODE unlimited` (no limit, remaining
//! 4294967295) or `CODE LIMIT/UNIT REMAINING`; a descriptor
//! `"key=value, key=value"`, or a table with `entries`, `hits` (its own
//! `hits_addend`) and `limit` (an override, `"10/DAY"`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use app_bootstrap::{AppConfig, Application, ConfigSources};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, rate_limit::Unit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::envoy::r#type::v3::RateLimitUnit;
use envoy_types::pb::google::protobuf::UInt64Value;
use import_envoy_ratelimit::{Source, convert, convert_with};
use serde::Deserialize;
use shared_contract::{Clock, ManualClock};

/// A whole minute past the epoch, plus 250 ms: a table never reaches the
/// end of a window unless a call advances the clock.
const T0: u64 = 1_700_000_040_000 + 250;

/// A pseudonymizer key (32 bytes or more).
const KEY: &str = "conformance-pseudonymizer-key-0123456789";

fn here() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests")
}

/// One configuration's table.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Table {
    /// The files imported together, under `tests/envoyproxy/`.
    files: Vec<String>,
    /// The domains imported with `--allow-override`: Envoy sends their
    /// descriptors a `limit` override.
    #[serde(default, rename = "allow-override")]
    allow_override: Vec<String>,
    #[serde(rename = "case")]
    cases: Vec<Case>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    /// Where envoyproxy/ratelimit's answers come from: file and function.
    source: String,
    domain: String,
    calls: Vec<Call>,
    /// Why ours differs, its class first: `(a)` stricter by design, as
    /// docs/envoy-rls.md's comparison table says; `(c)` a difference in the
    /// RLS adapter, documented there; `(d)` the import's documented choice.
    #[serde(default)]
    why: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Call {
    send: Vec<Sent>,
    /// The request's `hits_addend` (0, unset, counts 1).
    #[serde(default)]
    hits: u32,
    /// The same call this many times, each answered the same.
    #[serde(default = "once")]
    times: u32,
    /// Milliseconds the clock moves before the call.
    #[serde(default)]
    advance_ms: u64,
    /// The first status's `duration_until_reset` is shorter than the
    /// previous call's.
    #[serde(default)]
    reset_decreased: bool,
    /// envoyproxy/ratelimit's answer.
    code: String,
    statuses: Vec<String>,
    /// Ours, where it differs (the case says why).
    #[serde(default)]
    ours_code: Option<String>,
    #[serde(default)]
    ours: Option<Vec<String>>,
}

fn once() -> u32 {
    1
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Sent {
    Entries(String),
    Descriptor {
        entries: String,
        #[serde(default)]
        hits: Option<u64>,
        #[serde(default)]
        limit: Option<String>,
    },
}

impl Sent {
    fn descriptor(&self) -> RateLimitDescriptor {
        let (entries, hits, limit) = match self {
            Self::Entries(entries) => (entries, None, None),
            Self::Descriptor { entries, hits, limit } => (entries, *hits, limit.as_deref()),
        };
        let entries = entries
            .split(", ")
            .filter(|entry| !entry.is_empty())
            .map(|entry| {
                let (key, value) = entry.split_once('=').unwrap_or((entry, ""));
                Entry { key: key.to_owned(), value: value.to_owned() }
            })
            .collect();
        let limit = limit.map(|limit| {
            let (requests, unit) = limit.split_once('/').expect("limit is N/UNIT");
            let unit = RateLimitUnit::from_str_name(unit).expect("a RateLimitUnit name");
            RateLimitOverride { requests_per_unit: requests.parse().unwrap(), unit: unit.into() }
        });
        let hits_addend = hits.map(|value| UInt64Value { value });
        RateLimitDescriptor { entries, limit, hits_addend }
    }
}

/// A status in the tables' notation.
fn written(status: &DescriptorStatus) -> String {
    let code = Code::try_from(status.code).map_or("?", |code| code.as_str_name());
    match &status.current_limit {
        None if status.limit_remaining == u32::MAX => format!("{code} unlimited"),
        None if status.limit_remaining == 0 => code.to_owned(),
        None => format!("{code} (no limit) {}", status.limit_remaining),
        Some(limit) => {
            let unit = Unit::try_from(limit.unit).map_or("?", |unit| unit.as_str_name());
            format!("{code} {}/{unit} {}", limit.requests_per_unit, status.limit_remaining)
        }
    }
}

fn read_table(name: &str) -> Table {
    let path = here().join("conformance").join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    toml::from_str(&text).unwrap_or_else(|e| panic!("{path:?}: {e}"))
}

/// The files of a table as the import reads them, each named by its path
/// under `tests/envoyproxy/`.
fn sources(files: &[String]) -> Vec<(String, String)> {
    files
        .iter()
        .map(|file| {
            let path = here().join("envoyproxy").join(file);
            let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
            (file.clone(), text)
        })
        .collect()
}

/// The real server of an imported configuration, on ephemeral ports.
struct Server {
    clock: Arc<ManualClock>,
    client: RateLimitServiceClient<tonic::transport::Channel>,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

impl Server {
    async fn start(imported: &str) -> Self {
        // The import leaves the listener off; the rest is as printed.
        let on =
            imported.replacen("\n[envoy-rls]\n", "\n[envoy-rls]\nlisten = \"127.0.0.1:0\"\n", 1);
        assert_ne!(on, imported, "the import prints an [envoy-rls] table");
        let toml = format!(
            "[server]\nlisten = \"127.0.0.1:0\"\n\n[pseudonymizer.keys]\n1 = \"{KEY}\"\n\n{on}"
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("imported.toml");
        std::fs::write(&path, &toml).unwrap();
        let config = AppConfig::load(&ConfigSources::file_only(path))
            .unwrap_or_else(|e| panic!("the imported configuration loads: {e}\n{toml}"));
        let clock = Arc::new(ManualClock::new(T0));
        let shared: Arc<dyn Clock> = Arc::clone(&clock) as _;
        let application = Application::build_with_clock(&config, shared).await.unwrap();
        let rls = application.rls_addr().expect("the RLS listener is bound");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            application.run_until(async { drop(stopped.await) }).await.unwrap();
        });
        let client = RateLimitServiceClient::connect(format!("http://{rls}")).await.unwrap();
        Self { clock, client, stop, task, _dir: dir }
    }

    async fn stop(self) {
        drop(self.client);
        self.stop.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(15), self.task).await.unwrap().unwrap();
    }
}

/// Imports the table's files, serves them and replays every call.
async fn replay(name: &str) {
    let table = read_table(name);
    let texts = sources(&table.files);
    let sources: Vec<Source<'_>> = texts.iter().map(|(name, text)| Source { name, text }).collect();
    let imported =
        convert_with(&sources, &table.allow_override).unwrap_or_else(|e| panic!("{name}: {e}"));
    let mut server = Server::start(&imported.toml).await;
    let mut last_reset: Option<Duration> = None;
    for (at, case) in table.cases.iter().enumerate() {
        let differs = case.calls.iter().any(|call| call.ours.is_some() || call.ours_code.is_some());
        assert_eq!(
            differs,
            case.why.is_some(),
            "{name} case {at} ({}): an answer of ours that differs needs a `why`, and only then",
            case.source
        );
        for (number, call) in case.calls.iter().enumerate() {
            let request = RateLimitRequest {
                domain: case.domain.clone(),
                descriptors: call.send.iter().map(Sent::descriptor).collect(),
                hits_addend: call.hits,
            };
            let code = call.ours_code.as_ref().unwrap_or(&call.code);
            let statuses = call.ours.as_ref().unwrap_or(&call.statuses);
            for time in 0..call.times {
                if time == 0 && call.advance_ms > 0 {
                    server.clock.advance(Duration::from_millis(call.advance_ms));
                }
                let answer: RateLimitResponse =
                    server.client.should_rate_limit(request.clone()).await.unwrap().into_inner();
                let overall = Code::try_from(answer.overall_code).map_or("?", |c| c.as_str_name());
                let got: Vec<String> = answer.statuses.iter().map(written).collect();
                let context = format!(
                    "{name}, case {at} ({}), call {number} (repetition {time}): {:?}",
                    case.source, call.send
                );
                assert_eq!((overall, &got), (code.as_str(), statuses), "{context}");
                let reset = answer.statuses.first().and_then(|status| {
                    let reset = status.duration_until_reset.as_ref()?;
                    Some(Duration::new(reset.seconds as u64, reset.nanos as u32))
                });
                if call.reset_decreased {
                    assert!(
                        reset < last_reset && reset.is_some(),
                        "{context}: {reset:?} after {last_reset:?}"
                    );
                }
                last_reset = reset;
            }
        }
    }
    server.stop().await;
}

macro_rules! tables {
    ($($test:ident => $file:literal,)*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $test() {
                replay($file).await;
            }
        )*

        /// Every table the tests above replay.
        const TABLES: &[&str] = &[$($file),*];
    };
}

tables! {
    config_basic_config => "config_basic_config.toml",
    config_metadata => "config_metadata.toml",
    config_merge_domain_key1 => "config_merge_domain_key1.toml",
    config_merge_domain_key2 => "config_merge_domain_key2.toml",
    config_shadowmode_config => "config_shadowmode_config.toml",
    config_share_threshold => "config_share_threshold.toml",
    config_wildcard => "config_wildcard.toml",
    examples_config => "examples_config.toml",
    examples_example => "examples_example.toml",
    integration_another => "integration_another.toml",
    integration_basic => "integration_basic.toml",
    integration_reload => "integration_reload.toml",
    integration_runtime => "integration_runtime.toml",
    integration_share_threshold => "integration_share_threshold.toml",
    readme_01 => "readme_01.toml",
    readme_02 => "readme_02.toml",
    readme_03 => "readme_03.toml",
    readme_04 => "readme_04.toml",
    readme_05 => "readme_05.toml",
    readme_06 => "readme_06.toml",
    readme_07 => "readme_07.toml",
    readme_08 => "readme_08.toml",
    readme_09 => "readme_09.toml",
    readme_10 => "readme_10.toml",
    readme_11 => "readme_11.toml",
    readme_12 => "readme_12.toml",
    readme_13 => "readme_13.toml",
    readme_14 => "readme_14.toml",
    readme_15 => "readme_15.toml",
    readme_16 => "readme_16.toml",
}

/// The configurations envoyproxy/ratelimit refuses (`refused.toml`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Refusals {
    refused: Vec<Refused>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Refused {
    files: Vec<String>,
    /// envoyproxy/ratelimit's test and its error.
    source: String,
    /// What our message names: file and line (`file:line:`), then the key
    /// or value at fault, each a part of one problem line.
    problem: Vec<String>,
    /// Where envoyproxy/ratelimit accepts it under a setting ours lacks.
    #[serde(default)]
    why: Option<String>,
}

#[test]
fn what_envoyproxy_ratelimit_refuses_the_import_refuses_naming_file_line_and_key() {
    let text = std::fs::read_to_string(here().join("conformance/refused.toml")).unwrap();
    let refusals: Refusals = toml::from_str(&text).unwrap();
    let mut unnamed = Vec::new();
    for refused in &refusals.refused {
        let texts = sources(&refused.files);
        let sources: Vec<Source<'_>> =
            texts.iter().map(|(name, text)| Source { name, text }).collect();
        let problems = match convert(&sources) {
            Ok(imported) => panic!(
                "{:?} ({}; {:?}) imported:\n{}",
                refused.files, refused.source, refused.why, imported.toml
            ),
            Err(error) => error.problems,
        };
        let named =
            problems.iter().any(|line| refused.problem.iter().all(|part| line.contains(part)));
        if !named {
            unnamed.push(format!(
                "{:?} ({}): no problem names {:?}: {problems:#?}",
                refused.files, refused.source, refused.problem
            ));
        }
    }
    assert!(unnamed.is_empty(), "{}", unnamed.join("\n"));
}

/// Every vendored configuration is in a table or in `refused.toml`, and
/// every table is replayed.
#[test]
fn every_vendored_configuration_is_compared() {
    let mut covered: Vec<String> = Vec::new();
    let conformance = here().join("conformance");
    let mut tables: Vec<String> = std::fs::read_dir(&conformance)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .filter(|name| name != "refused.toml")
        .collect();
    tables.sort();
    let mut replayed: Vec<String> = TABLES.iter().map(|name| (*name).to_owned()).collect();
    replayed.sort();
    assert_eq!(tables, replayed, "each table in tests/conformance has its test");
    for name in &tables {
        covered.extend(read_table(name).files);
    }
    let text = std::fs::read_to_string(conformance.join("refused.toml")).unwrap();
    let refusals: Refusals = toml::from_str(&text).unwrap();
    covered.extend(refusals.refused.into_iter().flat_map(|refused| refused.files));
    let mut missing = Vec::new();
    let root = here().join("envoyproxy");
    let mut pending = vec![root.clone()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|ext| ext == "yaml") {
                let relative = path.strip_prefix(&root).unwrap().to_string_lossy().into_owned();
                if !covered.contains(&relative) {
                    missing.push(relative);
                }
            }
        }
    }
    assert!(missing.is_empty(), "vendored configurations no table compares: {missing:?}");
}
