//! Who a request counts against: the principal, the API key or the client
//! IP (behind trusted proxies, the address they forwarded), and the keyed
//! HMAC pseudonym that is the only form of it allowed to cross the port.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use axum::extract::ConnectInfo;
use hmac::{Hmac, Mac};
use http::request::Parts;
use http::{HeaderMap, HeaderValue};
use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use secrecy::{ExposeSecret, SecretSlice};
use sha2::Sha256;
use shared_contract::{SubjectDigest, SubjectPseudonymizer};

use crate::answer::{ApiKeyProblem, IdentityProblem, MAX_API_KEY_BYTES, Refusal};
use crate::settings::{ClientIpHeader, EdgeSettings, WebError};

/// The identity an upstream authentication layer established (a request
/// extension); it takes precedence over API key and client IP.
#[derive(Clone, PartialEq, Eq)]
pub struct AuthenticatedPrincipal(pub String);

// A raw subject: it must not reach a log line through a `{:?}` up the stack.
impl fmt::Debug for AuthenticatedPrincipal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AuthenticatedPrincipal([REDACTED])")
    }
}

shared_contract::named_enum! {
    /// The kind of a subject, the pseudonym's first frame (its name): the same
    /// string as principal and as API key never share a bucket.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub enum SubjectKind {
        /// An authenticated principal.
        Principal = "principal",
        /// An API key.
        ApiKey = "api-key",
        /// The client IP address.
        ClientIp = "ip",
    }
}

/// A resolved raw subject, which lives for one evaluation and never prints.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct RawSubject<'a> {
    pub(crate) kind: SubjectKind,
    /// The principal or API key as sent, or the client IP's network.
    pub(crate) identity: Cow<'a, str>,
}

impl fmt::Debug for RawSubject<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RawSubject").field("kind", &self.kind).finish_non_exhaustive()
    }
}

/// The subject of a request: its principal, else its API key, else its client IP.
pub(crate) fn resolve_subject<'a>(
    parts: &'a Parts,
    settings: &EdgeSettings,
) -> Result<RawSubject<'a>, Refusal<'static>> {
    if let Some(AuthenticatedPrincipal(principal)) = parts.extensions.get() {
        return Ok(RawSubject { kind: SubjectKind::Principal, identity: Cow::Borrowed(principal) });
    }
    if let Some(header) = &settings.api_key_header {
        let mut keys = parts.headers.get_all(header).iter();
        if let Some(key) = keys.next() {
            if keys.next().is_some() {
                return Err(Refusal::InvalidApiKey(ApiKeyProblem::Repeated));
            }
            let key = validate_api_key(key.as_bytes()).map_err(Refusal::InvalidApiKey)?;
            return Ok(RawSubject { kind: SubjectKind::ApiKey, identity: Cow::Borrowed(key) });
        }
    }
    let peer = parts.extensions.get::<ConnectInfo<SocketAddr>>();
    let ConnectInfo(peer) = peer.ok_or(Refusal::MissingPeerAddress)?;
    let ip =
        client_ip(peer.ip(), &parts.headers, settings.client_ip_header, &settings.trusted_proxies);
    Ok(RawSubject {
        kind: SubjectKind::ClientIp,
        identity: Cow::Owned(client_network(ip, settings).to_string()),
    })
}

/// The network a client address counts as, at the configured prefix.
fn client_network(ip: IpAddr, settings: &EdgeSettings) -> IpNet {
    match ip.to_canonical() {
        IpAddr::V4(v4) => IpNet::V4(Ipv4Net::new_assert(v4, settings.ipv4_prefix()).trunc()),
        IpAddr::V6(v6) => IpNet::V6(Ipv6Net::new_assert(v6, settings.ipv6_prefix()).trunc()),
    }
}

/// The identity the edge pseudonymizes for a subject of `kind` as an operator
/// types it (an IP becomes its network), so an operator finds a request's pseudonym.
pub fn canonical_identity(
    kind: SubjectKind,
    identity: &str,
    settings: &EdgeSettings,
) -> Result<String, IdentityProblem> {
    match kind {
        SubjectKind::Principal if identity.is_empty() => Err(IdentityProblem::EmptyPrincipal),
        SubjectKind::Principal => Ok(identity.to_owned()),
        SubjectKind::ApiKey => validate_api_key(identity.as_bytes())
            .map(str::to_owned)
            .map_err(IdentityProblem::InvalidApiKey),
        SubjectKind::ClientIp => {
            let ip: IpAddr = identity.parse().map_err(|_| IdentityProblem::NotAnIpAddress)?;
            Ok(client_network(ip, settings).to_string())
        }
    }
}

