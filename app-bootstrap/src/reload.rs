//! Hot reload of the policy table. On SIGHUP (or `POST /admin/reload`) the
//! configuration is read again from the sources the server started with;
//! a valid one puts a new bridge in force, over a port that shares the
//! provider's state, and an invalid one changes nothing.
//!
//! What a reload may change is the policy table and what only the edges
//! read: every key of `capabilities.rate-limit` and of `envoy-rls` but the
//! `RESTART_ONLY` ones. Every other key that differs from what is running is reported as
//! needing a restart, every time, until one happens.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use adapter_web::{BridgeSwitch, TransportBridge};
use figment::Figment;
use figment::providers::{Format, Toml};
use serde::Serialize;
use shared_contract::RateLimitPolicy;
use tokio::sync::Mutex;
use toml::{Table, Value};
use tracing::Instrument;

use crate::capability::{ProviderState, edge_settings, rls_engine};
use crate::config::render::{self, Secrets};
use crate::config::{AppConfig, ConfigProblems, ConfigSources, KeyPath, RateLimitConfig};
use crate::error::BootstrapError;
use crate::telemetry::Sampling;

/// The table whose absence would put the built-in policies in force.
const POLICIES_TABLE: &str = "capabilities.rate-limit.policies";

/// Counter of reloads, by `result` (`applied`, `unchanged`, `rejected`).
pub const CONFIG_RELOADS_TOTAL: &str = adapter_web::metric_name!("config_reloads_total");

/// The sections a reload applies, key by key ([`RESTART_ONLY`] aside):
/// the policy table and what only the edges read.
const RELOADABLE: [&str; 2] = ["capabilities.rate-limit", "envoy-rls"];

/// The keys of the [`RELOADABLE`] sections a reload does not apply: the
/// providers hold the first three (the degraded mode is built with the
/// provider), and the gRPC listener is bound once. Every
/// other key of those tables is the policy table or what only an edge
/// reads, so a key added to [`RateLimitConfig`], `EdgeSettings` or the RLS
/// rules reloads without being listed here.
const RESTART_ONLY: [&str; 4] = [
    "capabilities.rate-limit.provider",
    "capabilities.rate-limit.failure-retry-after",
    "capabilities.rate-limit.degraded",
    "envoy-rls.listen",
];

/// Whether the key at `path` (its segments) is one a reload applies.
fn reloadable(path: &[String]) -> bool {
    RELOADABLE.iter().any(|section| {
        let section: Vec<&str> = section.split('.').collect();
        path.len() > section.len()
            && path.iter().zip(&section).all(|(segment, expected)| segment == expected)
            && !RESTART_ONLY.contains(&path[..=section.len()].join(".").as_str())
    })
}

/// What one reload did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "result", rename_all = "kebab-case")]
pub enum ReloadReport {
    /// A new table is in force for every request that starts from now on.
    Applied {
        /// The keys whose values changed, as full key paths.
        changed: Vec<String>,
        /// Keys that changed in the file but apply only after a restart.
        #[serde(rename = "restart-required")]
        restart_required: Vec<String>,
    },
    /// Nothing a reload applies differs from what is running.
    Unchanged {
        /// Keys that changed in the file but apply only after a restart.
        #[serde(rename = "restart-required")]
        restart_required: Vec<String>,
    },
    /// The configuration was refused; what was running stays.
    Rejected {
        /// Every problem, each naming its full key path.
        problems: Vec<String>,
    },
}

impl ReloadReport {
    /// The `result` label of [`CONFIG_RELOADS_TOTAL`].
    pub fn result(&self) -> &'static str {
        match self {
            Self::Applied { .. } => "applied",
            Self::Unchanged { .. } => "unchanged",
            Self::Rejected { .. } => "rejected",
        }
    }
}

/// What a reload replaces: the bridge in force, and the provider state the
/// next port is built over. Absent when the provider is `disabled`.
#[derive(Debug, Clone)]
pub(crate) struct ReloadTarget {
    pub(crate) switch: BridgeSwitch,
    pub(crate) state: ProviderState,
    /// The Envoy RLS engine in force, when `envoy-rls.listen` is set.
    pub(crate) rls: Option<adapter_envoy_rls::RlsSwitch>,
}

