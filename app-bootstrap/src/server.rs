//! The HTTP server: the API routes (`routes`) behind the rate-limit layer,
//! probes and metrics beside them. Built in two steps (build, then run) so
//! tests bind port 0 and learn the real port before serving.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use adapter_envoy_rls::RlsSwitch;
use adapter_web::{EVALUATION_SECONDS, LeaseReleases, RateLimitLayer};
use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use shared_contract::{Clock, SubjectPseudonymizer, SystemClock};
use tokio::net::TcpListener;

use crate::admin::{self, AdminSource, AdminState};
use crate::capability::{self, RateLimitCapability, Upkeep};
use crate::config::{AppConfig, ConfigSources};
use crate::error::BootstrapError;
use crate::listener::{self, ConnectionLimits};
use crate::reload::{ReloadTarget, Reloader};
use crate::routes::{self, ApiRoutes};
use crate::telemetry::{self, Tracing};

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
    /// What a reloader starts from: the configuration built with, the
    /// operations served, and what a reload replaces.
    reload: (AppConfig, std::collections::BTreeSet<String>, Option<ReloadTarget>),
    reloader: Option<Reloader>,
    /// SIGHUP, listened for since before the build ([`Hangups::listen`]).
    hangups: Option<Hangups>,
    /// SIGTERM and SIGINT, caught since before the build ([`Self::stop_on`]).
    terminations: Option<Terminations>,
    admin: Option<AdminListener>,
    /// The Envoy RLS gRPC listener (`envoy-rls.listen`).
    rls: Option<RlsListener>,
    /// Both listeners' header-read timeout and shutdown grace.
    limits: ConnectionLimits,
    /// How requests are sampled, when they get spans at all
    /// (`telemetry.otlp.endpoint` is set).
    sampling: Option<telemetry::Sampling>,
    /// The trace pipeline, flushed at shutdown ([`Self::trace_with`]).
    tracing: Option<Tracing>,
    /// The edge's in-flight lease releases, which the shutdown waits for
    /// once the connections are closed, for at most the bound: the Redis
    /// `command-timeout`, the longest a release takes in all (the memory
    /// provider's never wait).
    lease_releases: Option<(LeaseReleases, Duration)>,
}

/// SIGHUP, caught from the moment this is made. The binary's `main` makes
/// it first thing, before it parses the command line, starts the runtime,
/// reads the configuration or binds a port, so a reload signal sent while
/// `serve` starts never takes SIGHUP's default action (ending the process):
/// it is kept, several as one, and applied as a reload once the server
/// serves. Another command [`release`](Self::release)s it and ends on a
/// SIGHUP as any program does.
#[derive(Debug)]
pub struct Hangups {
    /// Set by every SIGHUP; what came before the reload loop listens.
    #[cfg(unix)]
    caught: Caught,
}

impl Hangups {
    /// Catches SIGHUP from now on; needs no runtime (nor a logger: a
    /// failure to register is only reported once serving, by the reloader
    /// finding no signal stream either).
    pub fn catch() -> Self {
        #[cfg(unix)]
        {
            Self { caught: Caught::catch(&[signal_hook::consts::SIGHUP]) }
        }
        #[cfg(not(unix))]
        Self {}
    }

    /// For a command other than `serve`: a SIGHUP from now on ends the
    /// process, as it would had nothing caught it.
    pub fn release(self) {
        #[cfg(unix)]
        self.caught.release();
    }
}

/// Signals caught from the moment this is made, each setting one flag,
/// until released: then they take their default action again.
#[cfg(unix)]
#[derive(Debug)]
struct Caught {
    /// Set by every one of the signals; `None` when one could not be
    /// registered (the runtime's signal streams are all there is then).
    flag: Option<Arc<std::sync::atomic::AtomicBool>>,
    /// Once set, the signals take their default action again.
    ends_process: Arc<std::sync::atomic::AtomicBool>,
}

