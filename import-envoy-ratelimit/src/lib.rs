//! `import-envoy-ratelimit`: envoyproxy/ratelimit's YAML configuration (a
//! `domain` and nested `descriptors`) as this service's TOML,
//! `[[envoy-rls.rules]]` and fixed-window policies, printed for an operator
//! to review and keep. The `ca-skeleton-import` binary reads the files
//! ([`convert_files`]); [`convert`] converts texts.
//!
//! A crate of its own, so that a fork with no envoyproxy/ratelimit to
//! migrate from deletes this folder and its line in the workspace's
//! `members`. No other crate may import it, and its code imports
//! `shared-contract` alone of the workspace (a policy's rules and bounds):
//! never `app-bootstrap`, an adapter or an async runtime. Its tests load
//! what it prints through `app-bootstrap`, as `check-config` does.
//!
//! Each descriptor with a `rate_limit` becomes a rule whose pattern is its
//! path of keys (a `value` fixes the entry) and a policy of its own, so it
//! counts per (subject, rule) as envoyproxy/ratelimit counts per descriptor.
//! The rules come out in envoyproxy/ratelimit's precedence: at each level an
//! exact value, then the wildcard values (`*`) in file order, then the bare
//! key. Once a value matched, it looks for the later entries under that
//! value only, never under a later wildcard or the bare key; where their
//! subtrees limit a pattern the value's subtree does not, an unlimited rule
//! keeps the answer OK here too. A wildcard's matched value is part of the
//! subject (its own budget) unless `share_threshold` puts every value it
//! matches on one budget: the rule's `subject` then leaves it out.
//!
//! An unlimited descriptor is an `unlimited = true` rule, answered OK
//! without a provider call and with envoyproxy/ratelimit's status for it
//! (`limit_remaining` 4294967295, not an unmatched descriptor's 0).
//!
//! What the rules cannot say is a warning and a comment in the output, never
//! dropped silently; what would make the result less strict than the source
//! (a limit of 0) stops the import instead. So does a key
//! the import does not read where it stands, unless it cannot carry or
//! change a limit: envoyproxy/ratelimit refuses a key it does not know,
//! and one it knows but ignores there would take a limit with it.

#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::fmt::{self, Write as _};
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_saphyr::Spanned;
use sha2::{Digest, Sha256};
use shared_contract::{FixedWindow, MAX_COUNT, MAX_PERIOD, PolicyField, RateLimitPolicy};

/// One file to convert: its name, for messages, and its text.
#[derive(Debug, Clone, Copy)]
pub struct Source<'a> {
    /// How messages name the file (its path as given).
    pub name: &'a str,
    /// The YAML text.
    pub text: &'a str,
}

/// What an import produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Imported {
    /// The TOML to print on stdout.
    pub toml: String,
    /// One line for each thing the TOML cannot say, for stderr.
    pub warnings: Vec<String>,
}

/// Why an import printed nothing: every problem found, each naming its
/// file (and line, where it has one).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot import:\n{}", .problems.join("\n"))]
pub struct ImportError {
    /// One line per problem.
    pub problems: Vec<String>,
}

/// Converts envoyproxy/ratelimit configuration files (one domain each) to
/// one TOML configuration; `default` is the built-in HTTP policy, restated
/// because a `policies` table replaces it.
///
/// Every problem of every file is returned at once; a YAML syntax or type
/// error names its line and column.
pub fn convert(sources: &[Source<'_>]) -> Result<Imported, ImportError> {
    convert_with(sources, &[])
}

/// [`convert`], with `allow-override = true` on every limited rule of the
/// domains `allow_override` names: those whose descriptors Envoy's route
/// configuration sends a `limit` override for, which the YAML cannot say.
/// A domain no file defines is a problem.
pub fn convert_with(
    sources: &[Source<'_>],
    allow_override: &[String],
) -> Result<Imported, ImportError> {
    let mut converter = Converter::default();
    let mut domains: HashMap<String, String> = HashMap::new();
    for source in sources {
        converter.file(source, &mut domains);
        converter.end_file();
    }
    let ids = converter.policy_ids();
    for domain in allow_override {
        if !domains.contains_key(domain) {
            converter.problems.push(format!(
                "--allow-override {}: no file defines this domain",
                printable(domain)
            ));
        }
    }
    if !converter.problems.is_empty() {
        return Err(ImportError { problems: converter.problems });
    }
    let names: Vec<&str> = sources.iter().map(|source| source.name).collect();
    let toml = render(&names, &converter.rules, &ids, &converter.warnings, allow_override);
    Ok(Imported { toml, warnings: converter.warnings })
}

/// Largest file [`convert_files`] reads: far above any real rate limit
/// config, and it stops `/dev/zero` or a FIFO from taking the memory.
const MAX_FILE_BYTES: u64 = 16 * 1024 * 1024;

/// Reads `files` and converts them as [`convert`] does. A file that cannot
/// be read (missing, over 16 MiB, not UTF-8) is a problem beside those of
/// the files that could: every problem at once.
pub fn convert_files(
    files: &[PathBuf],
    allow_override: &[String],
) -> Result<Imported, ImportError> {
    let mut texts = Vec::with_capacity(files.len());
    let mut unread = Vec::new();
    for file in files {
        match read_bounded(file) {
            Ok(text) => texts.push((file.display().to_string(), text)),
            Err(problem) => {
                // The name as given, its control characters escaped like every message.
                let name = printable(&file.display().to_string());
                unread.push(format!("{name}: {problem}"));
            }
        }
    }
    let sources: Vec<Source<'_>> = texts.iter().map(|(name, text)| Source { name, text }).collect();
    match convert_with(&sources, allow_override) {
        Ok(imported) if unread.is_empty() => Ok(imported),
        Ok(_) => Err(ImportError { problems: unread }),
        Err(ImportError { problems }) => {
            unread.extend(problems);
            Err(ImportError { problems: unread })
        }
    }
}

fn read_bounded(file: &Path) -> Result<String, String> {
    let opened = std::fs::File::open(file).map_err(|error| format!("cannot read: {error}"))?;
    let mut bytes = Vec::new();
    opened
        .take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|error| format!("cannot read: {error}"))?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(format!("larger than {} MiB: not a rate limit config", MAX_FILE_BYTES >> 20));
    }
    String::from_utf8(bytes).map_err(|_| "not UTF-8 text".to_owned())
}

/// The HTTP edge's default policy id (`adapter_web::DEFAULT_POLICY`): no
/// imported policy takes it.
const DEFAULT_POLICY: &str = "default";

/// The policy a configuration without a `policies` table gives
/// [`DEFAULT_POLICY`], restated in the output because its `policies` table
/// replaces the built-in one. A test pins both to what `app-bootstrap` loads.
fn built_in_policy() -> RateLimitPolicy {
    let five_a_minute = FixedWindow { limit: 5, window: Duration::from_secs(60) };
    RateLimitPolicy::builder(DEFAULT_POLICY, five_a_minute)
        .build()
        .expect("the built-in policy is valid")
}

// ---------------------------------------------------------------------------
// The YAML model: envoyproxy/ratelimit's keys, each typed.

/// A file: one domain and its descriptor tree.
#[derive(Debug, Deserialize)]
struct YamlRoot {
    #[serde(default)]
    domain: Option<Spanned<Text>>,
    #[serde(default, deserialize_with = "null_as_empty")]
    descriptors: Vec<Spanned<YamlDescriptor>>,
}

