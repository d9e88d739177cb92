//! `RedisSettings`: where the Redis server is and how patient to be with it.

use std::time::Duration;

use redis::IntoConnectionInfo;
use secrecy::SecretString;

use crate::error::RedisAdapterError;

/// The key prefix used when none is configured.
pub(crate) const DEFAULT_KEY_PREFIX: &str = "ca:rl:";
/// Longest key prefix accepted: keys stay short, and the ACL key pattern is
/// `<key-prefix>*`.
pub const MAX_KEY_PREFIX_BYTES: usize = 64;
/// Most script calls in flight at once that the lane accepts.
pub const MAX_SCRIPT_LANE: usize = 65_536;
/// Most refusals the local denial cache may hold.
pub const MAX_DENY_CACHE_ENTRIES: usize = 1_000_000;

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

impl Topology {
    /// Every topology, in declaration order.
    pub const ALL: [Self; 2] = [Self::Standalone, Self::Cluster];

    /// The configuration name: `standalone` or `cluster`.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Standalone => "standalone",
            Self::Cluster => "cluster",
        }
    }
}

shared_contract::impl_from_str_by_name!(Topology);

/// A field of [`RedisSettings`] that validation can reject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RedisField {
    /// The URL list as a whole (how many there are).
    Urls,
    /// One URL, by its index in the list.
    Url(usize),
    /// [`RedisSettings::key_prefix`].
    KeyPrefix,
    /// [`RedisSettings::connect_timeout`].
    ConnectTimeout,
    /// [`RedisSettings::command_timeout`].
    CommandTimeout,
    /// [`RedisSettings::script_lane_max_in_flight`].
    ScriptLaneMaxInFlight,
    /// [`RedisSettings::failure_retry_after`].
    FailureRetryAfter,
    /// [`DenyCacheSettings::max_entries`].
    DenyCacheMaxEntries,
}

impl RedisField {
    /// The kebab-case name of the field.
    pub const fn key(self) -> &'static str {
        match self {
            Self::Urls | Self::Url(_) => "urls",
            Self::KeyPrefix => "key-prefix",
            Self::ConnectTimeout => "connect-timeout",
            Self::CommandTimeout => "command-timeout",
            Self::ScriptLaneMaxInFlight => "script-lane-max-in-flight",
            Self::FailureRetryAfter => "failure-retry-after",
            Self::DenyCacheMaxEntries => "deny-cache.max-entries",
        }
    }
}

/// One broken settings rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettingsProblem {
    /// The field that holds the bad value.
    pub field: RedisField,
    /// What is wrong, for a human; never echoes a URL (it may hold a
    /// password).
    pub problem: String,
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
    /// The local denial cache in front of Redis.
    pub deny_cache: DenyCacheSettings,
}

/// The local denial cache (docs/algorithms.md, "Local denial cache"): after
/// Redis refuses a set of fixed windows with retry-after R, the same
/// subject's same policy set at the same or a higher cost is refused in
/// process, without a Redis call, until R has passed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DenyCacheSettings {
    /// Whether refusals are cached (default true).
    pub enabled: bool,
    /// Most refusals held at once (default 10,000, at most
    /// [`MAX_DENY_CACHE_ENTRIES`]); beyond it the one that runs out soonest
    /// makes room. About 200 bytes each.
    pub max_entries: usize,
}

impl Default for DenyCacheSettings {
    fn default() -> Self {
        Self { enabled: true, max_entries: 10_000 }
    }
}

impl Default for RedisSettings {
    /// Standalone on `redis://127.0.0.1:6379` (a default value only; tests
    /// never use that server), prefix `ca:rl:`, 1 s connects, 250 ms
    /// commands, 256 lane permits, 1 s failure retry-after.
    ///
    /// The connect timeout is 1 s rather than something inside the 750 ms
    /// evaluation budget because a connect on a request's path is already
    /// cut at that request's deadline; the timeout only bounds connects no
    /// request waits for (a cluster's slot-map refresh), where a TLS or
    /// cross-zone handshake should not be cut short.
    fn default() -> Self {
        Self {
            topology: Topology::Standalone,
            urls: vec!["redis://127.0.0.1:6379".to_owned()],
            username: None,
            password: None,
            key_prefix: DEFAULT_KEY_PREFIX.to_owned(),
            connect_timeout: Duration::from_secs(1),
            command_timeout: Duration::from_millis(250),
            script_lane_max_in_flight: 256,
            failure_retry_after: Duration::from_secs(1),
            deny_cache: DenyCacheSettings::default(),
        }
    }
}

