//! The cache's rules on hand-made answers; the real-server tests in
//! `tests/deny_cache.rs` show the same against Redis.

use std::time::Instant;

use shared_contract::{
    Algorithm, EvaluationDedupPolicy, PolicyId, RateLimitDecision, RateLimitFailure,
};
use uuid::Uuid;

use super::*;

use crate::T0;

/// The default `deny-cache.max-age`; the windows here are shorter.
const MAX_AGE: Duration = Duration::from_secs(1);

fn fixed(id: &str, revision: u32) -> RateLimitPolicy {
    RateLimitPolicy::builder(
        id,
        Algorithm::FixedWindow(shared_contract::FixedWindow {
            limit: 3,
            window: Duration::from_millis(1000),
        }),
    )
    .revision(revision)
    .scope(PolicyScope::Subject)
    .maximum_cost(3)
    .evaluation_dedup(EvaluationDedupPolicy::Disabled)
    .build()
    .unwrap()
}

fn request(ids: &[&str], subject: u8, cost: u64, evaluation: u128) -> RateLimitRequest<'static> {
    RateLimitRequest {
        policies: PolicySet::new(ids.iter().map(|id| PolicyId::new(*id).unwrap())).unwrap().into(),
        subject: SubjectDigest::parse(format!("v1:{}", format!("{subject:02x}").repeat(16)))
            .unwrap(),
        operation: OperationDigest::from_u128(0x0011_2233_4455_6677_8899_aabb_ccdd_eeff),
        cost,
        evaluation_id: EvaluationId::from_uuid(Uuid::from_u128(evaluation)),
        deadline: Instant::now() + Duration::from_secs(5),
    }
}

fn decided(allowed: bool, remaining: u64, retry: u64, reset: u64) -> RateLimitDecision {
    RateLimitDecision {
        allowed,
        remaining,
        retry_after_ms: retry,
        reset_after_ms: reset,
        replayed: false,
    }
}

fn refused(decisions: &[RateLimitDecision]) -> RateLimitOutcome {
    let set = SetDecision::of_members(decisions.iter().map(|d| (PolicyMode::Enforce, *d)));
    assert!(!set.allowed(), "a refusal holds a denial");
    Ok(set)
}

fn admitted() -> RateLimitOutcome {
    Ok(SetDecision::single(decided(true, 0, 0, 700)))
}

fn only(decision: SetDecision) -> RateLimitDecision {
    match decision.decisions() {
        [one] => *one,
        other => panic!("one decision expected, got {other:?}"),
    }
}

#[test]
fn a_refusal_answers_with_shrinking_waits_until_its_retry_after() {
    let cache = DenyCache::new(100, MAX_AGE);
    let p = [fixed("p", 1)];
    let denied = request(&["p"], 1, 1, 1);
    // Refused at T0 + 250: 0 left, retry and reset 750 ms.
    cache.learn(&denied, p.iter(), T0 + 250, &refused(&[decided(false, 0, 750, 750)]));
    let later = request(&["p"], 1, 1, 2);
    let answer = cache.lookup(&later, p.iter(), T0 + 600).expect("cached");
    assert!(answer.cached() && !answer.allowed());
    assert_eq!(only(answer), decided(false, 0, 400, 400));
    // One millisecond before T0 + 1000 the wait is 1 ms; at T0 + 1000 the
    // window has ended and Redis answers.
    assert_eq!(only(cache.lookup(&later, p.iter(), T0 + 999).unwrap()).retry_after_ms, 1);
    assert_eq!(cache.lookup(&later, p.iter(), T0 + 1000), None);
    assert_eq!(cache.len(), 0, "a refusal that ran out is dropped when met");
}

