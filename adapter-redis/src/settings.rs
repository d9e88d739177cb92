//! `RedisSettings`: where the Redis server is and how patient to be with it.
//! The struct is the `[redis]` configuration table: its serde names are the
//! keys, its `Default` their defaults, so a new key is one field here.

use std::time::Duration;

use redis::IntoConnectionInfo;
use secrecy::SecretString;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use shared_contract::DEFAULT_FAILURE_RETRY_AFTER;

use crate::error::RedisAdapterError;

/// The key prefix used when none is configured.
pub(crate) const DEFAULT_KEY_PREFIX: &str = "ca:rl:";
/// Longest key prefix accepted: keys stay short, and the ACL key pattern is
/// `<key-prefix>*`.
pub const MAX_KEY_PREFIX_BYTES: usize = 64;
/// Most script calls in flight at once that the lane accepts.
pub const MAX_SCRIPT_LANE: usize = 65_536;
/// The master name Sentinel deployments use unless told otherwise.
pub(crate) const DEFAULT_MASTER_NAME: &str = "mymaster";
/// Most connections `WAIT` mode may open per master.
pub const MAX_WAIT_CONNECTIONS: usize = 256;
/// Most refusals the local denial cache may hold.
pub const MAX_DENY_CACHE_ENTRIES: usize = 1_000_000;
/// Longest a cached refusal may be served before Redis is asked again: an
/// admin reset through another instance reaches this one within it.
pub const MAX_DENY_CACHE_MAX_AGE: Duration = Duration::from_secs(60);

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
    /// A master and its replicas watched by Redis Sentinel: the master's
    /// address is asked of the `sentinels` (for `master_name`) whenever a
    /// connection is opened and, while calls flow, every `command_timeout`;
    /// the connections leave a master they no longer name. `urls` stays
    /// empty.
    Sentinel,
}

impl Topology {
    /// Every topology, in declaration order.
    pub const ALL: [Self; 3] = [Self::Standalone, Self::Cluster, Self::Sentinel];

    /// The configuration name: `standalone`, `cluster` or `sentinel`.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Standalone => "standalone",
            Self::Cluster => "cluster",
            Self::Sentinel => "sentinel",
        }
    }
}

shared_contract::impl_from_str_by_name!(Topology);

/// By name, as [`Topology::name`] writes it.
impl Serialize for Topology {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}

/// By name; an unknown one lists every name.
impl<'de> Deserialize<'de> for Topology {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer)?.parse().map_err(serde::de::Error::custom)
    }
}

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
    /// [`ScriptLaneSettings::max_in_flight`].
    ScriptLaneMaxInFlight,
    /// [`RedisSettings::failure_retry_after`].
    FailureRetryAfter,
    /// The sentinel list as a whole (how many there are).
    Sentinels,
    /// One sentinel address, by its index in the list.
    Sentinel(usize),
    /// [`RedisSettings::master_name`].
    MasterName,
    /// [`RedisSettings::sentinel_password`].
    SentinelPassword,
    /// [`RedisSettings::wait_timeout`].
    WaitTimeout,
    /// [`RedisSettings::wait_connections`].
    WaitConnections,
    /// [`DenyCacheSettings::max_entries`].
    DenyCacheMaxEntries,
    /// [`DenyCacheSettings::max_age`].
    DenyCacheMaxAge,
}

