//! The counting algorithms, each one type behind [`RateAlgorithm`],
//! registered at the foot. All arithmetic saturates or widens: caller times
//! may be anything, and `evaluate` must never panic.

use std::fmt;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::{Deserializer, Serialize};

use crate::bounds::millis;
use crate::error::{PolicyField, PolicyViolation};
use crate::leases::Leases;
use crate::outcome::Certainty;

/// One counting algorithm: its parameters and all it does (docs/adding-an-algorithm.md).
pub trait RateAlgorithm:
    Clone + fmt::Debug + PartialEq + Eq + Send + Sync + Serialize + DeserializeOwned + 'static
{
    /// The configuration name (`algorithm = "fixed-window"`), kebab-case.
    const NAME: &'static str;
    /// Its stored state's and ARGV block's byte: an upper-case letter, its own.
    const TAG: u8;
    /// Its configuration keys beside the common ones (kebab-case).
    const KEYS: &'static [&'static str];
    /// Those of [`Self::KEYS`] whose default comes from another key.
    const DEFAULTED: &'static [&'static str] = &[];
    /// Its Lua side.
    const LUA: Lua;
    /// Whether an admitted request holds a lease the caller gives back.
    const HOLDS_LEASES: bool = false;
    /// Whether [`Self::quota_window`] reads the caller time.
    const WINDOW_MOVES: bool = false;
    /// Whether `limit - remaining` is this window's count (degraded mode).
    const WINDOWED: bool = false;
    /// Whether a refusal stays one until its `reset_after` whatever the cost.
    const REFUSAL_STAYS: bool = false;
    /// The common policy keys that do not apply to it, refused when set.
    const REFUSED_COMMON_KEYS: &'static [PolicyField] = &[];

    /// The stored counting state of one key: a constant number of numbers.
    type State: Copy + fmt::Debug + PartialEq + Eq + Send + Sync + 'static;

    /// The most units (leases) spent at once, `RateLimit-Policy`'s `q`.
    fn limit(&self) -> u64;

    /// Whether its decisions are exact or its own estimate.
    fn certainty(&self) -> Certainty {
        Certainty::Certain
    }

    /// The time over which it grants its limit, `w` in `RateLimit-Policy`.
    fn quota_window(&self, now: impl FnOnce() -> u64) -> Option<Duration>;

    /// Pushes each violation of its parameters; true when the limit is valid.
    fn check(&self, checks: &mut Checks) -> bool;

    /// One run at effective time `run.t` over the key's state (`None`: absent).
    fn step(&self, state: Option<&Self::State>, run: &Run<'_>) -> Step<Self::State>;

    /// Units charged past the limit that the key's state still owes at `t`
    /// (a settle's excess, docs/algorithms.md "Settling usage"); 0 when none.
    fn debt(&self, _state: &Self::State, _t: u64) -> u64 {
        0
    }

    /// Its share of each instance's limiter in degraded mode, times kept.
    #[must_use]
    fn scaled(&self, share: &dyn Fn(u64) -> u64) -> Self;

    /// How long a lease counts (ms) given the clock regression, if it holds any.
    fn lease_life(&self, _regression: u64) -> Option<u64> {
        None
    }

    /// Its Lua function's parameters after the common ones, at caller time `t`.
    fn arguments(&self, t: u64) -> Arguments;

    /// Its state from the numbers inspect reads after the mark.
    fn decode(numbers: [u64; 3]) -> Option<Self::State>;
}

/// An algorithm's Lua file, as the Redis adapter composes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lua {
    /// The file's name, as an include line names it.
    pub file: &'static str,
    /// The file's text.
    pub source: &'static str,
    /// The function the file defines: `f(raw, t, charge, <arguments>)`.
    pub function: &'static str,
    /// How many arguments follow the common ones in its ARGV block.
    pub arity: usize,
    /// The bytes of its state header (tag and doubles); 0 for none.
    pub header: usize,
}