/// Reloads the policy table from `sources`. Cheap to clone; reloads run
/// one at a time.
#[derive(Debug, Clone)]
pub struct Reloader {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    sources: ConfigSources,
    served: BTreeSet<String>,
    target: Option<ReloadTarget>,
    running: Mutex<Running>,
}

#[derive(Debug)]
struct Running {
    /// The configuration in force: the restart-only keys as the server
    /// started, the reloadable ones as last applied.
    config: AppConfig,
    /// Every policy id this process has served, as last served, those
    /// removed since included: the store may still hold a removed policy's
    /// counters, so re-adding it is judged as if it had stayed. One entry
    /// per id: the revision rules keep an id's revisions growing, so an
    /// older (id, revision) can never come back, and the history grows
    /// only with ids never loaded before (bounded by the ids ever written
    /// in the file, a few hundred bytes each).
    history: BTreeMap<String, RateLimitPolicy>,
}

impl Reloader {
    pub(crate) fn new(
        sources: ConfigSources,
        running: AppConfig,
        served: BTreeSet<String>,
        target: Option<ReloadTarget>,
    ) -> Self {
        let history = running.capabilities.rate_limit.policies.clone();
        let running = Mutex::new(Running { config: running, history });
        Self { inner: Arc::new(Inner { sources, served, target, running }) }
    }

    /// Reads the configuration again and applies it, or refuses it with
    /// every problem named; logs and counts the result either way. Runs in
    /// a `config.reload` span, a child of the request that asked, when
    /// that request is traced (it runs in a span); otherwise in none, so
    /// the reload follows its caller's sampling.
    pub async fn reload(&self) -> ReloadReport {
        let traced =
            tracing::dispatcher::get_default(|dispatch| dispatch.current_span().id().is_some());
        self.reload_traced(traced).await
    }

    /// [`Self::reload`] on a signal, which no caller traces: its
    /// `config.reload` span is a trace of its own when `sampling` (`None`:
    /// traces are off) keeps a new trace.
    pub(crate) async fn reload_on_signal(&self, sampling: Option<Sampling>) -> ReloadReport {
        self.reload_traced(sampling.is_some_and(Sampling::keeps_new_trace)).await
    }

    async fn reload_traced(&self, traced: bool) -> ReloadReport {
        if !traced {
            return self.reload_in_span().await;
        }
        let span = tracing::info_span!("config.reload", result = tracing::field::Empty);
        let report = self.reload_in_span().instrument(span.clone()).await;
        span.record("result", report.result());
        report
    }