impl RedisField {
    /// The field's key under `redis.`, dotted where the file nests it
    /// (`deny-cache.max-entries`); the configuration layer reports each
    /// problem at this key, so no second table of keys exists.
    pub const fn key(self) -> &'static str {
        match self {
            Self::Urls | Self::Url(_) => "urls",
            Self::KeyPrefix => "key-prefix",
            Self::ConnectTimeout => "connect-timeout",
            Self::CommandTimeout => "command-timeout",
            Self::ScriptLaneMaxInFlight => "script-lane.max-in-flight",
            Self::FailureRetryAfter => "failure-retry-after",
            Self::Sentinels | Self::Sentinel(_) => "sentinels",
            Self::MasterName => "master-name",
            Self::SentinelPassword => "sentinel-password",
            Self::WaitTimeout => "wait-timeout",
            Self::WaitConnections => "wait-connections",
            Self::DenyCacheMaxEntries => "deny-cache.max-entries",
            Self::DenyCacheMaxAge => "deny-cache.max-age",
        }
    }

    /// The list index of a field that is one entry of a list.
    pub const fn index(self) -> Option<usize> {
        match self {
            Self::Url(index) | Self::Sentinel(index) => Some(index),
            Self::Urls
            | Self::KeyPrefix
            | Self::ConnectTimeout
            | Self::CommandTimeout
            | Self::ScriptLaneMaxInFlight
            | Self::FailureRetryAfter
            | Self::Sentinels
            | Self::MasterName
            | Self::SentinelPassword
            | Self::WaitTimeout
            | Self::WaitConnections
            | Self::DenyCacheMaxEntries
            | Self::DenyCacheMaxAge => None,
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

/// Connection and behaviour settings of the Redis provider: the `[redis]`
/// table, less `enabled` (the application's switch) and the two passwords,
/// which the configuration layer reads with their source so it can show
/// where they came from without showing them.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct RedisSettings {
    /// Standalone, Cluster or Sentinel.
    pub topology: Topology,
    /// `redis://host:port[/db]` URLs: exactly one for standalone; one or
    /// more seed nodes for a cluster; none for Sentinel (the sentinels name
    /// the master).
    pub urls: Vec<String>,
    /// ACL user name, if any (overrides one in the URL).
    pub username: Option<String>,
    /// ACL password, if any (overrides one in the URL). Never printed.
    #[serde(skip)]
    pub password: Option<SecretString>,
    /// Prefix of every key, before the `{...}` hash tag.
    pub key_prefix: String,
    /// Longest wait for a new connection (TCP connect and handshake).
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// Longest wait for one command's reply; never beyond the request deadline.
    #[serde(with = "humantime_serde")]
    pub command_timeout: Duration,
    /// The SCRIPT lane (`script-lane.*`).
    pub script_lane: ScriptLaneSettings,
    /// The retry-after of outcomes that carry no better hint: the edge's
    /// `failure-retry-after`, not a key of its own here.
    #[serde(skip)]
    pub failure_retry_after: Duration,
    /// Sentinel only: `host:port` of each sentinel, all asked at once (the
    /// newest configuration they hold wins).
    pub sentinels: Vec<String>,
    /// Sentinel only: the name the sentinels monitor the master under.
    pub master_name: String,
    /// Sentinel only: the ACL user to log in to the sentinels as, if any.
    pub sentinel_username: Option<String>,
    /// Sentinel only: the sentinels' password, if any. Never printed.
    #[serde(skip)]
    pub sentinel_password: Option<SecretString>,
    /// After a script that charged, `WAIT` for this many replicas to
    /// acknowledge the write; fewer is `Indeterminate`. 0 (default) sends no
    /// `WAIT`.
    pub wait_replicas: u32,
    /// The `WAIT` timeout (whole milliseconds). With `wait_replicas` > 0 it
    /// must be shorter than `command_timeout`, which bounds the script and
    /// the `WAIT` together, so the server's count comes back before the
    /// client gives up on the call.
    #[serde(with = "humantime_serde")]
    pub wait_timeout: Duration,
    /// With `wait_replicas` > 0: the connections per master (per node on a
    /// cluster) that charges and their `WAIT` go on, one call at a time
    /// each, so a blocked `WAIT` holds one connection. A charge waits for a
    /// free one within its `wait_timeout` only (default 8, at most
    /// [`MAX_WAIT_CONNECTIONS`]).
    pub wait_connections: usize,
    /// The local denial cache in front of Redis.
    pub deny_cache: DenyCacheSettings,
}

/// The local denial cache (docs/algorithms.md, "Local denial cache"): after
/// Redis refuses a set of fixed windows with retry-after R, the same
/// subject's same policy set at the same or a higher cost is refused in
/// process, without a Redis call, until R has passed or the refusal is
/// `max_age` old, whichever comes first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct DenyCacheSettings {
    /// Whether refusals are cached (default true).
    pub enabled: bool,
    /// Most refusals held at once (default 10,000, at most
    /// [`MAX_DENY_CACHE_ENTRIES`]); beyond it the one that runs out soonest
    /// makes room. About 200 bytes each.
    pub max_entries: usize,
    /// Longest a refusal is answered from the cache after Redis gave it
    /// (default 1 s, 1 ms to [`MAX_DENY_CACHE_MAX_AGE`]); then Redis is
    /// asked again. An admin reset through another instance, which cannot
    /// reach this cache, takes effect here within it, whatever the window.
    #[serde(with = "humantime_serde")]
    pub max_age: Duration,
}

