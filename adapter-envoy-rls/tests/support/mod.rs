//! A real RLS listener on a loopback port, and a tonic client to it.

#![allow(dead_code, unreachable_pub, missing_docs)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use adapter_envoy_rls::{RlsEngine, RlsRule, RlsSettings, RlsSwitch, RuleLimit};
use adapter_web::VersionedPseudonymizer;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use secrecy::SecretSlice;
use shared_contract::{
    Algorithm, Clock, EdgeRateLimitPort, PolicyId, PolicyScope, PolicySet, RateLimitPolicy,
    SubjectPseudonymizer,
};
use tokio::sync::oneshot;
use tonic::transport::Channel;

pub const BUDGET: Duration = Duration::from_secs(2);

pub fn pseudonymizer() -> Arc<VersionedPseudonymizer> {
    Arc::new(VersionedPseudonymizer::new([(1, SecretSlice::from(vec![7u8; 32]))], 1).unwrap())
}

pub fn fixed(id: &str, limit: u64, window_secs: u64, scope: PolicyScope) -> RateLimitPolicy {
    let algorithm = Algorithm::FixedWindow(shared_contract::FixedWindow {
        limit,
        window: Duration::from_secs(window_secs),
    });
    RateLimitPolicy::builder(id, algorithm).maximum_cost(limit).scope(scope).build().unwrap()
}

pub fn set(ids: &[&str]) -> PolicySet {
    PolicySet::new(ids.iter().map(|id| PolicyId::new(*id).unwrap())).unwrap()
}

/// A rule from `"key"` / `"key=value"` entries.
pub fn rule(domain: &str, pattern: &[&str], subject: Option<&[&str]>, ids: &[&str]) -> RlsRule {
    RlsRule {
        domain: domain.to_owned(),
        pattern: pattern
            .iter()
            .map(|entry| match entry.split_once('=') {
                Some((key, value)) => (key.to_owned(), Some(value.to_owned())),
                None => ((*entry).to_owned(), None),
            })
            .collect(),
        subject: subject.map(|keys| keys.iter().map(|key| (*key).to_owned()).collect()),
        limit: RuleLimit::Policies(set(ids)),
        name: None,
        replaces: Vec::new(),
        allow_override: false,
        charge_always: false,
    }
}

/// An `unlimited = true` rule from `"key"` / `"key=value"` entries.
pub fn unlimited(domain: &str, pattern: &[&str]) -> RlsRule {
    answered(domain, pattern, RuleLimit::Unlimited)
}

/// A rule without policies that answers with `limit`.
pub fn answered(domain: &str, pattern: &[&str], limit: RuleLimit) -> RlsRule {
    RlsRule { limit, ..rule(domain, pattern, None, &["unused"]) }
}

pub fn engine(
    port: Arc<dyn EdgeRateLimitPort>,
    clock: Arc<dyn Clock>,
    rules: &[RlsRule],
) -> RlsEngine {
    let pseudonymizer: Arc<dyn SubjectPseudonymizer> = pseudonymizer();
    RlsEngine::new(port, pseudonymizer, clock, RlsSettings { evaluation_budget: BUDGET }, rules)
        .unwrap()
}

/// A listener serving `switch` on a free loopback port, stopped on drop.
pub struct Rls {
    pub addr: SocketAddr,
    pub switch: RlsSwitch,
    pub client: RateLimitServiceClient<Channel>,
    stop: Option<oneshot::Sender<()>>,
    pub served: tokio::task::JoinHandle<Result<(), adapter_envoy_rls::RlsError>>,
}

impl Rls {
    pub async fn start(engine: RlsEngine) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let switch = RlsSwitch::new(engine);
        let (stop, stopped) = oneshot::channel::<()>();
        let served = tokio::spawn(adapter_envoy_rls::serve(listener, switch.clone(), async {
            let _ = stopped.await;
        }));
        let client = RateLimitServiceClient::connect(format!("http://{addr}")).await.unwrap();
        Self { addr, switch, client, stop: Some(stop), served }
    }

    pub async fn ask(
        &mut self,
        request: RateLimitRequest,
    ) -> Result<RateLimitResponse, tonic::Status> {
        self.client.should_rate_limit(request).await.map(tonic::Response::into_inner)
    }

    pub async fn ok(&mut self, request: RateLimitRequest) -> RateLimitResponse {
        self.ask(request).await.expect("an answer")
    }

    /// A `grpc.health.v1` client on the listener.
    pub async fn health(
        &self,
    ) -> tonic_health::pb::health_client::HealthClient<tonic::transport::Channel> {
        let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{}", self.addr));
        tonic_health::pb::health_client::HealthClient::new(
            endpoint.unwrap().connect().await.unwrap(),
        )
    }

    pub fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

impl Drop for Rls {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A descriptor of `(key, value)` entries, with an optional `hits_addend`.
pub fn descriptor(entries: &[(&str, &str)], hits: Option<u64>) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(key, value)| Entry { key: (*key).to_owned(), value: (*value).to_owned() })
            .collect(),
        hits_addend: hits.map(|value| UInt64Value { value }),
        ..RateLimitDescriptor::default()
    }
}

pub fn request(domain: &str, descriptors: Vec<RateLimitDescriptor>, hits: u32) -> RateLimitRequest {
    RateLimitRequest { domain: domain.to_owned(), descriptors, hits_addend: hits }
}

pub fn code(status: &DescriptorStatus) -> Code {
    Code::try_from(status.code).unwrap()
}

pub fn overall(response: &RateLimitResponse) -> Code {
    Code::try_from(response.overall_code).unwrap()
}

/// The value of the response header `name`.
pub fn header<'a>(response: &'a RateLimitResponse, name: &str) -> Option<&'a str> {
    response
        .response_headers_to_add
        .iter()
        .find(|header| header.key.eq_ignore_ascii_case(name))
        .map(|header| header.value.as_str())
}

/// `(code, remaining, limit name)` of each status.
pub fn summary(response: &RateLimitResponse) -> Vec<(Code, u32, Option<String>)> {
    response
        .statuses
        .iter()
        .map(|status| {
            (
                code(status),
                status.limit_remaining,
                status.current_limit.as_ref().map(|l| l.name.clone()),
            )
        })
        .collect()
}

pub mod scenarios;
