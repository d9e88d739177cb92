//! Who a request counts against: an authenticated principal, else an API
//! key (only when a header is configured for one), else the client IP, in
//! that order.

use std::borrow::Cow;
use std::fmt;
use std::net::{IpAddr, SocketAddr};

use axum::extract::ConnectInfo;
use http::request::Parts;
use ipnet::{IpNet, Ipv4Net, Ipv6Net};

use crate::client_ip::client_ip;
use crate::rejection::{ApiKeyProblem, EdgeRejection, MAX_API_KEY_BYTES};
use crate::settings::EdgeSettings;

/// The identity an upstream authentication layer established, inserted as a
/// request extension. It takes precedence over API key and client IP.
#[derive(Clone, PartialEq, Eq)]
pub struct AuthenticatedPrincipal(pub String);

// The principal is a raw subject: it must not reach a log line by way of
// a `{:?}` somewhere up the stack.
impl fmt::Debug for AuthenticatedPrincipal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AuthenticatedPrincipal([REDACTED])")
    }
}

/// The kind of a subject; its name is the first frame of the pseudonym, so
/// the same string as principal and as API key never share a bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SubjectKind {
    /// An authenticated principal, framed as `principal`.
    Principal,
    /// An API key, framed as `api-key`.
    ApiKey,
    /// The client IP address, framed as `ip`.
    ClientIp,
}

impl SubjectKind {
    /// The name framed into the pseudonym: `principal`, `api-key` or `ip`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Principal => "principal",
            Self::ApiKey => "api-key",
            Self::ClientIp => "ip",
        }
    }
}

/// A resolved raw subject: what the pseudonymizer turns into a digest. It
/// lives only for the duration of one evaluation and never prints.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct RawSubject<'a> {
    pub(crate) kind: SubjectKind,
    /// The canonical identity: the principal and API key as sent (borrowed
    /// from the request, not copied); for an IP, its network at the
    /// configured prefix (see [`client_network`]).
    pub(crate) identity: Cow<'a, str>,
}

impl fmt::Debug for RawSubject<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RawSubject").field("kind", &self.kind).finish_non_exhaustive()
    }
}

/// Resolves the subject of a request by precedence: principal extension,
/// then the API key header when one is configured, then the client IP (see
/// [`client_ip`]). Without `api_key_header` no header is read for a key:
/// an unverified key would let a client pick a fresh budget per request.
pub(crate) fn resolve_subject<'a>(
    parts: &'a Parts,
    settings: &EdgeSettings,
) -> Result<RawSubject<'a>, EdgeRejection> {
    if let Some(AuthenticatedPrincipal(principal)) = parts.extensions.get() {
        return Ok(RawSubject { kind: SubjectKind::Principal, identity: Cow::Borrowed(principal) });
    }
    if let Some(header) = &settings.api_key_header {
        let mut keys = parts.headers.get_all(header).iter();
        if let Some(key) = keys.next() {
            if keys.next().is_some() {
                return Err(EdgeRejection::InvalidApiKey(ApiKeyProblem::Repeated));
            }
            let key = validate_api_key(key.as_bytes())?;
            return Ok(RawSubject { kind: SubjectKind::ApiKey, identity: Cow::Borrowed(key) });
        }
    }
    let Some(ConnectInfo(peer)) = parts.extensions.get::<ConnectInfo<SocketAddr>>() else {
        return Err(EdgeRejection::MissingPeerAddress);
    };
    let ip =
        client_ip(peer.ip(), &parts.headers, settings.client_ip_header, &settings.trusted_proxies);
    Ok(RawSubject {
        kind: SubjectKind::ClientIp,
        identity: Cow::Owned(client_network(ip, settings).to_string()),
    })
}

/// The network a client address counts as: IPv4 (IPv4-mapped IPv6
/// included) at `client_ipv4_prefix`, IPv6 at `client_ipv6_prefix`, host
/// bits cleared. Its text, `<network address>/<prefix>` with the address
/// in RFC 5952 form (`203.0.113.7/32`, `2001:db8:1:2::/64`), is the
/// identity that is pseudonymized: every address of one network is one
/// subject, so rotating addresses inside a /64 gains nothing. Applied
/// after the trusted-proxy walk, which works on whole addresses.
fn client_network(ip: IpAddr, settings: &EdgeSettings) -> IpNet {
    match ip.to_canonical() {
        IpAddr::V4(v4) => IpNet::V4(Ipv4Net::new_assert(v4, settings.ipv4_prefix()).trunc()),
        IpAddr::V6(v6) => IpNet::V6(Ipv6Net::new_assert(v6, settings.ipv6_prefix()).trunc()),
    }
}

