//! Whether the server may evict rate-limit counters: read on every new
//! connection of a gateway (start-up and each reconnect), never on a
//! request's path.
//!
//! A counter Redis evicts (or an empty restart loses) reads as absent, and
//! absent means a fresh budget: with any `maxmemory-policy` but
//! `noeviction`, a full Redis re-grants spent budgets without a word (the
//! `volatile-*` policies too: every key of ours has an expiry, so ours go
//! first). The policy is read with `INFO memory`, which the least-privilege
//! user may run (`+info` in [`crate::acl`]) where `CONFIG GET` is refused,
//! and a policy that can evict is logged as one warning per connection
//! naming `maxmemory-policy` (docs/operations.md, "Eviction, persistence
//! and empty restarts").

use std::sync::Arc;
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{ErrorKind, ServerErrorKind, Value};

/// The only policy that never evicts a key: a full Redis refuses writes
/// instead (`OOM`), which the provider answers fail-closed.
const SAFE_POLICY: &str = "noeviction";

/// Reads the eviction policy on `connection` within `timeout`, on a task
/// of its own, and logs what it means; `label` names the topology.
pub(crate) fn check<C: ConnectionLike + Send + 'static>(
    mut connection: C,
    label: Arc<str>,
    timeout: Duration,
) {
    tokio::spawn(async move {
        let mut info = redis::cmd("INFO");
        info.arg("memory");
        let read = tokio::time::timeout(timeout, info.query_async::<Value>(&mut connection)).await;
        let label = &*label;
        match read {
            Ok(Ok(reply)) => report(label, &reply),
            Ok(Err(error)) if error.kind() == ErrorKind::Server(ServerErrorKind::NoPerm) => {
                tracing::warn!(
                    label,
                    "redis maxmemory-policy unknown: this user may not run INFO (grant +info, as \
                     `ca-skeleton redis-acl` prints); a policy that evicts re-grants spent budgets"
                );
            }
            Ok(Err(error)) => {
                tracing::warn!(label, kind = error.category(), "redis maxmemory-policy unread");
            }
            Err(_) => tracing::warn!(label, "redis maxmemory-policy unread: INFO timed out"),
        }
    });
}

/// Logs the policy of every node in `reply` (one node's text, or a
/// cluster's map of them): a warning for each that can evict.
fn report(label: &str, reply: &Value) {
    let mut texts = Vec::new();
    texts_of(reply, &mut texts);
    let mut seen = false;
    for text in texts {
        let Some(policy) = field(&text, "maxmemory_policy") else { continue };
        seen = true;
        let maxmemory = field(&text, "maxmemory").unwrap_or("unknown");
        if policy == SAFE_POLICY {
            tracing::debug!(label, maxmemory_policy = policy, "redis maxmemory-policy noeviction");
        } else {
            tracing::warn!(
                label,
                maxmemory_policy = policy,
                maxmemory,
                "redis maxmemory-policy can evict rate limit counters: an evicted counter \
                 re-grants a spent budget; set maxmemory-policy noeviction (docs/operations.md)"
            );
        }
    }
    if !seen {
        tracing::warn!(label, "redis maxmemory-policy unread: INFO memory did not name it");
    }
}

/// Every text reply inside `reply`, however nested.
fn texts_of(reply: &Value, into: &mut Vec<String>) {
    match reply {
        Value::BulkString(bytes) => into.push(String::from_utf8_lossy(bytes).into_owned()),
        Value::SimpleString(text) => into.push(text.clone()),
        Value::VerbatimString { text, .. } => into.push(text.clone()),
        Value::Array(items) | Value::Set(items) => {
            for item in items {
                texts_of(item, into);
            }
        }
        Value::Map(pairs) => {
            for (_, item) in pairs {
                texts_of(item, into);
            }
        }
        _ => {}
    }
}

/// The value of `name:value` among INFO's lines.
fn field<'t>(text: &'t str, name: &str) -> Option<&'t str> {
    text.lines().find_map(|line| {
        line.strip_prefix(name).and_then(|rest| rest.strip_prefix(':')).map(str::trim)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const INFO: &str = "# Memory\r\nused_memory:1000\r\nmaxmemory:0\r\n\
                        maxmemory_human:0B\r\nmaxmemory_policy:allkeys-lru\r\n";

    #[test]
    fn the_policy_and_the_limit_are_read_from_their_own_lines() {
        assert_eq!(field(INFO, "maxmemory_policy"), Some("allkeys-lru"));
        assert_eq!(field(INFO, "maxmemory"), Some("0"));
        assert_eq!(field(INFO, "maxmemory_samples"), None);
    }

    #[test]
    fn a_cluster_reply_gives_each_node_its_text() {
        let node = |policy: &str| Value::BulkString(format!("maxmemory_policy:{policy}").into());
        let reply = Value::Map(vec![
            (Value::SimpleString("a".into()), node("noeviction")),
            (Value::SimpleString("b".into()), node("volatile-lru")),
        ]);
        let mut texts = Vec::new();
        texts_of(&reply, &mut texts);
        let policies: Vec<_> =
            texts.iter().filter_map(|text| field(text, "maxmemory_policy")).collect();
        assert_eq!(policies, ["noeviction", "volatile-lru"]);
    }
}
