//! The refusals decided before evaluation (`EdgeRejection`) and the problem
//! `type` URIs every refusal answers with: the bottom of the crate.

use std::borrow::Cow;

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

impl EdgeRejection {
    /// The HTTP status of the refusal.
    pub const fn status(&self) -> StatusCode {
        match self {
            Self::InvalidApiKey(_) => StatusCode::BAD_REQUEST,
            Self::MissingPeerAddress => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// Every [`Self::category_name`], each once.
    pub const CATEGORY_NAMES: [&'static str; 2] = [
        Self::InvalidApiKey(ApiKeyProblem::Empty).category_name(),
        Self::MissingPeerAddress.category_name(),
    ];

    /// The problem's title.
    pub const fn title(&self) -> &'static str {
        match self {
            Self::InvalidApiKey(_) => "Invalid API Key",
            Self::MissingPeerAddress => "Client Address Unavailable",
        }
    }

    /// Kebab-case name: the problem `type` suffix.
    pub const fn category_name(&self) -> &'static str {
        match self {
            Self::InvalidApiKey(_) => "invalid-api-key",
            Self::MissingPeerAddress => "client-address-unavailable",
        }
    }

    /// A sentence for the client, free of the rejected value.
    pub fn detail(&self) -> Cow<'static, str> {
        Cow::Borrowed(match self {
            Self::InvalidApiKey(ApiKeyProblem::Empty) => "The API key header is empty.",
            Self::InvalidApiKey(ApiKeyProblem::TooLong) => {
                return Cow::Owned(format!(
                    "The API key is longer than {MAX_API_KEY_BYTES} bytes."
                ));
            }
            Self::InvalidApiKey(ApiKeyProblem::NotVisibleAscii) => {
                "The API key may only contain visible ASCII characters."
            }
            Self::InvalidApiKey(ApiKeyProblem::Repeated) => {
                "The API key header must appear only once."
            }
            Self::MissingPeerAddress => "The server could not determine the client address.",
        })
    }

    /// Every [`Self::outcome_label`], each once.
    pub const OUTCOME_LABELS: [&'static str; 2] = [
        Self::InvalidApiKey(ApiKeyProblem::Empty).outcome_label(),
        Self::MissingPeerAddress.outcome_label(),
    ];

    /// The metrics `outcome` label: `bad-request` for client errors.
    pub const fn outcome_label(&self) -> &'static str {
        match self {
            Self::InvalidApiKey(_) => "bad-request",
            Self::MissingPeerAddress => "client-address-unavailable",
        }
    }
}

/// Every problem type suffix the edge can produce.
pub(crate) fn problem_type_names() -> impl Iterator<Item = &'static str> {
    RateLimitFailure::outcome_names().chain(EdgeRejection::CATEGORY_NAMES)
}

/// `base + category` as a problem type, if it is a URI.
pub(crate) fn problem_type(base: &str, category: &str) -> Option<ProblemType> {
    format!("{base}{category}").parse::<Uri>().ok().map(ProblemType::from)
}

#[cfg(test)]
mod rejection_tests {
    use super::*;

    #[test]
    fn category_names_cover_every_rejection() {
        let all = [
            EdgeRejection::InvalidApiKey(ApiKeyProblem::Repeated),
            EdgeRejection::MissingPeerAddress,
        ];
        for rejection in all {
            // Exhaustive: a new rejection fails to compile until it is listed above.
            match rejection {
                EdgeRejection::InvalidApiKey(_) | EdgeRejection::MissingPeerAddress => {}
            }
            assert!(EdgeRejection::CATEGORY_NAMES.contains(&rejection.category_name()));
            assert!(EdgeRejection::OUTCOME_LABELS.contains(&rejection.outcome_label()));
        }
        assert_eq!(EdgeRejection::CATEGORY_NAMES.len(), all.len());
    }

    #[test]
    fn the_too_long_detail_states_the_limit_in_force() {
        let detail = EdgeRejection::InvalidApiKey(ApiKeyProblem::TooLong).detail();
        assert!(detail.contains(&format!("{MAX_API_KEY_BYTES} bytes")), "{detail}");
    }
}
