//! What a least-privilege Redis ACL user needs for this provider, in one
//! place: `ca-skeleton redis-acl` prints it and the ACL tests run on it.
//!
//! The commands were found against real servers with everything else
//! denied: the scripts (`EVALSHA`, `SCRIPT LOAD`), the readiness probe
//! (`PING`), `INFO` (read on each new connection: whether
//! `maxmemory-policy` can evict counters, `crate::eviction`; `CONFIG GET`
//! is never needed), `TIME` (the scripts read Redis's clock to tell which
//! caller clock is wrong, docs/algorithms.md step 3), and the commands the
//! scripts call, because Redis checks those
//! against the caller's ACL too (so all stay limited to the key pattern):
//! `GET` and `SET` on the counter keys of policies without dedupe, and
//! `HMGET`, `HSET`, `HDEL`, `UNLINK` and `PEXPIRE` on those with dedupe
//! records (a hash; docs/algorithms.md, "Stored state on Redis"),
//! `ZMSCORE`, `ZCOUNT`, `ZADD` and `ZREMRANGEBYSCORE` (and `PEXPIRE`) on a
//! concurrency policy's lease set, `ZSCORE` and `ZREM` for a lease's
//! release (`lua/release.lua`), plus `TYPE` and `ZRANGE` for an operator's
//! inspect (`lua/inspect.lua`). `AUTH` is open to every user; the client's `CLIENT SETINFO`
//! at connect is sent with its reply ignored, so denying it costs nothing.
//! A cluster client also reads its slot map (`CLUSTER SLOTS`) and sends
//! `ASKING` to follow an `ASK` redirect while a slot migrates (without it
//! the migration test's ASK step is refused); `CLUSTER SHARDS` and
//! `READONLY` are never sent (no reads from replicas). `EVAL` is never
//! needed.
//!
//! On the Sentinel topology the client checks that the node the sentinels
//! name is a master (`ROLE`) before it uses it, so the data user also needs
//! `+role`; the sentinels themselves are asked by another user (their ACLs
//! are their own), whose rules are [`sentinel_user_rules`]. With
//! `wait-replicas` set, `WAIT` follows every charging script
//! ([`user_rules_for`] adds `+wait`).

use crate::settings::{RedisSettings, Topology};

/// What every topology needs: the scripts, the probe and the commands the
/// scripts call.
const EVERY_TOPOLOGY: [&str; 20] = [
    "+evalsha",
    "+script|load",
    "+ping",
    "+info",
    "+time",
    "+get",
    "+set",
    "+hmget",
    "+hset",
    "+hdel",
    "+unlink",
    "+pexpire",
    "+type",
    "+zmscore",
    "+zcount",
    "+zadd",
    "+zremrangebyscore",
    "+zscore",
    "+zrem",
    "+zrange",
];
/// What a cluster client adds: the slot map and `ASK` redirects.
const CLUSTER: [&str; 2] = ["+cluster|slots", "+asking"];
/// What the Sentinel topology adds: the role check of the master the
/// sentinels name.
const SENTINEL: [&str; 1] = ["+role"];
/// What the client sends a sentinel: `ROLE` (to check it is a sentinel)
/// and `SENTINEL MASTERS` (the masters it monitors, with their flags, so a
/// master it holds down is skipped).
const SENTINEL_SIDE: [&str; 2] = ["+role", "+sentinel|masters"];

/// The commands the provider sends on `topology`, as `ACL SETUSER` rules
/// (`+evalsha`, `+script|load`, ...), in a fixed order. Without `WAIT`;
/// see [`user_rules_for`].
pub fn required_commands(topology: Topology) -> Vec<&'static str> {
    let own: &[&str] = match topology {
        Topology::Standalone => &[],
        Topology::Cluster => &CLUSTER,
        Topology::Sentinel => &SENTINEL,
    };
    EVERY_TOPOLOGY.iter().chain(own).copied().collect()
}

/// What a sentinel must allow the provider's sentinel user, as
/// `ACL SETUSER` rules after its login ones: no keys, no channels, only
/// `ROLE` and `SENTINEL MASTERS`.
pub fn sentinel_user_rules() -> Vec<String> {
    let mut rules = vec!["resetkeys".to_owned(), "resetchannels".to_owned(), "-@all".to_owned()];
    rules.extend(SENTINEL_SIDE.iter().map(|command| (*command).to_owned()));
    rules
}

