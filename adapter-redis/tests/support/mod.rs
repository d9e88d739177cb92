//! Helpers shared by the real-server tests.

#![allow(dead_code, unreachable_pub)] // each test binary uses a different subset

use std::sync::Arc;
use std::time::Duration;

use adapter_redis::{RedisEdgeRateLimitAdapter, RedisSettings, Topology};
use redis_fixture::RedisServer;
use shared_contract::{
    EvaluationId, ManualClock, OperationDigest, PolicyId, RateLimitPolicy, RateLimitRequest,
    SubjectDigest,
};

/// The operation of every request the tests send, as its keys print it
/// (an operation digest: a number, never a route).
pub const OPERATION: &str = "0123456789abcdef0123456789abcdef";

pub fn operation() -> OperationDigest {
    OperationDigest::from_u128(0x0123_4567_89ab_cdef_0123_4567_89ab_cdef)
}

/// A multiple of every window and period the tests use.
pub const T0: u64 = 1_800_000_000_000;

pub fn subject(n: u8) -> SubjectDigest {
    SubjectDigest::parse(format!("v1:{}", format!("{n:02x}").repeat(16))).unwrap()
}

pub fn adapter(
    server: &RedisServer,
    clock: &ManualClock,
    policies: Vec<RateLimitPolicy>,
    tweak: impl FnOnce(&mut RedisSettings),
) -> RedisEdgeRateLimitAdapter {
    let mut settings = RedisSettings {
        urls: vec![server.url()],
        command_timeout: Duration::from_secs(2),
        ..RedisSettings::default()
    };
    tweak(&mut settings);
    RedisEdgeRateLimitAdapter::new(settings, policies, Arc::new(clock.clone())).unwrap()
}

pub fn request(
    clock: &ManualClock,
    policy: &str,
    subject: &SubjectDigest,
) -> RateLimitRequest<'static> {
    request_with(clock, policy, subject, EvaluationId::random(), Duration::from_secs(5))
}

pub fn request_with(
    clock: &ManualClock,
    policy: &str,
    subject: &SubjectDigest,
    evaluation_id: EvaluationId,
    budget: Duration,
) -> RateLimitRequest<'static> {
    use shared_contract::Clock;
    RateLimitRequest {
        policies: shared_contract::PolicySet::single(PolicyId::new(policy).unwrap()).into(),
        subject: *subject,
        operation: operation(),
        cost: 1,
        evaluation_id,
        deadline: clock.monotonic() + budget,
    }
}

/// A plain connection for inspecting and sabotaging the server's keys.
pub async fn inspector(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    redis::Client::open(server.url()).unwrap().get_multiplexed_async_connection().await.unwrap()
}

/// The least-privilege user, with exactly the rules `ca-skeleton redis-acl`
/// prints (`app-bootstrap/src/acl.rs` builds them with the same
/// [`adapter_redis::acl::user_rules`]) for the default key prefix:
///
/// ```text
/// ACL SETUSER ca-rate-limit reset on >PASSWORD ~ca:rl:* resetchannels -@all +evalsha +script|load +ping +info +time +get +set +hmget +hset +hdel +unlink +pexpire +type +zmscore +zcount +zadd +zremrangebyscore +zscore +zrem +zrange
/// ```
///
/// The ACL lane proves the printed rule, not a look-alike.
pub const RATE_LIMIT_USER: &str = "ca-rate-limit";
pub const RATE_LIMIT_PASSWORD: &str = "rate-limit-pw";

/// The rate-limit user's rules on `topology`: its login, then the rules
/// `redis-acl` prints after the password.
pub fn rate_limit_rules(topology: Topology) -> Vec<String> {
    let mut rules = vec!["reset".to_owned(), "on".to_owned(), format!(">{RATE_LIMIT_PASSWORD}")];
    rules.extend(adapter_redis::acl::user_rules("ca:rl:", topology));
    rules
}

/// An operator account for the tests' own inspection.
pub const ADMIN_USER: &str = "admin";
pub const ADMIN_PASSWORD: &str = "admin-pw";

/// A redis-server whose default user is off, with the rate-limit user, an
/// admin, and `extra` users (`(name, rules)`), all from its ACL file.
pub fn acl_server(extra: &[(&str, &[&str])]) -> RedisServer {
    let mut users = vec![
        "user default off".to_owned(),
        format!("user {ADMIN_USER} on >{ADMIN_PASSWORD} ~* &* +@all"),
        format!("user {RATE_LIMIT_USER} {}", rate_limit_rules(Topology::Standalone).join(" ")),
    ];
    users.extend(extra.iter().map(|(name, rules)| format!("user {name} {}", rules.join(" "))));
    RedisServer::start_with_acl(&users)
}

/// A connection to `server` as `user`.
pub async fn connect_as(
    server: &RedisServer,
    user: &str,
    password: &str,
) -> redis::RedisResult<redis::aio::MultiplexedConnection> {
    let url = format!("redis://{user}:{password}@127.0.0.1:{}", server.port());
    redis::Client::open(url)?.get_multiplexed_async_connection().await
}

/// The key prefix of a contract-suite scope: checks never share state, and
/// two builds over one scope do. It stays inside the ACL user's `~ca:rl:*`.
pub fn scope_prefix(scope: &str) -> String {
    format!("ca:rl:t:{scope}:")
}

/// Settings that log in as `user`.
pub fn login(user: &str, password: &str) -> impl FnOnce(&mut RedisSettings) {
    let (user, password) = (user.to_owned(), password.to_owned());
    move |settings| {
        settings.username = Some(user);
        settings.password = Some(secrecy::SecretString::from(password));
    }
}

/// The user the provider asks the sentinels as, with exactly the rules
/// `redis-acl` prints for them ([`adapter_redis::acl::sentinel_user_rules`]).
pub const SENTINEL_USER: &str = "ca-rate-limit-sentinel";
pub const SENTINEL_PASSWORD: &str = "sentinel-pw";

/// `user <name> reset on ><password> <rules>...`, an ACL file line.
pub fn acl_line(user: &str, password: &str, rules: &[String]) -> String {
    format!("user {user} reset on >{password} {}", rules.join(" "))
}

/// Settings for the Sentinel group `sentinel`, logged in as the
/// least-privilege users on both sides, with generous timeouts (the checks
/// test semantics, and CI machines are busy).
pub fn sentinel_settings(sentinel: &redis_fixture::RedisSentinel) -> RedisSettings {
    RedisSettings {
        topology: Topology::Sentinel,
        urls: vec![],
        sentinels: sentinel.sentinel_addresses(),
        master_name: redis_fixture::MASTER_NAME.to_owned(),
        username: Some(RATE_LIMIT_USER.to_owned()),
        password: Some(secrecy::SecretString::from(RATE_LIMIT_PASSWORD)),
        sentinel_username: Some(SENTINEL_USER.to_owned()),
        sentinel_password: Some(secrecy::SecretString::from(SENTINEL_PASSWORD)),
        command_timeout: Duration::from_secs(2),
        connect_timeout: Duration::from_secs(2),
        ..RedisSettings::default()
    }
}

/// The data user's rules for `settings`, as `redis-acl` prints them.
pub fn data_user_line(settings: &RedisSettings) -> String {
    acl_line(RATE_LIMIT_USER, RATE_LIMIT_PASSWORD, &adapter_redis::acl::user_rules_for(settings))
}

/// The sentinel user's rules, as `redis-acl` prints them.
pub fn sentinel_user_line() -> String {
    acl_line(SENTINEL_USER, SENTINEL_PASSWORD, &adapter_redis::acl::sentinel_user_rules())
}
