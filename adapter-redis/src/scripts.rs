//! `RateLimitScripts`: the three Lua scripts and their digest registry.
//!
//! Scripts run with `EVALSHA` only. Plain `EVAL` is never sent: the
//! least-privilege ACL user may not run it, and it would ship the whole
//! script on every call.

use std::sync::{Arc, LazyLock, RwLock};
use std::time::Duration;

use redis::Value;
use shared_contract::Algorithm;
use tokio::time::Instant;

use crate::gateway::{GatewayFailure, LoadedScript, RedisGateway};

/// Which of the three scripts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScriptKind {
    /// `lua/fixed-window.lua`.
    FixedWindow,
    /// `lua/sliding-counter.lua`.
    SlidingCounter,
    /// `lua/token-bucket.lua`.
    TokenBucket,
}

impl ScriptKind {
    /// Every script, in registry order.
    pub const ALL: [Self; 3] = [Self::FixedWindow, Self::SlidingCounter, Self::TokenBucket];

    /// The script that runs `algorithm`.
    pub const fn of(algorithm: &Algorithm) -> Self {
        match algorithm {
            Algorithm::FixedWindow { .. } => Self::FixedWindow,
            Algorithm::SlidingCounter { .. } => Self::SlidingCounter,
            Algorithm::TokenBucket { .. } => Self::TokenBucket,
        }
    }

    /// The whole Lua source sent with `SCRIPT LOAD`: the algorithm's file
    /// with `lua/prelude.lua` put in at its include line.
    pub fn source(self) -> &'static str {
        &SOURCES[self.index()]
    }

    /// The algorithm's own file, embedded from `lua/`.
    const fn algorithm_file(self) -> &'static str {
        match self {
            Self::FixedWindow => include_str!("../lua/fixed-window.lua"),
            Self::SlidingCounter => include_str!("../lua/sliding-counter.lua"),
            Self::TokenBucket => include_str!("../lua/token-bucket.lua"),
        }
    }

    const fn index(self) -> usize {
        match self {
            Self::FixedWindow => 0,
            Self::SlidingCounter => 1,
            Self::TokenBucket => 2,
        }
    }
}

/// What the three scripts share: arguments, the clock bound, dedupe replay,
/// record keeping and the store. Written once, put into each script.
const PRELUDE: &str = include_str!("../lua/prelude.lua");
/// The line of an algorithm file that the prelude replaces.
const PRELUDE_INCLUDE: &str = "-- #include prelude.lua\n";

static SOURCES: LazyLock<[String; 3]> = LazyLock::new(|| {
    ScriptKind::ALL.map(|kind| kind.algorithm_file().replacen(PRELUDE_INCLUDE, PRELUDE, 1))
});

/// A process-local digest cache per script: a miss sends `SCRIPT LOAD`, a
/// `NOSCRIPT` reply (the script did not run) clears the cache, reloads and
/// retries `EVALSHA` once; a second `NOSCRIPT` is [`GatewayFailure::NotSent`].
#[derive(Debug, Default)]
pub(crate) struct RateLimitScripts {
    digests: [RwLock<Option<Arc<str>>>; 3],
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

