//! The `ShouldRateLimit` request as it arrives, its text fields read as
//! bytes. A proto3 `string` must be UTF-8, and the generated server refuses
//! a whole call whose descriptor value is not (`INTERNAL`), which Envoy's
//! default `failure_mode_deny: false` lets through; yet Envoy copies
//! request header bytes into descriptor values as they come. Read as bytes,
//! such a value is written with each byte that is not UTF-8 as `\xNN` and
//! limited as any other (docs/envoy-rls.md, "What the caller controls").

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use futures::future::BoxFuture;
use tonic::body::Body;
use tonic::server::{NamedService, UnaryService};

/// `envoy.service.ratelimit.v3.RateLimitRequest`, field for field.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct WireRequest {
    #[prost(bytes = "vec", tag = "1")]
    domain: Vec<u8>,
    #[prost(message, repeated, tag = "2")]
    descriptors: Vec<WireDescriptor>,
    #[prost(uint32, tag = "3")]
    hits_addend: u32,
}

/// `envoy.extensions.common.ratelimit.v3.RateLimitDescriptor`.
#[derive(Clone, PartialEq, prost::Message)]
struct WireDescriptor {
    #[prost(message, repeated, tag = "1")]
    entries: Vec<WireEntry>,
    #[prost(message, optional, tag = "2")]
    limit: Option<RateLimitOverride>,
    #[prost(message, optional, tag = "3")]
    hits_addend: Option<UInt64Value>,
}

/// Its `Entry`.
#[derive(Clone, PartialEq, prost::Message)]
struct WireEntry {
    #[prost(bytes = "vec", tag = "1")]
    key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    value: Vec<u8>,
}

impl From<WireRequest> for RateLimitRequest {
    // The `..default()` is needless on the workspace's envoy-types only.
    #[allow(clippy::needless_update)]
    fn from(wire: WireRequest) -> Self {
        let descriptors = wire.descriptors.into_iter().map(|descriptor| RateLimitDescriptor {
            entries: descriptor
                .entries
                .into_iter()
                .map(|entry| Entry { key: text(entry.key), value: text(entry.value) })
                .collect(),
            limit: descriptor.limit,
            hits_addend: descriptor.hits_addend,
            // Fields a later envoy-types has (the fuzz build resolves one).
            ..RateLimitDescriptor::default()
        });
        Self {
            domain: text(wire.domain),
            descriptors: descriptors.collect(),
            hits_addend: wire.hits_addend,
        }
    }
}

/// `bytes` as text, each byte that is not part of UTF-8 as `\xNN`: two
/// values that differ only there stay apart (a value that spells `\xNN`
/// itself may meet one: a shared budget, never a larger one).
fn text(bytes: Vec<u8>) -> String {
    // UTF-8, as every value Envoy makes of text is: the buffer as it is.
    let bytes = match String::from_utf8(bytes) {
        Ok(text) => return text,
        Err(error) => error.into_bytes(),
    };
    let mut text = String::with_capacity(bytes.len() * 2);
    for chunk in bytes.utf8_chunks() {
        text.push_str(chunk.valid());
        for byte in chunk.invalid() {
            text.push_str(&format!("\\x{byte:02X}"));
        }
    }
    text
}

/// The `RateLimitService` server over [`WireRequest`]: the generated
/// `RateLimitServiceServer`'s routing, with the request read as bytes.
#[derive(Debug)]
pub(crate) struct WireServer<T>(Arc<T>);

impl<T> WireServer<T> {
    pub(crate) fn new(service: T) -> Self {
        Self(Arc::new(service))
    }
}

impl<T> Clone for WireServer<T> {
    fn clone(&self) -> Self {
        Self(Arc::clone(&self.0))
    }
}

impl<T> NamedService for WireServer<T> {
    const NAME: &'static str = crate::RATE_LIMIT_SERVICE_NAME;
}

/// The one method.
struct ShouldRateLimit<T>(Arc<T>);

impl<T: RateLimitService> UnaryService<WireRequest> for ShouldRateLimit<T> {
    type Response = RateLimitResponse;
    type Future = BoxFuture<'static, Result<tonic::Response<RateLimitResponse>, tonic::Status>>;

    fn call(&mut self, request: tonic::Request<WireRequest>) -> Self::Future {
        let service = Arc::clone(&self.0);
        let (metadata, extensions, wire) = request.into_parts();
        let request = tonic::Request::from_parts(metadata, extensions, wire.into());
        Box::pin(async move { service.should_rate_limit(request).await })
    }
}

/// The method's path.
const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

impl<T, B> tower::Service<http::Request<B>> for WireServer<T>
where
    T: RateLimitService,
    B: http_body::Body + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>> + Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if request.uri().path() != SHOULD_RATE_LIMIT {
            return Box::pin(async { Ok(tonic::Status::unimplemented("").into_http()) });
        }
        let method = ShouldRateLimit(Arc::clone(&self.0));
        Box::pin(async move {
            let codec = tonic_prost::ProstCodec::<RateLimitResponse, WireRequest>::default();
            Ok(tonic::server::Grpc::new(codec).unary(method, request).await)
        })
    }
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::*;

    /// What Envoy sends, decoded through the wire type, is the generated
    /// type's decoding when it is UTF-8; a byte that is not is `\xNN`.
    #[test]
    fn a_request_reads_as_the_generated_type_and_bytes_that_are_not_utf8_as_escapes() {
        let entry = |key: &str, value: &str| Entry { key: key.to_owned(), value: value.to_owned() };
        let sent = RateLimitRequest {
            domain: "edge".to_owned(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![entry("remote_address", "10.0.0.1"), entry("path", "/é")],
                limit: Some(RateLimitOverride { requests_per_unit: 7, unit: 2 }),
                hits_addend: Some(UInt64Value { value: 3 }),
            }],
            hits_addend: 2,
        };
        let bytes = sent.encode_to_vec();
        let read: RateLimitRequest = WireRequest::decode(bytes.as_slice()).unwrap().into();
        assert_eq!(read, sent);
        let wire = WireRequest {
            domain: b"edge".to_vec(),
            descriptors: vec![WireDescriptor {
                entries: vec![WireEntry { key: b"user".to_vec(), value: b"a\xffb\xfe".to_vec() }],
                limit: None,
                hits_addend: None,
            }],
            hits_addend: 0,
        };
        let read: RateLimitRequest =
            WireRequest::decode(wire.encode_to_vec().as_slice()).unwrap().into();
        assert_eq!(read.descriptors[0].entries[0].value, "a\\xFFb\\xFE");
        assert_eq!(text(b"\xe2\x82".to_vec()), "\\xE2\\x82", "a cut sequence");
        assert_eq!(text("plain €".into()), "plain €");
    }
}