/// One level of a descriptor: a key, an optional value, a limit, children.
#[derive(Debug, Deserialize)]
struct YamlDescriptor {
    #[serde(default)]
    key: Option<Text>,
    #[serde(default)]
    value: Option<Text>,
    #[serde(default)]
    rate_limit: Option<YamlRateLimit>,
    #[serde(default, deserialize_with = "null_as_empty")]
    descriptors: Vec<Spanned<YamlDescriptor>>,
    #[serde(default)]
    shadow_mode: Flag,
    #[serde(default)]
    quota_mode: Flag,
    #[serde(default)]
    detailed_metric: Flag,
    #[serde(default)]
    value_to_metric: Flag,
    #[serde(default)]
    share_threshold: Flag,
    /// Free-form; only its presence matters here (it cannot be converted).
    #[serde(default)]
    metadata: Option<IgnoredAny>,
}

/// A `rate_limit` block.
#[derive(Debug, Deserialize)]
struct YamlRateLimit {
    /// With its line: a problem with the unit names where it is written.
    #[serde(default)]
    unit: Option<Spanned<Text>>,
    #[serde(default)]
    requests_per_unit: Option<Count>,
    #[serde(default)]
    unit_multiplier: Option<Multiplier>,
    #[serde(default)]
    unlimited: Flag,
    #[serde(default)]
    name: Option<Text>,
    /// Each with its line, for a problem with the entry.
    #[serde(default, deserialize_with = "null_as_empty")]
    replaces: Vec<Spanned<YamlReplaces>>,
}

/// One entry of `replaces`.
#[derive(Debug, Deserialize)]
struct YamlReplaces {
    #[serde(default)]
    name: Option<Text>,
}

/// A scalar read as text, as Go's YAML reader fills a string field:
/// `value: 2061234567` is the value "2061234567".
#[derive(Debug, Clone, PartialEq, Eq)]
struct Text(String);

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct TextVisitor;
        impl Visitor<'_> for TextVisitor {
            type Value = Text;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<Text, E> {
                Ok(Text(text.to_owned()))
            }
            fn visit_bool<E: de::Error>(self, value: bool) -> Result<Text, E> {
                Ok(Text(value.to_string()))
            }
            fn visit_i64<E: de::Error>(self, value: i64) -> Result<Text, E> {
                Ok(Text(value.to_string()))
            }
            fn visit_u64<E: de::Error>(self, value: u64) -> Result<Text, E> {
                Ok(Text(value.to_string()))
            }
            fn visit_f64<E: de::Error>(self, value: f64) -> Result<Text, E> {
                Ok(Text(value.to_string()))
            }
        }
        deserializer.deserialize_str(TextVisitor)
    }
}

/// A `true` / `false` key; anything else is refused in the user's terms
/// (the reader's own message is "invalid boolean").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Flag(bool);

impl<'de> Deserialize<'de> for Flag {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct FlagVisitor;
        impl Visitor<'_> for FlagVisitor {
            type Value = Flag;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("true or false")
            }
            fn visit_bool<E: de::Error>(self, value: bool) -> Result<Flag, E> {
                Ok(Flag(value))
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<Flag, E> {
                Err(E::custom(format!("expected true or false, found {text:?}")))
            }
            fn visit_i64<E: de::Error>(self, value: i64) -> Result<Flag, E> {
                Err(E::custom(format!("expected true or false, found {value}")))
            }
            fn visit_u64<E: de::Error>(self, value: u64) -> Result<Flag, E> {
                Err(E::custom(format!("expected true or false, found {value}")))
            }
            fn visit_f64<E: de::Error>(self, value: f64) -> Result<Flag, E> {
                Err(E::custom(format!("expected true or false, found {value}")))
            }
        }
        deserializer.deserialize_any(FlagVisitor)
    }
}

/// `requests_per_unit`: envoyproxy/ratelimit's `uint32`, refused in the
/// user's terms (the reader's own message is "invalid u32").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Count(u32);

impl<'de> Deserialize<'de> for Count {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct CountVisitor;
        fn refused<E: de::Error>(found: impl fmt::Display) -> E {
            E::custom(format!(
                "requests_per_unit must be a whole number from 0 to {}, found {found}",
                u32::MAX
            ))
        }
        impl Visitor<'_> for CountVisitor {
            type Value = Count;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a whole number")
            }
            fn visit_u64<E: de::Error>(self, value: u64) -> Result<Count, E> {
                u32::try_from(value).map(Count).map_err(|_| refused(value))
            }
            fn visit_i64<E: de::Error>(self, value: i64) -> Result<Count, E> {
                u32::try_from(value).map(Count).map_err(|_| refused(value))
            }
            fn visit_f64<E: de::Error>(self, value: f64) -> Result<Count, E> {
                // `Debug`, so a float reads as one: `1.0`, not `1`.
                Err(refused(format_args!("{value:?}")))
            }
            fn visit_bool<E: de::Error>(self, value: bool) -> Result<Count, E> {
                Err(refused(value))
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<Count, E> {
                Err(refused(format_args!("{text:?}")))
            }
        }
        deserializer.deserialize_any(CountVisitor)
    }
}

/// `unit_multiplier`: how many units make the window, a `uint32` as in
/// envoyproxy/ratelimit's proposal for it; refused in the user's terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Multiplier(u32);

impl<'de> Deserialize<'de> for Multiplier {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct MultiplierVisitor;
        fn refused<E: de::Error>(found: impl fmt::Display) -> E {
            E::custom(format!(
                "unit_multiplier must be a whole number from 1 to {}, found {found}",
                u32::MAX
            ))
        }
        impl Visitor<'_> for MultiplierVisitor {
            type Value = Multiplier;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a whole number")
            }
            fn visit_u64<E: de::Error>(self, value: u64) -> Result<Multiplier, E> {
                u32::try_from(value).map(Multiplier).map_err(|_| refused(value))
            }
            fn visit_i64<E: de::Error>(self, value: i64) -> Result<Multiplier, E> {
                u32::try_from(value).map(Multiplier).map_err(|_| refused(value))
            }
            fn visit_f64<E: de::Error>(self, value: f64) -> Result<Multiplier, E> {
                Err(refused(format_args!("{value:?}")))
            }
            fn visit_bool<E: de::Error>(self, value: bool) -> Result<Multiplier, E> {
                Err(refused(value))
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<Multiplier, E> {
                Err(refused(format_args!("{text:?}")))
            }
        }
        deserializer.deserialize_any(MultiplierVisitor)
    }
}

/// `descriptors:` with nothing after it is an empty list, as Go reads it.
fn null_as_empty<'de, D, T>(deserializer: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Ok(Option::<Vec<T>>::deserialize(deserializer)?.unwrap_or_default())
}

/// envoyproxy/ratelimit's units, each as the fixed window it counts in:
/// windows aligned to the epoch, a month 30 days and a year 365 days.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unit {
    Second,
    Minute,
    Hour,
    Day,
    Week,
    Month,
    Year,
}

impl Unit {
    const ALL: [Self; 7] =
        [Self::Second, Self::Minute, Self::Hour, Self::Day, Self::Week, Self::Month, Self::Year];