fn validate_api_key(key: &[u8]) -> Result<&str, ApiKeyProblem> {
    if key.is_empty() {
        Err(ApiKeyProblem::Empty)
    } else if key.len() > MAX_API_KEY_BYTES {
        Err(ApiKeyProblem::TooLong)
    } else {
        // Visible ASCII is UTF-8.
        std::str::from_utf8(key)
            .ok()
            .filter(|_| key.iter().all(|byte| (0x21..=0x7e).contains(byte)))
            .ok_or(ApiKeyProblem::NotVisibleAscii)
    }
}

/// The address a request counts against. Only the socket peer cannot be
/// forged: the trusted proxies' header is read only when the peer is one of
/// them, from the right, and the first untrusted address is the client. A
/// hop naming no address stops the walk at the trusted hop right of it.
pub(crate) fn client_ip(
    peer: IpAddr,
    headers: &HeaderMap,
    header: ClientIpHeader,
    trusted: &[IpNet],
) -> IpAddr {
    let peer = peer.to_canonical();
    if !is_trusted(peer, trusted) {
        return peer;
    }
    // Repeated lines are one list (RFC 9110 section 5.3), each split on its
    // own so a client's broken line cannot swallow a proxy's.
    let lines = headers.get_all(header.name()).iter().rev().map(HeaderValue::as_bytes);
    match header {
        ClientIpHeader::XForwardedFor => {
            let hops = lines.flat_map(|line| line.rsplit(|&byte| byte == b','));
            walk_from_right(peer, hops.map(x_forwarded_for_hop), trusted)
        }
        ClientIpHeader::Forwarded => {
            let hops = lines.flat_map(|line| split_unquoted(line, b',')).filter_map(forwarded_hop);
            walk_from_right(peer, hops, trusted)
        }
    }
}

fn is_trusted(ip: IpAddr, trusted: &[IpNet]) -> bool {
    trusted.iter().any(|net| net.contains(&ip))
}

/// The first untrusted address of `hops` (rightmost first), else the
/// farthest trusted one reached.
fn walk_from_right(
    peer: IpAddr,
    hops: impl Iterator<Item = Option<IpAddr>>,
    trusted: &[IpNet],
) -> IpAddr {
    let mut farthest_trusted = peer;
    for ip in hops.map_while(|hop| hop.map(|ip| ip.to_canonical())) {
        if !is_trusted(ip, trusted) {
            return ip;
        }
        farthest_trusted = ip;
    }
    farthest_trusted
}

/// One `X-Forwarded-For` entry: an address, maybe bracketed or with a port.
fn x_forwarded_for_hop(entry: &[u8]) -> Option<IpAddr> {
    let entry = std::str::from_utf8(entry).ok()?.trim_matches([' ', '\t']);
    let socket = || entry.parse::<SocketAddr>().ok().map(|socket| socket.ip());
    let bracketed = || entry.strip_prefix('[')?.strip_suffix(']')?.parse().ok().map(IpAddr::V6);
    entry.parse().ok().or_else(socket).or_else(bracketed)
}

/// `line` split at each `separator` outside quoted strings, rightmost first:
/// a `Forwarded` line's elements (`,`) or an element's pairs (`;`).
fn split_unquoted(line: &[u8], separator: u8) -> impl Iterator<Item = &[u8]> {
    // What is left to split is `line[..end]`.
    let mut end = Some(line.len());
    std::iter::from_fn(move || {
        let stop = end?;
        let mut at = stop;
        while at > 0 {
            at -= 1;
            match line[at] {
                byte if byte == separator => {
                    end = Some(at);
                    return Some(&line[at + 1..stop]);
                }
                b'"' => match opening_quote(&line[..at]) {
                    Some(open) => at = open,
                    // An unbalanced quote: the rest is one (broken) piece.
                    None => break,
                },
                _ => {}
            }
        }
        end = None;
        Some(&line[..stop])
    })
}

