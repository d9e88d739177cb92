//! `RateLimitScripts`: the rate-limit scripts and their digest registry.
//!
//! One script evaluates a whole policy set (`lua/policy-set.lua`); a set of
//! one policy runs a script specialised to one key of its algorithm
//! (`lua/single-policy.lua`; a concurrency policy's lease set
//! `lua/single-lease.lua`), with the same arguments, reply and answers,
//! because a set of one must stay as cheap as the single-policy scripts
//! were (docs/benchmarks.md). All are composed from the same files: the
//! registered algorithms (each one's file beside its module in
//! `shared-contract`, its tag, header length and ARGV width from the
//! registry), the shared half in
//! `lua/prelude.lua`. A lease goes back through `lua/release.lua`; a
//! request's usage is settled by `lua/settle.lua`, composed the same way.
//!
//! Scripts run with `EVALSHA` only. Plain `EVAL` is never sent: the
//! least-privilege ACL user may not run it, and it would ship the whole
//! script on every call.

use std::sync::{Arc, LazyLock, RwLock};
use std::time::Duration;

use redis::Value;
use shared_contract::{Algorithm, AlgorithmKind, Lua};
use tokio::time::Instant;

use crate::gateway::{GatewayFailure, LoadedScript, RedisGateway, WaitFor};

/// What a script call brought back.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Sent {
    /// The script's raw reply.
    pub(crate) reply: Value,
    /// With `WAIT`: the replicas that acknowledged, or why `WAIT` gave no
    /// count. `None` when no `WAIT` was sent.
    pub(crate) replicas: Option<Result<u64, GatewayFailure>>,
}

/// Which script.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScriptKind {
    /// A set of one policy of the algorithm.
    Single(AlgorithmKind),
    /// A set of two or more policies, any algorithms.
    PolicySet,
    /// The release of a lease under its set's concurrency policies.
    Release,
    /// The settle of a request's usage against its reservation.
    Settle,
}

/// How many algorithms are registered.
const ALGORITHMS: usize = AlgorithmKind::ALL.len();

impl ScriptKind {
    /// Every script, in registry order: one per algorithm, then the set
    /// driver, the release and the settle.
    pub const ALL: [Self; ALGORITHMS + 3] = {
        let mut all = [Self::PolicySet; ALGORITHMS + 3];
        let mut at = 0;
        while at < ALGORITHMS {
            all[at] = Self::Single(AlgorithmKind::ALL[at]);
            at += 1;
        }
        all[ALGORITHMS + 1] = Self::Release;
        all[ALGORITHMS + 2] = Self::Settle;
        all
    };

    /// The script that runs a set of one policy of `algorithm`.
    pub const fn of(algorithm: &Algorithm) -> Self {
        Self::Single(algorithm.kind())
    }

    /// The script's name in spans: its algorithm's name (`fixed-window`,
    /// ...), `policy-set`, `release` or `settle`.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Single(kind) => kind.name(),
            Self::PolicySet => "policy-set",
            Self::Release => "release",
            Self::Settle => "settle",
        }
    }

    /// The whole Lua source sent with `SCRIPT LOAD`: the driver file with
    /// every `-- #include <file>` line replaced by that file.
    pub fn source(self) -> &'static str {
        &SOURCES[self.index()]
    }

    /// This script's place in [`ScriptKind::ALL`] and in every array
    /// sized from it.
    const fn index(self) -> usize {
        match self {
            Self::Single(kind) => kind as usize,
            Self::PolicySet => ALGORITHMS,
            Self::Release => ALGORITHMS + 1,
            Self::Settle => ALGORITHMS + 2,
        }
    }

    /// Composes the source from the embedded files.
    fn compose(self) -> String {
        match self {
            // A lease key is a sorted set, not a state header: its own
            // driver.
            Self::Single(kind) if kind.holds_leases() => compose(SINGLE_LEASE, Some(kind.lua())),
            Self::Single(kind) => compose(SINGLE_POLICY, Some(kind.lua())),
            Self::PolicySet => compose(POLICY_SET, None),
            Self::Release => RELEASE.to_owned(),
            Self::Settle => compose(SETTLE, None),
        }
    }
}

