//! What a least-privilege Redis ACL user needs for this provider, in one
//! place: `ca-skeleton redis-acl` prints it and the ACL tests run on it.
//!
//! The commands were found against real servers with everything else
//! denied: the scripts (`EVALSHA`, `SCRIPT LOAD`), the readiness probe
//! (`PING`), and the commands the scripts call, because Redis checks those
//! against the caller's ACL too (so all stay limited to the key pattern):
//! `GET` and `SET` on the counter keys, and `HMGET`, `HSET`, `HDEL`, `DEL`
//! and `PEXPIRE` on the dedupe records keys (docs/algorithms.md, "Stored
//! state on Redis"). `AUTH` is open to every user; the client's `CLIENT SETINFO`
//! at connect is sent with its reply ignored, so denying it costs nothing.
//! A cluster client also reads its slot map (`CLUSTER SLOTS`) and sends
//! `ASKING` to follow an `ASK` redirect while a slot migrates (without it
//! the migration test's ASK step is refused); `CLUSTER SHARDS` and
//! `READONLY` are never sent (no reads from replicas). `EVAL` is never
//! needed.

use crate::settings::Topology;

/// Every command rule, standalone ones first; a cluster needs them all.
const COMMANDS: [&str; 12] = [
    "+evalsha",
    "+script|load",
    "+ping",
    "+get",
    "+set",
    "+hmget",
    "+hset",
    "+hdel",
    "+del",
    "+pexpire",
    "+cluster|slots",
    "+asking",
];
/// How many of [`COMMANDS`] a standalone server needs.
const STANDALONE_COMMANDS: usize = 10;

/// The commands the provider sends on `topology`, as `ACL SETUSER` rules
/// (`+evalsha`, `+script|load`, ...), in a fixed order.
pub fn required_commands(topology: Topology) -> &'static [&'static str] {
    match topology {
        Topology::Standalone => &COMMANDS[..STANDALONE_COMMANDS],
        Topology::Cluster => &COMMANDS,
    }
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
    rules.extend(required_commands(topology).iter().map(|command| (*command).to_owned()));
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
                "+get",
                "+set",
                "+hmget",
                "+hset",
                "+hdel",
                "+del",
                "+pexpire"
            ]
        );
        assert_eq!(
            required_commands(Topology::Cluster),
            [
                "+evalsha",
                "+script|load",
                "+ping",
                "+get",
                "+set",
                "+hmget",
                "+hset",
                "+hdel",
                "+del",
                "+pexpire",
                "+cluster|slots",
                "+asking"
            ]
        );
        for topology in [Topology::Standalone, Topology::Cluster] {
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
            "~ca:rl:* resetchannels -@all +evalsha +script|load +ping +get +set +hmget +hset +hdel \
             +del +pexpire"
        );
    }
}