/// A member that allowed the cached cost with fewer units left than a
/// higher one refuses that, as Redis would (docs/algorithms.md, the fixed
/// window: `n + c > L` is denied, `retry_after = max(e - t, 1)`).
#[test]
fn at_a_higher_cost_a_member_left_short_refuses_too() {
    let cache = DenyCache::new(100, MAX_AGE);
    let (p, q) = (fixed("p", 1), fixed("q", 1));
    let set = [p, q];
    // At cost 1, at T0 + 100: p denies (0 left), q allows with 1 left.
    let at_one = refused(&[decided(false, 0, 900, 900), decided(true, 1, 0, 900)]);
    cache.learn(&request(&["p", "q"], 1, 1, 1), set.iter(), T0 + 100, &at_one);
    let same = cache.lookup(&request(&["p", "q"], 1, 1, 2), set.iter(), T0 + 200).unwrap();
    assert_eq!(same.decisions(), [decided(false, 0, 800, 800), decided(true, 1, 0, 800)]);
    // At cost 2 q has too few left: it refuses until its window ends.
    let higher = cache.lookup(&request(&["p", "q"], 1, 2, 3), set.iter(), T0 + 200).unwrap();
    assert!(higher.cached() && !higher.allowed());
    assert_eq!(higher.decisions(), [decided(false, 0, 800, 800), decided(false, 1, 800, 800)]);
}

#[test]
fn a_higher_cost_is_refused_and_a_lower_one_asks_redis() {
    let cache = DenyCache::new(100, MAX_AGE);
    let p = [fixed("p", 1)];
    cache.learn(&request(&["p"], 1, 2, 1), p.iter(), T0, &refused(&[decided(false, 1, 900, 900)]));
    assert!(cache.lookup(&request(&["p"], 1, 3, 2), p.iter(), T0 + 10).is_some());
    assert!(cache.lookup(&request(&["p"], 1, 2, 3), p.iter(), T0 + 10).is_some());
    assert_eq!(cache.lookup(&request(&["p"], 1, 1, 4), p.iter(), T0 + 10), None);
    assert_eq!(cache.len(), 1, "a lower cost leaves the refusal in place");
}

#[test]
fn another_subject_set_revision_or_scoped_operation_is_another_key() {
    let cache = DenyCache::new(100, MAX_AGE);
    let p = [fixed("p", 1)];
    let q = [fixed("p", 1), fixed("q", 1)];
    let denial = refused(&[decided(false, 0, 900, 900)]);
    cache.learn(&request(&["p"], 1, 1, 1), p.iter(), T0, &denial);
    assert_eq!(cache.lookup(&request(&["p"], 2, 1, 2), p.iter(), T0), None, "subject");
    assert_eq!(cache.lookup(&request(&["p", "q"], 1, 1, 2), q.iter(), T0), None, "set");
    let revised = [fixed("p", 2)];
    assert_eq!(cache.lookup(&request(&["p"], 1, 1, 2), revised.iter(), T0), None, "revision");
    // A subject-scoped policy ignores the operation; an operation-scoped
    // one keys on it.
    let mut elsewhere = request(&["p"], 1, 1, 2);
    elsewhere.operation = OperationDigest::from_u128(0xffee_ddcc_bbaa_9988_7766_5544_3322_1100);
    assert!(cache.lookup(&elsewhere, p.iter(), T0).is_some());
    let scoped = [RateLimitPolicy::builder(
        "p",
        Algorithm::FixedWindow(shared_contract::FixedWindow {
            limit: 3,
            window: Duration::from_millis(1000),
        }),
    )
    .scope(PolicyScope::Operation)
    .evaluation_dedup(EvaluationDedupPolicy::Disabled)
    .build()
    .unwrap()];
    cache.learn(&request(&["p"], 3, 1, 1), scoped.iter(), T0, &denial);
    assert!(cache.lookup(&request(&["p"], 3, 1, 2), scoped.iter(), T0).is_some());
    assert_eq!(cache.lookup(&elsewhere_for(3), scoped.iter(), T0), None, "operation");
}

fn elsewhere_for(subject: u8) -> RateLimitRequest<'static> {
    let mut elsewhere = request(&["p"], subject, 1, 2);
    elsewhere.operation = OperationDigest::from_u128(0xffee_ddcc_bbaa_9988_7766_5544_3322_1100);
    elsewhere
}