/// The operator's inspect (`lua/inspect.lua`), composed with the prelude
/// that knows every algorithm's tag and header.
pub(crate) fn inspect_source() -> &'static str {
    static SOURCE: LazyLock<String> = LazyLock::new(|| compose(INSPECT, None));
    &SOURCE
}

/// `driver` with every `-- #include <file>` line replaced by that file
/// (composed in turn), its `-- #algorithm` line by `algorithm`'s file
/// followed by a line binding `algorithm` to the function that file
/// defines, and every other `-- #<part>` line by the part [`written`].
fn compose(driver: &str, algorithm: Option<Lua>) -> String {
    let mut source = String::with_capacity(driver.len() + PRELUDE.len() + 8192);
    compose_into(driver, algorithm, &mut source);
    source
}

fn compose_into(driver: &str, algorithm: Option<Lua>, source: &mut String) {
    for line in driver.split_inclusive('\n') {
        if line.trim_end() == ALGORITHM {
            // Only the single-key drivers have the line, and they always get one.
            let lua = algorithm.unwrap_or_else(|| panic!("no algorithm to put in"));
            source.push_str(lua.source);
            source.push_str(&format!("local algorithm = {}\n", lua.function));
            continue;
        }
        match line.strip_prefix(INCLUDE).map(str::trim_end) {
            Some(name) => compose_into(included(name), algorithm, source),
            None => match line.trim_end().strip_prefix(WRITTEN) {
                Some(part) => written(part, source),
                None => source.push_str(line),
            },
        }
    }
}

