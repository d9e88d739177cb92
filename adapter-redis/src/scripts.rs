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
    /// A set of two or more policies, any algorithms.
    PolicySet,
}

impl ScriptKind {
    /// Every script, in registry order.
    pub const ALL: [Self; 4] =
        [Self::FixedWindow, Self::SlidingCounter, Self::TokenBucket, Self::PolicySet];

    /// The script that runs a set of one policy of `algorithm`.
    pub const fn of(algorithm: &Algorithm) -> Self {
        match algorithm {
            Algorithm::FixedWindow { .. } => Self::FixedWindow,
            Algorithm::SlidingCounter { .. } => Self::SlidingCounter,
            Algorithm::TokenBucket { .. } => Self::TokenBucket,
        }
    }

    /// The whole Lua source sent with `SCRIPT LOAD`: the driver file with
    /// every `-- #include <file>` line replaced by that file.
    pub fn source(self) -> &'static str {
        &SOURCES[self.index()]
    }

    const fn index(self) -> usize {
        match self {
            Self::FixedWindow => 0,
            Self::SlidingCounter => 1,
            Self::TokenBucket => 2,
            Self::PolicySet => 3,
        }
    }

    /// The algorithm file and the name of the function it defines, for the
    /// single-key scripts.
    const fn algorithm(self) -> Option<(&'static str, &'static str)> {
        match self {
            Self::FixedWindow => Some((FIXED_WINDOW, "fixed_window")),
            Self::SlidingCounter => Some((SLIDING_COUNTER, "sliding_counter")),
            Self::TokenBucket => Some((TOKEN_BUCKET, "token_bucket")),
            Self::PolicySet => None,
        }
    }

    /// Composes the source from the embedded files.
    fn compose(self) -> String {
        let (driver, algorithm) = match self.algorithm() {
            Some((file, function)) => {
                // The single-key driver calls `algorithm`: bind it to the
                // one function its file defines.
                (SINGLE_POLICY, format!("{file}local algorithm = {function}\n"))
            }
            None => (POLICY_SET, String::new()),
        };
        let mut source = String::with_capacity(driver.len() + PRELUDE.len() + 8192);
        for line in driver.split_inclusive('\n') {
            match line.strip_prefix(INCLUDE).map(str::trim_end) {
                Some("prelude.lua") => source.push_str(PRELUDE),
                Some("fixed-window.lua") => source.push_str(FIXED_WINDOW),
                Some("sliding-counter.lua") => source.push_str(SLIDING_COUNTER),
                Some("token-bucket.lua") => source.push_str(TOKEN_BUCKET),
                Some("algorithm.lua") => source.push_str(&algorithm),
                // An unknown include is left in place; a pin test fails on it.
                Some(_) | None => source.push_str(line),
            }
        }
        source
    }
}

/// What every script shares: arguments, tags, dedupe records and the store.
const PRELUDE: &str = include_str!("../lua/prelude.lua");
const FIXED_WINDOW: &str = include_str!("../lua/fixed-window.lua");
const SLIDING_COUNTER: &str = include_str!("../lua/sliding-counter.lua");
const TOKEN_BUCKET: &str = include_str!("../lua/token-bucket.lua");
/// The driver over up to 8 keys; its head documents ARGV and the reply.
const POLICY_SET: &str = include_str!("../lua/policy-set.lua");
/// The driver of a set of one.
const SINGLE_POLICY: &str = include_str!("../lua/single-policy.lua");
/// How a driver line names a file to put in its place.
const INCLUDE: &str = "-- #include ";

static SOURCES: LazyLock<[String; 4]> = LazyLock::new(|| ScriptKind::ALL.map(ScriptKind::compose));

/// A process-local digest cache per script: a miss sends `SCRIPT LOAD`, a
/// `NOSCRIPT` reply (the script did not run) clears the cache, reloads and
/// retries `EVALSHA` once; a second `NOSCRIPT` is [`GatewayFailure::NotSent`].
#[derive(Debug, Default)]
pub(crate) struct RateLimitScripts {
    digests: [RwLock<Option<Arc<str>>>; 4],
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
    use shared_contract::{DEDUP_RECORD_BYTES, EvaluationId, MAX_POLICY_SET};

    use super::*;
    use crate::reply::{FAILURE_LEN, PER_KEY, ReplyStatus, SetReply};

