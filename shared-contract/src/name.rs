//! Names that configuration, metrics and problem types spell out.

/// A name that is not one of an enum's: every named enum's `FromStr` error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("must be one of {}, got {got:?}", quoted(.expected))]
pub struct UnknownName {
    /// The names that would have been accepted, in declaration order.
    pub expected: Vec<&'static str>,
    /// What was given.
    pub got: String,
}

/// `"a", "b", "c"`: how a list of names reads in a message.
fn quoted(names: &[&str]) -> String {
    names.iter().map(|name| format!("{name:?}")).collect::<Vec<_>>().join(", ")
}

/// Finds the member of `all` whose `name` is `text`.
pub fn parse_name<T: Copy>(
    all: &[T],
    name: impl Fn(T) -> &'static str,
    text: &str,
) -> Result<T, UnknownName> {
    all.iter().copied().find(|candidate| name(*candidate) == text).ok_or_else(|| UnknownName {
        expected: all.iter().map(|candidate| name(*candidate)).collect(),
        got: text.to_owned(),
    })
}

/// An enum whose variants each have a name ([`named_enum!`]).
pub trait Named: Copy {
    /// The name configuration, metrics and problems spell.
    fn name(self) -> &'static str;
}

/// Implements `FromStr` through [`parse_name`] (`ALL` and `name` needed).
#[macro_export]
macro_rules! impl_from_str_by_name {
    ($named:ty) => {
        impl ::std::str::FromStr for $named {
            type Err = $crate::UnknownName;

            fn from_str(text: &str) -> ::std::result::Result<Self, Self::Err> {
                $crate::parse_name(&<$named>::ALL, <$named>::name, text)
            }
        }
    };
}

/// Declares a unit-only enum whose variants each have a kebab-case name,
/// with `const ALL` (declaration order), `const fn name(self)` and `FromStr`.
#[macro_export]
macro_rules! named_enum {
    ($(#[$meta:meta])* $vis:vis enum $enum:ident {
        $($(#[$variant_meta:meta])* $variant:ident = $name:literal,)+
    }) => {
        $(#[$meta])*
        $vis enum $enum {
            $($(#[$variant_meta])* $variant,)+
        }

        impl $enum {
            /// Every variant, in declaration order.
            pub const ALL: [Self; [$($name),+].len()] = [$(Self::$variant),+];

            /// The kebab-case name configuration, metrics and problems spell.
            pub const fn name(self) -> &'static str {
                match self {
                    $(Self::$variant => $name,)+
                }
            }
        }

        $crate::impl_from_str_by_name!($enum);

        impl $crate::Named for $enum {
            fn name(self) -> &'static str {
                Self::name(self)
            }
        }
    };
}

/// The name of a metric the service exports: `$name` after the one prefix.
#[macro_export]
macro_rules! metric_name {
    ($name:literal) => {
        concat!("ca_skeleton_", $name)
    };
}

/// Counter of decisions, one per policy of each evaluated set: labels
/// `policy`, `algorithm`, `outcome` (`degraded` for each policy of a set the
/// degraded mode decided), `mode`, `cached` (answered from the provider's
/// local denial cache) and `front` ([`FRONT_HTTP`] or [`FRONT_ENVOY_RLS`]).
pub const DECISIONS_TOTAL: &str = metric_name!("rate_limit_decisions_total");

/// Histogram of port evaluation seconds per policy: `policy`, `algorithm`, `front`.
pub const EVALUATION_SECONDS: &str = metric_name!("rate_limit_evaluation_seconds");

/// The `front` label of a decision the HTTP edge asked for.
pub const FRONT_HTTP: &str = "http";
/// Counter of settles by `outcome` (`applied`, `repeated`,
/// `unknown-reservation`, `unsupported`, `failed`) and `front`.
pub const SETTLES_TOTAL: &str = metric_name!("rate_limit_settles_total");

/// The `outcome` label of a settle's answer.
pub const fn settle_outcome_label(outcome: &crate::SettleOutcome) -> &'static str {
    match outcome {
        Ok(crate::Settled::Applied) => "applied",
        Ok(crate::Settled::Repeated) => "repeated",
        Ok(crate::Settled::UnknownReservation) => "unknown-reservation",
        Ok(crate::Settled::Unsupported) => "unsupported",
        Err(_) => "failed",
    }
}

/// The `front` label of a decision Envoy's Rate Limit Service asked for.
pub const FRONT_ENVOY_RLS: &str = "envoy-rls";

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Colour {
        Red,
        Blue,
    }

    fn name(colour: Colour) -> &'static str {
        match colour {
            Colour::Red => "red",
            Colour::Blue => "blue",
        }
    }

    #[test]
    fn a_known_name_parses_and_an_unknown_one_lists_the_choices() {
        let all = [Colour::Red, Colour::Blue];
        assert_eq!(parse_name(&all, name, "blue"), Ok(Colour::Blue));
        let error = parse_name(&all, name, "green").unwrap_err();
        assert_eq!(error.to_string(), r#"must be one of "red", "blue", got "green""#);
        // Names are exact: no case folding, no trimming.
        assert!(parse_name(&all, name, "Red").is_err());
        assert!(parse_name(&all, name, " red").is_err());
    }
}