/// The parameters an algorithm's Lua function takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arguments {
    values: [u64; Arguments::MAX],
    len: usize,
}

impl Arguments {
    /// The most an algorithm takes.
    pub const MAX: usize = 4;

    /// Up to [`Self::MAX`] values, in order.
    ///
    /// # Panics
    /// With more: a mistake in the algorithm's module its first test finds.
    pub fn of(values: &[u64]) -> Self {
        assert!(values.len() <= Self::MAX, "an algorithm takes at most {} arguments", Self::MAX);
        let mut held = [0; Self::MAX];
        held[..values.len()].copy_from_slice(values);
        Self { values: held, len: values.len() }
    }

    /// The values.
    pub fn as_slice(&self) -> &[u64] {
        &self.values[..self.len]
    }
}

/// What one step runs at.
#[derive(Debug, Clone, Copy)]
pub struct Run<'a> {
    /// Effective time, epoch ms.
    pub t: u64,
    /// Units asked for.
    pub cost: u64,
    /// Whether an allowance charges.
    pub charge: Charge,
    /// The key's leases (empty unless the algorithm holds leases).
    pub leases: &'a Leases,
    /// The policy's maximum clock regression, ms.
    pub regression: u64,
}

/// What one run of an algorithm decided, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step<S> {
    /// Whether it allows.
    pub allowed: bool,
    /// Units left (after the charge when charged).
    pub remaining: u64,
    /// Wait before a retry can pass (0 when allowed).
    pub retry_after: u64,
    /// Time until the budget is whole again.
    pub reset_after: u64,
    /// The state to store and when its absence means the same, if written.
    pub write: Option<(S, u64)>,
}

impl<S> Step<S> {
    /// A denial that writes nothing.
    pub fn denied(remaining: u64, retry_after: u64, reset_after: u64) -> Self {
        Self { allowed: false, remaining, retry_after, reset_after, write: None }
    }

    /// An allowance that charges nothing (another member of the set denied).
    pub fn spared(remaining: u64, reset_after: u64) -> Self {
        Self { allowed: true, remaining, retry_after: 0, reset_after, write: None }
    }

    /// A charged allowance that stores `state` until `end`.
    pub fn charged(remaining: u64, reset_after: u64, state: S, end: u64) -> Self {
        Self { allowed: true, remaining, retry_after: 0, reset_after, write: Some((state, end)) }
    }

    /// A window counter's step over `n` of `limit` units in the window
    /// `start .. end`.
    pub fn count(
        limit: u64,
        n: u64,
        (start, end): (u64, u64),
        run: &Run<'_>,
        counted: impl FnOnce(u64) -> S,
    ) -> Self {
        let to_end = end.saturating_sub(run.t);
        let n = match run.charge {
            Charge::Force => n.saturating_add(run.cost),
            // A reservation of an earlier window is not in `n`: nothing to give back.
            Charge::Refund { reserved_at } if reserved_at >= start => n.saturating_sub(run.cost),
            Charge::Refund { .. } => n,
            Charge::Take | Charge::Spare if n.saturating_add(run.cost) > limit => {
                return Self::denied(limit.saturating_sub(n), to_end.max(1), to_end);
            }
            Charge::Spare => return Self::spared(limit - n, to_end),
            Charge::Take => n + run.cost,
        };
        Self::charged(limit.saturating_sub(n), to_end, counted(n), end)
    }

    /// The same step with its written state mapped.
    pub fn map<T>(self, into: impl FnOnce(S) -> T) -> Step<T> {
        let Self { allowed, remaining, retry_after, reset_after, write } = self;
        let write = write.map(|(state, end)| (into(state), end));
        Step { allowed, remaining, retry_after, reset_after, write }
    }
}

/// The stored state belongs to another algorithm: `StateIncompatible`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateMismatch;

