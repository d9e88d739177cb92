//! The anchor of `ca-skeleton bench`'s client CPU per decision: the same
//! single-key fixed-window script (dedupe off, every call allowed and
//! charged) driven through a bare `redis` crate `MultiplexedConnection` and
//! `redis::Script`, with none of the adapter around it: no request, no
//! port, no lane, no deadline, no reply decoding.
//!
//! `bare_client <redis url> <concurrency> <subjects> <seconds> [flavor]`
//! prints one JSON line with the decisions made and the median call's
//! latency; `scripts/bench.sh` runs it under `time` beside `ca-skeleton
//! bench`, at c=64 for client CPU and at c=1 for latency. `flavor` is the
//! tokio runtime's: `multi-thread` (the default, as `ca-skeleton` runs) or
//! `current-thread`, so the runtime's share of the client CPU shows apart
//! from the client's own.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use adapter_redis::ScriptKind;

fn main() -> redis::RedisResult<()> {
    let args: Vec<String> = std::env::args().collect();
    let (url, concurrency, subjects, seconds, flavor) = match &args[..] {
        [_, url, concurrency, subjects, seconds] => {
            (url, concurrency, subjects, seconds, "multi-thread")
        }
        [_, url, concurrency, subjects, seconds, flavor] => {
            (url, concurrency, subjects, seconds, flavor.as_str())
        }
        _ => {
            eprintln!(
                "usage: bare_client <redis url> <concurrency> <subjects> <seconds> \
                 [multi-thread|current-thread]"
            );
            std::process::exit(2);
        }
    };
    let mut runtime = match flavor {
        "multi-thread" => tokio::runtime::Builder::new_multi_thread(),
        "current-thread" => tokio::runtime::Builder::new_current_thread(),
        other => {
            eprintln!("bare_client: unknown runtime flavor {other:?}");
            std::process::exit(2);
        }
    };
    let runtime = runtime.enable_all().build()?;
    runtime.block_on(run(url, concurrency, subjects, seconds, flavor))
}

async fn run(
    url: &str,
    concurrency: &str,
    subjects: &str,
    seconds: &str,
    flavor: &str,
) -> redis::RedisResult<()> {
    let concurrency: usize = concurrency.parse().expect("a concurrency");
    let subjects: usize = subjects.parse().expect("a subject count");
    let duration = Duration::from_secs(seconds.parse().expect("whole seconds"));
    let connection = redis::Client::open(url)?.get_multiplexed_async_connection().await?;
    let script = redis::Script::new(
        ScriptKind::Single(shared_contract::AlgorithmKind::FixedWindow).source(),
    );
    // A fresh prefix per run, so a second run starts from empty counters.
    let salt = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |since| since.as_nanos());
    let end = Instant::now() + duration;
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(concurrency);
    for task in 0..concurrency {
        let mut connection = connection.clone();
        let script = script.clone();
        tasks.push(tokio::spawn(async move {
            let mut decisions = 0_u64;
            // Every call's latency in ns; a run makes a few million at most.
            let mut latencies = Vec::with_capacity(1 << 16);
            let mut next = task % subjects;
            loop {
                let sent = Instant::now();
                if sent >= end {
                    break;
                }
                let key = format!("bare:{{v1:{salt:032x}{next:016x}}}:fixed:1");
                let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis());
                let id = format!("{:016x}", decisions ^ ((task as u64) << 40));
                let _: redis::Value = script
                    .key(key)
                    .arg(now.to_string())
                    .arg(1)
                    .arg(id)
                    .arg("F")
                    .arg(1000)
                    .arg(1000)
                    .arg(0)
                    .arg(0)
                    .arg(1_000_000_000_u64)
                    .arg(60_000)
                    .invoke_async(&mut connection)
                    .await?;
                latencies.push(u32::try_from(sent.elapsed().as_nanos()).unwrap_or(u32::MAX));
                decisions += 1;
                next = (next + concurrency) % subjects;
            }
            Ok::<_, redis::RedisError>((decisions, latencies))
        }));
    }
    let mut decisions = 0;
    let mut latencies = Vec::new();
    for task in tasks {
        let (made, seen) = task.await.expect("a task")?;
        decisions += made;
        latencies.extend(seen);
    }
    let elapsed = started.elapsed().as_secs_f64();
    latencies.sort_unstable();
    let p50 = f64::from(latencies.get(latencies.len() / 2).copied().unwrap_or(0)) / 1e3;
    println!(
        "{{\"runtime\":\"{flavor}\",\"decisions\":{decisions},\"decisions_per_sec\":{:.1},\"p50_us\":{p50:.1}}}",
        decisions as f64 / elapsed
    );
    Ok(())
}