    async fn reload_in_span(&self) -> ReloadReport {
        let mut running = self.inner.running.lock().await;
        // A defect in reading a file must not end the reload loop with it
        // (no SIGHUP would be handled again): a panic rejects this one.
        let applied =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.apply(&mut running)));
        let report = match applied {
            Ok(Ok(report)) => report,
            Ok(Err(problems)) => ReloadReport::Rejected { problems },
            Err(_) => ReloadReport::Rejected {
                problems: vec![
                    "the reload failed unexpectedly (a defect, logged above); \
                                the configuration in force stays"
                        .to_owned(),
                ],
            },
        };
        metrics::counter!(CONFIG_RELOADS_TOTAL, "result" => report.result()).increment(1);
        match &report {
            ReloadReport::Applied { changed, restart_required } => {
                tracing::info!(
                    ?changed,
                    "configuration reloaded; new requests use the new policies"
                );
                warn_restart_required(restart_required);
            }
            ReloadReport::Unchanged { restart_required } => {
                tracing::info!("configuration reloaded; nothing a reload applies has changed");
                warn_restart_required(restart_required);
            }
            ReloadReport::Rejected { problems } => tracing::error!(
                ?problems,
                "configuration reload rejected; the policies in force stay"
            ),
        }
        report
    }

    fn apply(&self, state: &mut Running) -> Result<ReloadReport, Vec<String>> {
        let running = &state.config;
        // Valid TOML that would put the built-in defaults in force: far more
        // likely a file caught while being written than a wish. Both checks
        // read the file once, alone.
        let file = self.inner.sources.file().map(|file| (file, std::fs::read(file).ok()));
        if let Some((file, Some(bytes))) = &file {
            if bytes.iter().all(u8::is_ascii_whitespace) {
                return Err(vec![format!(
                    "{}: the file is empty; a reload reads the whole configuration, so an \
                     empty file is refused (restart to run on the defaults)",
                    file.display()
                )]);
            }
        }
        let loaded = AppConfig::load(&self.inner.sources).map_err(problem_lines)?;
        // Comments alone, a copy cut before the policies, or the table's
        // header alone load as the built-in policy: refused as an empty file
        // is. The file is asked alone: a `CA_SKELETON_*` variable of the
        // table must not make a cut file look whole.
        if let Some((file, bytes)) = &file {
            let text = bytes.as_deref().and_then(|bytes| std::str::from_utf8(bytes).ok());
            let policies = text
                .and_then(|text| Figment::from(Toml::string(text)).find_value(POLICIES_TABLE).ok());
            if policies.is_none_or(|policies| policies.as_dict().is_none_or(|p| p.is_empty())) {
                return Err(vec![format!(
                    "{}: names no policies ([{POLICIES_TABLE}]); a reload reads the whole \
                     configuration, so a file without them is refused (restart to run on the \
                     built-in default)",
                    file.display()
                )]);
            }
        }
        loaded
            .check_operations_from(&self.inner.served, &self.inner.sources)
            .map_err(problem_lines)?;
        let (changed, restart_required) = changes(running, &loaded);
        let Some(target) = &self.inner.target else {
            // `disabled`: no table is in use; any change needs a restart.
            let mut restart_required = restart_required;
            restart_required.extend(changed);
            return Ok(ReloadReport::Unchanged { restart_required });
        };
        if changed.is_empty() {
            return Ok(ReloadReport::Unchanged { restart_required });
        }
        let mut refused = ConfigProblems::default();
        revision_rules(
            &state.history,
            &running.capabilities.rate_limit.policies,
            &loaded.capabilities.rate_limit.policies,
            &mut refused,
        );
        if !refused.is_empty() {
            return Err(refused.iter().map(ToString::to_string).collect());
        }
        let next = with_reloadable(running, &loaded);
        let current = target.switch.current();
        let clock = Arc::clone(current.clock());
        let port = target.state.port_with_policies(&next, Arc::clone(&clock)).map_err(line)?;
        let settings = edge_settings(&next).map_err(line)?;
        let pseudonymizer = Arc::clone(current.pseudonymizer());
        // Built before either is swapped in, so a rule that fails to build
        // leaves both front ends as they were.
        let rls = match &target.rls {
            Some(rls) => {
                let engine = rls_engine(
                    &next,
                    Some((Arc::clone(&port), &target.state)),
                    Arc::clone(&pseudonymizer) as _,
                    Arc::clone(&clock),
                )
                .map_err(line)?;
                Some((rls, engine))
            }
            None => None,
        };
        // The same releases as before: the shutdown waits for them all.
        let releases = current.lease_releases().clone();
        let bridge = TransportBridge::new(port, pseudonymizer, clock, settings)
            .with_lease_releases(releases);
        target.switch.replace(Arc::new(bridge));
        if let Some((rls, engine)) = rls {
            rls.replace(engine);
        }
        let policies = &next.capabilities.rate_limit.policies;
        state.history.extend(policies.iter().map(|(id, policy)| (id.clone(), policy.clone())));
        state.config = next;
        Ok(ReloadReport::Applied { changed, restart_required })
    }
}

fn warn_restart_required(keys: &[String]) {
    if !keys.is_empty() {
        tracing::warn!(?keys, "changed in the configuration, applied only by a restart");
    }
}