/// What a run does with its cost (docs/algorithms.md "Settling usage").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Charge {
    /// Charge `cost` when the algorithm allows.
    Take,
    /// Charge nothing (another policy of the set denies); report the budget.
    Spare,
    /// Charge `cost` whatever remains, into debt: usage already spent. Allows.
    Force,
    /// Give `cost` back to the budget a reservation charged at effective
    /// time `reserved_at`, when that budget is still the current one. Allows.
    Refund {
        /// The reservation's effective time (its dedupe record's `written_at`).
        reserved_at: u64,
    },
}

/// The violations found in a policy, each with its key.
#[derive(Debug, Default)]
pub struct Checks {
    pub(crate) violations: Vec<PolicyViolation>,
}

impl Checks {
    /// Records a violation of the parameter `key`.
    pub fn reject(&mut self, key: impl Into<PolicyField>, problem: String) {
        self.violations.push(PolicyViolation { field: key.into(), problem });
    }

    /// Checks a count in `1..=most`; true when it is.
    pub fn count(&mut self, key: impl Into<PolicyField>, value: u64, most: u64) -> bool {
        let ok = (1..=most).contains(&value);
        if !ok {
            self.reject(key, format!("must be in 1..={most}, got {value}"));
        }
        ok
    }

    /// Checks a duration of whole ms in 1 ms ..= `longest`; true when it is.
    pub fn period(
        &mut self,
        key: impl Into<PolicyField>,
        period: Duration,
        longest: Duration,
    ) -> bool {
        let problem = if period < Duration::from_millis(1) || period > longest {
            Some(format!("must be between 1ms and {longest:?}, got {period:?}"))
        } else {
            crate::bounds::whole_millis_problem(period)
        };
        problem.map(|problem| self.reject(key, problem)).is_none()
    }

    /// Checks that `count x period` (ms) stays below 2^53, exact in Lua's doubles.
    pub fn exact_product(
        &mut self,
        (count_key, count): (&'static str, u64),
        (period_key, period): (&'static str, Duration),
    ) {
        let product = u128::from(count) * u128::from(millis(period));
        if product >= u128::from(crate::bounds::MAX_EXACT_PRODUCT) {
            let why = "must stay below 2^53 for exact arithmetic";
            self.reject(count_key, format!("{count_key} x {period_key} {why}, got {product}"));
        }
    }
}

/// Whole milliseconds of `duration`, at least 1, to divide by.
pub(crate) fn ms(duration: Duration) -> u64 {
    millis(duration).max(1)
}

/// A duration in a policy's table: a string with a unit, never a bare number.
pub mod duration {
    use std::fmt;
    use std::time::Duration;

    use humantime_serde::re::humantime;
    use serde::de::{Error, Visitor};
    use serde::{Deserializer, Serializer};

    /// `"1m 30s"`: humantime's form.
    ///
    /// # Errors
    /// The serializer's.
    pub fn serialize<S: Serializer>(value: &Duration, to: S) -> Result<S::Ok, S::Error> {
        to.collect_str(&humantime::format_duration(*value))
    }

    /// A string with a unit; a bare number is refused saying so.
    ///
    /// # Errors
    /// A value that is no such string.
    pub fn deserialize<'de, D: Deserializer<'de>>(from: D) -> Result<Duration, D::Error> {
        from.deserialize_any(Text)
    }

    const BARE: &str =
        "a bare number has no unit; write a duration string like \"750ms\" or \"60s\"";

    struct Text;

    impl Visitor<'_> for Text {
        type Value = Duration;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a duration string like \"60s\"")
        }

        fn visit_str<E: Error>(self, text: &str) -> Result<Duration, E> {
            humantime::parse_duration(text.trim()).map_err(|error| {
                E::custom(format!(
                    "{text:?} is not a duration ({error}); write a number with a unit, like \"750ms\" or \"60s\""
                ))
            })
        }