/// Why an identity an operator typed cannot name a subject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdentityProblem {
    /// Not an API key the edge would accept from a client.
    InvalidApiKey(ApiKeyProblem),
    /// Not an IPv4 or IPv6 address.
    NotAnIpAddress,
    /// An empty principal.
    EmptyPrincipal,
}

/// The canonical identity the edge pseudonymizes for a subject of `kind`,
/// from the form an operator types it: an API key as a client sends it
/// (checked by the same rules), a principal as the auth layer sets it, an
/// IP address as the edge sees the client (turned into its network at the
/// configured prefix, as requests are). Feeding the result to
/// [`crate::VersionedPseudonymizer::pseudonymize`] gives the pseudonym a
/// request of that subject is counted under. The identity is never kept.
///
/// # Errors
/// [`IdentityProblem`] when the text cannot be such a subject.
pub fn canonical_identity(
    kind: SubjectKind,
    identity: &str,
    settings: &EdgeSettings,
) -> Result<String, IdentityProblem> {
    match kind {
        SubjectKind::Principal if identity.is_empty() => Err(IdentityProblem::EmptyPrincipal),
        SubjectKind::Principal => Ok(identity.to_owned()),
        SubjectKind::ApiKey => match validate_api_key(identity.as_bytes()) {
            Ok(key) => Ok(key.to_owned()),
            Err(EdgeRejection::InvalidApiKey(problem)) => {
                Err(IdentityProblem::InvalidApiKey(problem))
            }
            Err(EdgeRejection::MissingPeerAddress) => {
                Err(IdentityProblem::InvalidApiKey(ApiKeyProblem::Empty))
            }
        },
        SubjectKind::ClientIp => {
            let ip: IpAddr = identity.parse().map_err(|_| IdentityProblem::NotAnIpAddress)?;
            Ok(client_network(ip, settings).to_string())
        }
    }
}