#[cfg(unix)]
impl Caught {
    fn catch(signals: &[std::ffi::c_int]) -> Self {
        use signal_hook::flag;
        let ends_process = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let caught = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut registered = true;
        for &signal in signals {
            // Registered first, so a released process ends before the
            // flag below would keep the signal.
            let _ = flag::register_conditional_default(signal, Arc::clone(&ends_process));
            registered &= flag::register(signal, Arc::clone(&caught)).is_ok();
        }
        Self { flag: registered.then_some(caught), ends_process }
    }

    fn release(&self) {
        self.ends_process.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// SIGTERM and SIGINT (ctrl-c), caught from the moment this is made. The
/// binary's `main` makes it first thing (before [`Hangups`]), so a stop
/// signal sent at any point of `serve`'s start-up is kept rather than
/// lost: before, the handlers were installed only once the server served,
/// and a signal in between either took the default action or fell between
/// the runtime installing its handler and listening on it (it was then
/// never seen, and the process served on until a second one). `serve`
/// stops on a kept one as soon as it serves ([`Self::received`]). Another
/// command [`release`](Self::release)s it and ends on them as any program
/// does.
#[derive(Debug)]
pub struct Terminations {
    /// Set by every SIGTERM and SIGINT.
    #[cfg(unix)]
    caught: Caught,
}

impl Terminations {
    /// Catches SIGTERM and SIGINT from now on; needs no runtime.
    pub fn catch() -> Self {
        #[cfg(unix)]
        {
            use signal_hook::consts::{SIGINT, SIGTERM};
            Self { caught: Caught::catch(&[SIGTERM, SIGINT]) }
        }
        #[cfg(not(unix))]
        Self {}
    }

    /// For a command other than `serve`: SIGTERM and SIGINT end the process
    /// from now on, as they would had nothing caught them.
    pub fn release(self) {
        #[cfg(unix)]
        self.caught.release();
    }

    /// Completes on SIGTERM or SIGINT, at once for one caught since
    /// [`Self::catch`].
    pub async fn received(self) {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{Signal, SignalKind, signal};
            async fn next(stream: std::io::Result<Signal>) {
                match stream {
                    Ok(mut stream) => {
                        stream.recv().await;
                    }
                    Err(_) => std::future::pending::<()>().await,
                }
            }
            let terminate = signal(SignalKind::terminate());
            let interrupt = signal(SignalKind::interrupt());
            // Checked once both streams listen, so none falls between the
            // flag and the streams.
            let kept = self
                .caught
                .flag
                .as_ref()
                .is_some_and(|caught| caught.load(std::sync::atomic::Ordering::SeqCst));
            if !kept {
                tokio::select! {
                    () = next(terminate) => {}
                    () = next(interrupt) => {}
                }
            }
        }
        #[cfg(not(unix))]
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
        tracing::info!("shutdown signal received; draining in-flight requests");
    }
}

/// Every signal `serve` handles, caught from the moment this is made: the
/// binary's `main` makes it first thing.
#[derive(Debug)]
pub struct Signals {
    /// SIGHUP: reload.
    pub hangups: Hangups,
    /// SIGTERM and SIGINT: stop.
    pub terminations: Terminations,
}

impl Signals {
    /// Catches SIGTERM and SIGINT, then SIGHUP: once SIGHUP is caught (a
    /// test can see it in `/proc`), so are the others.
    pub fn catch() -> Self {
        let terminations = Terminations::catch();
        Self { hangups: Hangups::catch(), terminations }
    }

