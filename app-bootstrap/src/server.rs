//! The HTTP server: the API routes (`routes`) behind the rate-limit layer,
//! probes and metrics beside them. Built in two steps (build, then run) so
//! tests bind port 0 and learn the real port before serving.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use adapter_web::{EVALUATION_SECONDS, RateLimitLayer};
use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use shared_contract::{Clock, SystemClock};
use tokio::net::TcpListener;

use crate::admin::{self, AdminState};
use crate::capability::{self, RateLimitCapability, Upkeep};
use crate::config::AppConfig;
use crate::error::BootstrapError;
use crate::routes::{self, ApiRoutes};

/// Longest wait for the provider's readiness answer before `/readyz` says no.
const READINESS_TIMEOUT: Duration = Duration::from_secs(2);
/// How often the Prometheus recorder is tidied (histogram buffers drained).
const METRICS_UPKEEP: Duration = Duration::from_secs(5);
/// Evaluation latency buckets in seconds: 100 µs to 1 s.
const LATENCY_BUCKETS: &[f64] =
    &[0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0];

/// A bound server, ready to run.
#[derive(Debug)]
pub struct Application {
    listener: TcpListener,
    router: Router,
    address: SocketAddr,
    metrics: PrometheusHandle,
    upkeep: Option<Upkeep>,
    admin: Option<AdminListener>,
}

/// The bound admin listener and its router (`admin.listen`).
#[derive(Debug)]
struct AdminListener {
    listener: TcpListener,
    router: Router,
    address: SocketAddr,
}

impl Application {
    /// Builds the provider, the edge and the router over [`routes::api`],
    /// and binds `server.listen` (port 0 picks a free port).
    pub async fn build(config: &AppConfig) -> Result<Self, BootstrapError> {
        Self::build_with(config, routes::api(), Arc::new(SystemClock)).await
    }

    /// [`Self::build`] with a clock of the caller's choosing.
    pub async fn build_with_clock(
        config: &AppConfig,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, BootstrapError> {
        Self::build_with(config, routes::api(), clock).await
    }

    /// [`Self::build`] over the API routes `api`, all of which are served
    /// behind the rate-limit layer. Every configured operation must be one
    /// `api` serves; otherwise start-up stops naming each key.
    pub async fn build_with(
        config: &AppConfig,
        api: ApiRoutes,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, BootstrapError> {
        config.check_operations(api.operations())?;
        let api = api.into_router();
        let metrics = metrics_handle()?;
        let capability = RateLimitCapability::build(config, Arc::clone(&clock))?;
        let upkeep = capability.upkeep().cloned();
        // One pseudonymizer for the edge and the admin lookups, so a
        // generated key (memory provider without keys) is the same for both.
        let shared = match (capability.port(), &config.admin.listen) {
            (None, None) => None,
            (Some(_), _) | (None, Some(_)) => Some(Arc::new(capability::pseudonymizer(config)?)),
        };
        let layer = match &shared {
            Some(pseudonymizer) => {
                capability.layer_with(config, Arc::clone(&clock), Arc::clone(pseudonymizer))?
            }
            None => capability.layer(config, Arc::clone(&clock))?,
        };
        let admin = match (config.admin.listen, &config.admin.token, shared) {
            (Some(address), Some(token), Some(pseudonymizer)) => {
                let state = AdminState::new(
                    capability.port().cloned(),
                    pseudonymizer,
                    Arc::new(capability::edge_settings(config)?),
                    token,
                    clock,
                )?;
                let (listener, address) = bind(address).await?;
                Some(AdminListener { listener, router: admin::router(state), address })
            }
            // Off; validation refuses a listener without a token.
            (None, _, _) | (Some(_), None, _) | (Some(_), Some(_), None) => None,
        };
        let router = router(api, capability, layer, metrics.clone());
        let (listener, address) = bind(config.server.listen).await?;
        Ok(Self { listener, router, address, metrics, upkeep, admin })
    }

    /// The bound admin address, when `admin.listen` is set.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin.as_ref().map(|admin| admin.address)
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.address
    }

    /// The bound port.
    pub fn port(&self) -> u16 {
        self.address.port()
    }

    /// Serves until SIGTERM or ctrl-c, then drains in-flight requests.
    pub async fn run_until_stopped(self) -> Result<(), BootstrapError> {
        self.run_until(shutdown_signal()).await
    }

    /// Serves until `shutdown` completes, then drains in-flight requests.
    pub async fn run_until(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), BootstrapError> {
        let metrics = self.metrics.clone();
        let upkeep = tokio::spawn(async move {
            let mut tick = tokio::time::interval(METRICS_UPKEEP);
            loop {
                tick.tick().await;
                metrics.run_upkeep();
            }
        });
        let purge = self.upkeep.map(|provider| {
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(Upkeep::EVERY);
                loop {
                    tick.tick().await;
                    provider.run();
                }
            })
        });
        // The admin listener stops with the public one: on the shutdown
        // signal, or when the public server ends (the sender is dropped).
        let (stop, stopped) = tokio::sync::watch::channel(());
        let admin = self.admin.map(|admin| {
            let mut stopped = stopped.clone();
            let service = admin.router.into_make_service_with_connect_info::<SocketAddr>();
            tokio::spawn(async move {
                let shutdown = async move {
                    let _ = stopped.changed().await;
                };
                axum::serve(admin.listener, service).with_graceful_shutdown(shutdown).await
            })
        });
        let shutdown = async move {
            shutdown.await;
            let _ = stop.send(());
        };
        let service = self.router.into_make_service_with_connect_info::<SocketAddr>();
        let served = axum::serve(self.listener, service).with_graceful_shutdown(shutdown).await;
        if let Some(admin) = admin {
            if let Ok(Err(error)) = admin.await {
                tracing::warn!(%error, "admin listener stopped with an error");
            }
        }
        upkeep.abort();
        if let Some(purge) = purge {
            purge.abort();
        }
        served.map_err(BootstrapError::Serve)
    }
}

