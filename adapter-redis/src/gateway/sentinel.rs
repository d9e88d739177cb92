//! `SentinelGateway`: the gateway of a master watched by Redis Sentinel,
//! over one multiplexed connection to whichever node the sentinels name.
//!
//! # Which master
//!
//! Every configured sentinel is asked `SENTINEL MASTERS` at once (over a
//! cached connection to a node that answered `ROLE` as a sentinel), and the
//! newest configuration wins: the entry of the master name with the highest
//! `config-epoch`, which every failover raises. A sentinel that has not
//! heard of a failover yet names the old master under the old epoch, so the
//! first answer alone (the `redis` crate's discovery) can lead back to an
//! old master. The named node is used unless every sentinel naming it holds
//! it down (`s_down`/`o_down`), and only once it answers `ROLE` as a master.
//! A master that any sentinel is failing over (`failover_in_progress`) is
//! not used either: it is about to be replaced, and what it takes until the
//! sentinels name its successor is lost (an old master restarted quickly,
//! empty, is named again for a moment). A sentinel gets [`MIN_FOLLOW_PERIOD`] or the command timeout, whichever
//! is longer, to answer.
//!
//! # Following a failover
//!
//! While calls flow, a background task asks the sentinels again every such
//! period. When they name another master than the one the connections
//! reach, or are failing that one over, it moves the connector's
//! [`Connect::mark`] on and every connection is replaced on its next call
//! (one atomic read per call). So a master the sentinels no longer name (an
//! old master restarted quickly, which they demote only seconds later)
//! takes calls for about one period at most, not until it answers
//! `READONLY`. Otherwise the connection is
//! replaced by the rule of the `connection` module. While no sentinel names
//! a usable master, connects fail and calls are
//! [`GatewayFailure::NotSent`].
//!
//! [`GatewayFailure::NotSent`]: super::GatewayFailure::NotSent

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{
    AsyncConnectionConfig, Client, ConnectionInfo, ErrorKind, IntoConnectionInfo,
    RedisConnectionInfo, RedisError, RedisResult, Role,
};

use super::connection::{Connect, LazyConnection};
use super::multiplexed::MultiplexedGateway;
use crate::settings::sentinel_address;

/// The gateway of a Sentinel-managed master.
pub(crate) type SentinelGateway = MultiplexedGateway<Discovered>;

/// Shortest pause between two rounds of asking the sentinels, and the
/// least time one sentinel gets to answer.
pub(crate) const MIN_FOLLOW_PERIOD: Duration = Duration::from_millis(50);

/// A node's `host` and `port` as the sentinels name it.
type Address = (String, u16);

/// Asks the sentinels for the master, connects to it, and follows them.
pub(crate) struct Discovered {
    sentinels: Box<[Sentinel]>,
    master_name: String,
    /// The logins on the master (whichever node it is).
    master_login: RedisConnectionInfo,
    config: AsyncConnectionConfig,
    /// How often the sentinels are asked while calls flow, and how long
    /// each may take to answer.
    period: Duration,
    /// The master the connections under the current mark reach.
    master: Mutex<Option<Address>>,
    mark: AtomicU64,
    /// Whether a call took a connection since the last round.
    used: AtomicBool,
    /// Whether the following task was started (on the first connect, inside
    /// the runtime).
    following: AtomicBool,
    /// The task's handle on this connector; it ends once the gateway is gone.
    me: Weak<Discovered>,
}

/// One configured sentinel and the connection to it, once opened.
struct Sentinel {
    info: ConnectionInfo,
    connection: Mutex<Option<MultiplexedConnection>>,
}

/// What one sentinel says of the master.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Named {
    address: Address,
    /// The `config-epoch` of that configuration.
    epoch: u64,
    /// Held down (`s_down` or `o_down`) by every sentinel naming it so.
    down: bool,
    /// Being failed over by at least one sentinel naming it so.
    replacing: bool,
}

impl Named {
    /// Whether calls may go to it.
    fn usable(&self) -> bool {
        !self.down && !self.replacing
    }
}

impl Connect for Discovered {
    type Connection = MultiplexedConnection;