/// The Lua a `-- #<part>` line of the prelude or the set driver stands
/// for, written from the registry so neither file names an algorithm:
/// `tags` the tag constants (each algorithm's function name in upper case,
/// and `LEASES`, the lease algorithm's), `headers` the branches of
/// `header_of`, `widths` each kind's ARGV block width, `runs` the local
/// each algorithm's function is bound to, `load` the branch that includes
/// its file on its first key, `charge` and `spare` the branches that run it,
/// `settle` those that run every algorithm but the lease one with the
/// settle's `charge` ('force', or a refund's reservation time: settle.lua).
fn written(part: &str, source: &mut String) {
    let all = AlgorithmKind::ALL.map(|kind| (kind, kind.lua()));
    let constant = |lua: &Lua| lua.function.to_ascii_uppercase();
    // A lease algorithm also gets the common block's regression bound.
    let call = |kind: AlgorithmKind, lua: &Lua, charge: &str| {
        let mut arguments: Vec<String> =
            (0..lua.arity).map(|at| format!("ARGV[b + {}] + 0", 5 + at)).collect();
        if kind.holds_leases() {
            arguments.push("ARGV[b + 1] + 0".to_owned());
        }
        format!("{}_run(raw, t, {charge}, {})", lua.function, arguments.join(", "))
    };
    let mut leases = all.iter().filter(|(kind, _)| kind.holds_leases());
    let lease = leases.next();
    assert!(leases.next().is_none(), "lua: one algorithm at most may hold leases");
    let mut out = String::new();
    let line = |out: &mut String, text: String| {
        out.push_str(&text);
        out.push('\n');
    };
    match part {
        "tags" => {
            let names: Vec<String> = all.iter().map(|(_, lua)| constant(lua)).collect();
            let tags: Vec<String> = all.iter().map(|(kind, _)| kind.tag().to_string()).collect();
            line(&mut out, format!("local {} = {}", names.join(", "), tags.join(", ")));
            // No lease algorithm: a kind no byte reaches.
            let tag = lease.map_or(-1, |(kind, _)| i32::from(kind.tag()));
            line(&mut out, format!("local LEASES = {tag}"));
        }
        "headers" => {
            let mut first = true;
            for (_, lua) in all.iter().filter(|(_, lua)| lua.header > 0) {
                let branch = if first { "if" } else { "elseif" };
                line(&mut out, format!("  {branch} tag == {} then", constant(lua)));
                line(&mut out, format!("    header = {}", lua.header));
                first = false;
            }
            line(
                &mut out,
                if first { "  return nil".into() } else { "  else\n    return nil\n  end".into() },
            );
        }
        "widths" => {
            // The first algorithm's width is the fallback, tested last.
            let usual = all[0].1.arity;
            let mut first = true;
            let mut arities: Vec<usize> = all.iter().map(|(_, lua)| lua.arity).collect();
            arities.sort_unstable();
            arities.dedup();
            for arity in arities.into_iter().filter(|&arity| arity != usual) {
                let kinds: Vec<String> = all
                    .iter()
                    .filter(|(_, lua)| lua.arity == arity)
                    .map(|(_, lua)| {
                        let name = constant(lua);
                        format!("kind == {name} or kind == {name} + SHADOW")
                    })
                    .collect();
                let branch = if first { "if" } else { "elseif" };
                line(&mut out, format!("  {branch} {} then", kinds.join(" or ")));
                line(&mut out, format!("    at = at + {}", 5 + arity));
                first = false;
            }
            if first {
                line(&mut out, format!("  at = at + {}", 5 + usual));
            } else {
                line(&mut out, format!("  else\n    at = at + {}\n  end", 5 + usual));
            }
        }
        "runs" => {
            let runs: Vec<String> =
                all.iter().map(|(_, lua)| format!("{}_run", lua.function)).collect();
            let nils = vec!["nil"; runs.len()];
            line(&mut out, format!("local {} = {}", runs.join(", "), nils.join(", ")));
        }
        "load" => {
            for (at, (kind, lua)) in all.iter().enumerate() {
                let branch = if at == 0 { "if" } else { "elseif" };
                line(&mut out, format!("  {branch} tag == {} then", constant(lua)));
                line(&mut out, format!("    if not {}_run then", lua.function));
                out.push_str(lua.source);
                line(&mut out, format!("      {0}_run = {0}", lua.function));
                if kind.holds_leases() {
                    line(
                        &mut out,
                        "      lease_read_run, lease_store_run = lease_read, lease_store".into(),
                    );
                    line(&mut out, "      lease_held_on_time_run = lease_held_on_time".into());
                }
                line(&mut out, "    end".into());
            }
            line(&mut out, "  end".into());
        }
        "charge" => {
            for (at, (kind, lua)) in all.iter().enumerate() {
                let branch = if at == 0 { "if" } else { "elseif" };
                line(&mut out, format!("    {branch} tag == {} then", constant(lua)));
                line(
                    &mut out,
                    "      allowed, remaining, reset_after, retry_after, state, state_end =".into(),
                );
                line(&mut out, format!("        {}", call(*kind, lua, "true")));
            }
            line(&mut out, "    else\n      failed = k\n    end".into());
        }
        "spare" => {
            if let Some((kind, lua)) = lease {
                line(&mut out, format!("    if tag == {} then", constant(lua)));
                line(&mut out, format!("      return {}", call(*kind, lua, "false")));
                line(&mut out, "    end".into());
            }
            line(&mut out, "    if raw and byte(raw, 1) ~= tag then return nil end".into());
            let mut first = true;
            for (kind, lua) in all.iter().filter(|(kind, _)| !kind.holds_leases()) {
                let branch = if first { "if" } else { "elseif" };
                line(&mut out, format!("    {branch} tag == {} then", constant(lua)));
                line(&mut out, format!("      return {}", call(*kind, lua, "false")));
                first = false;
            }
            if !first {
                line(&mut out, "    end".into());
            }
        }
        "settle" => {
            // A lease key takes no settle: its kind falls to the corrupt branch.
            let mut first = true;
            for (kind, lua) in all.iter().filter(|(kind, _)| !kind.holds_leases()) {
                let branch = if first { "if" } else { "elseif" };
                line(&mut out, format!("    {branch} tag == {} then", constant(lua)));
                line(&mut out, "      _, remaining, reset_after, _, state, state_end =".into());
                line(&mut out, format!("        {}", call(*kind, lua, "charge")));
                first = false;
            }
            let corrupt = "      return {'corrupt', k}";
            if first {
                line(&mut out, format!("    do\n{corrupt}\n    end"));
            } else {
                line(&mut out, format!("    else\n{corrupt}\n    end"));
            }
        }
        _ => panic!("lua: no part {part} to write"),
    }
    source.push_str(&out);
}

