//! The least-privilege ACL user: EVALSHA, SCRIPT LOAD and PING, plus GET and
//! SET because Redis checks the commands a script calls against the calling
//! user's ACL, all on the rate-limit key pattern only; and a refused command
//! is a typed `UnavailableBeforeSend`.

mod common;

use std::time::Duration;

use adapter_redis::fixture::RedisServer;
use common::{T0, adapter, inspector, request, subject};
use secrecy::SecretString;
use shared_contract::{
    Algorithm, EdgeRateLimitPort, ManualClock, RateLimitOutcome, RateLimitPolicy,
    UnavailableCategory,
};

/// The rules of the rate-limit user: the scripts, the two commands they
/// call, and PING, on the rate-limit key pattern only. No EVAL.
const LIMITER_RULES: &[&str] = &[
    "on",
    ">limiter-pw",
    "resetkeys",
    "~ca:rl:*",
    "resetchannels",
    "-@all",
    "+evalsha",
    "+script|load",
    "+get",
    "+set",
    "+ping",
];

async fn set_user(server: &RedisServer, name: &str, rules: &[&str]) {
    let mut redis = inspector(server).await;
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg(name)
        .arg(rules)
        .query_async(&mut redis)
        .await
        .unwrap();
}

fn policy() -> RateLimitPolicy {
    RateLimitPolicy::builder(
        "p",
        Algorithm::FixedWindow { limit: 3, window: Duration::from_secs(1) },
    )
    .build()
    .unwrap()
}

fn login(name: &str, password: &str) -> impl FnOnce(&mut adapter_redis::RedisSettings) {
    let (name, password) = (name.to_owned(), password.to_owned());
    move |settings| {
        settings.username = Some(name);
        settings.password = Some(SecretString::from(password));
    }
}

#[tokio::test]
async fn the_least_privilege_user_evaluates_and_may_not_eval() {
    let server = RedisServer::start();
    set_user(&server, "limiter", LIMITER_RULES).await;
    let clock = ManualClock::new(T0);
    let adapter = adapter(&server, &clock, vec![policy()], login("limiter", "limiter-pw"));
    assert!(adapter.is_ready().await);
    for _ in 0..3 {
        let outcome = adapter.evaluate(request(&clock, "p", &subject(1))).await;
        assert!(outcome.is_allowed(), "{outcome:?}");
    }
    assert!(!adapter.evaluate(request(&clock, "p", &subject(1))).await.is_allowed());

    // The same user cannot run plain EVAL, nor touch a key outside the pattern.
    let url = format!("redis://limiter:limiter-pw@127.0.0.1:{}", server.port());
    let mut as_limiter =
        redis::Client::open(url).unwrap().get_multiplexed_async_connection().await.unwrap();
    let eval: redis::RedisResult<i64> =
        redis::cmd("EVAL").arg("return 1").arg(0).query_async(&mut as_limiter).await;
    assert_eq!(eval.unwrap_err().kind(), redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm));
    let get: redis::RedisResult<Option<Vec<u8>>> =
        redis::cmd("GET").arg("app:session:1").query_async(&mut as_limiter).await;
    assert!(get.is_err());
}

#[tokio::test]
async fn noperm_is_unavailable_before_send() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    // May load scripts but not run them.
    set_user(&server, "no-evalsha", &["on", ">pw", "~ca:rl:*", "-@all", "+script|load", "+ping"])
        .await;
    // May run scripts, but on other keys only.
    set_user(
        &server,
        "other-keys",
        &["on", ">pw", "~other:*", "-@all", "+evalsha", "+script|load"],
    )
    .await;
    // May run scripts, but not the commands inside them.
    set_user(&server, "no-get", &["on", ">pw", "~ca:rl:*", "-@all", "+evalsha", "+script|load"])
        .await;
    // May not even load them.
    set_user(&server, "ping-only", &["on", ">pw", "-@all", "+ping"]).await;
    for user in ["no-evalsha", "other-keys", "no-get", "ping-only"] {
        let adapter = adapter(&server, &clock, vec![policy()], login(user, "pw"));
        assert_eq!(
            adapter.evaluate(request(&clock, "p", &subject(2))).await,
            RateLimitOutcome::Unavailable {
                category: UnavailableCategory::UnavailableBeforeSend,
                retry_after: Duration::from_secs(1),
            },
            "{user}"
        );
    }
    // A wrong password never gets a connection: the same outcome.
    let adapter = adapter(&server, &clock, vec![policy()], login("limiter", "wrong"));
    assert!(matches!(
        adapter.evaluate(request(&clock, "p", &subject(2))).await,
        RateLimitOutcome::Unavailable { category: UnavailableCategory::UnavailableBeforeSend, .. }
    ));
    assert!(!adapter.is_ready().await);
}