/// Where the quoted string ending after `text` opens: its last unescaped `"`.
fn opening_quote(text: &[u8]) -> Option<usize> {
    let escaped = |at: usize| text[..at].iter().rev().take_while(|&&b| b == b'\\').count() % 2 == 1;
    (0..text.len()).rev().find(|&at| text[at] == b'"' && !escaped(at))
}

/// The hop a `Forwarded` element (RFC 7239 section 4) names: `Some(None)` for
/// no address or a malformed one, `None` for an empty element.
fn forwarded_hop(element: &[u8]) -> Option<Option<IpAddr>> {
    let mut node: Option<Option<IpAddr>> = None;
    let mut empty = true;
    // An empty pair is allowed by the grammar. The only whitespace a header
    // value holds is spaces and tabs (RFC 9110 OWS) around a pair.
    let pairs = split_unquoted(element, b';').map(<[u8]>::trim_ascii);
    for pair in pairs.filter(|pair| !pair.is_empty()) {
        empty = false;
        let Some((name, value)) = name_and_value(pair) else { return Some(None) };
        if name.eq_ignore_ascii_case(b"for") {
            let node_text = std::str::from_utf8(&value).ok();
            let Some(parsed) = node_text.and_then(parse_node) else { return Some(None) };
            // Two `for` in one element leave the hop ambiguous.
            if node.replace(parsed).is_some() {
                return Some(None);
            }
        }
    }
    (!empty).then(|| node.flatten())
}

/// A `node` (RFC 7239 section 6): `Some(Some(ip))`, `Some(None)` for
/// `unknown` or an obfuscated `_name`, `None` when malformed.
fn parse_node(node: &str) -> Option<Option<IpAddr>> {
    if let Some(rest) = node.strip_prefix('[') {
        let (address, after) = rest.split_once(']')?;
        let ip: Ipv6Addr = address.parse().ok()?;
        return (after.is_empty() || after.strip_prefix(':').is_some_and(is_node_port))
            .then_some(Some(IpAddr::V6(ip)));
    }
    // `nodename [ ":" node-port ]`: no unbracketed name holds a ':'.
    let name = match node.split_once(':') {
        Some((name, port)) if is_node_port(port) => name,
        Some(_) => return None,
        None => node,
    };
    if name.eq_ignore_ascii_case("unknown") {
        return Some(None);
    }
    if let Some(obfuscated) = name.strip_prefix('_') {
        return is_obfuscated(obfuscated).then_some(None);
    }
    Some(Some(IpAddr::V4(name.parse().ok()?)))
}

fn is_node_port(port: &str) -> bool {
    match port.strip_prefix('_') {
        Some(obfuscated) => is_obfuscated(obfuscated),
        None => (1..=5).contains(&port.len()) && port.bytes().all(|b| b.is_ascii_digit()),
    }
}

fn is_obfuscated(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

/// `token "=" ( token / quoted-string )`, the value with its escapes resolved.
fn name_and_value(pair: &[u8]) -> Option<(&[u8], Vec<u8>)> {
    let at = pair.iter().position(|&byte| byte == b'=')?;
    let (name, value) = (&pair[..at], &pair[at + 1..]);
    let value = match value.strip_prefix(b"\"") {
        Some(quoted) => unquote(quoted)?,
        None => is_token(value).then(|| value.to_vec())?,
    };
    is_token(name).then_some((name, value))
}

/// A quoted string after its opening `"`, its escapes resolved, when its
/// closing `"` is the last byte.
fn unquote(quoted: &[u8]) -> Option<Vec<u8>> {
    let mut bytes = quoted.iter();
    let mut value = Vec::new();
    while let Some(&byte) = bytes.next() {
        match byte {
            b'"' => return bytes.as_slice().is_empty().then_some(value),
            b'\\' => value.push(*bytes.next()?),
            _ => value.push(byte),
        }
    }
    None
}

fn is_token(text: &[u8]) -> bool {
    !text.is_empty() && text.iter().copied().all(is_tchar)
}

/// RFC 9110 `tchar`.
fn is_tchar(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&byte)
}