    const fn name(self) -> &'static str {
        match self {
            Self::Second => "second",
            Self::Minute => "minute",
            Self::Hour => "hour",
            Self::Day => "day",
            Self::Week => "week",
            Self::Month => "month",
            Self::Year => "year",
        }
    }

    /// The window as a duration the configuration reads. Not humantime's
    /// "1M" or "1y", which are 30.44 and 365.25 days.
    const fn window(self) -> &'static str {
        match self {
            Self::Second => "1s",
            Self::Minute => "1m",
            Self::Hour => "1h",
            Self::Day => "1d",
            Self::Week => "7d",
            Self::Month => "30d",
            Self::Year => "365d",
        }
    }

    /// The unit in seconds (a month 30 days, a year 365).
    const fn seconds(self) -> u64 {
        match self {
            Self::Second => 1,
            Self::Minute => 60,
            Self::Hour => 3_600,
            Self::Day => 86_400,
            Self::Week => 7 * 86_400,
            Self::Month => 30 * 86_400,
            Self::Year => 365 * 86_400,
        }
    }

    /// `times` units as a duration the configuration reads: the unit's
    /// own suffix where there is one, else days.
    fn windows(self, times: u32) -> String {
        if times == 1 {
            return self.window().to_owned();
        }
        let times = u64::from(times);
        match self {
            Self::Second => format!("{times}s"),
            Self::Minute => format!("{times}m"),
            Self::Hour => format!("{times}h"),
            Self::Day => format!("{times}d"),
            Self::Week | Self::Month | Self::Year => {
                format!("{}d", times * self.seconds() / 86_400)
            }
        }
    }

    /// Case-insensitive, as envoyproxy/ratelimit reads it.
    fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|unit| unit.name().eq_ignore_ascii_case(text))
    }
}

// ---------------------------------------------------------------------------
// What the conversion builds.

/// One descriptor entry of a pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    key: String,
    value: Option<String>,
    /// A wildcard value with `share_threshold`: every value it matches
    /// counts on one budget, so it is left out of the rule's subject.
    shared: bool,
}

impl Entry {
    fn is_wildcard(&self) -> bool {
        self.value.as_deref().is_some_and(|value| value.contains('*'))
    }

    /// Whether its value is part of the subject unless `shared`: no fixed
    /// value, or a wildcard.
    fn counts_apart(&self) -> bool {
        self.value.is_none() || self.is_wildcard()
    }
}

/// The key of `pattern` that a rule's `subject` cannot say, if any: the
/// subject lists keys, each standing for every entry of it that counts
/// apart, so a repeated key's wildcards must all share or all count apart.
fn mixed_share(pattern: &[Entry]) -> Option<&str> {
    let mixed = pattern.iter().find(|entry| {
        entry.counts_apart()
            && pattern.iter().any(|other| {
                other.key == entry.key && other.counts_apart() && other.shared != entry.shared
            })
    });
    mixed.map(|entry| entry.key.as_str())
}

impl fmt::Display for Entry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.value {
            Some(value) => write!(f, "{}={value}", self.key),
            None => f.write_str(&self.key),
        }
    }
}

/// A rule: a domain, a pattern, and what it answers.
#[derive(Debug, Clone)]
struct Rule {
    domain: String,
    pattern: Vec<Entry>,
    target: Target,
    /// Comment lines printed above the rule.
    notes: Vec<String>,
    /// `rate_limit.name`, which other rules' `replaces` name.
    name: Option<String>,
    /// `rate_limit.replaces`: the names of the rules this one replaces.
    replaces: Vec<String>,
}

#[derive(Debug, Clone)]
enum Target {
    /// A fixed-window policy of its own, of `times` units.
    Limit { requests: u64, unit: Unit, times: u32, shadow: bool },
    /// Answered OK without a provider call.
    Unlimited,
    /// Answered as no rule (OK, no limit): where envoyproxy/ratelimit's
    /// lookup stops without a limit.
    NotLimited,
    /// `OVER_LIMIT` without a provider call: `requests_per_unit: 0`.
    Blocked,
}

impl Rule {
    /// Whether every descriptor this pattern matches `other` matches too.
    fn covers(&self, other: &[Entry]) -> bool {
        self.pattern.len() == other.len()
            && self.pattern.iter().zip(other).all(|(mine, theirs)| {
                mine.key == theirs.key && (mine.value.is_none() || mine.value == theirs.value)
            })
    }
}

#[derive(Debug, Default)]
struct Converter {
    rules: Vec<Rule>,
    problems: Vec<String>,
    warnings: Vec<String>,
    /// The current file's messages with their lines, flushed in line order.
    file_problems: Vec<(u64, String)>,
    file_warnings: Vec<(u64, String)>,
}

impl Converter {
    fn problem(&mut self, file: &str, line: u64, message: String) {
        self.file_problems.push((line, format!("{file}:{line}: {message}")));
    }

    fn warning(&mut self, file: &str, line: u64, message: String) {
        self.file_warnings.push((line, format!("{file}:{line}: {message}")));
    }

    /// Moves the current file's messages to the lists, in line order
    /// (the walk visits a bare key after its fixed values), each with its
    /// control characters escaped: a file name, key or value from the YAML
    /// must not move a terminal's cursor or end a line on stderr.
    fn end_file(&mut self) {
        for (messages, into) in [
            (&mut self.file_problems, &mut self.problems),
            (&mut self.file_warnings, &mut self.warnings),
        ] {
            messages.sort_by_key(|(line, _)| *line);
            into.extend(messages.drain(..).map(|(_, message)| printable(&message)));
        }
    }

    /// One file's rules, unless its domain is missing or already seen.
    fn file(&mut self, source: &Source<'_>, domains: &mut HashMap<String, String>) {
        let Some(root) = self.parse(source) else { return };
        let Some(domain) = self.domain(source, &root) else { return };
        if let Some(first) = domains.get(&domain) {
            let line = root.domain.as_ref().map_or(0, |domain| domain.referenced.line());
            let message = format!("domain {domain:?} is already defined in {first}");
            self.problem(source.name, line, message);
            return;
        }
        domains.insert(domain.clone(), source.name.to_owned());
        let mut level = Level { file: source.name, domain: &domain, converter: self };
        let rules = level.descriptors(&[], &root.descriptors);
        self.rules.extend(rules);
    }

    /// The typed model, once every key of the file is one the import reads
    /// where it stands (see [`Converter::check_keys`]).
    fn parse(&mut self, source: &Source<'_>) -> Option<YamlRoot> {
        let options = || yaml_options(MAX_YAML_NODES);
        let parsed = serde_saphyr::from_str_with_options::<YamlRoot>(source.text, options())
            .and_then(|root| {
                let keys = serde_saphyr::from_str_with_options::<Node>(source.text, options())?;
                Ok((root, keys))
            });
        match parsed {
            Ok((root, keys)) => {
                let domain = root.domain.as_ref().map(|domain| domain.value.0.as_str());
                self.check_keys(source.name, domain.unwrap_or_default(), &keys);
                Some(root)
            }
            Err(error) => {
                let line = error.location().map_or(0, |at| at.line());
                let message = format!("{}: {}", source.name, yaml_problem(&error));
                self.file_problems.push((line, message));
                None
            }
        }
    }