/// The SCRIPT lane: how many script calls may be in flight at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct ScriptLaneSettings {
    /// Script calls in flight at once (default 256, at most
    /// [`MAX_SCRIPT_LANE`]); beyond it callers wait for a permit until
    /// their deadline.
    pub max_in_flight: usize,
}

impl Default for ScriptLaneSettings {
    fn default() -> Self {
        Self { max_in_flight: 256 }
    }
}

impl Default for DenyCacheSettings {
    fn default() -> Self {
        Self { enabled: true, max_entries: 10_000, max_age: Duration::from_secs(1) }
    }
}

impl Default for RedisSettings {
    /// Standalone on `redis://127.0.0.1:6379` (a default value only; tests
    /// never use that server), prefix `ca:rl:`, 1 s connects, 250 ms
    /// commands, 256 lane permits, 1 s failure retry-after; no sentinels,
    /// master name `mymaster`; no `WAIT` (a 100 ms timeout and 8
    /// connections per master once `wait_replicas` is set).
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
            script_lane: ScriptLaneSettings::default(),
            failure_retry_after: DEFAULT_FAILURE_RETRY_AFTER,
            sentinels: Vec::new(),
            master_name: DEFAULT_MASTER_NAME.to_owned(),
            sentinel_username: None,
            sentinel_password: None,
            wait_replicas: 0,
            wait_timeout: Duration::from_millis(100),
            wait_connections: 8,
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
            Topology::Sentinel if !self.urls.is_empty() => reject(
                RedisField::Urls,
                format!(
                    "sentinel takes the master's address from the sentinels: remove urls \
                     (got {}) and list the sentinels in sentinels",
                    self.urls.len()
                ),
            ),
            Topology::Standalone | Topology::Cluster | Topology::Sentinel => {}
        }
        self.sentinel_problems(&mut reject);
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
        let in_flight = self.script_lane.max_in_flight;
        if !(1..=MAX_SCRIPT_LANE).contains(&in_flight) {
            reject(
                RedisField::ScriptLaneMaxInFlight,
                format!("must be in 1..={MAX_SCRIPT_LANE}, got {in_flight}"),
            );
        }
        if self.wait_replicas > 0 {
            let wait = self.wait_timeout;
            // `WAIT n 0` blocks forever, and a sub-millisecond timeout cannot
            // be sent: WAIT counts whole milliseconds.
            if wait < Duration::from_millis(1) || wait.subsec_nanos() % 1_000_000 != 0 {
                reject(
                    RedisField::WaitTimeout,
                    format!("must be whole milliseconds, at least 1ms, got {wait:?}"),
                );
            } else if wait >= self.command_timeout {
                reject(
                    RedisField::WaitTimeout,
                    format!(
                        "must be shorter than command-timeout ({:?}), which bounds the script and \
                         the WAIT together, got {wait:?}",
                        self.command_timeout
                    ),
                );
            }
        }
        if !(1..=MAX_WAIT_CONNECTIONS).contains(&self.wait_connections) {
            reject(
                RedisField::WaitConnections,
                format!("must be in 1..={MAX_WAIT_CONNECTIONS}, got {}", self.wait_connections),
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
        let max_age = self.deny_cache.max_age;
        if max_age < Duration::from_millis(1) || max_age > MAX_DENY_CACHE_MAX_AGE {
            reject(
                RedisField::DenyCacheMaxAge,
                format!("must be from 1ms to {MAX_DENY_CACHE_MAX_AGE:?}, got {max_age:?}"),
            );
        }
        problems
    }

    /// The sentinel fields' rules: checked on the Sentinel topology, and
    /// on the others only so a sentinel list is not silently ignored.
    fn sentinel_problems(&self, reject: &mut impl FnMut(RedisField, String)) {
        match self.topology {
            Topology::Sentinel => {}
            Topology::Standalone | Topology::Cluster => {
                if !self.sentinels.is_empty() {
                    reject(
                        RedisField::Sentinels,
                        format!(
                            "only topology = \"sentinel\" uses sentinels (topology is {:?}): \
                             remove them",
                            self.topology.name()
                        ),
                    );
                }
                return;
            }
        }
        if self.sentinels.is_empty() {
            reject(
                RedisField::Sentinels,
                "sentinel takes at least one sentinel host:port, got none".to_owned(),
            );
        }
        for (index, address) in self.sentinels.iter().enumerate() {
            if sentinel_address(address).is_none() {
                reject(
                    RedisField::Sentinel(index),
                    format!("{address:?} is not host:port (a port in 1..=65535)"),
                );
            }
        }
        let name = &self.master_name;
        if name.is_empty() || name.chars().any(|c| c.is_whitespace() || c.is_control()) {
            reject(
                RedisField::MasterName,
                format!("must be the name the sentinels monitor, without spaces, got {name:?}"),
            );
        }
        if self.sentinel_username.is_some() && self.sentinel_password.is_none() {
            reject(
                RedisField::SentinelPassword,
                "missing: sentinel-username is set, so the sentinels need its password".to_owned(),
            );
        }
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

/// `host:port` as a sentinel address; `None` unless both parts are there
/// and the port is 1..=65535. An IPv6 host is written in brackets.
pub(crate) fn sentinel_address(address: &str) -> Option<(String, u16)> {
    let (host, port) = address.rsplit_once(':')?;
    let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    let port: u16 = port.parse().ok().filter(|&port| port > 0)?;
    (!host.is_empty() && !host.contains(char::is_whitespace)).then(|| (host.to_owned(), port))
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
        assert_eq!(settings.script_lane.max_in_flight, 256);
        assert_eq!(settings.failure_retry_after, Duration::from_secs(1));
        assert_eq!(
            settings.deny_cache,
            DenyCacheSettings {
                enabled: true,
                max_entries: 10_000,
                max_age: Duration::from_secs(1)
            }
        );
    }

    #[test]
    fn each_bad_field_is_named() {
        let base = RedisSettings::default();
        let no_room = DenyCacheSettings { max_entries: 0, ..DenyCacheSettings::default() };
        let too_many = DenyCacheSettings { max_entries: MAX_DENY_CACHE_ENTRIES + 1, ..no_room };
        let no_age = DenyCacheSettings { max_age: Duration::ZERO, ..DenyCacheSettings::default() };
        let too_old = DenyCacheSettings {
            max_age: MAX_DENY_CACHE_MAX_AGE * 2,
            ..DenyCacheSettings::default()
        };
        let cases: [(RedisSettings, &str); 10] = [
            (RedisSettings { deny_cache: no_room, ..base.clone() }, "deny-cache.max-entries"),
            (RedisSettings { deny_cache: too_many, ..base.clone() }, "deny-cache.max-entries"),
            (RedisSettings { deny_cache: no_age, ..base.clone() }, "deny-cache.max-age"),
            (RedisSettings { deny_cache: too_old, ..base.clone() }, "deny-cache.max-age"),
            (RedisSettings { urls: vec![], ..base.clone() }, "urls"),
            (RedisSettings { urls: vec!["http://x".into()], ..base.clone() }, "urls"),
            (RedisSettings { key_prefix: "a{b".into(), ..base.clone() }, "key-prefix"),
            (RedisSettings { command_timeout: Duration::ZERO, ..base.clone() }, "command-timeout"),
            (
                RedisSettings {
                    script_lane: ScriptLaneSettings { max_in_flight: 0 },
                    ..base.clone()
                },
                "script-lane.max-in-flight",
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
                Topology::Standalone | Topology::Cluster | Topology::Sentinel => {}
            }
            assert_eq!(topology.name().parse(), Ok(topology));
        }
        assert_eq!(Topology::ALL.len(), 3);
        assert!("replicated".parse::<Topology>().is_err());
    }

    fn sentinel() -> RedisSettings {
        RedisSettings {
            topology: Topology::Sentinel,
            urls: vec![],
            sentinels: vec!["10.0.0.1:26379".into(), "[::1]:26380".into()],
            ..RedisSettings::default()
        }
    }

    #[test]
    fn sentinel_takes_sentinels_a_master_name_and_no_urls() {
        assert_eq!(sentinel().problems(), []);
        let fields = |settings: RedisSettings| -> Vec<RedisField> {
            settings.problems().into_iter().map(|problem| problem.field).collect()
        };
        assert_eq!(
            fields(RedisSettings { sentinels: vec![], ..sentinel() }),
            [RedisField::Sentinels]
        );
        assert_eq!(
            fields(RedisSettings {
                sentinels: vec!["ok:1".into(), "no-port".into(), "h:0".into(), ":5".into()],
                ..sentinel()
            }),
            [RedisField::Sentinel(1), RedisField::Sentinel(2), RedisField::Sentinel(3)]
        );
        assert_eq!(
            fields(RedisSettings { urls: vec!["redis://h:1".into()], ..sentinel() }),
            [RedisField::Urls]
        );
        assert_eq!(
            fields(RedisSettings { master_name: "my master".into(), ..sentinel() }),
            [RedisField::MasterName]
        );
        assert_eq!(
            fields(RedisSettings { master_name: String::new(), ..sentinel() }),
            [RedisField::MasterName]
        );
        assert_eq!(
            fields(RedisSettings { sentinel_username: Some("watcher".into()), ..sentinel() }),
            [RedisField::SentinelPassword]
        );
        let with_auth = RedisSettings {
            sentinel_username: Some("watcher".into()),
            sentinel_password: Some(SecretString::from("sentinel-secret")),
            ..sentinel()
        };
        assert_eq!(with_auth.problems(), []);
        assert!(!format!("{with_auth:?}").contains("sentinel-secret"));
        // Another topology with sentinels would ignore them: refused.
        assert_eq!(
            fields(RedisSettings { sentinels: vec!["h:1".into()], ..RedisSettings::default() }),
            [RedisField::Sentinels]
        );
        assert_eq!(sentinel_address("[::1]:26380"), Some(("::1".to_owned(), 26_380)));
    }

    #[test]
    fn the_wait_timeout_is_whole_milliseconds_shorter_than_the_command_timeout() {
        let waiting = RedisSettings { wait_replicas: 1, ..RedisSettings::default() };
        assert_eq!(waiting.problems(), []);
        assert_eq!(waiting.wait_timeout, Duration::from_millis(100));
        for bad in [Duration::ZERO, Duration::from_micros(1_500), Duration::from_millis(250)] {
            let settings = RedisSettings { wait_timeout: bad, ..waiting.clone() };
            let fields: Vec<_> = settings.problems().into_iter().map(|p| p.field).collect();
            assert_eq!(fields, [RedisField::WaitTimeout], "{bad:?}");
        }
        // Without WAIT the timeout is never used, so it is not judged.
        let off = RedisSettings { wait_timeout: Duration::ZERO, ..RedisSettings::default() };
        assert_eq!(off.problems(), []);
    }

    #[test]
    fn wait_mode_opens_one_to_the_most_connections_per_master() {
        let waiting = RedisSettings { wait_replicas: 1, ..RedisSettings::default() };
        assert_eq!(waiting.wait_connections, 8);
        for (connections, problems) in [(1, 0), (MAX_WAIT_CONNECTIONS, 0), (0, 1), (257, 1)] {
            let settings = RedisSettings { wait_connections: connections, ..waiting.clone() };
            let fields: Vec<_> = settings.problems().into_iter().map(|p| p.field).collect();
            assert_eq!(fields, vec![RedisField::WaitConnections; problems], "{connections}");
        }
        assert_eq!(RedisField::WaitConnections.key(), "wait-connections");
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