fn validate_api_key(key: &[u8]) -> Result<&str, EdgeRejection> {
    let problem = if key.is_empty() {
        ApiKeyProblem::Empty
    } else if key.len() > MAX_API_KEY_BYTES {
        ApiKeyProblem::TooLong
    } else if !key.iter().all(|byte| (0x21..=0x7e).contains(byte)) {
        ApiKeyProblem::NotVisibleAscii
    } else {
        // Visible ASCII is valid UTF-8.
        return std::str::from_utf8(key)
            .map_err(|_| EdgeRejection::InvalidApiKey(ApiKeyProblem::NotVisibleAscii));
    };
    Err(EdgeRejection::InvalidApiKey(problem))
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr};

    use http::{HeaderValue, Request};

    use super::*;

    fn parts(build: impl FnOnce(&mut Request<()>)) -> Parts {
        let mut request = Request::new(());
        request
            .extensions_mut()
            .insert(ConnectInfo(SocketAddr::new(IpAddr::V4(Ipv4Addr::new(198, 51, 100, 7)), 4711)));
        build(&mut request);
        request.into_parts().0
    }

    fn resolve_with(
        settings: &EdgeSettings,
        build: impl FnOnce(&mut Request<()>),
    ) -> Result<RawSubject<'static>, EdgeRejection> {
        resolve_subject(&parts(build), settings).map(|subject| RawSubject {
            kind: subject.kind,
            identity: Cow::Owned(subject.identity.into_owned()),
        })
    }

    /// At the defaults: no API key header.
    fn resolve(build: impl FnOnce(&mut Request<()>)) -> Result<RawSubject<'static>, EdgeRejection> {
        resolve_with(&EdgeSettings::default(), build)
    }

    /// With `api-key-header = "x-api-key"`.
    fn resolve_keyed(
        build: impl FnOnce(&mut Request<()>),
    ) -> Result<RawSubject<'static>, EdgeRejection> {
        let settings = EdgeSettings {
            api_key_header: Some(http::HeaderName::from_static("x-api-key")),
            ..EdgeSettings::default()
        };
        resolve_with(&settings, build)
    }

    fn subject(kind: SubjectKind, identity: &str) -> RawSubject<'static> {
        RawSubject { kind, identity: Cow::Owned(identity.to_owned()) }
    }

    #[test]
    fn principal_wins_over_api_key_and_ip() {
        let resolved = resolve_keyed(|r| {
            r.extensions_mut().insert(AuthenticatedPrincipal("alice".into()));
            r.headers_mut().insert("x-api-key", HeaderValue::from_static("key-1"));
        });
        assert_eq!(resolved.unwrap(), subject(SubjectKind::Principal, "alice"));
    }

    #[test]
    fn api_key_wins_over_ip_and_the_header_name_is_configurable() {
        let resolved = resolve_keyed(|r| {
            r.headers_mut().insert("x-api-key", HeaderValue::from_static("key-1"));
        });
        assert_eq!(resolved.unwrap(), subject(SubjectKind::ApiKey, "key-1"));

        let settings = EdgeSettings {
            api_key_header: Some(http::HeaderName::from_static("x-client-token")),
            ..EdgeSettings::default()
        };
        let request = parts(|r| {
            r.headers_mut().insert("x-api-key", HeaderValue::from_static("ignored"));
            r.headers_mut().insert("x-client-token", HeaderValue::from_static("token-9"));
        });
        let resolved = resolve_subject(&request, &settings).unwrap();
        assert_eq!(resolved, subject(SubjectKind::ApiKey, "token-9"));
    }

    #[test]
    fn by_default_no_header_names_the_subject_and_a_key_is_ignored() {
        let resolved = resolve(|r| {
            r.headers_mut().insert("x-api-key", HeaderValue::from_static("made-up"));
        });
        assert_eq!(resolved.unwrap(), subject(SubjectKind::ClientIp, "198.51.100.7/32"));
        // Not even a malformed key is looked at.
        let resolved = resolve(|r| {
            r.headers_mut().append("x-api-key", HeaderValue::from_static("a"));
            r.headers_mut().append("x-api-key", HeaderValue::from_static("b c"));
        });
        assert_eq!(resolved.unwrap(), subject(SubjectKind::ClientIp, "198.51.100.7/32"));
        // A principal set by a layer before this one still counts first.
        let resolved = resolve(|r| {
            r.extensions_mut().insert(AuthenticatedPrincipal("alice".into()));
        });
        assert_eq!(resolved.unwrap(), subject(SubjectKind::Principal, "alice"));
    }

    #[test]
    fn without_principal_or_key_the_peer_ip_counts() {
        assert_eq!(resolve(|_| {}).unwrap(), subject(SubjectKind::ClientIp, "198.51.100.7/32"));
    }

    fn resolve_peer(peer: &str, settings: &EdgeSettings) -> String {
        let peer: IpAddr = peer.parse().unwrap();
        let request = parts(|r| {
            r.extensions_mut().insert(ConnectInfo(SocketAddr::new(peer, 1)));
        });
        let resolved = resolve_subject(&request, settings).unwrap();
        assert_eq!(resolved.kind, SubjectKind::ClientIp);
        resolved.identity.into_owned()
    }

    #[test]
    fn ipv4_mapped_ipv6_peers_share_the_ipv4_bucket() {
        let defaults = EdgeSettings::default();
        assert_eq!(resolve_peer("::ffff:198.51.100.7", &defaults), "198.51.100.7/32");
        // The IPv4 prefix applies to a mapped address, not the IPv6 one.
        let per_24 = EdgeSettings { client_ipv4_prefix: 24, ..EdgeSettings::default() };
        assert_eq!(resolve_peer("::ffff:198.51.100.7", &per_24), "198.51.100.0/24");
        assert_eq!(resolve_peer("198.51.100.200", &per_24), "198.51.100.0/24");
    }

    #[test]
    fn ipv6_clients_count_per_network_at_the_configured_prefix() {
        let defaults = EdgeSettings::default();
        // Two addresses of one /64 are one subject; the next /64 is another.
        let first = resolve_peer("2001:db8:1:2:aaaa:bbbb:cccc:dddd", &defaults);
        assert_eq!(first, "2001:db8:1:2::/64");
        assert_eq!(resolve_peer("2001:db8:1:2::1", &defaults), first);
        assert_eq!(resolve_peer("2001:db8:1:3::1", &defaults), "2001:db8:1:3::/64");
        let per_48 = EdgeSettings { client_ipv6_prefix: 48, ..EdgeSettings::default() };
        assert_eq!(resolve_peer("2001:db8:1:3::1", &per_48), "2001:db8:1::/48");
        let per_host = EdgeSettings { client_ipv6_prefix: 128, ..EdgeSettings::default() };
        assert_eq!(resolve_peer("2001:db8:1:3::1", &per_host), "2001:db8:1:3::1/128");
    }

    #[test]
    fn bad_api_keys_are_rejected_with_their_reason() {
        let with_key = |value: &[u8]| {
            let value = HeaderValue::from_bytes(value).unwrap();
            resolve_keyed(move |r| {
                r.headers_mut().insert("x-api-key", value);
            })
        };
        let rejected = |problem| Err(EdgeRejection::InvalidApiKey(problem));
        assert_eq!(with_key(&[b'k'; 257]), rejected(ApiKeyProblem::TooLong));
        assert_eq!(with_key(b"has space"), rejected(ApiKeyProblem::NotVisibleAscii));
        assert_eq!(with_key(b"tab\there"), rejected(ApiKeyProblem::NotVisibleAscii));
        assert_eq!(with_key(&[b'k', 0xe9]), rejected(ApiKeyProblem::NotVisibleAscii));
        assert_eq!(with_key(b""), rejected(ApiKeyProblem::Empty));
        let exactly_256 = with_key(&[b'k'; 256]).unwrap();
        assert_eq!(exactly_256.identity.len(), 256);
        let twice = resolve_keyed(|r| {
            r.headers_mut().append("x-api-key", HeaderValue::from_static("a"));
            r.headers_mut().append("x-api-key", HeaderValue::from_static("b"));
        });
        assert_eq!(twice, rejected(ApiKeyProblem::Repeated));
    }

    #[test]
    fn a_request_without_connect_info_is_refused_not_guessed() {
        let mut request = Request::new(()).into_parts().0;
        request.extensions.clear();
        assert_eq!(
            resolve_subject(&request, &EdgeSettings::default()),
            Err(EdgeRejection::MissingPeerAddress)
        );
    }

    #[test]
    fn an_operator_s_identity_canonicalizes_as_a_request_s_does() {
        let settings = EdgeSettings::default();
        let of = |kind, identity| canonical_identity(kind, identity, &settings);
        // The same networks the edge counts (/32 and /64 by default).
        assert_eq!(of(SubjectKind::ClientIp, "203.0.113.7"), Ok("203.0.113.7/32".to_owned()));
        assert_eq!(
            of(SubjectKind::ClientIp, "2001:db8:1:2:3:4:5:6"),
            Ok("2001:db8:1:2::/64".to_owned())
        );
        assert_eq!(
            of(SubjectKind::ClientIp, "203.0.113.7"),
            Ok(resolve_peer("203.0.113.7", &settings))
        );
        assert_eq!(
            of(SubjectKind::ClientIp, "2001:db8::/64"),
            Err(IdentityProblem::NotAnIpAddress)
        );
        assert_eq!(of(SubjectKind::ApiKey, "key-123"), Ok("key-123".to_owned()));
        assert_eq!(
            of(SubjectKind::ApiKey, "a key"),
            Err(IdentityProblem::InvalidApiKey(ApiKeyProblem::NotVisibleAscii))
        );
        assert_eq!(of(SubjectKind::Principal, "user-7"), Ok("user-7".to_owned()));
        assert_eq!(of(SubjectKind::Principal, ""), Err(IdentityProblem::EmptyPrincipal));
    }

    #[test]
    fn debug_output_never_shows_the_identity() {
        let principal = AuthenticatedPrincipal("alice@example.com".into());
        assert!(!format!("{principal:?}").contains("alice"));
        let raw = subject(SubjectKind::ApiKey, "secret-key");
        assert!(!format!("{raw:?}").contains("secret-key"));
    }
}