    /// Every key of the file that the import does not read where it
    /// stands: a problem, naming its line and key, unless it is one of
    /// envoyproxy/ratelimit's keys that cannot carry or change a limit
    /// ([`HARMLESS_KEYS`]), which is a warning. envoyproxy/ratelimit refuses
    /// a key it does not know; one it knows it ignores where it does not
    /// read it (a `requests_per_unit` beside `rate_limit`, not in it), which
    /// would drop a limit without a word.
    fn check_keys(&mut self, file: &str, domain: &str, root: &Node) {
        let mut check = KeyCheck { file, domain, converter: self };
        check.map(Place::Root, &[], "", root);
    }
    fn domain(&mut self, source: &Source<'_>, root: &YamlRoot) -> Option<String> {
        match &root.domain {
            Some(domain) if !domain.value.0.is_empty() => Some(domain.value.0.clone()),
            Some(domain) => {
                self.problem(source.name, domain.referenced.line(), "domain is empty".into());
                None
            }
            None => {
                self.problem(source.name, 1, "no domain: the file sets no `domain`".into());
                None
            }
        }
    }

    /// A policy id for each limited rule, in rule order: envoyproxy/ratelimit's
    /// own key for the descriptor (`domain.key_value.key`) where it is a valid
    /// id, else a readable prefix and 8 hex digits of a hash of the exact
    /// path. Deterministic, unique, and never `default`.
    fn policy_ids(&mut self) -> Vec<Option<String>> {
        let candidates: Vec<Option<(String, [u8; 4])>> = self
            .rules
            .iter()
            .map(|rule| match rule.target {
                Target::Limit { .. } => Some(id_parts(&rule.domain, &rule.pattern)),
                Target::Unlimited | Target::NotLimited | Target::Blocked => None,
            })
            .collect();
        let mut hashed: Vec<bool> = candidates
            .iter()
            .map(|parts| {
                parts.as_ref().is_some_and(|(key, _)| sanitized(key) != *key || key.len() > 64)
            })
            .collect();
        loop {
            let ids: Vec<Option<String>> = candidates
                .iter()
                .zip(&hashed)
                .map(|(parts, &hashed)| {
                    parts.as_ref().map(|(key, hash)| policy_id(key, *hash, hashed))
                })
                .collect();
            let mut seen: HashMap<&str, usize> = HashMap::from([(DEFAULT_POLICY, 1)]);
            for id in ids.iter().flatten() {
                *seen.entry(id).or_default() += 1;
            }
            let mut changed = false;
            for (index, id) in ids.iter().enumerate() {
                let Some(id) = id else { continue };
                if seen[id.as_str()] > 1 && !hashed[index] {
                    hashed[index] = true;
                    changed = true;
                }
            }
            if !changed {
                if let Some((id, _)) = seen.iter().find(|(_, count)| **count > 1) {
                    let id = (*id).to_owned();
                    self.problems.push(format!("two rules derive the same policy id {id:?}"));
                }
                return ids;
            }
        }
    }
}

/// A YAML node as read for its keys: each key of a map with its line, the
/// text of a scalar (a descriptor's `key` and `value` name it in messages).
#[derive(Debug)]
enum Node {
    Map(Vec<(Spanned<String>, Node)>),
    Seq(Vec<Node>),
    Scalar(Option<String>),
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct NodeVisitor;
        impl<'de> Visitor<'de> for NodeVisitor {
            type Value = Node;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any YAML node")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
                let mut entries = Vec::new();
                while let Some(key) = map.next_key::<Spanned<String>>()? {
                    entries.push((key, map.next_value::<Node>()?));
                }
                Ok(Node::Map(entries))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
                let mut items = Vec::new();
                while let Some(item) = seq.next_element::<Node>()? {
                    items.push(item);
                }
                Ok(Node::Seq(items))
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<Node, E> {
                Ok(Node::Scalar(Some(text.to_owned())))
            }
            fn visit_bool<E: de::Error>(self, value: bool) -> Result<Node, E> {
                Ok(Node::Scalar(Some(value.to_string())))
            }
            fn visit_i64<E: de::Error>(self, value: i64) -> Result<Node, E> {
                Ok(Node::Scalar(Some(value.to_string())))
            }
            fn visit_u64<E: de::Error>(self, value: u64) -> Result<Node, E> {
                Ok(Node::Scalar(Some(value.to_string())))
            }
            fn visit_f64<E: de::Error>(self, value: f64) -> Result<Node, E> {
                Ok(Node::Scalar(Some(value.to_string())))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Node, E> {
                Ok(Node::Scalar(None))
            }
            fn visit_none<E: de::Error>(self) -> Result<Node, E> {
                Ok(Node::Scalar(None))
            }
            fn visit_some<D: Deserializer<'de>>(self, inner: D) -> Result<Node, D::Error> {
                Node::deserialize(inner)
            }
        }
        deserializer.deserialize_any(NodeVisitor)
    }
}

/// Where a map stands in the file, and the keys the import reads there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    Root,
    Descriptor,
    RateLimit,
    Replaces,
}

impl Place {
    /// Each place, in the order a misplaced key is said to belong.
    const ALL: [Self; 4] = [Self::Descriptor, Self::RateLimit, Self::Root, Self::Replaces];

    const fn keys(self) -> &'static [&'static str] {
        match self {
            Self::Root => &["domain", "descriptors"],
            Self::Descriptor => &[
                "key",
                "value",
                "rate_limit",
                "descriptors",
                "shadow_mode",
                "quota_mode",
                "detailed_metric",
                "value_to_metric",
                "share_threshold",
                "metadata",
            ],
            Self::RateLimit => {
                &["unit", "requests_per_unit", "unit_multiplier", "unlimited", "name", "replaces"]
            }
            Self::Replaces => &["name"],
        }
    }

    const fn name(self) -> &'static str {
        match self {
            Self::Root => "the top of the file",
            Self::Descriptor => "a descriptor",
            Self::RateLimit => "a rate_limit",
            Self::Replaces => "a replaces entry",
        }
    }
}

/// envoyproxy/ratelimit's keys that cannot carry or change a limit: where
/// it ignores one, so may the import, with a warning.
const HARMLESS_KEYS: [&str; 4] = ["name", "detailed_metric", "value_to_metric", "metadata"];

/// The walk of one file's keys.
struct KeyCheck<'a, 'c> {
    file: &'a str,
    domain: &'a str,
    converter: &'c mut Converter,
}

impl KeyCheck<'_, '_> {
    /// The keys of `node`, a map at `place` of the descriptor `pattern`;
    /// `within` names the keys above it inside that descriptor.
    fn map(&mut self, place: Place, pattern: &[Entry], within: &str, node: &Node) {
        // Another shape is the typed reader's to refuse.
        let Node::Map(entries) = node else { return };
        for (key, value) in entries {
            let name = key.value.as_str();
            if place == Place::Descriptor && name == "metadata" {
                // Free-form: envoyproxy/ratelimit reads none of its keys.
                continue;
            }
            if !place.keys().contains(&name) {
                self.misplaced(place, pattern, &format!("{within}{name}"), key);
                continue;
            }
            match (place, name) {
                (Place::Root | Place::Descriptor, "descriptors") => {
                    let Node::Seq(items) = value else { continue };
                    for item in items {
                        let mut below = pattern.to_vec();
                        below.push(entry_of(item));
                        self.map(Place::Descriptor, &below, "", item);
                    }
                }
                (Place::Descriptor, "rate_limit") => {
                    self.map(Place::RateLimit, pattern, "rate_limit.", value);
                }
                (Place::RateLimit, "replaces") => {
                    let Node::Seq(items) = value else { continue };
                    for (index, item) in items.iter().enumerate() {
                        let within = format!("{within}replaces.{index}.");
                        self.map(Place::Replaces, pattern, &within, item);
                    }
                }
                _ => {}
            }
        }
    }

