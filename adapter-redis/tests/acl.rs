//! The least-privilege ACL lane on a real redis-server started from an ACL
//! file: the default user is off, and the rate-limit user has exactly the
//! rule `ca-skeleton redis-acl` prints (EVALSHA, SCRIPT LOAD, PING, and the
//! scripts' own commands, because Redis checks the commands a script calls
//! against the caller's ACL; all on `ca:rl:*` only). A refused command is a
//! typed `UnavailableBeforeSend`; each sorted-set command of the rule is
//! needed by some lease script.

mod support;

use std::time::Duration;

use adapter_redis::Topology;
use redis::{ErrorKind, RedisResult, ServerErrorKind};
use shared_contract::{
    Algorithm, BudgetKey, EdgeRateLimitPort, EvaluationDedupPolicy, Lease, ManualClock, PolicyId,
    RateLimitFailure, RateLimitOutcomeExt, RateLimitPolicy, ReleaseOutcome, UnavailableCategory,
};
use support::{
    ADMIN_PASSWORD, ADMIN_USER, RATE_LIMIT_PASSWORD, RATE_LIMIT_USER, T0, acl_server, adapter,
    connect_as, login, operation, rate_limit_rules, request, subject,
};

fn policy() -> RateLimitPolicy {
    RateLimitPolicy::builder(
        "p",
        Algorithm::FixedWindow(shared_contract::FixedWindow {
            limit: 3,
            window: Duration::from_secs(1),
        }),
    )
    .build()
    .unwrap()
}

/// [`policy`] without dedupe: its key is a string, read with GET (with
/// dedupe on, the key is a hash read with HMGET).
fn policy_without_dedupe() -> RateLimitPolicy {
    RateLimitPolicy::builder(
        "p",
        Algorithm::FixedWindow(shared_contract::FixedWindow {
            limit: 3,
            window: Duration::from_secs(1),
        }),
    )
    .evaluation_dedup(EvaluationDedupPolicy::Disabled)
    .build()
    .unwrap()
}

fn noperm<T: std::fmt::Debug>(result: RedisResult<T>) -> bool {
    matches!(&result, Err(error) if error.kind() == ErrorKind::Server(ServerErrorKind::NoPerm))
}

#[tokio::test]
async fn the_rate_limit_user_evaluates_runs_evalsha_and_nothing_else() {
    let server = acl_server(&[]);
    let clock = ManualClock::new(T0);
    let adapter =
        adapter(&server, &clock, vec![policy()], login(RATE_LIMIT_USER, RATE_LIMIT_PASSWORD));
    assert!(adapter.is_ready().await);
    for _ in 0..3 {
        let outcome = adapter.evaluate(request(&clock, "p", &subject(1))).await;
        assert!(outcome.is_allowed(), "{outcome:?}");
    }
    assert!(!adapter.evaluate(request(&clock, "p", &subject(1))).await.is_allowed());

    // Asked of the real server, as the same user.
    let mut limiter = connect_as(&server, RATE_LIMIT_USER, RATE_LIMIT_PASSWORD).await.unwrap();
    let eval: RedisResult<i64> =
        redis::cmd("EVAL").arg("return 1").arg(0).query_async(&mut limiter).await;
    assert!(noperm(eval), "EVAL must be refused with NOPERM");
    // EVALSHA of a loaded script works, on a key inside the pattern.
    let digest: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg("return redis.call('GET', KEYS[1])")
        .query_async(&mut limiter)
        .await
        .unwrap();
    let inside: Option<Vec<u8>> = redis::cmd("EVALSHA")
        .arg(&digest)
        .arg(1)
        .arg("ca:rl:{probe}")
        .query_async(&mut limiter)
        .await
        .unwrap();
    assert_eq!(inside, None);
    // The same script on a key outside the pattern, and plain commands on
    // it, are refused.
    let outside: RedisResult<Option<Vec<u8>>> = redis::cmd("EVALSHA")
        .arg(&digest)
        .arg(1)
        .arg("app:session:1")
        .query_async(&mut limiter)
        .await;
    assert!(noperm(outside), "EVALSHA on a key outside ca:rl:* must be refused");
    let get: RedisResult<Option<Vec<u8>>> =
        redis::cmd("GET").arg("app:session:1").query_async(&mut limiter).await;
    assert!(noperm(get), "GET outside the pattern must be refused");
    for command in [&["FLUSHALL"][..], &["CONFIG", "GET", "maxmemory"], &["KEYS", "*"]] {
        let refused: RedisResult<redis::Value> =
            redis::cmd(command[0]).arg(&command[1..]).query_async(&mut limiter).await;
        assert!(noperm(refused), "{command:?} must be refused");
    }
}

#[tokio::test]
async fn the_default_user_is_off() {
    let server = acl_server(&[]);
    let url = format!("redis://127.0.0.1:{}", server.port());
    let mut anonymous =
        redis::Client::open(url).unwrap().get_multiplexed_async_connection().await.unwrap();
    let ping: RedisResult<String> = redis::cmd("PING").query_async(&mut anonymous).await;
    assert_eq!(ping.unwrap_err().code(), Some("NOAUTH"));
    assert!(connect_as(&server, ADMIN_USER, ADMIN_PASSWORD).await.is_ok());
    // An off user cannot authenticate, whatever the password.
    assert!(connect_as(&server, "default", "any-password").await.is_err());
}