    async fn connect(&self) -> RedisResult<MultiplexedConnection> {
        self.follow();
        let named = match self.ask_all().await {
            Some(named) if named.usable() => named,
            Some(_) => {
                return Err(no_master("the master the sentinels name is down or failing over"));
            }
            None => return Err(no_master("no sentinel named the master")),
        };
        let (host, port) = named.address.clone();
        let info =
            (host, port).into_connection_info()?.set_redis_settings(self.master_login.clone());
        let mut connection =
            Client::open(info)?.get_multiplexed_async_connection_with_config(&self.config).await?;
        let role: Role = redis::cmd("ROLE").query_async(&mut connection).await?;
        if !matches!(role, Role::Primary { .. }) {
            return Err(no_master("the node the sentinels name is not a master"));
        }
        self.reached(named.address);
        Ok(connection)
    }

    fn mark(&self) -> u64 {
        self.mark.load(Ordering::Relaxed)
    }

    fn used(&self) {
        // A store only when the flag is down: once per round, not per call.
        if !self.used.load(Ordering::Relaxed) {
            self.used.store(true, Ordering::Relaxed);
        }
    }

    fn opened(&self, connection: &MultiplexedConnection, label: &Arc<str>, timeout: Duration) {
        crate::eviction::check(connection.clone(), Arc::clone(label), timeout);
    }
}

fn no_master(why: &'static str) -> RedisError {
    RedisError::from((ErrorKind::MasterNameNotFoundBySentinel, why))
}

impl Discovered {
    /// A connection reached `address`: another master than the one of the
    /// current mark moves the mark on, so the connections to that one go.
    fn reached(&self, address: Address) {
        let mut master = self.master.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        match &*master {
            Some(held) if *held == address => {}
            Some(_) => {
                *master = Some(address);
                self.mark.fetch_add(1, Ordering::Relaxed);
            }
            None => *master = Some(address),
        }
    }

    /// Starts the task that asks the sentinels every period while calls
    /// flow; once per connector.
    fn follow(&self) {
        if self.following.swap(true, Ordering::Relaxed) {
            return;
        }
        let me = self.me.clone();
        let period = self.period;
        tokio::spawn(async move {
            let mut rounds = tokio::time::interval(period);
            rounds.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                rounds.tick().await;
                let Some(discovered) = me.upgrade() else { return };
                if discovered.used.swap(false, Ordering::Relaxed) {
                    discovered.check().await;
                }
            }
        });
    }

    /// One round: when the sentinels name another master than the one the
    /// connections reach, every connection is replaced on its next call.
    async fn check(&self) {
        // No answer teaches nothing: the connections stay.
        let Some(named) = self.ask_all().await else { return };
        let mut master = self.master.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let Some(held) = master.as_ref() else { return };
        if *held != named.address {
            tracing::warn!(
                epoch = named.epoch,
                "redis sentinels name another master; replacing the connections"
            );
            *master = Some(named.address);
            self.mark.fetch_add(1, Ordering::Relaxed);
        } else if named.replacing {
            tracing::warn!(
                epoch = named.epoch,
                "redis sentinels are failing the master over; leaving it"
            );
            *master = None;
            self.mark.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The newest of what the sentinels that answer within the period say.
    async fn ask_all(&self) -> Option<Named> {
        let asks = self.sentinels.iter().map(|sentinel| async move {
            match tokio::time::timeout(self.period, self.ask(sentinel)).await {
                Ok(named) => named,
                Err(_) => {
                    // A silent sentinel's connection is not asked again.
                    sentinel.forget();
                    None
                }
            }
        });
        newest(futures::future::join_all(asks).await.into_iter().flatten())
    }

    /// What `sentinel` says of the master; `None` when it cannot be asked
    /// or does not know it.
    async fn ask(&self, sentinel: &Sentinel) -> Option<Named> {
        let mut connection = match sentinel.cached() {
            Some(connection) => connection,
            None => sentinel.open(&self.config).await?,
        };
        let masters: RedisResult<Vec<HashMap<String, String>>> =
            redis::cmd("SENTINEL").arg("MASTERS").query_async(&mut connection).await;
        match masters {
            Ok(masters) => named_in(masters, &self.master_name),
            Err(error) => {
                tracing::warn!(
                    kind = error.category(),
                    code = error.code(),
                    "redis sentinel refused"
                );
                if error.is_io_error() || error.is_unrecoverable_error() {
                    sentinel.forget();
                }
                None
            }
        }
    }
}

impl Sentinel {
    fn cached(&self) -> Option<MultiplexedConnection> {
        self.connection.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }

    fn forget(&self) {
        *self.connection.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = None;
    }

    /// Connects, checks with `ROLE` that the node is a sentinel, and caches
    /// the connection.
    async fn open(&self, config: &AsyncConnectionConfig) -> Option<MultiplexedConnection> {
        let opened = async {
            let mut connection = Client::open(self.info.clone())?
                .get_multiplexed_async_connection_with_config(config)
                .await?;
            let role: Role = redis::cmd("ROLE").query_async(&mut connection).await?;
            if matches!(role, Role::Sentinel { .. }) {
                Ok(connection)
            } else {
                Err(RedisError::from((
                    ErrorKind::InvalidClientConfig,
                    "the node is not a sentinel",
                )))
            }
        };
        match opened.await {
            Ok(connection) => {
                *self.connection.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) =
                    Some(connection.clone());
                Some(connection)
            }
            Err(error) => {
                tracing::warn!(
                    kind = error.category(),
                    code = error.code(),
                    "redis sentinel connect failed"
                );
                None
            }
        }
    }
}

