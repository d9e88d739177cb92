//! `ca-skeleton redis-acl`: the `ACL SETUSER` rule for a least-privilege
//! Redis user that may run the rate-limit scripts on the rate-limit keys and
//! nothing else.

use adapter_redis::acl::{sentinel_user_rules, user_rules_for};
use adapter_redis::{RedisSettings, Topology};
use sha2::{Digest, Sha256};

use crate::config::RedisConfig;

/// User name when `redis.username` is not set.
pub const DEFAULT_ACL_USER: &str = "ca-rate-limit";
/// Sentinel-side user name when `redis.sentinel-username` is not set.
pub const DEFAULT_SENTINEL_ACL_USER: &str = "ca-rate-limit-sentinel";

/// What `redis-acl` prints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AclRules {
    /// Commands to send to every Redis node (stdout).
    pub commands: Vec<String>,
    /// Notes for the operator (stderr); never holds a secret.
    pub notes: Vec<String>,
}

/// The rule for `redis.username` (or [`DEFAULT_ACL_USER`]) on the key
/// pattern `<key-prefix>*`, with the commands the provider needs on the
/// configured topology and `WAIT` setting
/// ([`adapter_redis::acl::user_rules_for`]); on the Sentinel topology a
/// second rule, for `redis.sentinel-username` (or
/// [`DEFAULT_SENTINEL_ACL_USER`]) on the sentinels. A configured password
/// is given as its SHA-256 (`#<hex>`), so the output never holds the
/// password itself. Only `[redis]` is read
/// ([`crate::AppConfig::load_redis`]).
pub fn acl_rules(redis: &RedisConfig) -> AclRules {
    let user = redis.settings.username.as_deref().unwrap_or(DEFAULT_ACL_USER);
    let mut notes = vec![format!(
        "# user {user:?}: EVALSHA, SCRIPT LOAD, PING, INFO (whether maxmemory-policy can evict counters), and the scripts' own TIME (which caller clock is wrong), own GET/SET (counters without dedupe), HMGET/HSET/HDEL/UNLINK/PEXPIRE (counters with dedupe records), ZMSCORE/ZCOUNT/ZADD/ZREMRANGEBYSCORE/ZSCORE/ZREM (lease sets), TYPE/ZRANGE (an operator's inspect) on keys {}* only; no EVAL",
        redis.settings.key_prefix
    )];
    let password = login(redis.password.as_ref(), "redis.password", "<password>", &mut notes);
    // The failure retry-after plays no part in the commands.
    let settings = redis.provider_settings(RedisSettings::default().failure_retry_after);
    if settings.wait_replicas > 0 {
        notes.push(format!(
            "# wait-replicas = {}: +wait, so each charge waits for its replicas",
            settings.wait_replicas
        ));
    }
    let mut commands = vec![setuser(user, password, user_rules_for(&settings))];
    match redis.settings.topology {
        Topology::Standalone => {}
        Topology::Cluster => {
            notes.push("# cluster: run it on every node (ACLs are per node)".to_owned());
        }
        Topology::Sentinel => {
            let sentinel_user =
                redis.settings.sentinel_username.as_deref().unwrap_or(DEFAULT_SENTINEL_ACL_USER);
            notes.push(format!(
                "# sentinel: run the first line on the master and every replica (+role: the \
                 client checks the master's role), the second on every sentinel (user \
                 {sentinel_user:?}: ROLE and SENTINEL MASTERS only, no keys)"
            ));
            let password = login(
                redis.sentinel_password.as_ref(),
                "redis.sentinel-password",
                "<sentinel-password>",
                &mut notes,
            );
            commands.push(setuser(sentinel_user, password, sentinel_user_rules()));
        }
    }
    AclRules { commands, notes }
}

/// `#<sha256>` of a configured password, else a placeholder and a note.
fn login(
    password: Option<&crate::config::SecretValue>,
    key: &str,
    placeholder: &str,
    notes: &mut Vec<String>,
) -> String {
    match password {
        Some(password) => format!("#{}", hex::encode(Sha256::digest(password.expose().as_bytes()))),
        None => {
            notes.push(format!("# {key} is not set: replace {placeholder} before running this"));
            format!(">{placeholder}")
        }
    }
}

