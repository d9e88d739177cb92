//! `RedisSettings`: where the Redis server is and how patient to be with it.

use std::time::Duration;

use redis::IntoConnectionInfo;
use secrecy::SecretString;

use crate::error::RedisAdapterError;

/// The key prefix used when none is configured.
pub(crate) const DEFAULT_KEY_PREFIX: &str = "ca:rl:";

/// How the Redis deployment is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Topology {
    /// One server (or a primary behind a stable address).
    #[default]
    Standalone,
    /// Redis Cluster, through the `redis` crate's async cluster client:
    /// `urls` are seed nodes, scripts load on the master of each key's slot,
    /// `MOVED`/`ASK` are followed.
    Cluster,
}

/// Connection and behaviour settings of the Redis provider.
#[derive(Clone, Debug)]
pub struct RedisSettings {
    /// Standalone or Cluster.
    pub topology: Topology,
    /// `redis://host:port[/db]` URLs: exactly one for standalone; one or
    /// more seed nodes for a cluster.
    pub urls: Vec<String>,
    /// ACL user name, if any (overrides one in the URL).
    pub username: Option<String>,
    /// ACL password, if any (overrides one in the URL). Never printed.
    pub password: Option<SecretString>,
    /// Prefix of every key, before the `{...}` hash tag.
    pub key_prefix: String,
    /// Longest wait for a new connection (TCP connect and handshake).
    pub connect_timeout: Duration,
    /// Longest wait for one command's reply; never beyond the request deadline.
    pub command_timeout: Duration,
    /// Script calls in flight at once (the SCRIPT lane); beyond it callers wait
    /// for a permit until their deadline.
    pub script_lane_max_in_flight: usize,
    /// The retry-after of outcomes that carry no better hint.
    pub failure_retry_after: Duration,
}

impl Default for RedisSettings {
    /// Standalone on `redis://127.0.0.1:6379` (a default value only; tests
    /// never use that server), prefix `ca:rl:`, 250 ms commands, 256 lane
    /// permits, 1 s failure retry-after.
    fn default() -> Self {
        Self {
            topology: Topology::Standalone,
            urls: vec!["redis://127.0.0.1:6379".to_owned()],
            username: None,
            password: None,
            key_prefix: DEFAULT_KEY_PREFIX.to_owned(),
            connect_timeout: Duration::from_millis(500),
            command_timeout: Duration::from_millis(250),
            script_lane_max_in_flight: 256,
            failure_retry_after: Duration::from_secs(1),
        }
    }
}

impl RedisSettings {
    /// Checks every field; the first problem found is returned with its key.
    pub(crate) fn validate(&self) -> Result<(), RedisAdapterError> {
        let invalid =
            |field, problem: String| Err(RedisAdapterError::InvalidSettings { field, problem });
        match self.topology {
            Topology::Standalone if self.urls.len() != 1 => {
                return invalid(
                    "urls",
                    format!("standalone takes exactly one URL, got {}", self.urls.len()),
                );
            }
            Topology::Cluster if self.urls.is_empty() => {
                return invalid("urls", "cluster takes at least one seed URL, got none".to_owned());
            }
            Topology::Standalone | Topology::Cluster => {}
        }
        for url in &self.urls {
            if let Err(error) = url.as_str().into_connection_info() {
                // The URL may hold a password: name the problem, not the URL.
                return invalid("urls", format!("not a valid redis URL ({})", error.category()));
            }
        }
        let prefix = &self.key_prefix;
        if prefix.len() > 64
            || prefix.chars().any(|c| c == '{' || c == '}' || c.is_whitespace() || c.is_control())
        {
            return invalid(
                "key-prefix",
                format!("must be at most 64 characters without braces or spaces, got {prefix:?}"),
            );
        }
        for (field, value) in [
            ("connect-timeout", self.connect_timeout),
            ("command-timeout", self.command_timeout),
            ("failure-retry-after", self.failure_retry_after),
        ] {
            if value < Duration::from_millis(1) {
                return invalid(field, format!("must be at least 1ms, got {value:?}"));
            }
        }
        if !(1..=65_536).contains(&self.script_lane_max_in_flight) {
            return invalid(
                "script-lane-max-in-flight",
                format!("must be in 1..=65536, got {}", self.script_lane_max_in_flight),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field_of(settings: &RedisSettings) -> &'static str {
        match settings.validate() {
            Err(RedisAdapterError::InvalidSettings { field, .. }) => field,
            other => panic!("expected invalid settings, got {other:?}"),
        }
    }

    #[test]
    fn defaults_are_valid_and_documented() {
        let settings = RedisSettings::default();
        assert!(settings.validate().is_ok());
        assert_eq!(settings.key_prefix, "ca:rl:");
        assert_eq!(settings.command_timeout, Duration::from_millis(250));
        assert_eq!(settings.script_lane_max_in_flight, 256);
        assert_eq!(settings.failure_retry_after, Duration::from_secs(1));
    }

    #[test]
    fn each_bad_field_is_named() {
        let base = RedisSettings::default();
        let cases: [(RedisSettings, &str); 6] = [
            (RedisSettings { urls: vec![], ..base.clone() }, "urls"),
            (RedisSettings { urls: vec!["http://x".into()], ..base.clone() }, "urls"),
            (RedisSettings { key_prefix: "a{b".into(), ..base.clone() }, "key-prefix"),
            (RedisSettings { command_timeout: Duration::ZERO, ..base.clone() }, "command-timeout"),
            (
                RedisSettings { script_lane_max_in_flight: 0, ..base.clone() },
                "script-lane-max-in-flight",
            ),
            (
                RedisSettings { failure_retry_after: Duration::ZERO, ..base.clone() },
                "failure-retry-after",
            ),
        ];
        for (settings, field) in cases {
            assert_eq!(field_of(&settings), field);
        }
    }

    #[test]
    fn cluster_takes_one_or_more_seed_urls() {
        let one = RedisSettings { topology: Topology::Cluster, ..RedisSettings::default() };
        assert_eq!(one.validate(), Ok(()));
        let seeds = RedisSettings {
            urls: vec!["redis://127.0.0.1:7000".into(), "redis://127.0.0.1:7001".into()],
            ..one.clone()
        };
        assert_eq!(seeds.validate(), Ok(()));
        assert_eq!(field_of(&RedisSettings { urls: vec![], ..one.clone() }), "urls");
        assert_eq!(field_of(&RedisSettings { urls: vec!["http://x".into()], ..one }), "urls");
        let standalone_with_two = RedisSettings { topology: Topology::Standalone, ..seeds };
        assert_eq!(field_of(&standalone_with_two), "urls");
    }

    #[test]
    fn debug_never_prints_the_password() {
        let settings = RedisSettings {
            password: Some(SecretString::from("hunter2-secret")),
            ..RedisSettings::default()
        };
        assert!(!format!("{settings:?}").contains("hunter2-secret"));
    }
}