#[test]
fn a_clock_behind_the_refusal_drops_it() {
    let cache = DenyCache::new(100, MAX_AGE);
    let p = [fixed("p", 1)];
    let refusal = |retry| refused(&[decided(false, 0, retry, retry)]);
    cache.learn(&request(&["p"], 1, 1, 1), p.iter(), T0 + 500, &refusal(500));
    // Stepping back must not stretch the refusal: Redis decides (with its
    // mark), and the entry is gone even when the clock comes forward again.
    assert_eq!(cache.lookup(&request(&["p"], 1, 1, 2), p.iter(), T0 + 499), None);
    assert_eq!(cache.len(), 0);
    assert_eq!(cache.lookup(&request(&["p"], 1, 1, 3), p.iter(), T0 + 600), None);
}

#[test]
fn behind_the_latest_time_seen_nothing_is_answered_or_stored() {
    let cache = DenyCache::new(100, MAX_AGE);
    let p = [fixed("p", 1)];
    let refusal = |retry| refused(&[decided(false, 0, retry, retry)]);
    cache.learn(&request(&["p"], 1, 1, 1), p.iter(), T0 + 300, &refusal(700));
    // Another subject's request moves the latest time to T0 + 500.
    assert_eq!(cache.lookup(&request(&["p"], 9, 1, 1), p.iter(), T0 + 500), None);
    // Behind it a key may hold a mark up to T0 + 500, and Redis evaluates
    // at the mark: Redis answers, though the refusal (decided at T0 + 300)
    // is kept for later.
    assert_eq!(cache.lookup(&request(&["p"], 1, 1, 2), p.iter(), T0 + 499), None);
    assert_eq!(cache.len(), 1);
    assert!(cache.lookup(&request(&["p"], 1, 1, 3), p.iter(), T0 + 500).is_some());
    // A refusal decided behind the latest time is not stored: Redis may
    // have counted its waits from a mark ahead of its caller time.
    cache.learn(&request(&["p"], 2, 1, 1), p.iter(), T0 + 450, &refusal(550));
    assert_eq!(cache.len(), 1);
    cache.learn(&request(&["p"], 2, 1, 1), p.iter(), T0 + 500, &refusal(500));
    assert_eq!(cache.len(), 2);
}

#[test]
fn an_admission_drops_the_refusal_and_an_admitted_id_always_asks_redis() {
    let dedupe = [RateLimitPolicy::builder(
        "p",
        Algorithm::FixedWindow(shared_contract::FixedWindow {
            limit: 3,
            window: Duration::from_millis(1000),
        }),
    )
    .maximum_cost(3)
    .build()
    .unwrap()];
    assert!(dedupe[0].evaluation_dedup().record_capacity() > 0);
    let cache = DenyCache::new(100, MAX_AGE);
    let denial = refused(&[decided(false, 0, 900, 900)]);
    // Id 7 admitted at cost 1, then a cost-2 request refused.
    cache.learn(&request(&["p"], 1, 1, 7), dedupe.iter(), T0, &admitted());
    cache.learn(&request(&["p"], 1, 2, 8), dedupe.iter(), T0, &denial);
    assert!(cache.lookup(&request(&["p"], 1, 2, 9), dedupe.iter(), T0 + 1).is_some());
    // A repeat of id 7 at cost 2 (a caller replaying through the port)
    // reaches Redis, which replays it as admitted.
    assert_eq!(cache.lookup(&request(&["p"], 1, 2, 7), dedupe.iter(), T0 + 1), None);
    // Any admission of the key's set drops its refusal.
    cache.learn(&request(&["p"], 1, 1, 10), dedupe.iter(), T0 + 2, &admitted());
    assert_eq!(cache.len(), 0);
}

/// A set's refusal reports every member's `remaining`; a subject-scoped
/// member shared with another set changes when that set is admitted, so
/// any admission of the subject ends the subject's cached refusals.
#[test]
fn an_admission_of_the_subject_in_another_set_ends_its_refusals() {
    let cache = DenyCache::new(100, MAX_AGE);
    let (a, b) = (fixed("a", 1), fixed("b", 1));
    let both = request(&["a", "b"], 1, 1, 1);
    let denial = refused(&[decided(false, 0, 900, 900), decided(true, 2, 0, 900)]);
    cache.learn(&both, [&a, &b].into_iter(), T0, &denial);
    assert!(cache.lookup(&request(&["a", "b"], 1, 1, 2), [&a, &b].into_iter(), T0 + 1).is_some());
    // `b` alone admitted for the subject: the set's `remaining` of `b` is stale.
    cache.learn(&request(&["b"], 1, 1, 5), [&b].into_iter(), T0 + 4, &admitted());
    assert_eq!(cache.lookup(&request(&["a", "b"], 1, 1, 6), [&a, &b].into_iter(), T0 + 5), None);
}