        fn visit_i64<E: Error>(self, _: i64) -> Result<Duration, E> {
            Err(E::custom(BARE))
        }

        fn visit_u64<E: Error>(self, _: u64) -> Result<Duration, E> {
            Err(E::custom(BARE))
        }

        fn visit_f64<E: Error>(self, _: f64) -> Result<Duration, E> {
            Err(E::custom(BARE))
        }
    }
}

/// Registers the algorithms and generates [`Algorithm`], [`AlgorithmKind`]
/// and [`AlgorithmState`]; a state of another algorithm is a
/// [`StateMismatch`] decided here, not in any step.
macro_rules! algorithms {
    ($($module:ident::$name:ident),+ $(,)?) => {
        $(
            mod $module;
            pub use $module::*;
        )+

        /// The counting algorithm of a policy and its parameters.
        #[derive(Debug, Clone, PartialEq, Eq, Serialize)]
        #[serde(untagged)]
        pub enum Algorithm {
            $(
                #[doc = concat!("[`", stringify!($name), "`].")]
                $name($name),
            )+
        }

        /// Which algorithm, as a configuration's `algorithm` key names it.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum AlgorithmKind {
            $(
                #[doc = concat!("[`", stringify!($name), "`].")]
                $name,
            )+
        }

        /// The stored counting state of one key, whichever its algorithm.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum AlgorithmState {
            $(
                #[doc = concat!("[`", stringify!($name), "`]'s state.")]
                $name(<$name as RateAlgorithm>::State),
            )+
        }

        $(
            impl From<$name> for Algorithm {
                fn from(algorithm: $name) -> Self {
                    Self::$name(algorithm)
                }
            }
        )+

        impl AlgorithmKind {
            /// Every kind, in registration order.
            pub const ALL: [Self; [$(stringify!($name)),+].len()] = [$(Self::$name),+];

            /// The configuration name.
            pub const fn name(self) -> &'static str {
                match self { $(Self::$name => <$name as RateAlgorithm>::NAME,)+ }
            }

            /// The tag byte of its stored state and its ARGV kind.
            pub const fn tag(self) -> u8 {
                match self { $(Self::$name => <$name as RateAlgorithm>::TAG,)+ }
            }

            /// Its Lua side.
            pub const fn lua(self) -> Lua {
                match self { $(Self::$name => <$name as RateAlgorithm>::LUA,)+ }
            }

            /// Its configuration keys beside the common ones.
            pub const fn parameters(self) -> &'static [&'static str] {
                match self { $(Self::$name => <$name as RateAlgorithm>::KEYS,)+ }
            }

            /// Those of its keys that may be left out.
            pub const fn defaulted(self) -> &'static [&'static str] {
                match self { $(Self::$name => <$name as RateAlgorithm>::DEFAULTED,)+ }
            }

            /// The common keys that do not apply to it.
            pub const fn refused_common_keys(self) -> &'static [PolicyField] {
                match self { $(Self::$name => <$name as RateAlgorithm>::REFUSED_COMMON_KEYS,)+ }
            }

            /// Whether its admitted requests hold a lease.
            pub const fn holds_leases(self) -> bool {
                match self { $(Self::$name => <$name as RateAlgorithm>::HOLDS_LEASES,)+ }
            }

            /// Whether its quota window's length moves with the time.
            pub const fn window_moves(self) -> bool {
                match self { $(Self::$name => <$name as RateAlgorithm>::WINDOW_MOVES,)+ }
            }

            /// Its parameters from a policy's table (an unknown key is refused).
            ///
            /// # Errors
            /// The deserializer's error naming the key at fault.
            pub fn deserialize<'de, D: Deserializer<'de>>(
                self,
                parameters: D,
            ) -> Result<Algorithm, D::Error> {
                match self {
                    $(Self::$name => {
                        <$name as serde::Deserialize>::deserialize(parameters).map(Algorithm::$name)
                    })+
                }
            }
        }

        impl Algorithm {
            /// Which algorithm this is.
            pub const fn kind(&self) -> AlgorithmKind {
                match self { $(Self::$name(_) => AlgorithmKind::$name,)+ }
            }

            /// The most units (leases) a subject can hold at once.
            pub fn limit(&self) -> u64 {
                match self { $(Self::$name(algorithm) => algorithm.limit(),)+ }
            }

            /// The certainty of every decision under this algorithm.
            pub fn certainty(&self) -> Certainty {
                match self { $(Self::$name(algorithm) => algorithm.certainty(),)+ }
            }

            /// The time over which it grants its limit.
            pub fn quota_window(&self, now: impl FnOnce() -> u64) -> Option<Duration> {
                match self { $(Self::$name(algorithm) => algorithm.quota_window(now),)+ }
            }

            /// Its share of each instance's limiter in degraded mode.
            #[must_use]
            pub fn scaled(&self, share: &dyn Fn(u64) -> u64) -> Self {
                match self { $(Self::$name(algorithm) => Self::$name(algorithm.scaled(share)),)+ }
            }

            /// Whether `limit - remaining` is the window's count.
            pub fn windowed(&self) -> bool {
                match self { $(Self::$name(_) => <$name as RateAlgorithm>::WINDOWED,)+ }
            }

            /// Whether a refusal stays one until its `reset_after`.
            pub fn refusal_stays(&self) -> bool {
                match self { $(Self::$name(_) => <$name as RateAlgorithm>::REFUSAL_STAYS,)+ }
            }

            /// The arguments its Lua function takes at caller time `t`.
            pub fn arguments(&self, t: u64) -> Arguments {
                match self { $(Self::$name(algorithm) => algorithm.arguments(t),)+ }
            }

            pub(crate) fn lease_life(&self, regression: u64) -> Option<u64> {
                match self { $(Self::$name(algorithm) => algorithm.lease_life(regression),)+ }
            }

            /// What `state` still owes past the limit at `t` (0 for another algorithm's).
            pub(crate) fn debt(&self, state: &AlgorithmState, t: u64) -> u64 {
                match (self, state) {
                    $((Self::$name(algorithm), AlgorithmState::$name(state)) => algorithm.debt(state, t),)+
                    #[allow(unreachable_patterns, reason = "a registry of one has no other state")]
                    _ => 0,
                }
            }

            pub(crate) fn check(&self, checks: &mut Checks) -> bool {
                match self { $(Self::$name(algorithm) => algorithm.check(checks),)+ }
            }

            /// Runs the algorithm over the key's state.
            pub(crate) fn run(
                &self,
                state: Option<&AlgorithmState>,
                run: &Run<'_>,
            ) -> Result<Step<AlgorithmState>, StateMismatch> {
                match self {
                    $(Self::$name(algorithm) => {
                        let state = match state {
                            None => None,
                            Some(AlgorithmState::$name(state)) => Some(state),
                            #[allow(unreachable_patterns, reason = "a registry of one has no other state")]
                            Some(_) => return Err(StateMismatch),
                        };
                        Ok(algorithm.step(state, run).map(AlgorithmState::$name))
                    })+
                }
            }
        }

        impl AlgorithmState {
            /// Which algorithm stored it.
            #[cfg(test)]
            const fn kind(&self) -> AlgorithmKind {
                match self { $(Self::$name(_) => AlgorithmKind::$name,)+ }
            }

            /// The state an inspect read from its tag and numbers, if any.
            pub fn decode(tag: u8, numbers: [u64; 3]) -> Option<Self> {
                $(
                    if tag == <$name as RateAlgorithm>::TAG && <$name as RateAlgorithm>::LUA.header > 0 {
                        return <$name as RateAlgorithm>::decode(numbers).map(Self::$name);
                    }
                )+
                None
            }

            /// The state of a key that is a lease set.
            pub fn of_lease_set() -> Option<Self> {
                $(
                    if <$name as RateAlgorithm>::HOLDS_LEASES {
                        return <$name as RateAlgorithm>::decode([0; 3]).map(Self::$name);
                    }
                )+
                None
            }
        }
    };
}