fn line(error: BootstrapError) -> Vec<String> {
    vec![error.to_string()]
}

fn problem_lines(error: BootstrapError) -> Vec<String> {
    match error {
        BootstrapError::InvalidConfig(problems) => {
            problems.iter().map(ToString::to_string).collect()
        }
        other => line(other),
    }
}

/// `running` with every reloadable key taken from `loaded`: all of
/// [`RELOADABLE`] but [`RESTART_ONLY`].
fn with_reloadable(running: &AppConfig, loaded: &AppConfig) -> AppConfig {
    let mut next = running.clone();
    let to = &mut next.capabilities.rate_limit;
    // Named field by field, so a new one is decided here.
    let RateLimitConfig { provider: _, default_policy, edge, operations, policies, degraded: _ } =
        loaded.capabilities.rate_limit.clone();
    let failure_retry_after = to.edge.failure_retry_after;
    to.edge = adapter_web::EdgeSettings { failure_retry_after, ..edge };
    (to.default_policy, to.operations, to.policies) = (default_policy, operations, policies);
    let crate::config::EnvoyRlsConfig { listen: _, rules } = loaded.envoy_rls.clone();
    next.envoy_rls.rules = rules;
    next
}

/// The key paths whose values differ, split into those a reload applies
/// and those that need a restart. Both configurations are compared as the
/// tables `check-config` renders, secrets as fingerprints, so a key added
/// to the configuration is covered without being listed here.
fn changes(running: &AppConfig, loaded: &AppConfig) -> (Vec<String>, Vec<String>) {
    let before = flatten(&render::to_table(running, Secrets::Fingerprinted));
    let after = flatten(&render::to_table(loaded, Secrets::Fingerprinted));
    let paths: BTreeSet<&Vec<String>> = before.keys().chain(after.keys()).collect();
    // A provider's own table is built with it: restart only, as `provider`.
    let providers = [running, loaded].map(|config| config.capabilities.rate_limit.provider.name());
    let of_provider = |path: &[String]| {
        path.len() > 3
            && path[..2] == ["capabilities", "rate-limit"]
            && providers.contains(&path[2])
    };
    let (mut reloadable, mut restart) = (Vec::new(), Vec::new());
    for path in paths {
        if before.get(path) == after.get(path) {
            continue;
        }
        let name = path.iter().fold(KeyPath::root(), |key, segment| key.child(segment)).to_string();
        if self::reloadable(path) && !of_provider(path) {
            reloadable.push(name);
        } else {
            restart.push(name);
        }
    }
    (reloadable, restart)
}

/// Every leaf of `table` by its path; arrays are leaves.
fn flatten(table: &Table) -> BTreeMap<Vec<String>, Value> {
    fn walk(table: &Table, path: &mut Vec<String>, out: &mut BTreeMap<Vec<String>, Value>) {
        for (key, value) in table {
            path.push(key.clone());
            match value {
                Value::Table(inner) => walk(inner, path, out),
                leaf => {
                    out.insert(path.clone(), leaf.clone());
                }
            }
            path.pop();
        }
    }
    let mut out = BTreeMap::new();
    walk(table, &mut Vec::new(), &mut out);
    out
}