/// The file an include line names. The files are embedded, so a name
/// without a file is a mistake in this crate that the first composition
/// (any test that runs a script) reports.
fn included(name: &str) -> &'static str {
    if name == "prelude.lua" {
        return PRELUDE;
    }
    AlgorithmKind::ALL
        .into_iter()
        .map(AlgorithmKind::lua)
        .find_map(|lua| (lua.file == name).then_some(lua.source))
        .unwrap_or_else(|| panic!("lua: no file {name} to include"))
}

/// What every script shares: arguments, tags and header lengths, dedupe
/// records and the store.
const PRELUDE: &str = include_str!("../lua/prelude.lua");
/// The driver over up to 8 keys; its head documents ARGV and the reply.
const POLICY_SET: &str = include_str!("../lua/policy-set.lua");
/// The driver of a set of one.
const SINGLE_POLICY: &str = include_str!("../lua/single-policy.lua");
/// The driver of a set of one concurrency policy.
const SINGLE_LEASE: &str = include_str!("../lua/single-lease.lua");
/// A lease's release; stands alone.
const RELEASE: &str = include_str!("../lua/release.lua");
/// A request's usage settled over its set; its head documents ARGV and the reply.
const SETTLE: &str = include_str!("../lua/settle.lua");
const INSPECT: &str = include_str!("../lua/inspect.lua");
/// How a driver line names a file to put in its place.
const INCLUDE: &str = "-- #include ";
/// How a line names a part written from the registry ([`written`]).
const WRITTEN: &str = "-- #";
/// The single-key driver's line for its algorithm.
const ALGORITHM: &str = "-- #algorithm";

static SOURCES: LazyLock<[String; ScriptKind::ALL.len()]> =
    LazyLock::new(|| ScriptKind::ALL.map(ScriptKind::compose));

/// A process-local digest cache per script: a miss sends `SCRIPT LOAD`, a
/// `NOSCRIPT` reply (the script did not run) clears the cache, reloads and
/// retries `EVALSHA` once; a second `NOSCRIPT` is [`GatewayFailure::NotSent`].
#[derive(Debug, Default)]
pub(crate) struct RateLimitScripts {
    digests: [RwLock<Option<Arc<str>>>; ScriptKind::ALL.len()],
}

impl RateLimitScripts {
    /// An empty registry: every script loads on first use.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// The cached digest of a script, if loaded.
    pub(crate) fn cached_digest(&self, kind: ScriptKind) -> Option<Arc<str>> {
        self.digests[kind.index()].read().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }

    fn store(&self, kind: ScriptKind, digest: Option<Arc<str>>) {
        *self.digests[kind.index()].write().unwrap_or_else(|poisoned| poisoned.into_inner()) =
            digest;
    }