// The registry: one entry per algorithm, in the order every list shows them.
algorithms! {
    fixed_window::FixedWindow,
    sliding_counter::SlidingCounter,
    token_bucket::TokenBucket,
    gcra::Gcra,
    concurrency::Concurrency,
    calendar_window::CalendarWindow,
}

crate::impl_from_str_by_name!(AlgorithmKind);

impl fmt::Display for AlgorithmKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Algorithm {
    /// The configuration name of [`Self::kind`].
    pub const fn name(&self) -> &'static str {
        self.kind().name()
    }

    /// Whether its admitted requests hold a lease the caller releases.
    pub const fn holds_leases(&self) -> bool {
        self.kind().holds_leases()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // A multiple of every window below, as the worked numbers assume.
    pub(super) const T0: u64 = 1_800_000_000_000;

    pub(super) const fn d(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    /// A run that charges `cost` at `t` over a key without leases.
    pub(super) fn take(t: u64, cost: u64) -> Run<'static> {
        Run { t, cost, charge: Charge::Take, leases: &Leases::NONE, regression: 0 }
    }

    /// A spared run at `t` for `cost`.
    pub(super) fn spare(t: u64, cost: u64) -> Run<'static> {
        Run { charge: Charge::Spare, ..take(t, cost) }
    }

    /// Runs `algorithm` charging, storing what it writes.
    pub(super) fn apply(
        algorithm: impl Into<Algorithm>,
        state: &mut Option<AlgorithmState>,
        t: u64,
        cost: u64,
    ) -> Step<AlgorithmState> {
        let step = algorithm.into().run(state.as_ref(), &take(t, cost)).unwrap();
        if let Some((written, _)) = step.write {
            *state = Some(written);
        }
        step
    }

    fn all() -> [Algorithm; 6] {
        [
            FixedWindow { limit: 3, window: d(1000) }.into(),
            SlidingCounter { limit: 3, window: d(1000) }.into(),
            TokenBucket { capacity: 1, refill_tokens: 1, refill_period: d(1) }.into(),
            Gcra { limit: 1, period: d(1), burst: 1 }.into(),
            Concurrency { max_in_flight: 2, lease_ttl: d(1000), retry_after: d(100) }.into(),
            CalendarWindow {
                limit: 3,
                period: CalendarPeriod::Day,
                time_zone: "Europe/Berlin".parse().unwrap(),
            }
            .into(),
        ]
    }

    #[test]
    fn state_of_another_algorithm_is_a_mismatch() {
        let states = [
            AlgorithmState::FixedWindow(FixedWindowState { window_start: T0, count: 1 }),
            AlgorithmState::SlidingCounter(SlidingCounterState {
                window_start: T0,
                current: 1,
                previous: 0,
            }),
            AlgorithmState::TokenBucket(TokenBucketState { tokens: 1, updated_at: T0 }),
            AlgorithmState::Gcra(GcraState { tat: T0 * 1000 }),
            AlgorithmState::Concurrency(Leased),
            AlgorithmState::CalendarWindow(CalendarWindowState { period_start: T0, count: 1 }),
        ];
        for algorithm in all() {
            for state in &states {
                let run = algorithm.run(Some(state), &take(T0, 1));
                assert_eq!(
                    run.is_err(),
                    state.kind() != algorithm.kind(),
                    "{algorithm:?} {state:?}"
                );
            }
        }
    }

    #[test]
    fn each_algorithm_has_its_own_upper_case_tag_and_name() {
        // A shadow policy sends its tag in lower case, so every tag must be
        // an upper-case letter, and none another's.
        for (at, kind) in AlgorithmKind::ALL.iter().enumerate() {
            assert!(kind.tag().is_ascii_uppercase(), "{kind}");
            assert!(AlgorithmKind::ALL[..at].iter().all(|other| other.tag() != kind.tag()));
            assert!(AlgorithmKind::ALL[..at].iter().all(|other| other.name() != kind.name()));
            assert_eq!(kind.name().parse::<AlgorithmKind>(), Ok(*kind));
            let header = kind.lua().header > 0;
            assert_eq!(AlgorithmState::decode(kind.tag(), [1, 2, 3]).is_some(), header, "{kind}");
        }
        assert_eq!(AlgorithmState::decode(b'X', [1, 2, 3]), None);
        assert_eq!(
            AlgorithmState::decode(b'f', [1, 2, 3]),
            None,
            "lower case is a kind argument, never a state"
        );
    }

    #[test]
    fn each_algorithm_sends_as_many_arguments_as_its_lua_function_takes() {
        for algorithm in all() {
            let sent = algorithm.arguments(T0).as_slice().len();
            assert_eq!(sent, algorithm.kind().lua().arity, "{algorithm:?}");
        }
    }

    #[test]
    fn extreme_clock_values_do_not_panic() {
        let mut every = all().to_vec();
        every.push(Gcra { limit: 1, period: Duration::from_secs(u64::MAX / 4), burst: 3 }.into());
        every.push(
            Concurrency { max_in_flight: 3, lease_ttl: Duration::MAX, retry_after: d(1) }.into(),
        );
        for algorithm in every {
            let mut state = None;
            for t in [0, u64::MAX, 0, u64::MAX - 1] {
                let step = apply(algorithm.clone(), &mut state, t, 1);
                assert!(step.allowed || step.retry_after >= 1);
            }
        }
    }

    #[test]
    fn a_spared_run_reports_the_budget_as_it_stands_and_writes_what_a_denial_writes() {
        let fixed = Algorithm::from(FixedWindow { limit: 3, window: d(1000) });
        let mut state = None;
        apply(fixed.clone(), &mut state, T0 + 250, 1);
        let spared = fixed.run(state.as_ref(), &spare(T0 + 300, 1)).unwrap();
        assert!(spared.allowed);
        assert_eq!((spared.remaining, spared.reset_after, spared.write), (2, 700, None));

        let sliding = Algorithm::from(SlidingCounter { limit: 10, window: d(1000) });
        let mut state = None;
        apply(sliding.clone(), &mut state, T0, 4);
        let spared = sliding.run(state.as_ref(), &spare(T0 + 500, 1)).unwrap();
        assert_eq!((spared.allowed, spared.remaining, spared.write), (true, 6, None));

        // Capacity 5, 1 token per 100 ms: 2 left at T0, 3 at T0 + 100 (refilled).
        let bucket =
            Algorithm::from(TokenBucket { capacity: 5, refill_tokens: 1, refill_period: d(100) });
        let mut state = None;
        apply(bucket.clone(), &mut state, T0, 3);
        let spared = bucket.run(state.as_ref(), &spare(T0 + 100, 1)).unwrap();
        assert_eq!((spared.allowed, spared.remaining), (true, 3));
        let written =
            AlgorithmState::TokenBucket(TokenBucketState { tokens: 3, updated_at: T0 + 100 });
        assert_eq!(spared.write, Some((written, T0 + 100 + 200)));

        // GCRA b = 5, T = 100 ms: 3 cells at T0 leave 2, spared at T0 + 100 3.
        let gcra = Algorithm::from(Gcra { limit: 10, period: d(1000), burst: 5 });
        let mut state = None;
        apply(gcra.clone(), &mut state, T0, 3);
        let spared = gcra.run(state.as_ref(), &spare(T0 + 100, 1)).unwrap();
        assert_eq!((spared.allowed, spared.remaining, spared.write), (true, 3, None));
    }
}
