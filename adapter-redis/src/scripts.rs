//! `RateLimitScripts`: the rate-limit scripts and their digest registry.
//!
//! One script evaluates a whole policy set (`lua/policy-set.lua`); a set of
//! one policy runs a script specialised to one key of its algorithm
//! (`lua/single-policy.lua`), with the same arguments, reply and answers,
//! because a set of one must stay as cheap as the single-policy scripts
//! were (docs/benchmarks.md). All are composed from the same files: the
//! algorithms in `lua/<algorithm>.lua`, the shared half in
//! `lua/prelude.lua`.
//!
//! Scripts run with `EVALSHA` only. Plain `EVAL` is never sent: the
//! least-privilege ACL user may not run it, and it would ship the whole
//! script on every call.

use std::sync::{Arc, LazyLock, RwLock};
use std::time::Duration;

use redis::Value;
use shared_contract::Algorithm;
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
    /// A set of one fixed-window policy.
    FixedWindow,
    /// A set of one sliding-counter policy.
    SlidingCounter,
    /// A set of one token-bucket policy.
    TokenBucket,
    /// A set of one GCRA policy.
    Gcra,
    /// A set of two or more policies, any algorithms.
    PolicySet,
}

impl ScriptKind {
    /// Every script, in registry order.
    pub const ALL: [Self; 5] =
        [Self::FixedWindow, Self::SlidingCounter, Self::TokenBucket, Self::Gcra, Self::PolicySet];

    /// The script that runs a set of one policy of `algorithm`.
    pub const fn of(algorithm: &Algorithm) -> Self {
        match algorithm {
            Algorithm::FixedWindow { .. } => Self::FixedWindow,
            Algorithm::SlidingCounter { .. } => Self::SlidingCounter,
            Algorithm::TokenBucket { .. } => Self::TokenBucket,
            Algorithm::Gcra { .. } => Self::Gcra,
            // Placeholder until branch leases-redis gives leases their Lua.
            Algorithm::Concurrency { .. } => Self::PolicySet,
        }
    }

    /// The script's name in spans: `fixed-window`, `sliding-counter`,
    /// `token-bucket`, `gcra` or `policy-set`.
    pub const fn name(self) -> &'static str {
        match self {
            Self::FixedWindow => "fixed-window",
            Self::SlidingCounter => "sliding-counter",
            Self::TokenBucket => "token-bucket",
            Self::Gcra => "gcra",
            Self::PolicySet => "policy-set",
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
            Self::FixedWindow => 0,
            Self::SlidingCounter => 1,
            Self::TokenBucket => 2,
            Self::Gcra => 3,
            Self::PolicySet => 4,
        }
    }

    /// The algorithm of a single-key script: its file's name and text,
    /// and the name of the function the file defines.
    const fn algorithm(self) -> Option<LuaAlgorithm> {
        match self {
            Self::FixedWindow => Some(("fixed-window.lua", FIXED_WINDOW, "fixed_window")),
            Self::SlidingCounter => {
                Some(("sliding-counter.lua", SLIDING_COUNTER, "sliding_counter"))
            }
            Self::TokenBucket => Some(("token-bucket.lua", TOKEN_BUCKET, "token_bucket")),
            Self::Gcra => Some(("gcra.lua", GCRA, "gcra")),
            Self::PolicySet => None,
        }
    }

    /// Composes the source from the embedded files.
    fn compose(self) -> String {
        match self.algorithm() {
            Some(algorithm) => compose(SINGLE_POLICY, Some(algorithm)),
            None => compose(POLICY_SET, None),
        }
    }
}

/// The operator's inspect (`lua/inspect.lua`), composed with the prelude
/// that knows every algorithm's tag and header.
pub(crate) fn inspect_source() -> &'static str {
    static SOURCE: LazyLock<String> = LazyLock::new(|| compose(INSPECT, None));
    &SOURCE
}