#[tokio::test]
async fn users_without_a_needed_permission_get_unavailable_before_send() {
    // The printed rule with one permission taken out at a time.
    let rules = rate_limit_rules(Topology::Standalone);
    let without = |dropped: &str| -> Vec<&str> {
        rules.iter().map(String::as_str).filter(|rule| *rule != dropped).collect()
    };
    let no_script_load = without("+script|load");
    let no_evalsha = without("+evalsha");
    let no_get = without("+get");
    let no_hmget = without("+hmget");
    let mut other_keys = without("~ca:rl:*");
    other_keys.push("~other:*");
    let server = acl_server(&[
        ("no-script-load", &no_script_load),
        ("no-evalsha", &no_evalsha),
        ("no-get", &no_get),
        ("no-hmget", &no_hmget),
        ("other-keys", &other_keys),
    ]);
    let clock = ManualClock::new(T0);
    for (user, policy) in [
        ("no-script-load", policy()),
        ("no-evalsha", policy()),
        ("no-get", policy_without_dedupe()),
        ("no-hmget", policy()),
        ("other-keys", policy()),
    ] {
        let adapter = adapter(&server, &clock, vec![policy], login(user, RATE_LIMIT_PASSWORD));
        assert_eq!(
            adapter.evaluate(request(&clock, "p", &subject(2))).await,
            Err(RateLimitFailure::Unavailable {
                category: UnavailableCategory::UnavailableBeforeSend,
                retry_after: Duration::from_secs(1),
            }),
            "{user}"
        );
    }
    // A wrong password never gets a connection: the same outcome.
    let wrong = adapter(&server, &clock, vec![policy()], login(RATE_LIMIT_USER, "wrong"));
    assert!(matches!(
        wrong.evaluate(request(&clock, "p", &subject(2))).await,
        Err(RateLimitFailure::Unavailable {
            category: UnavailableCategory::UnavailableBeforeSend,
            ..
        })
    ));
    assert!(!wrong.is_ready().await);
    // Nothing was charged by any of them: the real user still has the whole budget.
    let adapter =
        adapter(&server, &clock, vec![policy()], login(RATE_LIMIT_USER, RATE_LIMIT_PASSWORD));
    let Ok(decision) = adapter.evaluate(request(&clock, "p", &subject(2))).await else {
        panic!("the rate-limit user must get a decision");
    };
    assert_eq!(decision.decisions()[0].remaining, 2);
}

/// A concurrency policy: its key is a lease set (docs/algorithms.md,
/// "Stored state on Redis").
fn leases() -> RateLimitPolicy {
    RateLimitPolicy::builder(
        "p",
        Algorithm::Concurrency(shared_contract::Concurrency {
            max_in_flight: 3,
            lease_ttl: Duration::from_secs(30),
            retry_after: Duration::from_secs(1),
        }),
    )
    .build()
    .unwrap()
}

/// Whether `user` can take two leases, give one back, inspect the budget
/// and reset it: every script a lease key meets, each call a definite
/// answer.
async fn leases_work_as(server: &redis_fixture::RedisServer, user: &str) -> bool {
    let clock = ManualClock::new(T0);
    let adapter = adapter(server, &clock, vec![leases()], login(user, RATE_LIMIT_PASSWORD));
    let first = request(&clock, "p", &subject(3));
    let lease = Lease::of(&first);
    // A fresh key each time: the reset below drops it.
    let taken = adapter.evaluate(first).await.is_allowed()
        && adapter.evaluate(request(&clock, "p", &subject(3))).await.is_allowed();
    let released = adapter.release(&lease).await == ReleaseOutcome::Released;
    let budget = BudgetKey::new(subject(3), PolicyId::new("p").unwrap(), Some(operation()));
    let inspected = adapter.inspect(&budget).await.is_ok_and(|state| state.remaining == 2);
    let reset = adapter.reset(&budget).await.is_ok();
    taken && released && inspected && reset
}

#[tokio::test]
async fn the_printed_rule_runs_leases_and_each_sorted_set_command_in_it_is_needed() {
    let rules = rate_limit_rules(Topology::Standalone);
    let sorted_set =
        ["+zmscore", "+zcount", "+zadd", "+zremrangebyscore", "+zscore", "+zrem", "+zrange"];
    let users: Vec<(String, Vec<&str>)> = sorted_set
        .iter()
        .map(|dropped| {
            let held = rules.iter().map(String::as_str).filter(|rule| rule != dropped).collect();
            (format!("no-{}", &dropped[1..]), held)
        })
        .collect();
    let extra: Vec<(&str, &[&str])> =
        users.iter().map(|(name, held)| (name.as_str(), held.as_slice())).collect();
    let server = acl_server(&extra);
    assert!(leases_work_as(&server, RATE_LIMIT_USER).await, "the printed rule");
    for (user, _) in &users {
        assert!(!leases_work_as(&server, user).await, "{user} still runs every lease script");
    }
}

/// A rule printed before the scripts read Redis's clock has no `+time`:
/// the scripts then judge clocks against each other only, and every
/// evaluation still decides (a second write moves the key's mark, the
/// moment the scripts ask for `TIME`).
#[tokio::test]
async fn a_user_without_time_still_evaluates() {
    let rules = rate_limit_rules(Topology::Standalone);
    let no_time: Vec<&str> =
        rules.iter().map(String::as_str).filter(|rule| *rule != "+time").collect();
    let server = acl_server(&[("no-time", &no_time)]);
    let clock = ManualClock::new(T0);
    for policy in [policy(), policy_without_dedupe(), leases()] {
        let adapter = adapter(&server, &clock, vec![policy], login("no-time", RATE_LIMIT_PASSWORD));
        for at in [T0, T0 + 5, T0 + 10] {
            clock.set_epoch_millis(at);
            let outcome = adapter.evaluate(request(&clock, "p", &subject(9))).await;
            assert!(outcome.is_allowed(), "{outcome:?}");
        }
        let budget = BudgetKey::new(subject(9), PolicyId::new("p").unwrap(), Some(operation()));
        adapter.reset(&budget).await.unwrap();
    }
}