    fn misplaced(&mut self, place: Place, pattern: &[Entry], path: &str, key: &Spanned<String>) {
        let line = key.referenced.line();
        let at = at(self.domain, pattern);
        let name = key.value.as_str();
        let home =
            Place::ALL.into_iter().find(|home| *home != place && home.keys().contains(&name));
        let (message, harmless) = match home {
            Some(home) if HARMLESS_KEYS.contains(&name) => (
                format!(
                    "{at}key {path:?} belongs in {}: ignored here, as envoyproxy/ratelimit \
                     ignores it",
                    home.name()
                ),
                true,
            ),
            Some(home) => (
                format!(
                    "{at}key {path:?} belongs in {}: envoyproxy/ratelimit ignores it here, \
                     and a limit with it",
                    home.name()
                ),
                false,
            ),
            None => {
                let guess = place.keys().iter().find(|known| alike(known, name));
                let hint = guess.map(|known| format!(" (did you mean {known:?}?)"));
                let hint = hint.unwrap_or_default();
                (
                    format!("{at}unknown key {path:?}{hint}: envoyproxy/ratelimit refuses it too"),
                    false,
                )
            }
        };
        if harmless {
            self.converter.warning(self.file, line, message);
        } else {
            self.converter.problem(self.file, line, message);
        }
    }
}

/// The entry a descriptor map stands for, for messages: its `key` and
/// `value` as written (none when missing or not text).
fn entry_of(node: &Node) -> Entry {
    let text = |name: &str| match node {
        Node::Map(entries) => {
            entries.iter().find(|(key, _)| key.value == name).and_then(|(_, value)| match value {
                Node::Scalar(text) => text.clone(),
                Node::Map(_) | Node::Seq(_) => None,
            })
        }
        Node::Seq(_) | Node::Scalar(_) => None,
    };
    Entry {
        key: text("key").unwrap_or_default(),
        value: text("value").filter(|value| !value.is_empty()),
        shared: false,
    }
}

/// Whether `typed` looks like a misspelling of `known`: the same letters
/// and digits, case, separators and a plural `s` aside (`ratelimit`,
/// `requestsPerUnit`, `descriptor`).
fn alike(known: &str, typed: &str) -> bool {
    let letters = |text: &str| -> String {
        let letters: String = text
            .chars()
            .filter(char::is_ascii_alphanumeric)
            .map(|c| c.to_ascii_lowercase())
            .collect();
        letters.strip_suffix('s').map_or(letters.clone(), str::to_owned)
    };
    letters(known) == letters(typed)
}

/// `domain > entry > entry: ` for a message.
fn at(domain: &str, pattern: &[Entry]) -> String {
    let mut at = domain.to_owned();
    for entry in pattern {
        let _ = write!(at, " > {entry}");
    }
    at + ": "
}

/// The walk of one file's tree.
struct Level<'a, 'c> {
    file: &'a str,
    domain: &'a str,
    converter: &'c mut Converter,
}

impl Level<'_, '_> {
    /// The rules of one level's descriptors below `prefix`, in precedence
    /// order: per key (in file order), its fixed values, then the bare key.
    fn descriptors(&mut self, prefix: &[Entry], nodes: &[Spanned<YamlDescriptor>]) -> Vec<Rule> {
        let mut keys: Vec<&str> = Vec::new();
        let mut seen: Vec<(&str, Option<&str>, u64)> = Vec::new();
        let mut valid: Vec<&Spanned<YamlDescriptor>> = Vec::new();
        for node in nodes {
            let line = node.referenced.line();
            let Some(key) = node.value.key.as_ref().map(|key| key.0.as_str()) else {
                self.problem(line, prefix, "a descriptor has no key".into());
                continue;
            };
            if key.is_empty() {
                self.problem(line, prefix, "a descriptor has an empty key".into());
                continue;
            }
            let value = entry_value(&node.value);
            if let Some((_, _, first)) = seen.iter().find(|(k, v, _)| *k == key && *v == value) {
                let value = value.map(str::to_owned);
                let entry = Entry { key: key.to_owned(), value, shared: false };
                let message = format!("descriptor {entry} is repeated (first at line {first})");
                self.problem(line, prefix, message);
                continue;
            }
            seen.push((key, value, line));
            valid.push(node);
            if !keys.contains(&key) {
                keys.push(key);
            }
        }

        let mut rules = Vec::new();
        for key in keys {
            let of_key = |node: &&&Spanned<YamlDescriptor>| {
                node.value.key.as_ref().is_some_and(|k| k.0 == key)
            };
            let bare = valid.iter().filter(of_key).find(|node| entry_value(&node.value).is_none());
            let bare_rules = bare.map(|node| self.node(prefix, node)).unwrap_or_default();
            // envoyproxy/ratelimit's precedence at a level: the exact value,
            // then the wildcards in file order, then the bare key.
            let fixed = valid.iter().filter(of_key).filter_map(|node| {
                let value = entry_value(&node.value)?;
                Some((value.contains('*'), node))
            });
            let (wild, exact): (Vec<_>, Vec<_>) = fixed.partition(|(wild, _)| *wild);
            let groups: Vec<(Entry, Vec<Rule>)> = exact
                .into_iter()
                .chain(wild)
                .map(|(_, node)| (node_entry(&node.value), self.node(prefix, node)))
                .collect();
            for (at, (entry, own)) in groups.iter().enumerate() {
                // Once this value matched, envoyproxy/ratelimit looks no
                // further: not under a later wildcard, not under the bare key.
                let later_wild = groups[at + 1..].iter().filter(|(later, _)| later.is_wildcard());
                let later = later_wild.flat_map(|(_, rules)| rules).chain(&bare_rules);
                let stops = stops_fallback(entry, prefix.len(), own, later);
                rules.extend(own.iter().cloned().chain(stops));
            }
            rules.extend(bare_rules);
        }
        rules
    }

    /// One descriptor: its own rule, when it has a `rate_limit`, then its
    /// children's.
    fn node(&mut self, prefix: &[Entry], node: &Spanned<YamlDescriptor>) -> Vec<Rule> {
        let line = node.referenced.line();
        let descriptor = &node.value;
        let mut pattern = prefix.to_vec();
        pattern.push(node_entry(descriptor));
        let mut rules = Vec::new();
        if self.entry_is_expressible(line, &pattern) {
            self.metric_notes(line, &pattern, descriptor);
            if let Some(limit) = &descriptor.rate_limit {
                rules.extend(self.rule(line, &pattern, descriptor, limit));
            }
            rules.extend(self.descriptors(&pattern, &descriptor.descriptors));
        }
        rules
    }

    /// Whether the last entry of `pattern` can be a rule's pattern entry.
    /// A key may repeat along a path (`files` under `files`): a rule's
    /// entries match by position.
    fn entry_is_expressible(&mut self, line: u64, pattern: &[Entry]) -> bool {
        let entry = pattern.last().expect("a pattern has an entry");
        if entry.key.contains('=') {
            let message = format!(
                "key {:?} holds '=', which a rule's descriptor entry cannot (it separates key and value)",
                entry.key
            );
            self.problem(line, pattern, message);
            return false;
        }
        true
    }

