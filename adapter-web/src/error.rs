//! `WebError`: the one error type of this crate, for configuration that
//! cannot work. Bad client input is not an error here; it is an
//! [`crate::EdgeRejection`] answered with a `400`.

/// Edge configuration that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WebError {
    /// A pseudonymizer key shorter than the HMAC-SHA-256 output size.
    #[error(
        "pseudonymizer key version {version} has {length} bytes; at least {minimum} are required"
    )]
    KeyTooShort {
        /// The key version.
        version: u32,
        /// Bytes the key has.
        length: usize,
        /// Bytes a key needs.
        minimum: usize,
    },
    /// The same key version configured twice.
    #[error("pseudonymizer key version {0} is configured more than once")]
    DuplicateKeyVersion(u32),
    /// A version asked for (the active one, or an explicit one) has no key.
    #[error("pseudonymizer key version {0} is not configured")]
    UnknownKeyVersion(u32),
    /// `problem_type_base` is empty, or plus a category name does not form
    /// a URI.
    #[error("problem type base {base:?} does not form a valid URI with {category:?}")]
    InvalidProblemTypeBase {
        /// The configured base.
        base: String,
        /// The category that was appended (empty for an empty base).
        category: &'static str,
    },
    /// The evaluation budget is under a millisecond, so every request would
    /// miss its deadline.
    #[error("the evaluation budget must be at least 1ms, got {0:?}")]
    EvaluationBudgetTooShort(std::time::Duration),
    /// The failure retry-after is under a millisecond: clients would be told
    /// to retry at once.
    #[error("the failure retry-after must be at least 1ms, got {0:?}")]
    FailureRetryAfterTooShort(std::time::Duration),
    /// `client_ipv4_prefix` is outside `1..=32`.
    #[error("the client IPv4 prefix must be 1 to 32 bits, got {0}")]
    ClientIpv4PrefixOutOfRange(u8),
    /// `client_ipv6_prefix` is outside `1..=128`.
    #[error("the client IPv6 prefix must be 1 to 128 bits, got {0}")]
    ClientIpv6PrefixOutOfRange(u8),
    /// `trusted_proxies` covers every address of a family (`0.0.0.0/0`,
    /// `::/0`, or networks that add up to one): any client of it could
    /// write its own address into the forwarding header.
    #[error(
        "the trusted proxies cover every address ({0}), so any client could name its own \
         address in a forwarding header: list only the networks your proxies connect from"
    )]
    TrustedProxiesCoverEveryAddress(ipnet::IpNet),
}
