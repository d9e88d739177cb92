//! Configuration problems and the key paths that name them.

use std::fmt;

/// A full key path such as `capabilities.rate-limit.policies.api.window`.
/// Segments that are not bare TOML keys are quoted, as TOML would write them
/// (`operations."GET /api/hello"`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct KeyPath(Vec<String>);

impl KeyPath {
    /// The segments, outermost first.
    pub fn segments(&self) -> &[String] {
        &self.0
    }

    /// The empty path (the document root).
    pub fn root() -> Self {
        Self::default()
    }

    /// This path extended by one segment.
    pub fn child(&self, segment: &str) -> Self {
        let mut segments = self.0.clone();
        segments.push(segment.to_owned());
        Self(segments)
    }

    /// This path extended by a dotted run of bare segments
    /// (`"evaluation-dedup.ttl"`).
    pub fn dotted(&self, dotted: &str) -> Self {
        dotted.split('.').fold(self.clone(), |path, segment| path.child(segment))
    }

    /// `capabilities.rate-limit.<rest>`.
    pub fn rate_limit(rest: &str) -> Self {
        Self::root().dotted("capabilities.rate-limit").dotted(rest)
    }

    /// `capabilities.rate-limit.policies.<id>`.
    pub fn policy(id: &str) -> Self {
        Self::rate_limit("policies").child(id)
    }
}

impl fmt::Display for KeyPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("<root>");
        }
        for (index, segment) in self.0.iter().enumerate() {
            if index > 0 {
                f.write_str(".")?;
            }
            let bare = !segment.is_empty()
                && segment.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
            if bare { f.write_str(segment)? } else { write!(f, "{segment:?}")? }
        }
        Ok(())
    }
}

/// One problem with the configuration, naming its full key path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigProblem {
    /// Where the problem is.
    pub path: KeyPath,
    /// What is wrong, for a human. Never holds a secret's value.
    pub message: String,
    /// Where the value came from, when known: the file (and line) or the
    /// environment variable.
    pub source: Option<String>,
}

impl fmt::Display for ConfigProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)?;
        match &self.source {
            Some(source) => write!(f, " ({source})"),
            None => Ok(()),
        }
    }
}

/// Every problem found, in the order found.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ConfigProblems(Vec<ConfigProblem>);

impl ConfigProblems {
    /// Records a problem.
    pub fn push(&mut self, path: KeyPath, message: impl Into<String>) {
        self.0.push(ConfigProblem { path, message: message.into(), source: None });
    }

    /// Names each problem's source, as `source` finds it from its path.
    pub(crate) fn locate(&mut self, source: impl Fn(&KeyPath) -> Option<String>) {
        for problem in &mut self.0 {
            problem.source = source(&problem.path);
        }
    }

    /// True when nothing is wrong.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The problems.
    pub fn iter(&self) -> impl Iterator<Item = &ConfigProblem> {
        self.0.iter()
    }

    /// The number of problems.
    pub fn len(&self) -> usize {
        self.0.len()
    }
}

impl fmt::Display for ConfigProblems {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let count = self.0.len();
        write!(f, "invalid configuration ({count} problem{}):", if count == 1 { "" } else { "s" })?;
        for problem in &self.0 {
            write!(f, "\n  - {problem}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_quote_segments_that_are_not_bare_keys() {
        let path = KeyPath::rate_limit("operations").child("GET /api/hello");
        assert_eq!(path.to_string(), r#"capabilities.rate-limit.operations."GET /api/hello""#);
        assert_eq!(
            KeyPath::policy("api").dotted("evaluation-dedup.ttl").to_string(),
            "capabilities.rate-limit.policies.api.evaluation-dedup.ttl"
        );
        assert_eq!(KeyPath::policy("a.b").to_string(), r#"capabilities.rate-limit.policies."a.b""#);
    }

    #[test]
    fn the_list_names_every_problem_on_its_own_line() {
        let mut problems = ConfigProblems::default();
        problems.push(KeyPath::root().child("a"), "first");
        problems.push(KeyPath::root().dotted("b.c"), "second");
        assert_eq!(
            problems.to_string(),
            "invalid configuration (2 problems):\n  - a: first\n  - b.c: second"
        );
    }
}