    /// For a command other than `serve`: every signal takes its default
    /// action again.
    pub fn release(self) {
        self.hangups.release();
        self.terminations.release();
    }
}

/// The bound Envoy RLS listener and the engine it serves.
#[derive(Debug)]
struct RlsListener {
    listener: TcpListener,
    switch: RlsSwitch,
    address: SocketAddr,
}

/// The bound admin listener and its router (`admin.listen`).
#[derive(Debug)]
struct AdminListener {
    listener: TcpListener,
    /// Its router is built when the server runs, with the reloader.
    state: AdminState,
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
        let served = api.operations().clone();
        let api = api.into_router();
        let metrics = metrics_handle()?;
        let capability = RateLimitCapability::build(config, Arc::clone(&clock))?;
        let upkeep = capability.upkeep().cloned();
        let layer = capability.layer(config, Arc::clone(&clock))?;
        let lease_releases = layer.switch().map(|switch| {
            (switch.current().lease_releases().clone(), config.redis.settings.command_timeout)
        });
        let rls = match config.envoy_rls.listen {
            Some(address) => {
                // The edge's pseudonymizer, so one subject kind never
                // needs a second key; a fresh one only when nothing limits.
                let pseudonymizer: Arc<dyn SubjectPseudonymizer> = match layer.switch() {
                    Some(switch) => Arc::clone(switch.current().pseudonymizer()) as _,
                    None => Arc::new(capability::pseudonymizer(config)?),
                };
                let port = capability.port().cloned().zip(capability.state());
                let engine =
                    capability::rls_engine(config, port, pseudonymizer, Arc::clone(&clock))?;
                let (listener, address) = bind(address).await?;
                Some(RlsListener { listener, switch: RlsSwitch::new(engine), address })
            }
            None => None,
        };
        let admin = match (config.admin.listen, &config.admin.token) {
            (Some(address), Some(token)) => {
                // The edge's bridge in force (its port, pseudonymizer and
                // settings), so the admin routes follow every reload.
                let source = match layer.switch() {
                    Some(switch) => AdminSource::Edge(switch.clone()),
                    None => AdminSource::Disabled {
                        pseudonymizer: Arc::new(capability::pseudonymizer(config)?),
                        edge: Arc::new(capability::edge_settings(config)?),
                    },
                };
                let state = AdminState::new(source, token, served.clone(), Arc::clone(&clock))?
                    .with_rls(rls.as_ref().map(|rls| rls.switch.clone()));
                let (listener, address) = bind(address).await?;
                Some(AdminListener { listener, state, address })
            }
            // Off; validation refuses a listener without a token.
            (Some(_), None) | (None, _) => None,
        };
        let target = capability.state().zip(layer.switch()).map(|(state, switch)| ReloadTarget {
            switch: switch.clone(),
            state: state.clone(),
            rls: rls.as_ref().map(|rls| rls.switch.clone()),
        });
        let reload = (config.clone(), served, target);
        let otlp = &config.telemetry.otlp;
        let sampling = otlp.endpoint.as_ref().map(|_| telemetry::Sampling::new(otlp));
        let base = match layer.switch() {
            Some(switch) => routes::ProblemBase::Edge(switch.clone()),
            None => routes::ProblemBase::Fixed(Arc::from(
                capability::edge_settings(config)?.problem_type_base,
            )),
        };
        let mut router = router_with(api, capability, layer, metrics.clone(), base);
        if let Some(sampling) = sampling {
            // Outside every route's layers, so the rate-limit decision is
            // a child of the request span.
            let spans = axum::middleware::from_fn_with_state(sampling, telemetry::public_span);
            router = router.layer(spans);
        }
        let (listener, address) = bind(config.server.listen).await?;
        let limits = ConnectionLimits {
            header_read_timeout: config.server.header_read_timeout,
            shutdown_grace: config.server.shutdown_grace,
        };
        Ok(Self {
            listener,
            router,
            address,
            metrics,
            upkeep,
            reload,
            reloader: None,
            hangups: None,
            terminations: None,
            admin,
            rls,
            limits,
            sampling,
            tracing: None,
            lease_releases,
        })
    }

    /// Flushes `tracing`'s pending spans when the server stops, within
    /// what is left of `server.shutdown-grace` once the connections have
    /// drained.
    #[must_use]
    pub fn trace_with(mut self, tracing: Option<Tracing>) -> Self {
        if let Some(tracing) = &tracing {
            tracing.register_metrics();
        }
        self.tracing = tracing;
        self
    }

