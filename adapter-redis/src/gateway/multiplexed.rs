//! Sending on one multiplexed connection: the standalone and the Sentinel
//! gateways differ only in how they find the server (their [`Connect`]),
//! so both are a [`MultiplexedGateway`] and send through the same code.

use std::fmt::{self, Debug};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use redis::Value;
use redis::aio::{ConnectionLike, MultiplexedConnection};
use tokio::time::Instant;

use super::connection::{Connect, LazyConnection};
use super::pool::{WaitPool, patience};
use super::{
    Acknowledged, GatewayFailure, LoadedScript, RedisGateway, WaitFor, acknowledged_of, classify,
    digest_of, evalsha_command, log_error_reply, pong, script_load_command, wait_command,
};

/// The gateway of one server reached over one multiplexed connection,
/// opened lazily by `C` and replaced by the rule of the `connection` module.
/// In `WAIT` mode the charges go on a [`WaitPool`] of such connections
/// instead, one call at a time each.
pub(crate) struct MultiplexedGateway<C: Connect<Connection = MultiplexedConnection>> {
    pub(super) connection: LazyConnection<C>,
    pub(super) waiting: Option<WaitPool<C>>,
}

impl<C: Connect<Connection = MultiplexedConnection>> MultiplexedGateway<C> {
    /// Sends [`RedisGateway::evalsha_then_wait`] on a pool of `size`
    /// connections to the same server, opened by the same connector.
    pub(crate) fn with_wait_connections(mut self, size: usize) -> Self {
        let connection = &self.connection;
        self.waiting = Some(WaitPool::new(
            connection.connector(),
            size,
            connection.connect_timeout(),
            connection.label(),
        ));
        self
    }
}

impl<C: Connect<Connection = MultiplexedConnection>> Debug for MultiplexedGateway<C> {
    // The connector may hold passwords: print none of it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MultiplexedGateway")
            .field("topology", &self.connection.label())
            .field("connect_timeout", &self.connection.connect_timeout())
            .field("generation", &self.connection.generation())
            .field("wait_connections", &self.waiting.as_ref().map(WaitPool::size))
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl<C: Connect<Connection = MultiplexedConnection> + 'static> RedisGateway
    for MultiplexedGateway<C>
{
    async fn script_load(
        &self,
        source: &'static str,
        _key: &str,
        timeout: Duration,
    ) -> Result<String, GatewayFailure> {
        digest_of(self.connection.query(&script_load_command(source), timeout).await?)
    }

    async fn evalsha(
        &self,
        script: &LoadedScript,
        keys: &[String],
        args: &[Arc<[u8]>],
        timeout: Duration,
    ) -> Result<Value, GatewayFailure> {
        self.connection.query(&evalsha_command(&script.digest, keys, args), timeout).await
    }

    async fn evalsha_then_wait(
        &self,
        script: &LoadedScript,
        keys: &[String],
        args: &[Arc<[u8]>],
        wait: WaitFor,
        timeout: Duration,
    ) -> Result<Acknowledged, GatewayFailure> {
        let cmd = evalsha_command(&script.digest, keys, args);
        let Some(pool) = &self.waiting else {
            return self.connection.query_then_wait(&cmd, wait, timeout).await;
        };
        let started = Instant::now();
        let patient = started + Duration::from_millis(wait.timeout_ms);
        let Some(lent) = pool.lend(patient.min(started + timeout)).await else {
            tracing::debug!("no WAIT connection came free within wait-timeout");
            return Err(GatewayFailure::NotSent);
        };
        let now = Instant::now();
        let Some(wait) = patience(wait, started, now) else {
            return Err(GatewayFailure::NotSent);
        };
        lent.query_then_wait(&cmd, wait, timeout.saturating_sub(now - started)).await
    }

    async fn ping(&self, timeout: Duration) -> Result<(), GatewayFailure> {
        pong(&self.connection.query(&redis::cmd("PING"), timeout).await?)
    }
}

impl<C: Connect<Connection = MultiplexedConnection>> LazyConnection<C> {
    /// Sends `cmd` within `timeout` and classifies how it failed.
    pub(crate) async fn query(
        &self,
        cmd: &redis::Cmd,
        timeout: Duration,
    ) -> Result<Value, GatewayFailure> {
        self.send(timeout, async |mut connection: MultiplexedConnection| {
            cmd.query_async::<Value>(&mut connection).await
        })
        .await
    }

    /// Sends `cmd` and `WAIT` as one pipeline within `timeout`: one round
    /// trip, on one connection, so `WAIT` covers `cmd`'s write.
    pub(crate) async fn query_then_wait(
        &self,
        cmd: &redis::Cmd,
        wait: WaitFor,
        timeout: Duration,
    ) -> Result<Acknowledged, GatewayFailure> {
        let mut pipeline = redis::pipe();
        pipeline.add_command(cmd.clone()).add_command(wait_command(wait));
        self.send(timeout, async |mut connection: MultiplexedConnection| {
            let mut replies = connection.req_packed_commands(&pipeline, 0, 2).await?.into_iter();
            match (replies.next(), replies.next()) {
                (Some(evalsha), Some(wait)) => acknowledged_of(evalsha, wait),
                _ => Err(redis::RedisError::from((
                    redis::ErrorKind::UnexpectedReturnType,
                    "a pipeline of two answered with fewer replies",
                ))),
            }
        })
        .await
    }

    async fn send<T>(
        &self,
        timeout: Duration,
        request: impl AsyncFnOnce(MultiplexedConnection) -> redis::RedisResult<T>,
    ) -> Result<T, GatewayFailure> {
        let until = Instant::now() + timeout;
        let opened = self.get(until).await?;
        if Instant::now() >= until {
            return Err(GatewayFailure::NotSent);
        }
        match tokio::time::timeout_at(until, request(opened.connection)).await {
            Ok(Ok(value)) => {
                self.answered();
                Ok(value)
            }
            Ok(Err(error)) => {
                let failure = classify(&error);
                if failure != GatewayFailure::NoScript {
                    log_error_reply(&error, "redis error");
                }
                Err(self.failed(opened.generation, failure, Some(&error)))
            }
            Err(_) => Err(self.failed(opened.generation, GatewayFailure::TimedOut, None)),
        }
    }
}