/// Shortest key accepted: the HMAC-SHA-256 output size, never the pseudonym's weak point.
pub const MIN_KEY_BYTES: usize = 32;

/// HMAC-SHA-256 pseudonyms under versioned keys, one active; a pseudonym
/// depends on the subject alone (the Redis Cluster hash tag of its keys).
/// Rotation makes a new key active beside the old (budgets restart once).
pub struct VersionedPseudonymizer {
    /// HMAC-SHA-256 keyed once per version: as secret as the key, never printed.
    keys: BTreeMap<u32, Hmac<Sha256>>,
    active_version: u32,
}

impl VersionedPseudonymizer {
    /// Keys by version, each of [`MIN_KEY_BYTES`] or more, no version twice,
    /// `active_version` among them.
    pub fn new(
        keys: impl IntoIterator<Item = (u32, SecretSlice<u8>)>,
        active_version: u32,
    ) -> Result<Self, WebError> {
        let mut by_version = BTreeMap::new();
        for (version, key) in keys {
            let length = key.expose_secret().len();
            if length < MIN_KEY_BYTES {
                return Err(WebError::KeyTooShort { version, length, minimum: MIN_KEY_BYTES });
            }
            // HMAC accepts keys of any length; ours were checked above.
            let mac = <Hmac<Sha256> as Mac>::new_from_slice(key.expose_secret())
                .expect("HMAC-SHA-256 accepts a key of any length");
            if by_version.insert(version, mac).is_some() {
                return Err(WebError::DuplicateKeyVersion(version));
            }
        }
        if !by_version.contains_key(&active_version) {
            return Err(WebError::UnknownKeyVersion(active_version));
        }
        Ok(Self { keys: by_version, active_version })
    }

    /// The version new pseudonyms are made with.
    pub fn active_version(&self) -> u32 {
        self.active_version
    }

    /// Whether `digest` has the form this pseudonymizer makes.
    pub fn could_make(&self, digest: &SubjectDigest) -> bool {
        self.keys.contains_key(&digest.version()) && digest.tag().len() == 32
    }

    /// The pseudonym under the active key: the frames `[kind.name(), identity]`.
    pub fn pseudonymize(&self, kind: SubjectKind, identity: &str) -> SubjectDigest {
        self.pseudonymize_frames(&mut [kind.name(), identity].into_iter())
    }
}

/// HMAC-SHA-256 under the active key over the frames, each a 4-byte
/// big-endian length and its bytes, so no two frame lists make one message.
impl SubjectPseudonymizer for VersionedPseudonymizer {
    fn pseudonymize_frames(&self, frames: &mut dyn Iterator<Item = &str>) -> SubjectDigest {
        let mut mac = self.keys[&self.active_version].clone();
        for frame in frames {
            // Saturating: HTTP header and route limits cut parts off long before 4 GiB.
            mac.update(&u32::try_from(frame.len()).unwrap_or(u32::MAX).to_be_bytes());
            mac.update(frame.as_bytes());
        }
        let tag: [u8; 32] = mac.finalize().into_bytes().into();
        SubjectDigest::from_tag(self.active_version, &tag)
            .expect("a 32-byte tag makes a valid digest")
    }
}

// Key bytes never print: only the versions and which one is active.
impl fmt::Debug for VersionedPseudonymizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VersionedPseudonymizer")
            .field("versions", &self.keys.keys().collect::<Vec<_>>())
            .field("active_version", &self.active_version)
            .finish()
    }
}