    /// Runs a script on `keys` (one subject's, one hash tag) with `args`,
    /// with `WAIT` after it in the same round trip when `wait` is set
    /// ([`Sent::replicas`] is then `Some`). Each gateway call waits at most
    /// `command_timeout`, and never past `deadline`.
    #[allow(clippy::too_many_arguments, reason = "the script call's arguments plus the WAIT")]
    pub(crate) async fn evaluate_then_wait(
        &self,
        gateway: &dyn RedisGateway,
        kind: ScriptKind,
        keys: &[String],
        args: &[Arc<[u8]>],
        wait: Option<WaitFor>,
        command_timeout: Duration,
        deadline: Instant,
    ) -> Result<Sent, GatewayFailure> {
        let budget = || {
            let left = deadline.saturating_duration_since(Instant::now());
            (!left.is_zero()).then(|| left.min(command_timeout)).ok_or(GatewayFailure::NotSent)
        };
        let source = kind.source();
        let key = keys.first().map_or("", String::as_str);
        let send = async |digest: Arc<str>, timeout: Duration| {
            let script = LoadedScript { digest, source };
            match wait {
                None => gateway
                    .evalsha(&script, keys, args, timeout)
                    .await
                    .map(|reply| Sent { reply, replicas: None }),
                Some(wait) => gateway
                    .evalsha_then_wait(&script, keys, args, wait, timeout)
                    .await
                    .map(|acked| Sent { reply: acked.reply, replicas: Some(acked.replicas) }),
            }
        };
        let digest = match self.cached_digest(kind) {
            Some(digest) => digest,
            None => self.load(gateway, kind, key, budget()?).await?,
        };
        match send(digest, budget()?).await {
            Err(GatewayFailure::NoScript) => {
                // The server lost its script cache (restart, SCRIPT FLUSH,
                // failover), or in a cluster this key's node never saw the
                // script: NOSCRIPT proves nothing ran, so one retry is safe.
                self.store(kind, None);
                let digest = self.load(gateway, kind, key, budget()?).await?;
                match send(digest, budget()?).await {
                    Err(GatewayFailure::NoScript) => Err(GatewayFailure::NotSent),
                    other => other,
                }
            }
            other => other,
        }
    }

    async fn load(
        &self,
        gateway: &dyn RedisGateway,
        kind: ScriptKind,
        key: &str,
        timeout: Duration,
    ) -> Result<Arc<str>, GatewayFailure> {
        // In a cluster the script must reach the node that will run it.
        match gateway.script_load(kind.source(), key, timeout).await {
            Ok(digest) => {
                let digest: Arc<str> = digest.into();
                self.store(kind, Some(digest.clone()));
                Ok(digest)
            }
            // SCRIPT LOAD charges nothing, so however it failed, the
            // evaluation itself was never sent.
            Err(
                GatewayFailure::TimedOut
                | GatewayFailure::ConnectionLost
                | GatewayFailure::NoScript
                | GatewayFailure::WrongType
                | GatewayFailure::ScriptError
                | GatewayFailure::UnexpectedReply
                | GatewayFailure::NotSent,
            ) => Err(GatewayFailure::NotSent),
            Err(GatewayFailure::Refused) => Err(GatewayFailure::Refused),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_script_has_its_place_in_every_array_sized_from_all() {
        for (at, kind) in ScriptKind::ALL.into_iter().enumerate() {
            assert_eq!(kind.index(), at, "{kind:?}");
        }
        // Composing puts every file in (an unknown include panics).
        for kind in ScriptKind::ALL {
            assert!(!kind.source().is_empty());
            assert!(!kind.source().contains(INCLUDE), "{kind:?} left an include line");
        }
        assert!(!inspect_source().is_empty());
        // One single-key script per algorithm, the set script, the release
        // and the settle.
        for algorithm in AlgorithmKind::ALL {
            assert!(ScriptKind::ALL.contains(&ScriptKind::Single(algorithm)), "{algorithm}");
        }
        assert_eq!(ScriptKind::ALL.len(), AlgorithmKind::ALL.len() + 3);
    }

    #[test]
    #[should_panic(expected = "no file missing.lua")]
    fn an_include_of_a_file_that_does_not_exist_is_refused() {
        compose("-- #include missing.lua\n", None);
    }
}