fn setuser(user: &str, password: String, rules: Vec<String>) -> String {
    let mut rule = vec![
        "ACL SETUSER".to_owned(),
        user.to_owned(),
        "reset".to_owned(),
        "on".to_owned(),
        password,
    ];
    rule.extend(rules);
    rule.join(" ")
}

#[cfg(test)]
mod tests {
    use secrecy::SecretString;

    use super::*;
    use crate::config::{AppConfig, ConfigSources, SecretSource, SecretValue};

    #[allow(clippy::result_large_err, reason = "figment::Jail fixes the closure's error type")]
    fn config() -> RedisConfig {
        // Defaults only: no file, and no variable of the test machine.
        let mut config = None;
        figment::Jail::expect_with(|jail| {
            jail.clear_env();
            config = Some(AppConfig::load_redis(&ConfigSources::new(None)).expect("defaults load"));
            Ok(())
        });
        config.expect("loaded")
    }

    #[test]
    fn the_rule_allows_only_the_script_commands_on_the_prefix() {
        let rules = acl_rules(&config());
        assert_eq!(
            rules.commands,
            ["ACL SETUSER ca-rate-limit reset on ><password> ~ca:rl:* resetchannels -@all \
              +evalsha +script|load +ping +info +time +get +set +hmget +hset +hdel +unlink +pexpire +type \
              +zmscore +zcount +zadd +zremrangebyscore +zscore +zrem +zrange"]
        );
        assert!(rules.notes.iter().any(|note| note.contains("<password>")));
    }

    #[test]
    fn a_configured_password_appears_only_as_its_sha256() {
        let mut config = config();
        config.settings.username = Some("edge".into());
        config.password =
            Some(SecretValue::new(SecretSource::Inline, SecretString::from("hunter2")));
        config.settings.key_prefix = "app*[x]:".into();
        config.settings.topology = Topology::Cluster;
        let rules = acl_rules(&config);
        let rule = &rules.commands[0];
        // sha256("hunter2")
        let hash = "f52fbd32b2b3b86ff88ef6c490628285f482af15ddcb29541f94bcf526a3f6c7";
        assert!(
            rule.starts_with(&format!("ACL SETUSER edge reset on #{hash} ~app\\*\\[x\\]:* ")),
            "{rule}"
        );
        assert!(
            rule.ends_with(
                "+ping +info +time +get +set +hmget +hset +hdel +unlink +pexpire +type +zmscore +zcount +zadd \
                 +zremrangebyscore +zscore +zrem +zrange +cluster|slots +asking"
            ),
            "{rule}"
        );
        assert!(!rule.contains("hunter2") && !rules.notes.concat().contains("hunter2"));
    }

    #[test]
    fn sentinel_prints_the_data_rule_with_role_and_wait_and_the_sentinel_rule() {
        let mut config = config();
        config.settings.topology = Topology::Sentinel;
        config.settings.wait_replicas = 1;
        config.settings.sentinel_username = Some("watcher".into());
        config.sentinel_password =
            Some(SecretValue::new(SecretSource::Inline, SecretString::from("hunter2")));
        let rules = acl_rules(&config);
        // sha256("hunter2")
        let hash = "f52fbd32b2b3b86ff88ef6c490628285f482af15ddcb29541f94bcf526a3f6c7";
        assert_eq!(
            rules.commands,
            [
                "ACL SETUSER ca-rate-limit reset on ><password> ~ca:rl:* resetchannels -@all \
                 +evalsha +script|load +ping +info +time +get +set +hmget +hset +hdel +unlink +pexpire +type \
                 +zmscore +zcount +zadd +zremrangebyscore +zscore +zrem +zrange +role +wait"
                    .to_owned(),
                format!(
                    "ACL SETUSER watcher reset on #{hash} resetkeys resetchannels -@all +role \
                     +sentinel|masters"
                ),
            ]
        );
        assert!(rules.notes.iter().any(|note| note.contains("every sentinel")));
        config.sentinel_password = None;
        config.settings.sentinel_username = None;
        let rules = acl_rules(&config);
        assert!(
            rules.commands[1].starts_with(
                "ACL SETUSER ca-rate-limit-sentinel reset on ><sentinel-password> resetkeys"
            ),
            "{rules:?}"
        );
    }
}