#[derive(Debug, Clone)]
struct Probes {
    capability: RateLimitCapability,
    metrics: PrometheusHandle,
}

/// Binds `address` (port 0 picks a free port) and reports the bound one.
async fn bind(address: SocketAddr) -> Result<(TcpListener, SocketAddr), BootstrapError> {
    let listener = TcpListener::bind(address)
        .await
        .map_err(|source| BootstrapError::Bind { address, source })?;
    let bound = listener.local_addr().map_err(BootstrapError::Serve)?;
    Ok((listener, bound))
}

/// The whole router: every route of `api` behind `layer`; `/healthz`,
/// `/readyz` and `/metrics` beside it, so probes are never rate limited.
/// The layer wraps `api` as a whole, so no API route can end up outside it.
pub fn router(
    api: Router,
    capability: RateLimitCapability,
    layer: RateLimitLayer,
    metrics: PrometheusHandle,
) -> Router {
    let probes = Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(render_metrics))
        .with_state(Probes { capability, metrics });
    api.layer(layer).merge(probes)
}

async fn healthz() -> &'static str {
    "ok"
}

async fn readyz(State(probes): State<Probes>) -> (StatusCode, &'static str) {
    let ready = tokio::time::timeout(READINESS_TIMEOUT, probes.capability.is_ready()).await;
    match ready {
        Ok(true) => (StatusCode::OK, "ready"),
        Ok(false) | Err(_) => (StatusCode::SERVICE_UNAVAILABLE, "rate-limit provider unavailable"),
    }
}

async fn render_metrics(State(probes): State<Probes>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], probes.metrics.render())
}

/// The process-wide Prometheus recorder, installed on first use. The
/// `metrics` facade has one global recorder, so every server in a process
/// shares it.
pub fn metrics_handle() -> Result<PrometheusHandle, BootstrapError> {
    static HANDLE: Mutex<Option<PrometheusHandle>> = Mutex::new(None);
    let mut installed = HANDLE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(handle) = installed.as_ref() {
        return Ok(handle.clone());
    }
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Full(EVALUATION_SECONDS.to_owned()), LATENCY_BUCKETS)
        .and_then(PrometheusBuilder::install_recorder)
        .map_err(|error| BootstrapError::Wiring {
            component: "the Prometheus recorder",
            reason: error.to_string(),
        })?;
    *installed = Some(handle.clone());
    Ok(handle)
}

/// Completes on ctrl-c or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut stream) => {
                stream.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
    }
    tracing::info!("shutdown signal received; draining in-flight requests");
}