/// A policy id names one set of parameters per revision for the life of
/// the process: a limit, a window, an algorithm, ... may change only with a
/// higher `revision` (the new revision's keys start fresh; the old counters
/// mean a different limit, or nothing to another algorithm), and a revision
/// never goes back (the store may still hold the older one's counters).
/// `mode` may change alone: shadow -> enforce keeps the counters it
/// observed with, which is the point of a shadow rollout. Each policy is
/// judged against `history`, the id as last served, in force or removed
/// since, so removing a policy and re-adding it changed gets around none
/// of this; re-adding it unchanged is fine.
fn revision_rules(
    history: &BTreeMap<String, RateLimitPolicy>,
    running: &BTreeMap<String, RateLimitPolicy>,
    loaded: &BTreeMap<String, RateLimitPolicy>,
    problems: &mut ConfigProblems,
) {
    for (id, new) in loaded {
        let Some(old) = history.get(id) else { continue };
        let path = KeyPath::policy(id);
        // Said of a policy re-added: the rule is not about the table in force.
        let removed = if running.contains_key(id) { "" } else { " (served before it was removed)" };
        if new.revision() < old.revision() {
            problems.push(
                path.child("revision"),
                format!(
                    "went back from {} to {}{removed}: revisions only grow (the store may still \
                     hold the older revision's counters)",
                    old.revision(),
                    new.revision()
                ),
            );
            continue;
        }
        if new.revision() > old.revision() {
            continue;
        }
        let (from, to) = (old.algorithm().name(), new.algorithm().name());
        if from != to {
            problems.push(
                path.child("algorithm"),
                format!(
                    "cannot change from {from} to {to} under revision {}{removed}: its counters \
                     mean nothing to another algorithm; raise revision, or give the new limit a \
                     new policy id",
                    new.revision()
                ),
            );
            continue;
        }
        let mut altered = altered_parameters(old, new);
        // A lease set means the same whatever a concurrency policy's
        // parameters (`max-in-flight`, `lease-ttl`, `retry-after`): they
        // change in place, and the leases held count against the new
        // maximum. A new revision would forget them, letting the old and
        // the new maximum run at once.
        if new.algorithm().holds_leases() {
            let in_place = new.algorithm().kind().parameters();
            altered.retain(|key| !in_place.contains(&key.as_str()));
        }
        if !altered.is_empty() {
            problems.push(
                path.child("revision"),
                format!(
                    "{} changed but revision is still {}{removed}: raise revision so the new \
                     limit starts fresh counters",
                    altered.join(", "),
                    new.revision()
                ),
            );
        }
    }
}

/// The parameter keys of a policy whose values differ, `mode` aside.
fn altered_parameters(old: &RateLimitPolicy, new: &RateLimitPolicy) -> Vec<String> {
    let (Value::Table(old), Value::Table(new)) =
        (render::policy_table(old), render::policy_table(new))
    else {
        return Vec::new();
    };
    let (old, new) = (flatten(&old), flatten(&new));
    let keys: BTreeSet<&Vec<String>> = old.keys().chain(new.keys()).collect();
    keys.into_iter()
        .filter(|key| key.first().is_some_and(|first| first != "mode"))
        .filter(|key| old.get(*key) != new.get(*key))
        .map(|key| key.join("."))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(toml: &str) -> AppConfig {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, toml).unwrap();
        AppConfig::load(&ConfigSources::file_only(path)).expect("loads")
    }

    const BASE: &str = r#"
[capabilities.rate-limit]
default-policy = "demo"

[capabilities.rate-limit.policies.demo]
algorithm = "fixed-window"
limit = 5
window = "60s"
"#;

    /// Every reloadable key away from BASE's value.
    const EVERY_RELOADABLE: &str = r#"
[capabilities.rate-limit]
default-policy = ["demo", "extra"]
evaluation-budget = "300ms"
api-key-header = "x-other-key"
trusted-proxies = ["10.0.0.0/8"]
client-ip-header = "forwarded"
problem-type-base = "https://errors.example/"
client-ipv4-prefix = 24
client-ipv6-prefix = 48
operations = { "GET /api/hello" = "extra" }

[capabilities.rate-limit.policies.demo]
algorithm = "fixed-window"
limit = 9
window = "60s"
revision = 2

