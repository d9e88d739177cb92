//! Sending on one multiplexed connection: the standalone and the Sentinel
//! gateways differ only in how they find the server, so both send through
//! these two methods of their [`LazyConnection`].

use std::time::Duration;

use redis::Value;
use redis::aio::{ConnectionLike, MultiplexedConnection};
use tokio::time::Instant;

use super::connection::{Connect, LazyConnection};
use super::{Acknowledged, GatewayFailure, WaitFor, acknowledged_of, classify, wait_command};

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
                    tracing::warn!(
                        kind = error.category(),
                        code = error.code(),
                        ?failure,
                        "redis error"
                    );
                }
                Err(self.failed(opened.generation, failure, Some(&error)))
            }
            Err(_) => Err(self.failed(opened.generation, GatewayFailure::TimedOut, None)),
        }
    }
}