impl RedisSettings {
    /// Every broken rule, in field order; empty when the settings can work.
    /// The configuration layer reports each under its own key path.
    pub fn problems(&self) -> Vec<SettingsProblem> {
        let mut problems = Vec::new();
        let mut reject = |field, problem: String| problems.push(SettingsProblem { field, problem });
        match self.topology {
            Topology::Standalone if self.urls.len() != 1 => reject(
                RedisField::Urls,
                format!("standalone takes exactly one URL, got {}", self.urls.len()),
            ),
            Topology::Cluster if self.urls.is_empty() => {
                reject(
                    RedisField::Urls,
                    "cluster takes at least one seed URL, got none".to_owned(),
                );
            }
            Topology::Standalone | Topology::Cluster => {}
        }
        for (index, url) in self.urls.iter().enumerate() {
            // The client that will connect judges the URL, so a scheme it
            // cannot serve (rediss:// without TLS support) stops start-up.
            if let Err(error) = url.as_str().into_connection_info() {
                // The URL may hold a password: name the scheme, not the URL.
                let scheme = url.split_once("://").map_or("none", |(scheme, _)| scheme);
                reject(
                    RedisField::Url(index),
                    format!(
                        "not a usable redis URL (scheme {scheme:?}; redis:// or unix:// expected): {}",
                        error.category()
                    ),
                );
            }
        }
        let prefix = &self.key_prefix;
        if prefix.is_empty() || prefix.len() > MAX_KEY_PREFIX_BYTES {
            reject(
                RedisField::KeyPrefix,
                format!(
                    "must be 1 to {MAX_KEY_PREFIX_BYTES} bytes (the ACL key pattern is <key-prefix>*), got {}",
                    prefix.len()
                ),
            );
        }
        if prefix.chars().any(|c| c == '{' || c == '}' || c.is_whitespace() || c.is_control()) {
            reject(
                RedisField::KeyPrefix,
                "must not contain '{', '}', spaces or control characters: the subject's hash tag \
                 must be the only one in a key"
                    .to_owned(),
            );
        }
        for (field, value) in [
            (RedisField::ConnectTimeout, self.connect_timeout),
            (RedisField::CommandTimeout, self.command_timeout),
            (RedisField::FailureRetryAfter, self.failure_retry_after),
        ] {
            if value < Duration::from_millis(1) {
                reject(field, format!("must be at least 1ms, got {value:?}"));
            }
        }
        if !(1..=MAX_SCRIPT_LANE).contains(&self.script_lane_max_in_flight) {
            reject(
                RedisField::ScriptLaneMaxInFlight,
                format!("must be in 1..={MAX_SCRIPT_LANE}, got {}", self.script_lane_max_in_flight),
            );
        }
        if !(1..=MAX_DENY_CACHE_ENTRIES).contains(&self.deny_cache.max_entries) {
            reject(
                RedisField::DenyCacheMaxEntries,
                format!(
                    "must be in 1..={MAX_DENY_CACHE_ENTRIES}, got {}",
                    self.deny_cache.max_entries
                ),
            );
        }
        problems
    }

    /// The first of [`Self::problems`], as the adapter's error.
    pub(crate) fn validate(&self) -> Result<(), RedisAdapterError> {
        match self.problems().into_iter().next() {
            None => Ok(()),
            Some(SettingsProblem { field, problem }) => {
                Err(RedisAdapterError::InvalidSettings { field: field.key(), problem })
            }
        }
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
        assert_eq!(settings.connect_timeout, Duration::from_secs(1));
        assert_eq!(settings.command_timeout, Duration::from_millis(250));
        assert_eq!(settings.script_lane_max_in_flight, 256);
        assert_eq!(settings.failure_retry_after, Duration::from_secs(1));
        assert_eq!(settings.deny_cache, DenyCacheSettings { enabled: true, max_entries: 10_000 });
    }

    #[test]
    fn each_bad_field_is_named() {
        let base = RedisSettings::default();
        let no_room = DenyCacheSettings { enabled: true, max_entries: 0 };
        let too_many = DenyCacheSettings { max_entries: MAX_DENY_CACHE_ENTRIES + 1, ..no_room };
        let cases: [(RedisSettings, &str); 8] = [
            (RedisSettings { deny_cache: no_room, ..base.clone() }, "deny-cache.max-entries"),
            (RedisSettings { deny_cache: too_many, ..base.clone() }, "deny-cache.max-entries"),
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
    fn the_prefix_is_never_empty_and_every_problem_is_listed() {
        let settings = RedisSettings {
            key_prefix: String::new(),
            urls: vec!["http://x".into()],
            command_timeout: Duration::ZERO,
            ..RedisSettings::default()
        };
        let fields: Vec<_> = settings.problems().into_iter().map(|p| p.field).collect();
        assert_eq!(fields, [RedisField::Url(0), RedisField::KeyPrefix, RedisField::CommandTimeout]);
    }

    #[test]
    fn unix_sockets_are_accepted_and_a_url_password_is_never_echoed() {
        let unix = RedisSettings {
            urls: vec!["unix:///tmp/redis.sock".into()],
            ..RedisSettings::default()
        };
        assert_eq!(unix.problems(), []);
        // This build has no TLS: saying so at start-up beats failing at connect.
        let tls =
            RedisSettings { urls: vec!["rediss://host:6380".into()], ..RedisSettings::default() };
        assert_eq!(tls.problems().len(), 1);
        let bad = RedisSettings {
            urls: vec!["http://user:hunter2@host".into()],
            ..RedisSettings::default()
        };
        let problems = bad.problems();
        assert_eq!(problems.len(), 1);
        assert!(!problems[0].problem.contains("hunter2"), "{problems:?}");
        assert!(problems[0].problem.contains("\"http\""), "{problems:?}");
    }

    #[test]
    fn every_topology_is_listed_and_named() {
        // Exhaustive: a new topology fails to compile here until ALL lists it.
        for topology in Topology::ALL {
            match topology {
                Topology::Standalone | Topology::Cluster => {}
            }
            assert_eq!(topology.name().parse(), Ok(topology));
        }
        assert_eq!(Topology::ALL.len(), 2);
        assert!("sentinel".parse::<Topology>().is_err());
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
