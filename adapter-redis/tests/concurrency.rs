//! 64 concurrent tasks x 20 evaluations on one key with limit 500 admit
//! exactly 500: the scripts are atomic on the server.

mod support;

use std::sync::Arc;
use std::time::Duration;

use redis_fixture::RedisServer;
use shared_contract::{Algorithm, EdgeRateLimitPort, ManualClock, RateLimitPolicy};
use support::{T0, adapter, request, subject};

const TASKS: usize = 64;
const PER_TASK: usize = 20;

async fn admitted(algorithm: Algorithm) -> (usize, usize) {
    let server = RedisServer::start();
    // The manual clock stands still: no new window, no refill.
    let clock = ManualClock::new(T0);
    let policy = RateLimitPolicy::builder("burst", algorithm).build().unwrap();
    let adapter = Arc::new(adapter(&server, &clock, vec![policy], |settings| {
        // Generous, so a busy machine yields decisions, not timeouts.
        settings.command_timeout = Duration::from_secs(10);
    }));
    let who = subject(9);
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let adapter = adapter.clone();
            let clock = clock.clone();
            tokio::spawn(async move {
                let mut outcomes = Vec::with_capacity(PER_TASK);
                for _ in 0..PER_TASK {
                    let mut request = request(&clock, "burst", &who);
                    request.deadline += Duration::from_secs(25);
                    outcomes.push(adapter.evaluate(request).await);
                }
                outcomes
            })
        })
        .collect();
    let (mut allowed, mut denied) = (0, 0);
    for task in tasks {
        for outcome in task.await.unwrap() {
            match outcome {
                Ok(set) if set.allowed() => allowed += 1,
                Ok(_) => denied += 1,
                other => panic!("expected a decision, got {other:?}"),
            }
        }
    }
    (allowed, denied)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fixed_window_admits_exactly_the_limit_under_64_concurrent_tasks() {
    let window = Duration::from_secs(3600);
    let counts =
        admitted(Algorithm::FixedWindow(shared_contract::FixedWindow { limit: 500, window })).await;
    assert_eq!(counts, (500, TASKS * PER_TASK - 500));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn token_bucket_admits_exactly_its_capacity_under_64_concurrent_tasks() {
    let bucket = Algorithm::TokenBucket(shared_contract::TokenBucket {
        capacity: 500,
        refill_tokens: 1,
        refill_period: Duration::from_secs(3600),
    });
    let counts = admitted(bucket).await;
    assert_eq!(counts, (500, TASKS * PER_TASK - 500));
}