    /// Warnings for the metric options, which change only envoyproxy/ratelimit's
    /// statistics.
    fn metric_notes(&mut self, line: u64, pattern: &[Entry], descriptor: &YamlDescriptor) {
        if descriptor.detailed_metric.0 {
            self.warning(line, pattern, "detailed_metric is not converted: decision metrics here carry the policy id, never a descriptor value".into());
        }
        if descriptor.value_to_metric.0 {
            self.warning(line, pattern, "value_to_metric is not converted: decision metrics here carry the policy id, never a descriptor value".into());
        }
        if descriptor.metadata.is_some() {
            self.warning(line, pattern, "metadata is not converted: it has no equivalent".into());
        }
        let wildcard = pattern.last().is_some_and(Entry::is_wildcard);
        if descriptor.share_threshold.0 && !wildcard {
            // envoyproxy/ratelimit refuses it too.
            self.problem(line, pattern, "share_threshold needs a wildcard value (with '*')".into());
        }
    }

    fn rule(
        &mut self,
        line: u64,
        pattern: &[Entry],
        descriptor: &YamlDescriptor,
        limit: &YamlRateLimit,
    ) -> Option<Rule> {
        let mut notes = Vec::new();
        // A problem with the unit is said at its own line.
        let unit = limit
            .unit
            .as_ref()
            .map(|unit| (&unit.value, Unit::parse(&unit.value.0), unit.referenced.line()));
        let target = if limit.unlimited.0 {
            if let Some((text, Some(_), at)) = unit {
                let message = format!("an unlimited rate_limit sets unit {:?}", text.0);
                self.problem(at, pattern, message);
                return None;
            }
            notes.push("unlimited: answered OK".to_owned());
            Target::Unlimited
        } else {
            'limit: {
                let unit = match unit {
                    Some((_, Some(unit), _)) => unit,
                    Some((text, None, at)) => {
                        let units: Vec<&str> = Unit::ALL.iter().map(|unit| unit.name()).collect();
                        let message = format!(
                            "invalid rate_limit unit {:?}: expected one of {}",
                            text.0,
                            units.join(", ")
                        );
                        self.problem(at, pattern, message);
                        return None;
                    }
                    None => {
                        self.problem(line, pattern, "rate_limit has no unit".into());
                        return None;
                    }
                };
                let requests = match limit.requests_per_unit.map(|count| count.0) {
                    None | Some(0) => {
                        notes.push(
                            "requests_per_unit 0: every request refused, as there".to_owned(),
                        );
                        break 'limit Target::Blocked;
                    }
                    Some(requests) if u64::from(requests) > MAX_COUNT => {
                        let message = format!(
                            "requests_per_unit {requests} is above the largest limit, {MAX_COUNT}: converted as {MAX_COUNT}"
                        );
                        notes.push(message.clone());
                        self.warning(line, pattern, message);
                        MAX_COUNT
                    }
                    Some(requests) => u64::from(requests),
                };
                if descriptor.shadow_mode.0 {
                    notes.push("shadow_mode: evaluated and counted, never denies".to_owned());
                }
                if descriptor.quota_mode.0 {
                    let message = "quota_mode is not converted: enforced as an ordinary limit, \
                               so it denies even when another quota descriptor passes"
                        .to_owned();
                    notes.push(message.clone());
                    self.warning(line, pattern, message);
                }
                let times = match limit.unit_multiplier.map(|times| times.0) {
                    None => 1,
                    Some(0) => {
                        let message = "unit_multiplier 0 makes an empty window (envoyproxy/ratelimit's \
                                   proposal for it refuses it too)";
                        self.problem(line, pattern, message.into());
                        return None;
                    }
                    Some(times) if u64::from(times) * unit.seconds() > MAX_PERIOD.as_secs() => {
                        let message = format!(
                            "unit_multiplier {times} x {} is longer than the longest window a policy \
                         holds, {} days",
                            unit.name(),
                            MAX_PERIOD.as_secs() / 86_400
                        );
                        self.problem(line, pattern, message);
                        return None;
                    }
                    Some(times) => times,
                };
                Target::Limit { requests, unit, times, shadow: descriptor.shadow_mode.0 }
            }
        };
        let name = limit_name(limit);
        if let Some(name) = &name {
            notes.push(format!("rate_limit name {name:?}: a status here names the policy id"));
        }
        let mut replaces = Vec::new();
        for replaced in &limit.replaces {
            let at = replaced.referenced.line();
            // envoyproxy/ratelimit refuses both.
            match replaced.value.name.as_ref().map(|name| name.0.as_str()) {
                None | Some("") => {
                    self.problem(at, pattern, "a replaces entry has no name".into());
                    return None;
                }
                Some(own) if Some(own) == name.as_deref() => {
                    self.problem(at, pattern, format!("replaces its own name {own:?}"));
                    return None;
                }
                Some(other) => replaces.push(other.to_owned()),
            }
        }
        let mixed = mixed_share(pattern).filter(|_| matches!(target, Target::Limit { .. }));
        if let Some(key) = mixed {
            let message = format!(
                "key {key:?} repeats in the path, shared (share_threshold) at one entry and \
                 counted apart at another: a rule's subject names a key for all its entries"
            );
            self.problem(line, pattern, message);
            return None;
        }
        let (domain, pattern) = (self.domain.to_owned(), pattern.to_vec());
        Some(Rule { domain, pattern, target, notes, name, replaces })
    }

    fn problem(&mut self, line: u64, pattern: &[Entry], message: String) {
        let at = self.at(pattern);
        self.converter.problem(self.file, line, format!("{at}{message}"));
    }

    fn warning(&mut self, line: u64, pattern: &[Entry], message: String) {
        let at = self.at(pattern);
        self.converter.warning(self.file, line, format!("{at}{message}"));
    }

    /// `domain > entry > entry: ` for a message.
    fn at(&self, pattern: &[Entry]) -> String {
        at(self.domain, pattern)
    }
}

/// A descriptor's value; an empty one is no value, as there.
/// `rate_limit.name`, when it has one.
fn limit_name(limit: &YamlRateLimit) -> Option<String> {
    limit.name.as_ref().map(|name| name.0.clone()).filter(|name| !name.is_empty())
}

/// The pattern entry of a descriptor.
fn node_entry(descriptor: &YamlDescriptor) -> Entry {
    let key = descriptor.key.as_ref().map(|key| key.0.clone()).unwrap_or_default();
    let value = entry_value(descriptor).map(str::to_owned);
    let wildcard = value.as_deref().is_some_and(|value| value.contains('*'));
    Entry { key, value, shared: wildcard && descriptor.share_threshold.0 }
}

fn entry_value(descriptor: &YamlDescriptor) -> Option<&str> {
    descriptor.value.as_ref().map(|value| value.0.as_str()).filter(|value| !value.is_empty())
}

/// The `unlimited` rules that keep a request whose entry at `position` is
/// `fixed` from falling through to the rules envoyproxy/ratelimit never
/// reaches once it matched (`later`: a later wildcard's and the bare key's):
/// one for each limited pattern of theirs that no rule of the fixed value's
/// subtree already covers.
fn stops_fallback<'r>(
    fixed: &Entry,
    position: usize,
    fixed_rules: &[Rule],
    later: impl IntoIterator<Item = &'r Rule>,
) -> Vec<Rule> {
    let mut stops: Vec<Rule> = Vec::new();
    for alternative in later {
        if matches!(alternative.target, Target::Unlimited | Target::NotLimited) {
            // Falling through to it answers OK, as envoyproxy/ratelimit does.
            continue;
        }
        let mut pattern = alternative.pattern.clone();
        pattern[position] = fixed.clone();
        if fixed_rules.iter().chain(&stops).any(|rule| rule.covers(&pattern)) {
            continue;
        }
        let instead = match &alternative.pattern[position] {
            Entry { value: None, key, .. } => format!("the bare {key:?}"),
            wildcard => format!("the later wildcard {wildcard}"),
        };
        let note = format!(
            "envoyproxy/ratelimit answers OK here: after {fixed} it looks only under that \
             value, never under {instead}"
        );
        stops.push(Rule {
            domain: alternative.domain.clone(),
            pattern,
            target: Target::NotLimited,
            notes: vec![note],
            name: None,
            replaces: Vec::new(),
        });
    }
    stops
}