    /// The bound Envoy RLS address, when `envoy-rls.listen` is set.
    pub fn rls_addr(&self) -> Option<SocketAddr> {
        self.rls.as_ref().map(|rls| rls.address)
    }

    /// The bound admin address, when `admin.listen` is set.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin.as_ref().map(|admin| admin.address)
    }

    /// Lets SIGHUP (and [`Self::reloader`]) reload the policies from
    /// `sources`: the sources this server's configuration was loaded from.
    #[must_use]
    pub fn reload_from(mut self, sources: ConfigSources) -> Self {
        let (running, served, target) = self.reload.clone();
        self.reloader = Some(Reloader::new(sources, running, served, target));
        self
    }

    /// Reloads on the SIGHUPs `hangups` has caught (those that came during
    /// the build included) as well as on those once it runs; with
    /// [`Self::reload_from`].
    #[must_use]
    pub fn reload_on(mut self, hangups: Hangups) -> Self {
        self.hangups = Some(hangups);
        self
    }

    /// Stops on the SIGTERMs and SIGINTs `terminations` has caught (those
    /// that came during the build included) as well as on those once it
    /// runs, in [`Self::run_until_stopped`].
    #[must_use]
    pub fn stop_on(mut self, terminations: Terminations) -> Self {
        self.terminations = Some(terminations);
        self
    }

    /// The reloader, once [`Self::reload_from`] has set one.
    pub fn reloader(&self) -> Option<&Reloader> {
        self.reloader.as_ref()
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.address
    }

    /// The bound port.
    pub fn port(&self) -> u16 {
        self.address.port()
    }

    /// Serves until SIGTERM or ctrl-c (one caught by [`Self::stop_on`]'s
    /// before it ran included), then drains in-flight requests for at most
    /// `server.shutdown-grace`.
    pub async fn run_until_stopped(mut self) -> Result<(), BootstrapError> {
        let terminations = self.terminations.take().unwrap_or_else(Terminations::catch);
        self.run_until(terminations.received()).await
    }

    /// Serves until `shutdown` completes, then drains in-flight requests
    /// for at most `server.shutdown-grace` and cuts the connections left.
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
        let reloader = self.reloader;
        let hangups = self.hangups;
        let sampling = self.sampling;
        let hangup = reloader
            .clone()
            .map(|reloader| tokio::spawn(reload_on_hangup(reloader, hangups, sampling)));
        // The admin listener stops with the public one: on the shutdown
        // signal, or when the public server ends (the sender is dropped).
        let (stop, stopped) = tokio::sync::watch::channel(());
        let limits = self.limits;
        let admin = self.admin.map(|admin| {
            let mut stopped = stopped.clone();
            let mut router = admin::router(admin.state.with_reloader(reloader));
            if let Some(sampling) = sampling {
                let spans = axum::middleware::from_fn_with_state(sampling, telemetry::admin_span);
                router = router.layer(spans);
            }
            tokio::spawn(async move {
                let shutdown = async move {
                    let _ = stopped.changed().await;
                };
                listener::serve(admin.listener, router, limits, shutdown, "admin").await;
            })
        });
        // When the shutdown began: the span flush gets what is left of the
        // grace after the drain.
        let (began, began_at) = tokio::sync::oneshot::channel();
        // The gRPC listener too; on the signal it stops accepting and its
        // calls in flight get the same grace as the HTTP ones.
        let rls = self.rls.map(|rls| {
            let mut stopped = stopped.clone();
            tokio::spawn(async move {
                let shutdown = async move {
                    let _ = stopped.changed().await;
                };
                let tracing = sampling
                    .map(|sampling| Arc::new(sampling) as Arc<dyn adapter_envoy_rls::CallTracing>);
                let served =
                    adapter_envoy_rls::serve_traced(rls.listener, rls.switch, tracing, shutdown);
                if let Err(error) = served.await {
                    tracing::error!(%error, "the envoy rls listener stopped");
                }
            })
        });
        let shutdown = async move {
            shutdown.await;
            let _ = began.send(tokio::time::Instant::now());
            let _ = stop.send(());
        };
        listener::serve(self.listener, self.router, limits, shutdown, "public").await;
        // The connections are closed (drained or cut), so every lease guard
        // has dropped; the releases they spawned still need the runtime.
        if let Some((releases, bound)) = &self.lease_releases {
            releases.finish_within(*bound).await;
        }
        if let Some(mut rls) = rls {
            // The public drain took its share of the grace already; what is
            // still open past one more grace is cut.
            if tokio::time::timeout(limits.shutdown_grace, &mut rls).await.is_err() {
                tracing::warn!("envoy rls calls still open after the shutdown grace; cutting them");
                rls.abort();
            }
        }
        if let Some(admin) = admin {
            if let Err(error) = admin.await {
                tracing::warn!(%error, "admin listener stopped with an error");
            }
        }
        upkeep.abort();
        for task in [purge, hangup].into_iter().flatten() {
            task.abort();
        }
        if let Some(tracing) = self.tracing {
            let began = began_at.await.unwrap_or_else(|_| tokio::time::Instant::now());
            tracing.shutdown(limits.shutdown_grace.saturating_sub(began.elapsed())).await;
        }
        Ok(())
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
/// The layer wraps `api` as a whole, its fallback included, so no API route
/// can end up outside it, and a path no route serves is charged as
/// `"<METHOD> <unmatched>"`. Problem types start with the layer's
/// `problem-type-base` in force (the default one when the layer is
/// disabled; [`Application::build`] passes the configured one).
pub fn router(
    api: Router,
    capability: RateLimitCapability,
    layer: RateLimitLayer,
    metrics: PrometheusHandle,
) -> Router {
    let base = match layer.switch() {
        Some(switch) => routes::ProblemBase::Edge(switch.clone()),
        None => routes::ProblemBase::Fixed(Arc::from(adapter_web::DEFAULT_PROBLEM_TYPE_BASE)),
    };
    router_with(api, capability, layer, metrics, base)
}