    /// The numbers a Lua line `local <names> = <numbers>` sets in `source`,
    /// by name.
    fn lua_numbers(source: &str, names: &[&str]) -> Vec<usize> {
        let definition = format!("local {} = ", names.join(", "));
        let line = source
            .lines()
            .find_map(|line| line.trim().strip_prefix(definition.as_str()))
            .unwrap_or_else(|| panic!("no `{definition}` line"));
        line.split(',')
            .map(|n| n.trim().parse().unwrap_or_else(|_| panic!("`{line}` is not numbers")))
            .collect()
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

    /// The items of the table constructor that follows `opening` in
    /// `source` (items without nested tables or calls).
    fn lua_constructor(source: &str, opening: &str) -> Vec<String> {
        let rest = &source[source.find(opening).expect(opening) + opening.len()..];
        rest[..rest.find('}').expect("a closing brace")]
            .split(',')
            .map(|item| item.trim().to_owned())
            .collect()
    }

    #[test]
    fn a_lua_record_is_the_contract_s_record_and_its_sequence_number() {
        // The contract counts a record as what the script stores for it
        // (DEDUP_RECORD_BYTES): the id field naming remaining, reset_after,
        // written_at and its sequence number (four doubles), and the
        // sequence field (one double) naming the id and written_at.
        let id = std::mem::size_of_val(EvaluationId::random().as_bytes());
        let id_field = id + 4 * 8;
        let seq_field = 8 + id + 8;
        assert_eq!(u32::try_from(id_field + seq_field), Ok(DEDUP_RECORD_BYTES));
        assert!(
            PRELUDE.contains("evaluation_id, struct.pack('dddd', remaining, reset_after, t, seq),")
        );
        assert!(PRELUDE.contains("struct.pack('d', seq), evaluation_id .. struct.pack('d', t))"));
        for driver in [SINGLE_POLICY, POLICY_SET] {
            assert!(driver.contains("struct.unpack('dddd', record)"));
        }
        // The trailer: newest written_at, oldest written_at, oldest seq,
        // next seq, the time the last write asked the key to live to.
        let [trailer] = lua_numbers(PRELUDE, &["TRAILER"])[..] else { panic!("one number") };
        let [legacy] = lua_numbers(PRELUDE, &["LEGACY_TRAILER"])[..] else { panic!("one number") };
        assert_eq!((trailer, legacy), (5 * 8, 3 * 8));
        assert!(
            PRELUDE.contains("struct.pack('ddddd', newest, oldest_at, oldest, next_seq, need)")
        );
    }

    #[test]
    fn each_header_is_its_tag_byte_and_the_doubles_its_algorithm_stores() {
        let tags = lua_numbers(PRELUDE, &["FIXED_WINDOW", "SLIDING_COUNTER", "TOKEN_BUCKET"]);
        let headers = lua_numbers(
            PRELUDE,
            &["FIXED_WINDOW_HEADER", "SLIDING_COUNTER_HEADER", "TOKEN_BUCKET_HEADER"],
        );
        // The adapter sends these tags as the kind argument (adapter.rs).
        assert_eq!(tags, [usize::from(b'F'), usize::from(b'S'), usize::from(b'B')]);
        for ((file, name), header) in [
            (FIXED_WINDOW, "fixed-window"),
            (SLIDING_COUNTER, "sliding-counter"),
            (TOKEN_BUCKET, "token-bucket"),
        ]
        .into_iter()
        .zip(headers)
        {
            let packed: Vec<_> = file
                .split("struct.pack('")
                .skip(1)
                .filter_map(|rest| rest.split('\'').next())
                .collect();
            assert_eq!(packed.len(), 1, "{name} packs its state once");
            // The tag byte, then doubles: the value is packed whole, so the
            // store concatenates nothing but the records trailer.
            let doubles = packed[0].strip_prefix('B').unwrap_or_else(|| panic!("{name} tag"));
            assert!(doubles.chars().all(|c| c == 'd'), "{name} packs {packed:?}");
            assert_eq!(header, 1 + 8 * doubles.len(), "{name} header");
            // The state starts with the algorithm's own tag, then the mark,
            // the effective time.
            let tag = name.to_uppercase().replace('-', "_");
            assert!(file.contains(&format!("struct.pack('{}', {tag}, t, ", packed[0])), "{name}");
        }
        // Lower case marks a shadow policy: the letter plus 32.
        let [shadow, first_shadow] = lua_numbers(PRELUDE, &["SHADOW", "SHADOW_KINDS"])[..] else {
            panic!("two numbers")
        };
        assert_eq!((b'F' + 32, shadow, first_shadow), (b'f', 32, usize::from(b'a')));
    }

    #[test]
    fn every_reply_a_script_sends_has_the_decoder_s_shape_and_a_known_status() {
        let mut sent = Vec::new();
        for kind in ScriptKind::ALL {
            for items in returned_tables(kind.source()) {
                let name = items[0].trim_matches('\'');
                let status = ReplyStatus::from_wire(name.as_bytes())
                    .unwrap_or_else(|| panic!("{kind:?} sends unknown status {name:?}"));
                let expected = match status {
                    // The set driver builds its decided reply key by key.
                    ReplyStatus::Allowed | ReplyStatus::Denied => SetReply::decided_len(1),
                    ReplyStatus::ClockUnsafe | ReplyStatus::Corrupt => FAILURE_LEN,
                };
                assert_eq!(items.len(), expected, "{kind:?}: {items:?}");
                sent.push(status);
            }
        }
        let set = ScriptKind::PolicySet.source();
        assert!(set.contains("reply[1] = 'denied'"));
        // The reply starts 'allowed' with a free (nil) slot for every
        // answer of a set of two, so that set never grows it, and ends at
        // the first nil, so a set of one sends only its own answers.
        let slots = lua_constructor(set, "local reply = {");
        assert_eq!(slots[0], "'allowed'");
        assert!(slots[1..].iter().all(|slot| slot == "nil"), "{slots:?}");
        assert_eq!(slots.len(), SetReply::decided_len(2));
        // Key k's answer sits at 1 + PER_KEY * (k - 1) + 1 ..= 1 + PER_KEY * k.
        assert!(set.contains(&format!("local r = {PER_KEY} * k - {}", PER_KEY - 2)));
        assert!(set.contains("reply[r], reply[r + 1], reply[r + 2], reply[r + 3]"));
        sent.extend([ReplyStatus::Allowed, ReplyStatus::Denied]);
        for status in ReplyStatus::ALL {
            assert!(sent.contains(&status), "no script sends {status:?}");
        }
    }

    #[test]
    fn every_include_is_put_in_once_and_the_single_scripts_bind_their_algorithm() {
        for kind in ScriptKind::ALL {
            let source = kind.source();
            assert!(!source.contains(INCLUDE), "{kind:?}: an include is left in");
            assert_eq!(source.matches(PRELUDE).count(), 1, "{kind:?} prelude");
        }
        for file in [FIXED_WINDOW, SLIDING_COUNTER, TOKEN_BUCKET] {
            assert_eq!(ScriptKind::PolicySet.source().matches(file).count(), 1);
        }
        for kind in [ScriptKind::FixedWindow, ScriptKind::SlidingCounter, ScriptKind::TokenBucket] {
            let (file, function) = kind.algorithm().expect("a single-key script");
            let source = kind.source();
            assert!(source.contains(&format!("{file}local algorithm = {function}\n")), "{kind:?}");
            assert!(source.contains(&format!("local function {function}(raw, t, charge, ")));
            // Only its own algorithm: no closure it does not use.
            let others = [FIXED_WINDOW, SLIDING_COUNTER, TOKEN_BUCKET];
            assert_eq!(others.iter().filter(|other| source.contains(**other)).count(), 1);
        }
    }

    #[test]
    fn the_set_driver_steps_over_the_adapter_s_argv_blocks() {
        // Caller time, cost, id; then per key: kind, four bounds, and two
        // (token bucket: three) algorithm parameters.
        let set = ScriptKind::PolicySet.source();
        assert!(set.contains("local block = 4\n"));
        assert!(set.contains("block = block + 8") && set.contains("block = block + 7"));
        let single = ScriptKind::FixedWindow.source();
        for (index, what) in
            [(4, "kind"), (5, "regression"), (6, "slack"), (7, "ttl"), (8, "capacity")]
        {
            assert!(single.contains(&format!("ARGV[{index}]")), "single-key {what}");
        }
        const { assert!(MAX_POLICY_SET <= 8, "the driver's layout names 1 to 8 keys") };
        // Eleven scratch slots per key, free (nil) for a set of two.
        assert!(set.contains("local s = 11 * k - 10"));
        assert!(!set.contains("7 * k - 6"));
        let scratch = lua_constructor(set, "local scratch = {");
        assert!(scratch.iter().all(|slot| slot == "nil"), "{scratch:?}");
        assert_eq!(scratch.len(), 11 * 2);
        // The counter keys only: records live in them (adapter.rs).
        assert!(set.contains("if kind == TOKEN_BUCKET or kind == TOKEN_BUCKET + SHADOW then at = at + 8 else at = at + 7 end"));
        assert!(single.contains("local key = KEYS[1]\n"));
        assert!(!set.contains("KEYS[n + k]"));
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
    fn each_algorithm_has_its_single_key_script() {
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
        assert!(ScriptKind::PolicySet.source().starts_with("-- Policy set"));
        assert!(ScriptKind::TokenBucket.source().starts_with("-- A set of one policy"));
    }
}