#[test]
fn only_certain_refusals_are_cached() {
    let cache = DenyCache::new(100, MAX_AGE);
    let p = [fixed("p", 1)];
    let sliding = [RateLimitPolicy::builder(
        "p",
        Algorithm::SlidingCounter(shared_contract::SlidingCounter {
            limit: 3,
            window: Duration::from_millis(1000),
        }),
    )
    .build()
    .unwrap()];
    let approximate = RateLimitDecision { ..decided(false, 0, 300, 900) };
    let failures = [
        Err(RateLimitFailure::Indeterminate { retry_after: Duration::from_secs(1) }),
        Err(RateLimitFailure::Unavailable {
            category: shared_contract::UnavailableCategory::ClockUnsafe,
            retry_after: Duration::from_secs(1),
        }),
        Err(RateLimitFailure::Incompatible {
            category: shared_contract::IncompatibleCategory::StateIncompatible,
        }),
    ];
    for failure in &failures {
        cache.learn(&request(&["p"], 1, 1, 1), p.iter(), T0, failure);
    }
    cache.learn(&request(&["p"], 1, 1, 1), sliding.iter(), T0, &refused(&[approximate]));
    assert_eq!(cache.len(), 0);
}

#[test]
fn a_set_is_cached_until_its_soonest_enforced_denial_or_window_end() {
    let window = |id: &str, ms, mode| {
        RateLimitPolicy::builder(
            id,
            Algorithm::FixedWindow(shared_contract::FixedWindow {
                limit: 3,
                window: Duration::from_millis(ms),
            }),
        )
        .mode(mode)
        .scope(PolicyScope::Subject)
        .maximum_cost(3)
        .evaluation_dedup(EvaluationDedupPolicy::Disabled)
        .build()
        .unwrap()
    };
    let set = [
        window("p", 1000, PolicyMode::Enforce),
        window("q", 100, PolicyMode::Enforce),
        window("s", 1000, PolicyMode::Shadow),
    ];
    let cache = DenyCache::new(100, MAX_AGE);
    // p refuses for 600 ms; q allows and its window ends in 40 ms; the
    // shadow policy's own denial decides nothing.
    let answer = refused(&[
        decided(false, 0, 600, 600),
        decided(true, 2, 0, 40),
        decided(false, 0, 600, 600),
    ]);
    cache.learn(&request(&["p", "q", "s"], 1, 3, 1), set.iter(), T0, &answer);
    let ask = request(&["p", "q", "s"], 1, 3, 2);
    assert!(cache.lookup(&ask, set.iter(), T0 + 39).is_some());
    assert_eq!(cache.lookup(&ask, set.iter(), T0 + 40), None, "q's window ended");
}

#[test]
fn a_set_with_a_token_bucket_a_gcra_or_a_concurrency_policy_is_not_cached() {
    let bucket = Algorithm::TokenBucket(shared_contract::TokenBucket {
        capacity: 5,
        refill_tokens: 1,
        refill_period: Duration::from_millis(100),
    });
    let gcra = Algorithm::Gcra(shared_contract::Gcra {
        limit: 10,
        period: Duration::from_secs(1),
        burst: 5,
    });
    let leases = Algorithm::Concurrency(shared_contract::Concurrency {
        max_in_flight: 2,
        lease_ttl: Duration::from_secs(30),
        retry_after: Duration::from_secs(1),
    });
    for algorithm in [bucket, gcra, leases] {
        let other = RateLimitPolicy::builder("b", algorithm.clone())
            .evaluation_dedup(EvaluationDedupPolicy::Disabled)
            .build()
            .unwrap();
        let cache = DenyCache::new(100, MAX_AGE);
        for set in [vec![other.clone()], vec![fixed("p", 1), other]] {
            let ids: Vec<&str> = set.iter().map(|policy| policy.id().as_str()).collect();
            let denials = vec![decided(false, 0, 100, 500); set.len()];
            cache.learn(&request(&ids, 1, 1, 1), set.iter(), T0, &refused(&denials));
        }
        assert_eq!(cache.len(), 0, "{}", algorithm.name());
    }
}