[capabilities.rate-limit.policies.extra]
algorithm = "token-bucket"
capacity = 3
refill-tokens = 1
refill-period = "1s"
"#;

    #[test]
    fn every_reloadable_key_is_applied_and_none_is_reported_for_a_restart() {
        let (running, loaded) = (load(BASE), load(EVERY_RELOADABLE));
        let (changed, restart) = changes(&running, &loaded);
        assert!(restart.is_empty(), "{restart:?}");
        let keys: BTreeSet<&str> =
            changed.iter().map(|path| path.split('.').nth(2).unwrap()).collect();
        // A key unset by default (`api-key-header`) renders only where set.
        let tables = [&running, &loaded].map(|config| render::to_table(config, Secrets::Redacted));
        let listed = tables
            .iter()
            .flat_map(|table| table["capabilities"]["rate-limit"].as_table().unwrap().keys())
            .map(String::as_str)
            .filter(|k| !RESTART_ONLY.contains(&format!("capabilities.rate-limit.{k}").as_str()))
            .collect();
        assert_eq!(keys, listed, "each reloadable key differs");
        // What with_reloadable takes over is exactly what changed.
        let next = with_reloadable(&running, &loaded);
        assert_eq!(changes(&next, &loaded), (vec![], vec![]));
    }

    #[test]
    fn restart_only_keys_are_named_secrets_included() {
        let running = load(&format!("{BASE}\n[pseudonymizer.keys]\n1 = \"{}\"\n", "a".repeat(32)));
        let base = BASE.replace("default-policy", "failure-retry-after = \"3s\"\ndefault-policy");
        let loaded = load(&format!(
            "{base}\n[capabilities.rate-limit.degraded]\ninstances = 3\n\
             [server]\nlisten = \"0.0.0.0:9000\"\n[pseudonymizer.keys]\n1 = \"{}\"\n",
            "b".repeat(32)
        ));
        let (changed, restart) = changes(&running, &loaded);
        assert!(changed.is_empty(), "{changed:?}");
        assert_eq!(
            restart,
            [
                // The degraded mode is built with the provider.
                "capabilities.rate-limit.degraded.instances",
                "capabilities.rate-limit.failure-retry-after",
                "pseudonymizer.keys.1",
                "server.listen"
            ]
        );
    }

    #[test]
    fn a_password_changed_inside_a_redis_url_needs_a_restart_and_is_never_shown() {
        let url = |password: &str| {
            format!("{BASE}\n[redis]\nurls = [\"redis://default:{password}@127.0.0.1:7001\"]\n")
        };
        let (running, loaded) = (load(&url("oldpw")), load(&url("newpw")));
        let (changed, restart) = changes(&running, &loaded);
        assert!(changed.is_empty(), "{changed:?}");
        assert_eq!(restart, ["redis.urls"]);
        let unix = |password: &str| {
            format!("{BASE}\n[redis]\nurls = [\"unix:///run/redis.sock?pass={password}\"]\n")
        };
        let (running, loaded) = (load(&unix("oldpw")), load(&unix("newpw")));
        assert_eq!(changes(&running, &loaded).1, ["redis.urls"]);
        // The fingerprints hold no password.
        let table = render::to_table(&loaded, Secrets::Fingerprinted);
        assert!(!table.to_string().contains("newpw"), "{table}");
    }

    #[test]
    fn a_changed_dedupe_setting_needs_a_new_revision_and_mode_does_not() {
        let running = load(BASE);
        let dedupe = load(&format!("{BASE}evaluation-dedup = {{ enabled = false }}\n"));
        let mut problems = ConfigProblems::default();
        let (old, new) =
            (&running.capabilities.rate_limit.policies, &dedupe.capabilities.rate_limit.policies);
        revision_rules(old, old, new, &mut problems);
        let listed: Vec<String> = problems.iter().map(ToString::to_string).collect();
        assert_eq!(listed.len(), 1);
        assert!(listed[0].starts_with(
            "capabilities.rate-limit.policies.demo.revision: evaluation-dedup.enabled, \
             evaluation-dedup.max-entries, evaluation-dedup.max-stored-bytes, \
             evaluation-dedup.ttl changed"
        ));
        let shadow = load(&format!("{BASE}mode = \"shadow\"\n"));
        let mut problems = ConfigProblems::default();
        revision_rules(old, old, &shadow.capabilities.rate_limit.policies, &mut problems);
        assert!(problems.is_empty());
    }
    #[test]
    fn a_gcra_burst_changed_needs_a_new_revision_even_when_it_was_the_default() {
        let gcra = |burst: &str| {
            load(&format!(
                "[capabilities.rate-limit]\ndefault-policy = \"g\"\n\
                 [capabilities.rate-limit.policies.g]\nalgorithm = \"gcra\"\nlimit = 10\n\
                 period = \"1s\"\n{burst}"
            ))
        };
        // No burst is a burst of 10: the same policy, nothing to refuse.
        let (implicit, explicit) = (gcra(""), gcra("burst = 10\n"));
        let (old, same) = (
            &implicit.capabilities.rate_limit.policies,
            &explicit.capabilities.rate_limit.policies,
        );
        let mut problems = ConfigProblems::default();
        revision_rules(old, old, same, &mut problems);
        assert!(problems.is_empty(), "{problems:?}");
        let smaller = gcra("burst = 4\n");
        let mut problems = ConfigProblems::default();
        revision_rules(old, old, &smaller.capabilities.rate_limit.policies, &mut problems);
        let listed: Vec<String> = problems.iter().map(ToString::to_string).collect();
        assert_eq!(listed.len(), 1, "{listed:?}");
        assert!(
            listed[0].starts_with(
                "capabilities.rate-limit.policies.g.revision: burst changed but revision is still 1"
            ),
            "{listed:?}"
        );
    }

    #[test]
    fn a_concurrency_policy_changes_its_parameters_in_place_but_not_its_scope() {
        let exports = |keys: &str| {
            load(&format!(
                "[capabilities.rate-limit]\ndefault-policy = \"exports\"\n\
                 [capabilities.rate-limit.policies.exports]\nalgorithm = \"concurrency\"\n{keys}"
            ))
        };
        let running = exports("max-in-flight = 2\nlease-ttl = \"30s\"\nretry-after = \"1s\"\n");
        let old = &running.capabilities.rate_limit.policies;
        let raised = exports("max-in-flight = 5\nlease-ttl = \"1m\"\nretry-after = \"2s\"\n");
        let mut problems = ConfigProblems::default();
        revision_rules(old, old, &raised.capabilities.rate_limit.policies, &mut problems);
        assert!(problems.is_empty(), "{problems:?}");
        // Another key still needs a revision, as for every algorithm.
        let scoped = exports(
            "max-in-flight = 2\nlease-ttl = \"30s\"\nretry-after = \"1s\"\nscope = \"subject\"\n",
        );
        let mut problems = ConfigProblems::default();
        revision_rules(old, old, &scoped.capabilities.rate_limit.policies, &mut problems);
        let listed: Vec<String> = problems.iter().map(ToString::to_string).collect();
        assert_eq!(listed.len(), 1, "{listed:?}");
        assert!(
            listed[0].starts_with(
                "capabilities.rate-limit.policies.exports.revision: scope changed but revision is \
                 still 1"
            ),
            "{listed:?}"
        );
    }

    #[test]
    fn envoy_rls_rules_reload_and_its_listen_address_needs_a_restart() {
        let rls = |listen: &str, policies: &str| {
            format!(
                "{BASE}\n[envoy-rls]\nlisten = \"{listen}\"\n[[envoy-rls.rules]]\n\
                 domain = \"edge\"\ndescriptor = [\"remote_address\"]\npolicies = {policies}\n"
            )
        };
        let running = load(&rls("127.0.0.1:8081", "\"demo\""));
        let loaded = load(&rls("127.0.0.1:8082", "[\"demo\"]\nsubject = \"remote_address\""));
        let (changed, restart) = changes(&running, &loaded);
        assert_eq!(changed, ["envoy-rls.rules"]);
        assert_eq!(restart, ["envoy-rls.listen"]);
        let next = with_reloadable(&running, &loaded);
        assert_eq!(next.envoy_rls.rules, loaded.envoy_rls.rules);
        assert_eq!(next.envoy_rls.listen, running.envoy_rls.listen);
        assert_eq!(changes(&next, &loaded), (vec![], vec!["envoy-rls.listen".to_owned()]));
    }
}