/// Most YAML nodes (each key, value, list and map counts one) a file may
/// hold: about 200,000 descriptors with a `rate_limit` each, well past a
/// real configuration, and a bound on what a hostile file costs.
pub const MAX_YAML_NODES: usize = 1_000_000;

/// Deepest nesting of lists and maps a file may hold: 30 levels of
/// `descriptors`, each a list of maps.
pub const MAX_YAML_DEPTH: usize = 64;

/// The reader's limits: `max_nodes` nodes (events, each node's start and
/// end, are bounded well above them), [`MAX_YAML_DEPTH`] levels.
fn yaml_options(max_nodes: usize) -> serde_saphyr::Options {
    serde_saphyr::options! {
        budget: serde_saphyr::budget! {
            max_nodes: max_nodes,
            max_events: max_nodes * 4,
            max_depth: MAX_YAML_DEPTH,
            // What aliases repeat counts against the same limit as the
            // nodes written out.
            max_recorded_anchor_events: max_nodes,
        },
        with_snippet: false,
    }
}

/// A YAML error in the user's terms: where (line and column), then what
/// is wrong, without the reader's internals (its budget structs, its Rust
/// type names).
fn yaml_problem(error: &serde_saphyr::Error) -> String {
    use serde_saphyr::budget::BudgetBreach;
    use serde_saphyr::granit_parser::ErrorKind;
    use serde_saphyr::localizer::ExternalMessageSource;
    use serde_saphyr::{Error, MessageFormatter, UserMessageFormatter};
    let error = error.without_snippet();
    // The reader's own error, under the alias locations it may carry (the
    // location said is the outer one: where the alias is used).
    let mut cause = error;
    while let Error::AliasError { error, .. } | Error::WithSnippet { error, .. } = cause {
        cause = error;
    }
    let depth = || format!("nested deeper than {MAX_YAML_DEPTH} levels of lists and maps");
    let what = match cause {
        Error::Budget {
            breach: BudgetBreach::Nodes { .. } | BudgetBreach::Events { .. }, ..
        } => {
            format!(
                "more than {MAX_YAML_NODES} YAML nodes (keys, values, lists and maps), the most \
                 one file may hold: split the domain's descriptors over several files"
            )
        }
        Error::Budget { breach: BudgetBreach::Depth { .. }, .. } => depth(),
        Error::Budget { breach: BudgetBreach::RecordedAnchorEvents { .. }, .. } => {
            format!(
                "aliases (`*name`) repeat more than {MAX_YAML_NODES} YAML nodes (keys, values, \
                 lists and maps), the most one file may hold: write the descriptors out"
            )
        }
        // The parser's own bound on `[`/`{` nesting, past the depth limit.
        Error::ExternalMessage { source, .. }
            if matches!(
                &**source,
                ExternalMessageSource::Parser(scan)
                    if matches!(scan.kind(), ErrorKind::RecursionLimitExceeded)
            ) =>
        {
            depth()
        }
        Error::TaggedScalarCannotDeserializeIntoString { .. } => {
            "a tagged value (`!!int`, `!!str`, ...) where plain text is expected: remove the tag"
                .to_owned()
        }
        Error::RecursiveReferencesRequireWeakTypes { .. } => {
            "an alias (`*name`) inside the list or map it names: it would repeat for ever"
                .to_owned()
        }
        Error::Budget { .. } => {
            "too many aliases, anchors or documents, or too much text, for a configuration"
                .to_owned()
        }
        Error::Unexpected { expected, .. } => match *expected {
            "sequence start" => "expected a list (`- ` items)".to_owned(),
            "mapping start" => "expected keys and values".to_owned(),
            "string scalar" => "expected a single value, not a list or keys and values".to_owned(),
            other => format!("expected {other}"),
        },
        other => UserMessageFormatter.format_message(other).into_owned(),
    };
    match error.location() {
        Some(at) => format!("line {}, column {}: {what}", at.line(), at.column()),
        None => what,
    }
}

/// envoyproxy/ratelimit's key for a descriptor (`domain.key_value.key`)
/// and a hash of the exact path, length-framed so no two paths share it.
fn id_parts(domain: &str, pattern: &[Entry]) -> (String, [u8; 4]) {
    let mut key = domain.to_owned();
    let mut hash = Sha256::new();
    let mut frame = |part: &str| {
        hash.update((part.len() as u64).to_be_bytes());
        hash.update(part.as_bytes());
    };
    frame(domain);
    for entry in pattern {
        key.push('.');
        key.push_str(&entry.key);
        frame(&entry.key);
        match &entry.value {
            Some(value) => {
                key.push('_');
                key.push_str(value);
                frame("=");
                frame(value);
            }
            None => frame(""),
        }
    }
    let digest = hash.finalize();
    (key, [digest[0], digest[1], digest[2], digest[3]])
}

/// `key` in a policy id's characters: ASCII lower case, `.`, `_`, `-`.
fn sanitized(key: &str) -> String {
    key.chars()
        .map(|c| match c {
            'a'..='z' | '0'..='9' | '.' | '_' | '-' => c,
            'A'..='Z' => c.to_ascii_lowercase(),
            _ => '-',
        })
        .collect()
}

fn policy_id(key: &str, hash: [u8; 4], hashed: bool) -> String {
    let clean = sanitized(key);
    if !hashed {
        return clean;
    }
    // 55 characters, '-', 8 hex digits: 64, the longest id.
    let prefix: String = clean.chars().take(55).collect();
    format!("{prefix}-{}", hex::encode(hash))
}

// ---------------------------------------------------------------------------
// The TOML.

