//! `redis-acl` against a real `redis-server` (spawned on a free port): the
//! printed rule is applied with `redis-cli`, the server then runs the
//! provider as that user, and the user can do nothing else.

mod support;

use std::process::Command;

use app_bootstrap::acl::acl_rules;
use redis_fixture::RedisServer;
use reqwest::StatusCode;
use support::{Running, fixed_window_config, load, three_allowed_then_429};

const USER: &str = "e2e-acl";
const PASSWORD: &str = "e2e-acl-password-0123";

/// `redis-cli` on the fixture's port, as `user` (or the default user).
fn redis_cli(redis: &RedisServer, user: Option<(&str, &str)>, args: &[&str]) -> String {
    let mut command = Command::new("redis-cli");
    command.args(["-h", "127.0.0.1", "-p", &redis.port().to_string(), "--no-auth-warning"]);
    if let Some((user, password)) = user {
        command.args(["--user", user, "--pass", password]);
    }
    let output = command.args(args).output().expect("redis-cli runs");
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[tokio::test]
async fn the_printed_rule_is_enough_for_the_provider_and_nothing_more() {
    let redis = RedisServer::start();
    let extra = format!(
        "[redis]\nenabled = true\nurls = [\"{}\"]\nkey-prefix = \"acl:\"\nusername = \"{USER}\"\npassword = \"{PASSWORD}\"\n",
        redis.url()
    );
    let config = load(&fixed_window_config("e2e-acl", "redis", &extra));

    let rules = acl_rules(&config.redis);
    assert_eq!(rules.commands.len(), 1);
    let words: Vec<&str> = rules.commands[0].split(' ').collect();
    assert_eq!(&words[..3], ["ACL", "SETUSER", USER]);
    assert!(!rules.commands[0].contains(PASSWORD), "the password itself is never printed");
    assert_eq!(redis_cli(&redis, None, &words).trim(), "OK");

    // The provider works as that user: scripts load, run, and PING answers.
    let server = Running::start(&config).await;
    assert_eq!(server.get("/readyz").await.status, StatusCode::OK);
    three_allowed_then_429(&server, "e2e-acl", "/api/hello").await;
    server.stop().await;

    // Everything else is refused.
    let as_user = Some((USER, PASSWORD));
    for denied in [
        vec!["EVAL", "return 1", "0"],
        vec!["GET", "outside-the-prefix"],
        vec!["SET", "outside-the-prefix", "1"],
        // The scripts' own commands, outside the prefix; inside it `UNLINK`
        // is the scripts' (the reset, a key changing type), `DEL` is not.
        vec!["UNLINK", "outside-the-prefix"],
        vec!["HSET", "outside-the-prefix", "f", "1"],
        vec!["DEL", "acl:anything"],
        vec!["HGETALL", "acl:anything"],
        vec!["KEYS", "*"],
        vec!["FLUSHALL"],
        vec!["CONFIG", "GET", "*"],
        vec!["SCRIPT", "FLUSH"],
    ] {
        let reply = redis_cli(&redis, as_user, &denied);
        assert!(reply.contains("NOPERM"), "{denied:?} was not refused: {reply}");
    }
    assert_eq!(redis_cli(&redis, as_user, &["PING"]).trim(), "PONG");
}