#[test]
fn the_cache_stays_within_max_entries_and_evicts_the_soonest_to_run_out() {
    let cache = DenyCache::new(16, MAX_AGE);
    let p = [fixed("p", 1)];
    for subject in 0..200u8 {
        let retry = 100 + u64::from(subject);
        let denial = refused(&[decided(false, 0, retry, retry)]);
        cache.learn(&request(&["p"], subject, 1, 1), p.iter(), T0, &denial);
        assert!(cache.len() <= 16, "{} entries", cache.len());
    }
    // The newest refusal is always kept.
    assert!(cache.lookup(&request(&["p"], 199, 1, 2), p.iter(), T0 + 1).is_some());
}

#[test]
fn forget_drops_every_refusal_of_a_subject_only() {
    let cache = DenyCache::new(100, MAX_AGE);
    let p = [fixed("p", 1)];
    let q = [fixed("q", 1)];
    let denial = refused(&[decided(false, 0, 900, 900)]);
    for subject in [1, 2] {
        cache.learn(&request(&["p"], subject, 1, 1), p.iter(), T0, &denial);
        cache.learn(&request(&["q"], subject, 1, 1), q.iter(), T0, &denial);
    }
    let one = request(&["p"], 1, 1, 1).subject;
    assert_eq!(cache.forget(&one), 2);
    assert_eq!(cache.lookup(&request(&["p"], 1, 1, 2), p.iter(), T0), None);
    assert!(cache.lookup(&request(&["q"], 2, 1, 2), q.iter(), T0).is_some());
}

#[test]
fn a_refusal_is_served_at_most_its_max_age_whatever_its_retry_after() {
    let cache = DenyCache::new(100, Duration::from_millis(300));
    let hourly = [RateLimitPolicy::builder(
        "h",
        Algorithm::FixedWindow(shared_contract::FixedWindow {
            limit: 3,
            window: Duration::from_secs(3_600),
        }),
    )
    .scope(PolicyScope::Subject)
    .evaluation_dedup(EvaluationDedupPolicy::Disabled)
    .build()
    .unwrap()];
    let denied = request(&["h"], 1, 1, 1);
    let hour = 3_600_000;
    cache.learn(&denied, hourly.iter(), T0, &refused(&[decided(false, 0, hour, hour)]));
    let served = cache.lookup(&denied, hourly.iter(), T0 + 299).unwrap();
    assert_eq!(only(served).retry_after_ms, hour - 299);
    assert!(cache.lookup(&denied, hourly.iter(), T0 + 300).is_none(), "Redis is asked again");
    assert_eq!(cache.len(), 0, "and the entry is gone");
}

#[test]
fn a_settle_ends_the_subjects_refusals_and_one_decided_behind_it_is_not_stored() {
    let cache = DenyCache::new(100, MAX_AGE);
    let p = [fixed("p", 1)];
    let refusal = refused(&[decided(false, 0, 750, 750)]);
    cache.learn(&request(&["p"], 1, 1, 1), p.iter(), T0 + 250, &refusal);
    cache.learn(&request(&["p"], 2, 1, 2), p.iter(), T0 + 250, &refusal);
    // A settle of subject 1 at T0 + 300 may have given its units back.
    cache.settling(T0 + 300);
    cache.settled(&request(&["p"], 1, 1, 3).subject);
    assert_eq!(cache.lookup(&request(&["p"], 1, 1, 4), p.iter(), T0 + 300), None);
    assert!(cache.lookup(&request(&["p"], 2, 1, 5), p.iter(), T0 + 300).is_some(), "another's");
    // Its write may have moved a mark to T0 + 300: a refusal a caller at
    // T0 + 299 got was counted from there, so it is not kept.
    cache.learn(&request(&["p"], 1, 1, 6), p.iter(), T0 + 299, &refusal);
    assert_eq!(cache.lookup(&request(&["p"], 1, 1, 7), p.iter(), T0 + 300), None);
}
