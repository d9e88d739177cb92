//! The Envoy front's failed-closed log line while Redis is down: one a
//! second with `suppressed`, not one per call (the line is throttled per
//! process, so this file holds the one test that fails closed).

mod support;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use adapter_redis::{RedisEdgeRateLimitAdapter, RedisSettings};
use redis_fixture::RedisServer;
use shared_contract::{EdgeRateLimitPort, ManualClock, PolicyScope};
use support::*;

/// Keeps the `suppressed` value of each event whose message is `message`.
struct LinesOf {
    message: &'static str,
    suppressed: Arc<Mutex<Vec<Option<u64>>>>,
    ids: AtomicUsize,
}

#[derive(Default)]
struct Fields {
    message: Option<String>,
    suppressed: Option<u64>,
}

impl tracing::field::Visit for Fields {
    fn record_u64(&mut self, field: &tracing::field::Field, value: u64) {
        if field.name() == "suppressed" {
            self.suppressed = Some(value);
        }
    }

    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.message = Some(format!("{value:?}"));
        }
    }
}

impl tracing::Subscriber for LinesOf {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(self.ids.fetch_add(1, Ordering::Relaxed) as u64 + 1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        if fields.message.as_deref() == Some(self.message) {
            self.suppressed.lock().unwrap().push(fields.suppressed);
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// Calls refused while Redis is down.
const CALLS: u64 = 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_closed_is_logged_once_a_second_with_the_count_held_back() {
    let suppressed = Arc::new(Mutex::new(Vec::new()));
    let subscriber = LinesOf {
        message: "envoy rls failed closed",
        suppressed: Arc::clone(&suppressed),
        ids: AtomicUsize::new(0),
    };
    tracing::subscriber::set_global_default(subscriber).unwrap();

    let mut server = RedisServer::start();
    let settings = RedisSettings {
        urls: vec![server.url()],
        command_timeout: Duration::from_secs(2),
        connect_timeout: Duration::from_secs(2),
        ..RedisSettings::default()
    };
    let clock = ManualClock::new(1_700_000_000_000);
    let policies = vec![fixed("api", 100, 60, PolicyScope::Subject)];
    let redis: Arc<dyn EdgeRateLimitPort> = Arc::new(
        RedisEdgeRateLimitAdapter::new(settings, policies, Arc::new(clock.clone())).unwrap(),
    );
    let rules = [rule("edge", &["remote_address"], None, &["api"])];
    let mut rls = Rls::start(engine(redis, Arc::new(clock), &rules)).await;
    let ask = || request("edge", vec![descriptor(&[("remote_address", "10.9.0.1")], None)], 1);
    rls.ok(ask()).await;
    server.crash();
    // However long the calls take, one line a second at most, each with
    // the refusals it held back.
    let started = std::time::Instant::now();
    let refused = AtomicBool::new(true);
    for _ in 0..CALLS {
        let status = rls.ask(ask()).await.unwrap_err();
        refused.fetch_and(status.code() == tonic::Code::Unavailable, Ordering::Relaxed);
    }
    let seconds = started.elapsed().as_secs();
    assert!(refused.load(Ordering::Relaxed), "every call fails closed");
    let lines = suppressed.lock().unwrap().clone();
    assert!(!lines.is_empty(), "the first refusal is logged");
    assert!(lines.len() as u64 <= seconds + 1, "{} lines in {seconds} s: {lines:?}", lines.len());
    assert_eq!(lines[0], Some(0), "{lines:?}");
    let held: u64 = lines.iter().map(|held| held.expect("suppressed on every line")).sum();
    assert!(held + lines.len() as u64 <= CALLS, "{lines:?}");
}
