//! Each algorithm as the Lua scripts meet it: the tag byte that opens its
//! stored state and names it in a policy's ARGV block, its parameters in
//! that block, and its state as `lua/inspect.lua` replies it. Its Lua side
//! is `lua/<algorithm>.lua`, with its tag and header length in
//! `lua/prelude.lua`; its script is a [`crate::ScriptKind`].

use shared_contract::{Algorithm, AlgorithmKind, AlgorithmState, millis};

/// The tag byte of the algorithm's stored state and of a policy's kind
/// argument (in lower case for a shadow policy), as `lua/prelude.lua`
/// names it.
pub(crate) const fn tag(kind: AlgorithmKind) -> u8 {
    match kind {
        AlgorithmKind::FixedWindow => b'F',
        AlgorithmKind::SlidingCounter => b'S',
        AlgorithmKind::TokenBucket => b'B',
        AlgorithmKind::Gcra => b'G',
        AlgorithmKind::Concurrency => b'C',
    }
}

/// The algorithm's parameters in the order its Lua function takes them,
/// durations in whole milliseconds (GCRA's emission interval in whole
/// microseconds): the end of a policy's ARGV block.
pub(crate) fn parameters(algorithm: &Algorithm) -> Vec<u64> {
    match *algorithm {
        Algorithm::FixedWindow { limit, window } | Algorithm::SlidingCounter { limit, window } => {
            vec![limit, millis(window)]
        }
        Algorithm::TokenBucket { capacity, refill_tokens, refill_period } => {
            vec![capacity, refill_tokens, millis(refill_period)]
        }
        Algorithm::Gcra { burst, .. } => {
            vec![burst, algorithm.emission_interval_micros().unwrap_or(1)]
        }
        Algorithm::Concurrency { max_in_flight, lease_ttl, retry_after } => {
            vec![max_in_flight, millis(lease_ttl), millis(retry_after)]
        }
    }
}

/// The state `lua/inspect.lua` read: its tag byte and the doubles after the
/// mark (zero beyond the algorithm's own); `None` for an unknown tag.
pub(crate) fn state(tag: u8, [a, b, c]: [u64; 3]) -> Option<AlgorithmState> {
    let kind = AlgorithmKind::ALL.into_iter().find(|&kind| self::tag(kind) == tag)?;
    Some(match kind {
        AlgorithmKind::FixedWindow => AlgorithmState::FixedWindow { window_start: a, count: b },
        AlgorithmKind::SlidingCounter => {
            AlgorithmState::SlidingCounter { window_start: a, current: b, previous: c }
        }
        AlgorithmKind::TokenBucket => AlgorithmState::TokenBucket { tokens: a, updated_at: b },
        AlgorithmKind::Gcra => AlgorithmState::Gcra { tat: a },
        AlgorithmKind::Concurrency => AlgorithmState::Concurrency,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_algorithm_has_its_own_upper_case_tag() {
        // A shadow policy sends its tag in lower case, so every tag must be
        // an upper-case letter, and none another's.
        let tags: Vec<u8> = AlgorithmKind::ALL.into_iter().map(tag).collect();
        for (at, t) in tags.iter().enumerate() {
            assert!(t.is_ascii_uppercase(), "{t}");
            assert!(!tags[..at].contains(t), "{t} twice");
        }
        for kind in AlgorithmKind::ALL {
            assert!(state(tag(kind), [1, 2, 3]).is_some(), "{kind}");
        }
        assert_eq!(state(b'X', [1, 2, 3]), None);
        assert_eq!(state(b'f', [1, 2, 3]), None, "lower case is a kind argument, never a state");
    }
}