    /// Runs a script on `key` with `args`. Each gateway call waits at most
    /// `command_timeout`, and never past `deadline`.
    pub(crate) async fn evaluate(
        &self,
        gateway: &dyn RedisGateway,
        kind: ScriptKind,
        key: &str,
        args: &[Vec<u8>],
        command_timeout: Duration,
        deadline: Instant,
    ) -> Result<Value, GatewayFailure> {
        let budget = || {
            let left = deadline.saturating_duration_since(Instant::now());
            (!left.is_zero()).then(|| left.min(command_timeout)).ok_or(GatewayFailure::NotSent)
        };
        let source = kind.source();
        let digest = match self.cached_digest(kind) {
            Some(digest) => digest,
            None => self.load(gateway, kind, key, budget()?).await?,
        };
        match gateway.evalsha(&LoadedScript { digest, source }, key, args, budget()?).await {
            Err(GatewayFailure::NoScript) => {
                // The server lost its script cache (restart, SCRIPT FLUSH,
                // failover), or in a cluster this key's node never saw the
                // script: NOSCRIPT proves nothing ran, so one retry is safe.
                self.store(kind, None);
                let digest = self.load(gateway, kind, key, budget()?).await?;
                match gateway.evalsha(&LoadedScript { digest, source }, key, args, budget()?).await
                {
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
    use shared_contract::{DEDUP_RECORD_BYTES, EvaluationId};

    use super::*;
    use crate::reply::{ReplyStatus, ScriptReply};

    /// The number a Lua line `local <name> = <number>` sets in `source`.
    fn lua_number(source: &str, name: &str) -> usize {
        let definition = format!("local {name} = ");
        let line = source
            .lines()
            .find_map(|line| line.trim().strip_prefix(definition.as_str()))
            .unwrap_or_else(|| panic!("no `{definition}` line"));
        line.trim().parse().unwrap_or_else(|_| panic!("`{definition}{line}` is not a number"))
    }

    /// The elements of every `return {...}` table in `source`, split at the
    /// commas outside parentheses.
    fn returned_tables(source: &str) -> Vec<Vec<String>> {
        source
            .split("return {")
            .skip(1)
            .map(|rest| {
                let body = &rest[..rest.find('}').expect("a closing brace")];
                let (mut items, mut item, mut depth) = (Vec::new(), String::new(), 0_i32);
                for c in body.chars() {
                    match c {
                        '(' => depth += 1,
                        ')' => depth -= 1,
                        ',' if depth == 0 => {
                            items.push(item.trim().to_owned());
                            item.clear();
                            continue;
                        }
                        _ => {}
                    }
                    item.push(c);
                }
                items.push(item.trim().to_owned());
                items
            })
            .collect()
    }

    #[test]
    fn the_lua_record_size_is_the_contract_s() {
        let record = lua_number(PRELUDE, "RECORD");
        assert_eq!(u32::try_from(record), Ok(DEDUP_RECORD_BYTES), "lua/prelude.lua RECORD");
        // A record is the evaluation id, then remaining, reset_after and
        // written_at as doubles.
        let id = std::mem::size_of_val(EvaluationId::random().as_bytes());
        assert!(PRELUDE.contains("records .. evaluation_id .. struct.pack('ddd', "));
        assert_eq!(record, id + 3 * 8, "id bytes + three doubles");
    }

    #[test]
    fn each_header_is_its_tag_byte_and_the_doubles_it_stores() {
        let mut tags = Vec::new();
        for kind in ScriptKind::ALL {
            let file = kind.algorithm_file();
            let packed = file
                .split("store(struct.pack('")
                .nth(1)
                .and_then(|rest| rest.split('\'').next())
                .unwrap_or_else(|| panic!("{kind:?} stores no packed state"));
            assert!(packed.chars().all(|c| c == 'd'), "{kind:?} packs {packed:?}");
            assert_eq!(lua_number(file, "HEADER"), 1 + 8 * packed.len(), "{kind:?} HEADER");
            let tag = file
                .lines()
                .find_map(|line| line.strip_prefix("local TAG = '"))
                .and_then(|rest| rest.strip_suffix('\''))
                .unwrap_or_else(|| panic!("{kind:?} has no one-byte TAG"));
            assert_eq!(tag.len(), 1, "{kind:?} TAG");
            tags.push(tag);
        }
        tags.sort_unstable();
        tags.dedup();
        assert_eq!(tags.len(), ScriptKind::ALL.len(), "every algorithm has its own tag");
    }

    #[test]
    fn every_reply_a_script_sends_has_the_decoder_s_arity_and_a_known_status() {
        let mut sent = Vec::new();
        for kind in ScriptKind::ALL {
            let tables = returned_tables(kind.source());
            assert!(!tables.is_empty(), "{kind:?} returns nothing");
            for items in tables {
                assert_eq!(items.len(), ScriptReply::LEN, "{kind:?}: {items:?}");
                let name = items[0].trim_matches('\'');
                let status = ReplyStatus::from_wire(name.as_bytes());
                assert!(status.is_some(), "{kind:?} sends unknown status {name:?}");
                sent.extend(status);
            }
        }
        for status in ReplyStatus::ALL {
            assert!(sent.contains(&status), "no script sends {status:?}");
        }
    }

    #[test]
    fn every_script_holds_the_prelude_once_after_its_tag_and_header() {
        for kind in ScriptKind::ALL {
            let file = kind.algorithm_file();
            assert_eq!(file.matches(PRELUDE_INCLUDE).count(), 1, "{kind:?} include line");
            let source = kind.source();
            assert!(!source.contains(PRELUDE_INCLUDE), "{kind:?} include left in");
            assert_eq!(source.matches(PRELUDE).count(), 1, "{kind:?} prelude");
            let prelude_at = source.find(PRELUDE).unwrap_or(usize::MAX);
            for definition in ["local TAG = ", "local HEADER = "] {
                let at = source.find(definition).unwrap_or(usize::MAX);
                assert!(at < prelude_at, "{kind:?}: {definition} must come before the prelude");
            }
        }
    }

    #[test]
    fn scripts_take_caller_time_and_never_call_time() {
        for kind in ScriptKind::ALL {
            let source = kind.source();
            assert!(!source.contains("'TIME'") && !source.contains("\"TIME\""), "{kind:?}");
            assert!(!source.contains("tostring"), "{kind:?} formats a number");
            assert!(source.contains("local now = tonumber(ARGV[1])"), "{kind:?}");
        }
    }

    #[test]
    fn each_algorithm_has_its_script() {
        let window = Duration::from_secs(1);
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
        assert!(ScriptKind::TokenBucket.source().starts_with("-- Token bucket"));
    }
}