#[cfg(test)]
mod subject_tests {
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
    ) -> Result<RawSubject<'static>, Refusal<'static>> {
        resolve_subject(&parts(build), settings).map(|subject| RawSubject {
            kind: subject.kind,
            identity: Cow::Owned(subject.identity.into_owned()),
        })
    }

    /// At the defaults: no API key header.
    fn resolve(
        build: impl FnOnce(&mut Request<()>),
    ) -> Result<RawSubject<'static>, Refusal<'static>> {
        resolve_with(&EdgeSettings::default(), build)
    }

    /// With `api-key-header = "x-api-key"`.
    fn resolve_keyed(
        build: impl FnOnce(&mut Request<()>),
    ) -> Result<RawSubject<'static>, Refusal<'static>> {
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
        let rejected = |problem| Err(Refusal::InvalidApiKey(problem));
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
            Err(Refusal::MissingPeerAddress)
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

#[cfg(test)]
mod client_ip_tests {
    use http::HeaderValue;

    use super::*;

    const PEER_PROXY: &str = "10.0.0.5";
    const UNTRUSTED_PEER: &str = "198.51.100.7";

    fn trusted() -> Vec<IpNet> {
        vec!["10.0.0.0/8".parse().unwrap(), "2001:db8:ffff::/48".parse().unwrap()]
    }

    fn resolve_from(
        header: ClientIpHeader,
        peer: &str,
        headers: &[(&'static str, &[u8])],
    ) -> String {
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            map.append(*name, HeaderValue::from_bytes(value).unwrap());
        }
        client_ip(peer.parse().unwrap(), &map, header, &trusted()).to_string()
    }

    /// Behind proxies that write `X-Forwarded-For`, the default.
    fn resolve(peer: &str, headers: &[(&'static str, &str)]) -> String {
        let headers: Vec<_> =
            headers.iter().map(|(name, value)| (*name, value.as_bytes())).collect();
        resolve_from(ClientIpHeader::XForwardedFor, peer, &headers)
    }

    /// Behind proxies that write `Forwarded`.
    fn resolve_forwarded(peer: &str, value: &str) -> String {
        resolve_from(ClientIpHeader::Forwarded, peer, &[("forwarded", value.as_bytes())])
    }

    #[test]
    fn headers_from_an_untrusted_peer_are_ignored() {
        let spoofed = [("x-forwarded-for", "203.0.113.9"), ("forwarded", "for=203.0.113.9")];
        assert_eq!(resolve(UNTRUSTED_PEER, &spoofed), UNTRUSTED_PEER);
        assert_eq!(resolve_forwarded(UNTRUSTED_PEER, "for=203.0.113.9"), UNTRUSTED_PEER);
    }

    #[test]
    fn x_forwarded_for_is_walked_from_the_right_past_trusted_hops() {
        // The leftmost entry is whatever the client wrote; 203.0.113.9 is
        // what our first trusted proxy saw.
        let chain = [("x-forwarded-for", "6.6.6.6, 203.0.113.9, 10.1.1.1")];
        assert_eq!(resolve(PEER_PROXY, &chain), "203.0.113.9");
        let with_ports = [("x-forwarded-for", "[2001:db8::7]:443 , 10.2.2.2:80")];
        assert_eq!(resolve(PEER_PROXY, &with_ports), "2001:db8::7");
        let split_lines = [("x-forwarded-for", "203.0.113.9"), ("x-forwarded-for", "10.1.1.1")];
        assert_eq!(resolve(PEER_PROXY, &split_lines), "203.0.113.9");
    }

    #[test]
    fn when_every_hop_is_trusted_the_leftmost_counts() {
        let chain = [("x-forwarded-for", "10.9.9.9, 10.1.1.1")];
        assert_eq!(resolve(PEER_PROXY, &chain), "10.9.9.9");
        assert_eq!(resolve_forwarded(PEER_PROXY, "for=10.9.9.9, for=10.1.1.1"), "10.9.9.9");
    }

    #[test]
    fn junk_left_of_the_client_is_never_parsed() {
        let junk = [("x-forwarded-for", "not-an-ip, 203.0.113.5")];
        assert_eq!(resolve(PEER_PROXY, &junk), "203.0.113.5");
        let behind_two = [("x-forwarded-for", "[::1, 1.2.3.4:99999, 203.0.113.5 ,10.1.1.1")];
        assert_eq!(resolve(PEER_PROXY, &behind_two), "203.0.113.5");
        // The client's own line is not even ASCII; the proxy's line is.
        let lines =
            [("x-forwarded-for", &b"\xff\xfe, \x80"[..]), ("x-forwarded-for", b"203.0.113.5")];
        assert_eq!(resolve_from(ClientIpHeader::XForwardedFor, PEER_PROXY, &lines), "203.0.113.5");
        // The same for Forwarded: broken syntax, an unbalanced quote, a
        // second `for`, all left of the client's element.
        for value in [
            "garbage, for=203.0.113.5",
            "for=\"[::1, for=203.0.113.5",
            "for=1.1.1.1;for=2.2.2.2, for=203.0.113.5;proto=https",
            "\\\", for=\"203.0.113.5:80\", for=10.1.1.1",
        ] {
            assert_eq!(resolve_forwarded(PEER_PROXY, value), "203.0.113.5", "{value}");
        }
        let lines = [("forwarded", &b"for=\"\xff"[..]), ("forwarded", b"for=203.0.113.5")];
        assert_eq!(resolve_from(ClientIpHeader::Forwarded, PEER_PROXY, &lines), "203.0.113.5");
    }

    #[test]
    fn only_x_forwarded_for_is_read_by_default() {
        let spoofed = [("x-forwarded-for", "203.0.113.5"), ("forwarded", "for=198.51.100.1")];
        assert_eq!(resolve(PEER_PROXY, &spoofed), "203.0.113.5");
        let only_forwarded = [("forwarded", "for=198.51.100.1")];
        assert_eq!(resolve(PEER_PROXY, &only_forwarded), PEER_PROXY);
    }

    #[test]
    fn behind_proxies_that_write_forwarded_only_forwarded_is_read() {
        let both = [
            (
                "forwarded",
                &br#"for=192.0.2.60;proto=http;by=203.0.113.43, for="10.3.3.3:8080""#[..],
            ),
            ("x-forwarded-for", b"203.0.113.200"),
        ];
        assert_eq!(resolve_from(ClientIpHeader::Forwarded, PEER_PROXY, &both), "192.0.2.60");
        let only_x_forwarded_for = [("x-forwarded-for", &b"203.0.113.200"[..])];
        let ip = resolve_from(ClientIpHeader::Forwarded, PEER_PROXY, &only_x_forwarded_for);
        assert_eq!(ip, PEER_PROXY);
    }

    #[test]
    fn forwarded_is_parsed_per_rfc_7239() {
        assert_eq!(
            resolve_forwarded(PEER_PROXY, r#"For="[2001:db8:cafe::17]:4711""#),
            "2001:db8:cafe::17"
        );
        let trusted_v6_hop = r#"for=192.0.2.1, for="[2001:db8:ffff::1]""#;
        assert_eq!(resolve_forwarded(PEER_PROXY, trusted_v6_hop), "192.0.2.1");
        let escaped = r#"for="\192.0.2.61";secret="a\"b,c""#;
        assert_eq!(resolve_forwarded(PEER_PROXY, escaped), "192.0.2.61");
        // A comma and escapes inside a quoted string of the proxy's own
        // element are not element boundaries, read from either side.
        let quoted = r#"for=6.6.6.6, for=192.0.2.62;host="a, for=10.1.1.1\\", , "#;
        assert_eq!(resolve_forwarded(PEER_PROXY, quoted), "192.0.2.62");
        let empty_pairs = "for=192.0.2.63;;proto=https;, ;";
        assert_eq!(resolve_forwarded(PEER_PROXY, empty_pairs), "192.0.2.63");
    }

    #[test]
    fn an_unreadable_rightmost_entry_leaves_the_peer() {
        for value in ["not-an-ip", "203.0.113.9, garbage", "", "203.0.113.9,"] {
            assert_eq!(resolve(PEER_PROXY, &[("x-forwarded-for", value)]), PEER_PROXY, "{value}");
        }
        for value in [
            "for=2001:db8::1",
            "for=\"192.0.2.1",
            "for=192.0.2.1;for=192.0.2.2",
            "for 192.0.2.1",
            "for=192.0.2.1:99999",
            ", ,",
            "for=\"[2001:db8::1]x\"",
            "for=unknown",
            "for=_hidden",
            "proto=https",
            "for=192.0.2.1, by=_p",
        ] {
            assert_eq!(resolve_forwarded(PEER_PROXY, value), PEER_PROXY, "{value}");
        }
    }

    #[test]
    fn an_unreadable_hop_further_in_leaves_the_proxy_that_wrote_it() {
        // 10.1.1.1 is a trusted proxy that wrote junk (or hid its client):
        // its clients share its budget, not the budget of everyone behind
        // the peer.
        for value in ["not-an-ip, 10.1.1.1", "203.0.113.9,,10.1.1.1", "6.6.6.6, :80, 10.1.1.1"] {
            assert_eq!(resolve(PEER_PROXY, &[("x-forwarded-for", value)]), "10.1.1.1", "{value}");
        }
        for value in
            ["for=unknown, for=10.1.1.1", "for=_hidden:_p, for=10.1.1.1", "for=\"x, for=10.1.1.1"]
        {
            assert_eq!(resolve_forwarded(PEER_PROXY, value), "10.1.1.1", "{value}");
        }
    }

    #[test]
    fn non_ascii_header_bytes_are_unreadable_entries() {
        let ip = resolve_from(
            ClientIpHeader::XForwardedFor,
            PEER_PROXY,
            &[("x-forwarded-for", b"203.0.113.9\xff")],
        );
        assert_eq!(ip, PEER_PROXY);
    }

    #[test]
    fn ipv4_mapped_peers_are_matched_as_ipv4() {
        let chain = [("x-forwarded-for", "203.0.113.9")];
        assert_eq!(resolve("::ffff:10.0.0.5", &chain), "203.0.113.9");
    }
}

#[cfg(test)]
mod pseudonymizer_tests {
    use super::*;

    fn key(byte: u8) -> SecretSlice<u8> {
        SecretSlice::from(vec![byte; 32])
    }

    fn single(version: u32, byte: u8) -> VersionedPseudonymizer {
        VersionedPseudonymizer::new([(version, key(byte))], version).unwrap()
    }

    #[test]
    fn matches_vectors_computed_with_python_hmac() {
        // Computed independently of this code with Python 3's standard library:
        // python3 -c 'import hmac,hashlib,struct; f=lambda s: struct.pack(">I", len(s.encode())) + s.encode(); print(hmac.new(KEY, f(KIND) + f(IDENTITY), hashlib.sha256).hexdigest())'
        // with KEY = bytes(range(32)) for version 1 and
        // KEY = b"rotation-key-version-two-32bytes!" (33 bytes) for version 2.
        // The first is the worked example of docs/http-edge.md ("Pseudonym framing").
        let keys = || {
            let sequential: Vec<u8> = (0u8..32).collect();
            let rotation = b"rotation-key-version-two-32bytes!".to_vec();
            [(1, SecretSlice::from(sequential)), (2, SecretSlice::from(rotation))]
        };
        let pseudonymizer = VersionedPseudonymizer::new(keys(), 1).unwrap();
        let vectors = [
            (
                SubjectKind::ClientIp,
                "203.0.113.7/32",
                "v1:ebb86875561615151dcde4e2faca5ef791264ae17d27b582a93d102bc7cfba67",
            ),
            (
                SubjectKind::ClientIp,
                "2001:db8:1:2::/64",
                "v1:5ec82f5aded88df814168f90c5cfdfcbe780119a3c8126359e4edcdc106186b9",
            ),
            (
                SubjectKind::ApiKey,
                "k-123",
                "v1:d246ab7168f827743842f0d5e4031fbdc3ce365388a502b9943bdfadfcf5bd1a",
            ),
            (
                SubjectKind::Principal,
                "ユーザー",
                "v1:a561057b43584b70d5e456ba60e4e2f45bf50fc36186359a7d40636f1ab95f7b",
            ),
        ];
        for (kind, identity, expected) in vectors {
            assert_eq!(pseudonymizer.pseudonymize(kind, identity).to_string(), expected);
        }
        let under_two = VersionedPseudonymizer::new(keys(), 2)
            .unwrap()
            .pseudonymize(SubjectKind::ClientIp, "203.0.113.7/32");
        assert_eq!(
            under_two.to_string(),
            "v2:76ce83273386b8b902fa0475cae0af0f91840fcbcfc63c5b9ecfeb563b380555"
        );
    }

    #[test]
    fn framing_keeps_part_boundaries_apart() {
        let pseudonymizer = single(1, 0x42);
        let frames = |frames: [&str; 2]| pseudonymizer.pseudonymize_frames(&mut frames.into_iter());
        assert_ne!(frames(["ab", "c"]), frames(["a", "bc"]));
        // The kind is framed too: one string as principal and as API key
        // are two subjects.
        assert_ne!(
            pseudonymizer.pseudonymize(SubjectKind::Principal, "alice"),
            pseudonymizer.pseudonymize(SubjectKind::ApiKey, "alice")
        );
    }

    /// See [`any_frames_take_the_same_framing_as_a_kind_and_identity`].
    const PYTHON_DESCRIPTOR_VECTOR: &str =
        "v1:d07cbfe158235f4a8bb581cbb118a7f4fefac1a2d29492ff2bdcf039747eb653";

    #[test]
    fn any_frames_take_the_same_framing_as_a_kind_and_identity() {
        let pseudonymizer = single(1, 0x42);
        let framed = pseudonymizer.pseudonymize_frames(&mut ["ip", "203.0.113.7/32"].into_iter());
        assert_eq!(framed, pseudonymizer.pseudonymize(SubjectKind::ClientIp, "203.0.113.7/32"));
        // Computed with Python 3's standard library as above, KEY = bytes(range(32)):
        // hmac.new(KEY, f("descriptor") + f("edge") + f("remote_address") + f("10.0.0.1"), hashlib.sha256)
        let sequential =
            VersionedPseudonymizer::new([(1, SecretSlice::from((0u8..32).collect::<Vec<_>>()))], 1)
                .unwrap();
        let descriptor = sequential.pseudonymize_frames(
            &mut ["descriptor", "edge", "remote_address", "10.0.0.1"].into_iter(),
        );
        assert_eq!(descriptor.to_string(), PYTHON_DESCRIPTOR_VECTOR);
        assert_ne!(
            descriptor,
            sequential.pseudonymize_frames(
                &mut ["descriptor", "edge", "remote_address10.0.0.1"].into_iter()
            )
        );
    }

    #[test]
    fn output_carries_the_version_and_256_bits() {
        let digest = single(7, 0x01).pseudonymize(SubjectKind::ClientIp, "192.0.2.1/32");
        let text = digest.to_string();
        let hex = text.strip_prefix("v7:").expect("version prefix");
        assert_eq!(hex.len(), 64);
        assert_eq!((digest.version(), digest.tag().len()), (7, 32));
    }

    #[test]
    fn rotation_uses_the_active_key_and_versions_differ() {
        let under = |active| VersionedPseudonymizer::new([(1, key(0x11)), (2, key(0x22))], active);
        let both = under(2).unwrap();
        let old = under(1).unwrap().pseudonymize(SubjectKind::Principal, "alice");
        let new = under(2).unwrap().pseudonymize(SubjectKind::Principal, "alice");
        assert_ne!(old, new);
        assert_eq!(both.active_version(), 2);
        assert_eq!(both.pseudonymize(SubjectKind::Principal, "alice"), new);
        assert!(old.to_string().starts_with("v1:") && new.to_string().starts_with("v2:"));
        // The same key under the same version gives the same pseudonym in
        // another instance: versions, not instances, define buckets.
        assert_eq!(single(1, 0x11).pseudonymize(SubjectKind::Principal, "alice"), old);
    }

    #[test]
    fn construction_refuses_short_duplicate_and_missing_keys() {
        let short = VersionedPseudonymizer::new([(1, SecretSlice::from(vec![0u8; 31]))], 1);
        assert_eq!(
            short.unwrap_err(),
            WebError::KeyTooShort { version: 1, length: 31, minimum: 32 }
        );
        let twice = VersionedPseudonymizer::new([(1, key(1)), (1, key(2))], 1);
        assert_eq!(twice.unwrap_err(), WebError::DuplicateKeyVersion(1));
        let inactive = VersionedPseudonymizer::new([(1, key(1))], 2);
        assert_eq!(inactive.unwrap_err(), WebError::UnknownKeyVersion(2));
    }

    #[test]
    fn debug_output_shows_versions_but_no_key_bytes() {
        let secret = b"0123456789abcdefghijklmnopqrstuvwxyz".to_vec();
        let pseudonymizer =
            VersionedPseudonymizer::new([(3, SecretSlice::from(secret))], 3).unwrap();
        let debug = format!("{pseudonymizer:?}");
        assert_eq!(debug, "VersionedPseudonymizer { versions: [3], active_version: 3 }");
        assert!(!debug.contains("0123"));
    }
}