/// An algorithm's Lua file as [`ScriptKind::algorithm`] names it: file
/// name, text, and the function the file defines.
type LuaAlgorithm = (&'static str, &'static str, &'static str);

/// `driver` with every `-- #include <file>` line replaced by that file, and
/// its `-- #algorithm` line by `algorithm`'s file followed by a line binding
/// `algorithm` to the function that file defines.
fn compose(driver: &str, algorithm: Option<LuaAlgorithm>) -> String {
    let mut source = String::with_capacity(driver.len() + PRELUDE.len() + 8192);
    for line in driver.split_inclusive('\n') {
        if line.trim_end() == ALGORITHM {
            // Only the single-key driver has the line, and it always gets one.
            let (_, file, function) = algorithm.unwrap_or_else(|| panic!("no algorithm to put in"));
            source.push_str(file);
            source.push_str(&format!("local algorithm = {function}\n"));
            continue;
        }
        match line.strip_prefix(INCLUDE).map(str::trim_end) {
            Some(name) => source.push_str(included(name)),
            None => source.push_str(line),
        }
    }
    source
}

/// The file an include line names. The files are embedded, so a name
/// without a file is a mistake in this crate that the first composition
/// (any test that runs a script) reports.
fn included(name: &str) -> &'static str {
    if name == "prelude.lua" {
        return PRELUDE;
    }
    ScriptKind::ALL
        .into_iter()
        .filter_map(ScriptKind::algorithm)
        .find_map(|(file_name, file, _)| (file_name == name).then_some(file))
        .unwrap_or_else(|| panic!("lua: no file {name} to include"))
}

/// What every script shares: arguments, tags and header lengths, dedupe
/// records and the store.
const PRELUDE: &str = include_str!("../lua/prelude.lua");
const FIXED_WINDOW: &str = include_str!("../lua/fixed-window.lua");
const SLIDING_COUNTER: &str = include_str!("../lua/sliding-counter.lua");
const TOKEN_BUCKET: &str = include_str!("../lua/token-bucket.lua");
const GCRA: &str = include_str!("../lua/gcra.lua");
/// The driver over up to 8 keys; its head documents ARGV and the reply.
const POLICY_SET: &str = include_str!("../lua/policy-set.lua");
/// The driver of a set of one.
const SINGLE_POLICY: &str = include_str!("../lua/single-policy.lua");
const INSPECT: &str = include_str!("../lua/inspect.lua");
/// How a driver line names a file to put in its place.
const INCLUDE: &str = "-- #include ";
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
    use shared_contract::AlgorithmKind;

    use super::*;

    #[test]
    fn each_script_has_its_place_in_every_array_sized_from_all() {
        for (at, kind) in ScriptKind::ALL.into_iter().enumerate() {
            assert_eq!(kind.index(), at, "{kind:?}");
        }
        // Composing puts every file in (an unknown include panics), and
        // each single-key script gets its own algorithm.
        for kind in ScriptKind::ALL {
            assert_eq!(kind.algorithm().is_some(), kind != ScriptKind::PolicySet, "{kind:?}");
            assert!(!kind.source().is_empty());
        }
        assert!(!inspect_source().is_empty());
        // One single-key script per algorithm, and the set script.
        assert_eq!(ScriptKind::ALL.len(), AlgorithmKind::ALL.len() + 1);
    }

    #[test]
    #[should_panic(expected = "no file missing.lua")]
    fn an_include_of_a_file_that_does_not_exist_is_refused() {
        compose("-- #include missing.lua\n", None);
    }

    #[test]
    fn each_algorithm_has_its_single_key_script() {
        let window = Duration::from_secs(1);
        assert_eq!(
            ScriptKind::of(&Algorithm::FixedWindow { limit: 1, window }),
            ScriptKind::FixedWindow
        );
        assert_eq!(
            ScriptKind::of(&Algorithm::SlidingCounter { limit: 1, window }),
            ScriptKind::SlidingCounter
        );
        assert_eq!(
            ScriptKind::of(&Algorithm::TokenBucket {
                capacity: 1,
                refill_tokens: 1,
                refill_period: window
            }),
            ScriptKind::TokenBucket
        );
        assert_eq!(
            ScriptKind::of(&Algorithm::Gcra { limit: 1, period: window, burst: 1 }),
            ScriptKind::Gcra
        );
    }
}
