//! `charge = "always"`: hits reported after the fact (Envoy's
//! `apply_on_stream_done`) are charged whatever remains and answered OK;
//! a look (`hits_addend` 0) at request time refuses while the debt stands.
//! The numbers are docs/algorithms.md's "Settling usage" (a reservation of
//! 0: fixed window `L = 10`, 12 charged, in debt until the window ends).

mod support;

use std::sync::Arc;
use std::time::Duration;

use adapter_envoy_rls::RlsRule;
use adapter_memory::MemoryEdgeRateLimitAdapter;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use shared_contract::{ManualClock, PolicyScope};
use support::*;

#[tokio::test]
async fn hits_charged_always_go_past_the_limit_and_a_look_refuses_until_the_window_ends() {
    // A multiple of the 60 s window.
    let clock = ManualClock::new(1_800_000_000_000);
    let policies = vec![fixed("tokens", 10, 60, PolicyScope::Subject)];
    let port =
        Arc::new(MemoryEdgeRateLimitAdapter::new(policies, Arc::new(clock.clone())).unwrap());
    let charged = RlsRule { charge_always: true, ..rule("ai", &["user"], None, &["tokens"]) };
    let mut rls = Rls::start(engine(port, Arc::new(clock.clone()), &[charged])).await;
    let look = || request("ai", vec![descriptor(&[("user", "u1")], Some(0))], 1);
    let report = |hits| request("ai", vec![descriptor(&[("user", "u1")], Some(hits))], 1);

    let before = rls.ok(look()).await;
    assert_eq!(overall(&before), Code::Ok, "a fresh budget: {before:?}");
    // 12 of 10, above maximum-cost too: charged, answered OK.
    let after = rls.ok(report(12)).await;
    assert_eq!(overall(&after), Code::Ok, "usage is charged, never refused: {after:?}");
    let refused = rls.ok(look()).await;
    assert_eq!(overall(&refused), Code::OverLimit, "in debt: {refused:?}");
    assert_eq!(refused.statuses[0].limit_remaining, 0);
    // More usage still goes in, answered OK.
    assert_eq!(overall(&rls.ok(report(1)).await), Code::Ok);
    assert_eq!(overall(&rls.ok(look()).await), Code::OverLimit);
    clock.advance(Duration::from_secs(60));
    let next = rls.ok(look()).await;
    assert_eq!(overall(&next), Code::Ok, "the next window: {next:?}");
    assert_eq!(next.statuses[0].limit_remaining, 10);
}

/// Charges run in the call's order among its sets: a look before a charge
/// sees the budget without it, one after it with it. A report beyond a
/// counter's range is charged as the most a settle charges, never as nothing.
#[tokio::test]
async fn charges_keep_their_place_in_the_call_and_a_huge_report_is_charged() {
    let clock = ManualClock::new(1_800_000_000_000);
    let policies = vec![fixed("tokens", 10, 60, PolicyScope::Subject)];
    let port =
        Arc::new(MemoryEdgeRateLimitAdapter::new(policies, Arc::new(clock.clone())).unwrap());
    let charged = RlsRule { charge_always: true, ..rule("ai", &["user"], None, &["tokens"]) };
    let mut rls = Rls::start(engine(port, Arc::new(clock), &[charged])).await;
    let of = |user: &str, hits| descriptor(&[("user", user)], Some(hits));

    let first = rls.ok(request("ai", vec![of("u1", 0), of("u1", 15)], 1)).await;
    assert_eq!(overall(&first), Code::Ok, "the look ran first: {first:?}");
    assert_eq!(first.statuses[0].limit_remaining, 10);
    let second = rls.ok(request("ai", vec![of("u2", 15), of("u2", 0)], 1)).await;
    assert_eq!(overall(&second), Code::OverLimit, "the charge ran first: {second:?}");
    assert_eq!(code(&second.statuses[1]), Code::OverLimit);

    assert_eq!(overall(&rls.ok(request("ai", vec![of("u3", u64::MAX)], 1)).await), Code::Ok);
    let look = rls.ok(request("ai", vec![of("u3", 0)], 1)).await;
    assert_eq!(overall(&look), Code::OverLimit, "charged as 10^9: {look:?}");
}

/// The default: a rule's hits are charged only when its set admits them.
#[tokio::test]
async fn hits_are_charged_when_allowed_by_default() {
    let clock = ManualClock::new(1_800_000_000_000);
    let policies = vec![fixed("tokens", 10, 60, PolicyScope::Subject)];
    let port =
        Arc::new(MemoryEdgeRateLimitAdapter::new(policies, Arc::new(clock.clone())).unwrap());
    let rule = rule("ai", &["user"], None, &["tokens"]);
    let mut rls = Rls::start(engine(port, Arc::new(clock), &[rule])).await;
    let report = |hits| request("ai", vec![descriptor(&[("user", "u1")], Some(hits))], 1);
    assert_eq!(overall(&rls.ok(report(8)).await), Code::Ok);
    assert_eq!(overall(&rls.ok(report(3)).await), Code::OverLimit, "8 + 3 > 10, charged nothing");
    assert_eq!(overall(&rls.ok(report(2)).await), Code::Ok, "8 + 2 fits");
}