fn render(
    files: &[&str],
    rules: &[Rule],
    ids: &[Option<String>],
    warnings: &[String],
    allow_override: &[String],
) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# Converted by `ca-skeleton-import envoy-ratelimit` from {}.",
        printable(&files.join(", "))
    );
    out.push_str(concat!(
        "# Each rate_limit is a fixed-window policy of its own (windows aligned to\n",
        "# the epoch, as there; a month is 30 days and a year 365 days, as\n",
        "# envoyproxy/ratelimit counts them) and a rule whose descriptor is the\n",
        "# path of keys, `key=value` where a value fixes the entry. A descriptor\n",
        "# matches the first rule with its keys and values: the order below is\n",
        "# envoyproxy/ratelimit's precedence: an exact value, then a wildcard\n",
        "# (`*`), then the bare key. A descriptor's `limit` override, which\n",
        "# envoyproxy/ratelimit honours everywhere, is ignored here unless its\n",
        "# rule sets `allow-override = true` (`--allow-override DOMAIN`): the\n",
        "# YAML cannot say which domains Envoy sends overrides for\n",
        "# (docs/envoy-rls.md, \"Rules\").\n",
    ));
    if warnings.is_empty() {
        out.push_str("# Everything was converted.\n");
    } else {
        out.push_str("#\n# Not converted (also printed as warnings):\n");
        for warning in warnings {
            let _ = writeln!(out, "# - {}", printable(warning));
        }
    }
    out.push_str(concat!(
        "\n[envoy-rls]\n",
        "# The gRPC listener is off until `listen` is set, e.g.\n",
        "# listen = \"127.0.0.1:8081\"\n",
    ));

    for (rule, id) in rules.iter().zip(ids) {
        out.push('\n');
        let _ = writeln!(out, "# {}", printable(&describe(rule)));
        for note in &rule.notes {
            let _ = writeln!(out, "# {}", printable(note));
        }
        out.push_str("[[envoy-rls.rules]]\n");
        let _ = writeln!(out, "domain = {}", toml_string(&rule.domain));
        let entries: Vec<String> =
            rule.pattern.iter().map(|entry| toml_string(&entry.to_string())).collect();
        let _ = writeln!(out, "descriptor = [{}]", entries.join(", "));
        if rule.pattern.iter().any(|entry| entry.shared)
            && matches!(rule.target, Target::Limit { .. })
        {
            // Every entry whose value counts apart, the shared wildcards left
            // out; a repeated key once (it names each of its entries).
            let mut keys: Vec<String> = Vec::new();
            for entry in rule.pattern.iter().filter(|entry| entry.counts_apart() && !entry.shared) {
                let key = toml_string(&entry.key);
                if !keys.contains(&key) {
                    keys.push(key);
                }
            }
            let _ = writeln!(out, "subject = [{}]", keys.join(", "));
        }
        if let Some(name) = &rule.name {
            let _ = writeln!(out, "name = {}", toml_string(name));
        }
        if !rule.replaces.is_empty() {
            let names: Vec<String> = rule.replaces.iter().map(|name| toml_string(name)).collect();
            let _ = writeln!(out, "replaces = [{}]", names.join(", "));
        }
        let _ = match (&rule.target, id) {
            (Target::Limit { .. }, Some(id)) if allow_override.contains(&rule.domain) => {
                writeln!(out, "policies = {}\nallow-override = true", toml_string(id))
            }
            (Target::Limit { .. }, Some(id)) => writeln!(out, "policies = {}", toml_string(id)),
            (Target::Unlimited, _) => writeln!(out, "unlimited = true"),
            (Target::NotLimited, _) => writeln!(out, "not-limited = true"),
            (Target::Blocked, _) => writeln!(out, "blocked = true"),
            (Target::Limit { .. }, None) => unreachable!("policy_ids names every limited rule"),
        };
    }

    for (rule, id) in rules.iter().zip(ids) {
        let (Target::Limit { requests, unit, times, shadow }, Some(id)) = (&rule.target, id) else {
            continue;
        };
        out.push('\n');
        let _ = writeln!(out, "# {}", printable(&describe(rule)));
        let _ = writeln!(out, "[capabilities.rate-limit.policies.{}]", toml_key(id));
        out.push_str("algorithm = \"fixed-window\"\n");
        let _ = writeln!(out, "limit = {requests}");
        let window = format!("window = {}", toml_string(&unit.windows(*times)));
        let _ = match unit {
            _ if *times > 1 => {
                let days = match unit {
                    Unit::Month => " (a month: 30 days)",
                    Unit::Year => " (a year: 365 days)",
                    _ => "",
                };
                writeln!(out, "{window:<36}# unit_multiplier {times} x {}{days}", unit.name())
            }
            Unit::Month => {
                writeln!(out, "{window:<36}# month: 30 days, as envoyproxy/ratelimit counts it")
            }
            Unit::Year => {
                writeln!(out, "{window:<36}# year: 365 days, as envoyproxy/ratelimit counts it")
            }
            Unit::Second | Unit::Minute | Unit::Hour | Unit::Day | Unit::Week => {
                writeln!(out, "{window:<36}# {}", unit.name())
            }
        };
        // envoyproxy/ratelimit admits any hits_addend up to what is left.
        let cost = format!("maximum-cost = {requests}");
        let _ = writeln!(out, "{cost:<36}# a hits_addend up to the limit, as there");
        if *shadow {
            out.push_str("mode = \"shadow\"                     # shadow_mode\n");
        }
    }

    out.push_str(concat!(
        "\n# The HTTP edge's built-in policy, restated: a policies table replaces the\n",
        "# built-in one. Drop it when merging into a configuration with its own\n",
        "# default-policy.\n",
    ));
    let _ = writeln!(out, "[capabilities.rate-limit.policies.{}]", toml_key(DEFAULT_POLICY));
    out.push_str(&policy_body(&built_in_policy()));
    out
}

/// The algorithm keys of a policy, without the keys left at their default.
fn policy_body(policy: &RateLimitPolicy) -> String {
    let algorithm = policy.algorithm();
    let mut body =
        format!("{} = {}\n", PolicyField::Algorithm.key(), toml_string(algorithm.name()));
    // The algorithm's own keys, as its serde derive names them.
    body.push_str(&toml::to_string(algorithm).unwrap_or_default());
    body
}

/// "domain: key=value > key — 5 per day" for a comment.
fn describe(rule: &Rule) -> String {
    let path: Vec<String> = rule.pattern.iter().map(Entry::to_string).collect();
    let what = match rule.target {
        Target::Limit { requests, unit, times: 1, .. } => format!("{requests} per {}", unit.name()),
        Target::Limit { requests, unit, times, .. } => {
            format!("{requests} per {times} {}s", unit.name())
        }
        Target::Unlimited => "unlimited".to_owned(),
        Target::NotLimited => "not limited".to_owned(),
        Target::Blocked => "blocked (requests_per_unit 0)".to_owned(),
    };
    format!("{}: {}: {what}", rule.domain, path.join(" > "))
}

/// `text` safe on one line of a TOML comment or of stderr: a control
/// character (a newline or an escape in a descriptor value, say) is
/// escaped, so no value ends the comment and starts a line of TOML, or
/// drives the terminal; so is an invisible format or separator character,
/// so no value reorders (bidi overrides), hides (zero-width) or breaks
/// (line and paragraph separators) the line a reader sees.
fn printable(text: &str) -> String {
    text.chars()
        .flat_map(|c| {
            let escape = (c.is_control() && c != '\t') || is_invisible_format(c);
            let (plain, escaped) =
                if escape { (None, Some(c.escape_default())) } else { (Some(c), None) };
            plain.into_iter().chain(escaped.into_iter().flatten())
        })
        .collect()
}

/// The format and separator characters a terminal or an editor does not
/// show as themselves: the bidi marks, embeddings, overrides and isolates
/// (U+061C, U+200E/U+200F, U+202A..U+202E, U+2066..U+2069), the zero-width
/// ones (U+200B..U+200D, U+2060, U+FEFF) and the line and paragraph
/// separators (U+2028, U+2029).
fn is_invisible_format(c: char) -> bool {
    matches!(
        c,
        '\u{061c}'
            | '\u{200b}'..='\u{200f}'
            | '\u{2028}'..='\u{202e}'
            | '\u{2060}'
            | '\u{2066}'..='\u{2069}'
            | '\u{feff}'
    )
}

/// A TOML basic string, escaped by the toml crate.
fn toml_string(text: &str) -> String {
    toml::Value::String(text.to_owned()).to_string()
}

/// A bare key where TOML allows one, else a quoted one.
fn toml_key(key: &str) -> String {
    let bare =
        !key.is_empty() && key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if bare { key.to_owned() } else { toml_string(key) }
}

#[cfg(test)]
mod tests;