/// [`router`] with the problem types starting at `base`. The fallback is
/// set on `api` before the layer: a merge keeps the one fallback set, so
/// the probes' unlimited default one never answers an API path.
fn router_with(
    api: Router,
    capability: RateLimitCapability,
    layer: RateLimitLayer,
    metrics: PrometheusHandle,
    base: routes::ProblemBase,
) -> Router {
    let problem_base = axum::Extension(base);
    let probes = Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(render_metrics))
        .method_not_allowed_fallback(routes::method_not_allowed)
        .layer(problem_base.clone())
        .with_state(Probes { capability, metrics });
    api.method_not_allowed_fallback(routes::method_not_allowed)
        .fallback(routes::not_found)
        .layer(problem_base)
        .layer(layer)
        .layer(axum::middleware::map_request(routes::reserve))
        .merge(probes)
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

/// Reloads on every SIGHUP, one at a time, for as long as the server runs,
/// and once for those `hangups` caught before it ran.
async fn reload_on_hangup(
    reloader: Reloader,
    hangups: Option<Hangups>,
    sampling: Option<telemetry::Sampling>,
) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let Ok(mut signal) = signal(SignalKind::hangup()) else {
            tracing::warn!("cannot listen for SIGHUP; reload through the admin listener instead");
            return;
        };
        // Checked once the stream listens, so none falls between the two.
        let caught = hangups.and_then(|hangups| hangups.caught.flag);
        if caught.is_some_and(|caught| caught.swap(false, std::sync::atomic::Ordering::SeqCst)) {
            tracing::info!("SIGHUP received during start-up; reloading the configuration");
            reloader.reload_on_signal(sampling).await;
        }
        while signal.recv().await.is_some() {
            tracing::info!("SIGHUP received; reloading the configuration");
            reloader.reload_on_signal(sampling).await;
        }
    }
    #[cfg(not(unix))]
    drop((reloader, hangups, sampling));
}