/// The entry of `name` in a `SENTINEL MASTERS` reply.
fn named_in(masters: Vec<HashMap<String, String>>, name: &str) -> Option<Named> {
    let master =
        masters.into_iter().find(|master| master.get("name").is_some_and(|n| n == name))?;
    let host = master.get("ip")?.clone();
    let port = master.get("port")?.parse().ok()?;
    let epoch = master.get("config-epoch").and_then(|epoch| epoch.parse().ok()).unwrap_or(0);
    let flags = master.get("flags").map_or("", String::as_str);
    let flag = |wanted: &[&str]| flags.split(',').any(|flag| wanted.contains(&flag));
    Some(Named {
        address: (host, port),
        epoch,
        down: flag(&["s_down", "o_down"]),
        replacing: flag(&["failover_in_progress"]),
    })
}

/// The newest configuration among `answers`: the highest epoch (a sentinel
/// behind on a failover still names the old master under an older one),
/// down only when every sentinel naming it at that epoch holds it down,
/// and being replaced when any of them is failing it over.
fn newest(answers: impl IntoIterator<Item = Named>) -> Option<Named> {
    let mut newest: Option<Named> = None;
    for named in answers {
        match &mut newest {
            Some(best) if named.epoch < best.epoch => {}
            Some(best) if named.epoch == best.epoch => {
                if named.address == best.address {
                    best.down &= named.down;
                    best.replacing |= named.replacing;
                }
            }
            Some(_) | None => newest = Some(named),
        }
    }
    newest
}

/// Who the gateway logs in as, on the master and on the sentinels.
#[derive(Clone, Copy, Default)]
pub(crate) struct Logins<'a> {
    pub(crate) username: Option<&'a str>,
    pub(crate) password: Option<&'a str>,
    pub(crate) sentinel_username: Option<&'a str>,
    pub(crate) sentinel_password: Option<&'a str>,
}

fn login(username: Option<&str>, password: Option<&str>) -> RedisConnectionInfo {
    let mut login = RedisConnectionInfo::default();
    if let Some(username) = username {
        login = login.set_username(username);
    }
    if let Some(password) = password {
        login = login.set_password(password);
    }
    login
}