/// The `ACL SETUSER` key pattern of every key under `key_prefix`:
/// `~<prefix>*`, with the prefix's glob characters escaped.
pub fn key_pattern(key_prefix: &str) -> String {
    let mut pattern = String::with_capacity(key_prefix.len() + 2);
    pattern.push('~');
    for c in key_prefix.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            pattern.push('\\');
        }
        pattern.push(c);
    }
    pattern.push('*');
    pattern
}

/// The rules of the user after its login ones (`reset on <password>`):
/// the key pattern, no Pub/Sub channels, no command but
/// [`required_commands`].
pub fn user_rules(key_prefix: &str, topology: Topology) -> Vec<String> {
    let mut rules = vec![key_pattern(key_prefix), "resetchannels".to_owned(), "-@all".to_owned()];
    rules.extend(required_commands(topology).into_iter().map(str::to_owned));
    rules
}

/// [`user_rules`] for the settings' prefix and topology, plus `+wait` when
/// `wait_replicas` asks for replica acknowledgements.
pub fn user_rules_for(settings: &RedisSettings) -> Vec<String> {
    let mut rules = user_rules(&settings.key_prefix, settings.topology);
    if settings.wait_replicas > 0 {
        rules.push("+wait".to_owned());
    }
    rules
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cluster_needs_the_standalone_commands_and_its_own() {
        assert_eq!(
            required_commands(Topology::Standalone),
            [
                "+evalsha",
                "+script|load",
                "+ping",
                "+info",
                "+time",
                "+get",
                "+set",
                "+hmget",
                "+hset",
                "+hdel",
                "+unlink",
                "+pexpire",
                "+type",
                "+zmscore",
                "+zcount",
                "+zadd",
                "+zremrangebyscore",
                "+zscore",
                "+zrem",
                "+zrange"
            ]
        );
        // The others: the standalone commands, then their own.
        let standalone = required_commands(Topology::Standalone);
        assert_eq!(
            required_commands(Topology::Cluster),
            [standalone.as_slice(), &["+cluster|slots", "+asking"]].concat()
        );
        assert_eq!(
            required_commands(Topology::Sentinel),
            [standalone.as_slice(), &["+role"]].concat()
        );
        for topology in Topology::ALL {
            assert!(!required_commands(topology).iter().any(|rule| rule.contains("eval|")));
            assert!(!required_commands(topology).contains(&"+eval"));
        }
    }

    #[test]
    fn glob_characters_of_the_prefix_are_escaped() {
        assert_eq!(key_pattern("ca:rl:"), "~ca:rl:*");
        assert_eq!(key_pattern("app*[x]?\\:"), "~app\\*\\[x\\]\\?\\\\:*");
    }

    #[test]
    fn the_rules_hold_the_pattern_then_nothing_but_the_commands() {
        assert_eq!(
            user_rules("ca:rl:", Topology::Standalone).join(" "),
            "~ca:rl:* resetchannels -@all +evalsha +script|load +ping +info +time +get +set +hmget +hset +hdel \
             +unlink +pexpire +type +zmscore +zcount +zadd +zremrangebyscore +zscore +zrem +zrange"
        );
    }

    #[test]
    fn wait_adds_its_own_rule_and_the_sentinels_get_only_discovery() {
        let sentinel = RedisSettings {
            topology: Topology::Sentinel,
            wait_replicas: 1,
            ..RedisSettings::default()
        };
        assert_eq!(
            user_rules_for(&sentinel).join(" "),
            "~ca:rl:* resetchannels -@all +evalsha +script|load +ping +info +time +get +set +hmget +hset +hdel \
             +unlink +pexpire +type +zmscore +zcount +zadd +zremrangebyscore +zscore +zrem +zrange \
             +role +wait"
        );
        let no_wait = RedisSettings { wait_replicas: 0, ..sentinel };
        assert_eq!(user_rules_for(&no_wait), user_rules("ca:rl:", Topology::Sentinel));
        assert_eq!(
            sentinel_user_rules().join(" "),
            "resetkeys resetchannels -@all +role +sentinel|masters"
        );
    }
}
