//! The refusals decided before evaluation (`EdgeRejection`), an operator's
//! unusable identity (`IdentityProblem`), and the problem `type` URIs every
//! refusal answers with: the bottom of the crate.

use http::{StatusCode, Uri};
use problem_details::ProblemType;
use shared_contract::RateLimitFailure;

/// Longest API key accepted, in bytes.
pub const MAX_API_KEY_BYTES: usize = 256;

/// Why a request was refused before evaluation. Nothing was charged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EdgeRejection {
    /// The API key header is unusable: `400`.
    InvalidApiKey(ApiKeyProblem),
    /// No socket peer address (`ConnectInfo`) reached the edge: a wiring fault, `500`.
    MissingPeerAddress,
}

/// What is wrong with an API key. The key itself is never kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiKeyProblem {
    /// The header is present but empty.
    Empty,
    /// Longer than [`MAX_API_KEY_BYTES`].
    TooLong,
    /// A byte outside visible ASCII (`0x21..=0x7E`).
    NotVisibleAscii,
    /// The header appears more than once.
    Repeated,
}

/// Why an identity an operator typed cannot name a subject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdentityProblem {
    /// Not an API key the edge would accept from a client.
    InvalidApiKey(ApiKeyProblem),
    /// Not an IPv4 or IPv6 address.
    NotAnIpAddress,
    /// An empty principal.
    EmptyPrincipal,
}

impl EdgeRejection {
    /// One rejection of each category.
    pub(crate) const ALL: [Self; 2] =
        [Self::InvalidApiKey(ApiKeyProblem::Empty), Self::MissingPeerAddress];

    /// The HTTP status and the problem's title.
    pub const fn status_and_title(&self) -> (StatusCode, &'static str) {
        match self {
            Self::InvalidApiKey(_) => (StatusCode::BAD_REQUEST, "Invalid API Key"),
            Self::MissingPeerAddress => {
                (StatusCode::INTERNAL_SERVER_ERROR, "Client Address Unavailable")
            }
        }
    }

    /// Kebab-case name: the problem `type` suffix.
    pub const fn category_name(&self) -> &'static str {
        match self {
            Self::InvalidApiKey(_) => "invalid-api-key",
            Self::MissingPeerAddress => "client-address-unavailable",
        }
    }

    /// The metrics `outcome` label: `bad-request` for client errors.
    pub const fn outcome_label(&self) -> &'static str {
        match self {
            Self::InvalidApiKey(_) => "bad-request",
            Self::MissingPeerAddress => "client-address-unavailable",
        }
    }

    /// A sentence for the client, free of the rejected value.
    pub const fn detail(&self) -> &'static str {
        match self {
            Self::InvalidApiKey(ApiKeyProblem::Empty) => "The API key header is empty.",
            // `MAX_API_KEY_BYTES` written out (a const text cannot format it); a test checks it.
            Self::InvalidApiKey(ApiKeyProblem::TooLong) => "The API key is longer than 256 bytes.",
            Self::InvalidApiKey(ApiKeyProblem::NotVisibleAscii) => {
                "The API key may only contain visible ASCII characters."
            }
            Self::InvalidApiKey(ApiKeyProblem::Repeated) => {
                "The API key header must appear only once."
            }
            Self::MissingPeerAddress => "The server could not determine the client address.",
        }
    }
}

/// Every problem type suffix the edge can produce.
pub(crate) fn problem_type_names() -> impl Iterator<Item = &'static str> {
    RateLimitFailure::outcome_names().chain(EdgeRejection::ALL.map(|r| r.category_name()))
}

/// `base + category` as a problem type, if it is a URI.
pub(crate) fn problem_type(base: &str, category: &str) -> Option<ProblemType> {
    format!("{base}{category}").parse::<Uri>().ok().map(ProblemType::from)
}

#[cfg(test)]
mod rejection_tests {
    use super::*;

    #[test]
    fn every_rejection_has_its_category_listed() {
        for rejection in [
            EdgeRejection::InvalidApiKey(ApiKeyProblem::Repeated),
            EdgeRejection::MissingPeerAddress,
        ] {
            // Exhaustive: a new rejection fails to compile until it is listed in `ALL`.
            match rejection {
                EdgeRejection::InvalidApiKey(_) | EdgeRejection::MissingPeerAddress => {}
            }
            let listed =
                EdgeRejection::ALL.iter().find(|r| r.category_name() == rejection.category_name());
            assert_eq!(listed.map(EdgeRejection::outcome_label), Some(rejection.outcome_label()));
        }
    }

    #[test]
    fn the_too_long_detail_states_the_limit_in_force() {
        let detail = EdgeRejection::InvalidApiKey(ApiKeyProblem::TooLong).detail();
        assert!(detail.contains(&format!("than {MAX_API_KEY_BYTES} bytes")), "{detail}");
    }
}