impl MultiplexedGateway<Discovered> {
    /// A gateway that asks `sentinels` (`host:port`) for `master_name` on
    /// first use, and again every `follow_period` (at least
    /// [`MIN_FOLLOW_PERIOD`]) while calls flow. Fails only on a bad address.
    pub(crate) fn new(
        sentinels: &[String],
        master_name: &str,
        logins: Logins<'_>,
        connect_timeout: Duration,
        follow_period: Duration,
    ) -> Result<Self, RedisError> {
        let sentinel_login = login(logins.sentinel_username, logins.sentinel_password);
        let mut nodes = Vec::with_capacity(sentinels.len());
        for address in sentinels {
            let Some((host, port)) = sentinel_address(address) else {
                return Err(RedisError::from((ErrorKind::InvalidClientConfig, "not host:port")));
            };
            let info =
                (host, port).into_connection_info()?.set_redis_settings(sentinel_login.clone());
            nodes.push(Sentinel { info, connection: Mutex::new(None) });
        }
        if nodes.is_empty() {
            return Err(RedisError::from((ErrorKind::InvalidClientConfig, "no sentinels")));
        }
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(connect_timeout))
            // Each call carries its own timeout (capped by the request deadline).
            .set_response_timeout(None);
        let connector = Arc::new_cyclic(|me| Discovered {
            sentinels: nodes.into_boxed_slice(),
            master_name: master_name.to_owned(),
            master_login: login(logins.username, logins.password),
            config,
            period: follow_period.max(MIN_FOLLOW_PERIOD),
            master: Mutex::new(None),
            mark: AtomicU64::new(0),
            used: AtomicBool::new(false),
            following: AtomicBool::new(false),
            me: me.clone(),
        });
        Ok(Self {
            connection: LazyConnection::checking_each_connection(
                connector,
                connect_timeout,
                "sentinel".into(),
            ),
            waiting: None,
        })
    }

    /// How many master connections were opened so far.
    #[cfg(test)]
    pub(crate) fn generation(&self) -> u64 {
        self.connection.generation()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::{GatewayFailure, RedisGateway};

    fn named(port: u16, epoch: u64, down: bool) -> Named {
        Named { address: ("10.0.0.1".to_owned(), port), epoch, down, replacing: false }
    }

    #[test]
    fn the_newest_configuration_wins_whatever_the_order_of_the_answers() {
        // Two sentinels still on the old master, one past the failover.
        let old = named(6379, 0, false);
        let promoted = named(6380, 1, false);
        for answers in [
            vec![old.clone(), old.clone(), promoted.clone()],
            vec![promoted.clone(), old.clone(), old.clone()],
        ] {
            assert_eq!(newest(answers), Some(promoted.clone()));
        }
        assert_eq!(newest([]), None);
        // Down only when every sentinel naming it at that epoch says so.
        assert!(!newest([named(1, 2, true), named(1, 2, false)]).unwrap().down);
        assert!(newest([named(1, 2, true), named(1, 2, true), named(2, 1, false)]).unwrap().down);
        // One sentinel failing it over is enough to leave it.
        let replacing = Named { replacing: true, ..named(1, 2, false) };
        let seen = newest([named(1, 2, false), replacing, named(1, 2, false)]).unwrap();
        assert!(!seen.usable(), "{seen:?}");
        assert!(named(1, 2, false).usable());
    }

    #[test]
    fn a_sentinel_s_entry_gives_the_address_the_epoch_and_whether_it_is_down() {
        let entry = |name: &str, flags: &str| {
            HashMap::from([
                ("name".to_owned(), name.to_owned()),
                ("ip".to_owned(), "10.0.0.1".to_owned()),
                ("port".to_owned(), "6380".to_owned()),
                ("flags".to_owned(), flags.to_owned()),
                ("config-epoch".to_owned(), "3".to_owned()),
            ])
        };
        assert_eq!(
            named_in(vec![entry("other", "master"), entry("mymaster", "master")], "mymaster"),
            Some(named(6380, 3, false))
        );
        assert_eq!(
            named_in(vec![entry("mymaster", "master,s_down")], "mymaster"),
            Some(named(6380, 3, true))
        );
        let failing_over =
            named_in(vec![entry("mymaster", "master,failover_in_progress")], "mymaster");
        assert_eq!(failing_over, Some(Named { replacing: true, ..named(6380, 3, false) }));
        assert_eq!(named_in(vec![entry("other", "master")], "mymaster"), None);
    }

    #[tokio::test]
    async fn no_answering_sentinel_is_not_sent_within_the_timeout() {
        // Ports 1 and 2 on loopback: nothing listens, every connect is refused.
        let sentinels = ["127.0.0.1:1".to_owned(), "127.0.0.1:2".to_owned()];
        let gateway = SentinelGateway::new(
            &sentinels,
            "mymaster",
            Logins::default(),
            Duration::from_millis(200),
            Duration::from_millis(200),
        )
        .unwrap();
        let started = std::time::Instant::now();
        assert_eq!(gateway.ping(Duration::from_millis(300)).await, Err(GatewayFailure::NotSent));
        assert!(started.elapsed() < Duration::from_secs(2));
        assert_eq!(gateway.generation(), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn with_no_sentinel_answering_a_burst_of_calls_makes_one_connect_attempt() {
        let sentinels = ["127.0.0.1:1".to_owned(), "127.0.0.1:2".to_owned()];
        let gateway = Arc::new(
            SentinelGateway::new(
                &sentinels,
                "mymaster",
                Logins::default(),
                Duration::from_secs(1),
                Duration::from_millis(200),
            )
            .unwrap(),
        );
        let pings = super::super::tests::pings_at_once(&gateway, 16, Duration::from_secs(2)).await;
        assert_eq!(pings, [Err(GatewayFailure::NotSent); 16]);
        assert_eq!(gateway.connection.connect_attempts(), 1, "not one attempt per caller");
    }
}
