//! Hostile input at the HTTP edge: proptest properties that drive a real
//! axum `Router` behind `RateLimitLayer` in process (`oneshot`, with the
//! `ConnectInfo` peer inserted by hand), in front of the recording
//! `ScriptedPort` of `tests/support`, which always allows.
//!
//! The rule (DEVELOPERS guide): bad input gets a clear, typed answer and
//! loses nothing; hostile headers get a 400 or are ignored, never a panic
//! or a 500. What each property pins:
//!
//! - `forwarding_headers_from_an_untrusted_peer_change_nothing`: from a peer
//!   outside the trusted CIDRs, any `Forwarded` / `X-Forwarded-For` lines
//!   (raw bytes, RFC 7239 fragments, long chains, repeated lines) are
//!   ignored: 200, and the subject is the one the same peer gets without
//!   them.
//! - `forwarding_headers_from_a_trusted_peer_name_the_peer_or_a_written_address`:
//!   from a trusted proxy the same headers still give 200, and the subject
//!   is the peer or an address written in the one header the edge reads
//!   (`client-ip-header`), nothing else.
//! - `well_formed_x_forwarded_for_is_walked_from_the_right` and
//!   `well_formed_forwarded_is_walked_from_the_right`: behind a trusted
//!   proxy the client is the rightmost hop that is not itself trusted; a
//!   hop that names no address (`unknown`, an obfuscated node, no `for`)
//!   stops the walk at the trusted hop right of it (the peer when it is the
//!   rightmost); when every hop is trusted the leftmost counts; the header
//!   the edge is not configured to read is never consulted (RFC 7239
//!   grammar, `client_ip` docs).
//! - `junk_left_of_the_client_changes_nothing`: whatever a client writes
//!   left of the address its first trusted proxy appended (bytes, broken
//!   syntax, unbalanced quotes, lines of its own) leaves that address the
//!   subject, for either header.
//! - `api_keys_are_refused_with_400_exactly_when_invalid`: with
//!   `api-key-header = "x-api-key"`, exactly one `x-api-key` of 1..=256
//!   visible ASCII bytes (0x21..=0x7E) is the subject; an empty, longer,
//!   non-visible or repeated key is a 400 problem+json that charges nothing
//!   and never runs the handler (`identity.rs`).
//! - `any_id_segment_shares_the_bucket_of_orders_1`: the operation is the
//!   route template, so `/api/orders/<anything>` has the policy set, the
//!   pseudonym and the operation digest of `/api/orders/1`, for every
//!   method.
//! - `any_method_and_path_names_only_a_template_or_unmatched`: for any
//!   method and path the operation digest is that of the route template or
//!   of `<unmatched>` (never of the raw path), the pseudonym is the peer's
//!   whatever the path, and the status is never 500.

mod support;

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use adapter_web::{
    ClientIpHeader, DEFAULT_PROBLEM_TYPE_BASE, EdgeSettings, RateLimitLayer, SubjectKind,
    TransportBridge, UNMATCHED_ROUTE, VersionedPseudonymizer, charged_digest, operation_digest,
};
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, Path, State};
use axum::routing::get;
use http::header::{CONTENT_TYPE, FORWARDED};
use http::{HeaderName, HeaderValue, Method, Request, StatusCode, Uri};
use http_body_util::BodyExt;
use ipnet::IpNet;
use proptest::collection::vec;
use proptest::option;
use proptest::prelude::*;
use proptest::sample::{Index, select};
use proptest::test_runner::Config;
use shared_contract::{
    Algorithm, ManualClock, OperationDigest, PolicyId, PolicySet, RateLimitDecision,
    RateLimitOutcome, RateLimitPolicy, RateLimitRequest, SetDecision, SubjectDigest,
};
use support::{ORDER_OPERATION, ORDER_ROUTE, ScriptedPort, network_at_defaults};
use tower::ServiceExt;

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const API_KEY: HeaderName = HeaderName::from_static("x-api-key");
const ORDERS_1: &str = "/api/orders/1";

/// 256 cases or fewer per property. No regression files: this helper may
/// write only this file, and a failure prints its shrunk input anyway.
fn config(cases: u32) -> Config {
    Config { cases, failure_persistence: None, ..Config::default() }
}

// ---------------------------------------------------------------------------
// The edge under test
// ---------------------------------------------------------------------------

fn trusted_proxies() -> Vec<IpNet> {
    vec!["10.0.0.0/8".parse().unwrap(), "2001:db8:ffff::/48".parse().unwrap()]
}

fn is_trusted(ip: IpAddr) -> bool {
    trusted_proxies().iter().any(|net| net.contains(&ip.to_canonical()))
}

fn allowed() -> RateLimitOutcome {
    Ok(SetDecision::single(RateLimitDecision {
        allowed: true,
        remaining: 7,
        retry_after_ms: 0,
        reset_after_ms: 1500,
        replayed: false,
    }))
}

fn single(id: &str) -> PolicySet {
    PolicySet::single(PolicyId::new(id).unwrap())
}

fn policies() -> Vec<RateLimitPolicy> {
    let orders = Algorithm::FixedWindow(shared_contract::FixedWindow {
        limit: 10,
        window: Duration::from_secs(60),
    });
    let default = Algorithm::SlidingCounter(shared_contract::SlidingCounter {
        limit: 100,
        window: Duration::from_secs(1),
    });
    vec![
        RateLimitPolicy::builder("orders", orders).build().unwrap(),
        RateLimitPolicy::builder("default", default).build().unwrap(),
    ]
}

async fn order(State(calls): State<Arc<AtomicUsize>>, Path(id): Path<String>) -> String {
    calls.fetch_add(1, Ordering::SeqCst);
    format!("order {id}")
}

async fn fallback(State(calls): State<Arc<AtomicUsize>>) -> (StatusCode, &'static str) {
    calls.fetch_add(1, Ordering::SeqCst);
    (StatusCode::NOT_FOUND, "no such route")
}

/// One router with the layer, built fresh for every case so cases (and
/// proptest's shrinking reruns) never see each other's requests.
struct Edge {
    router: Router,
    port: Arc<ScriptedPort>,
    pseudonymizer: Arc<VersionedPseudonymizer>,
    calls: Arc<AtomicUsize>,
}

/// What one request did.
#[derive(Debug)]
struct Seen {
    status: StatusCode,
    content_type: Option<HeaderValue>,
    body: Bytes,
    /// What crossed the port while this request ran.
    requests: Vec<RateLimitRequest<'static>>,
    handler_runs: usize,
}

impl Edge {
    /// Behind proxies that write `X-Forwarded-For`, the default.
    fn new() -> Self {
        Self::behind(ClientIpHeader::XForwardedFor)
    }

    /// Behind trusted proxies that write `header`, taking API keys in
    /// `x-api-key` (as a layer before this one verified them).
    fn behind(header: ClientIpHeader) -> Self {
        let port = Arc::new(ScriptedPort::new(allowed(), policies()));
        let pseudonymizer = support::pseudonymizer();
        let mut operations = HashMap::new();
        operations.insert(ORDER_OPERATION.to_owned(), single("orders"));
        let settings = EdgeSettings {
            trusted_proxies: trusted_proxies(),
            client_ip_header: header,
            api_key_header: Some(API_KEY),
            operations,
            ..EdgeSettings::default()
        };
        settings.validate().unwrap();
        let bridge = TransportBridge::new(
            port.clone(),
            Arc::clone(&pseudonymizer),
            Arc::new(ManualClock::new(1_700_000_000_000)),
            settings,
        );
        let calls = Arc::new(AtomicUsize::new(0));
        let router = Router::new()
            .route(ORDER_ROUTE, get(order))
            .fallback(fallback)
            .with_state(Arc::clone(&calls))
            .layer(RateLimitLayer::new(Arc::new(bridge)));
        Self { router, port, pseudonymizer, calls }
    }

    /// Sends `request` from `peer` through the router. A panic anywhere in
    /// the layer surfaces here and fails the case.
    fn send(&self, peer: SocketAddr, mut request: Request<Body>) -> Seen {
        request.extensions_mut().insert(ConnectInfo(peer));
        let before = self.port.requests().len();
        let calls_before = self.calls.load(Ordering::SeqCst);
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let (parts, body) = runtime.block_on(async {
            let response = self.router.clone().oneshot(request).await.unwrap();
            let (parts, body) = response.into_parts();
            (parts, body.collect().await.unwrap().to_bytes())
        });
        Seen {
            status: parts.status,
            content_type: parts.headers.get(CONTENT_TYPE).cloned(),
            body,
            requests: self.port.requests().split_off(before),
            handler_runs: self.calls.load(Ordering::SeqCst) - calls_before,
        }
    }

    /// The pseudonym of a client address: its network at the default
    /// prefixes (IPv4-mapped IPv6 counts as IPv4).
    fn ip_digest(&self, ip: IpAddr) -> SubjectDigest {
        self.pseudonymizer.pseudonymize(SubjectKind::ClientIp, &network_at_defaults(ip))
    }
}

/// A `GET /api/orders/1` with these header lines, in order.
fn orders_request(headers: &[(HeaderName, Vec<u8>)]) -> Request<Body> {
    let mut request = Request::get(ORDERS_1).body(Body::empty()).unwrap();
    for (name, value) in headers {
        let value = HeaderValue::from_bytes(value).expect("strategies make valid header bytes");
        request.headers_mut().append(name.clone(), value);
    }
    request
}

/// The subject of the single evaluation a request made.
fn only_subject(seen: &Seen) -> Result<&SubjectDigest, TestCaseError> {
    prop_assert_eq!(seen.requests.len(), 1, "one evaluation per request");
    Ok(&seen.requests[0].subject)
}

/// The operation digest of the single evaluation a request made.
fn only_operation(seen: &Seen) -> Result<&OperationDigest, TestCaseError> {
    prop_assert_eq!(seen.requests.len(), 1, "one evaluation per request");
    Ok(&seen.requests[0].operation)
}

// ---------------------------------------------------------------------------
// Strategies: addresses and peers
// ---------------------------------------------------------------------------

/// Any address, with trusted-proxy and IPv4-mapped addresses well
/// represented so chains mix trusted and untrusted hops.
fn address() -> impl Strategy<Value = IpAddr> {
    let trusted_v4 = any::<[u8; 3]>().prop_map(|[a, b, c]| Ipv4Addr::new(10, a, b, c));
    let trusted_v6 = any::<[u16; 5]>()
        .prop_map(|[a, b, c, d, e]| Ipv6Addr::new(0x2001, 0xdb8, 0xffff, a, b, c, d, e));
    prop_oneof![
        3 => any::<Ipv4Addr>().prop_map(IpAddr::V4),
        2 => trusted_v4.clone().prop_map(IpAddr::V4),
        2 => any::<Ipv6Addr>().prop_map(IpAddr::V6),
        2 => trusted_v6.prop_map(IpAddr::V6),
        1 => any::<Ipv4Addr>().prop_map(|ip| IpAddr::V6(ip.to_ipv6_mapped())),
        1 => trusted_v4.prop_map(|ip| IpAddr::V6(ip.to_ipv6_mapped())),
    ]
}

fn untrusted_peer() -> impl Strategy<Value = SocketAddr> {
    let ip = prop_oneof![
        Just("198.51.100.7".parse::<IpAddr>().unwrap()),
        Just("::ffff:198.51.100.7".parse::<IpAddr>().unwrap()),
        address(),
    ]
    .prop_filter("an untrusted peer", |ip| !is_trusted(*ip));
    (ip, any::<u16>()).prop_map(|(ip, port)| SocketAddr::new(ip, port))
}

fn trusted_peer() -> impl Strategy<Value = SocketAddr> {
    let ip = prop_oneof![
        Just("10.0.0.2".parse::<IpAddr>().unwrap()),
        Just("::ffff:10.0.0.2".parse::<IpAddr>().unwrap()),
        address(),
    ]
    .prop_filter("a trusted peer", |ip| is_trusted(*ip));
    (ip, any::<u16>()).prop_map(|(ip, port)| SocketAddr::new(ip, port))
}

// ---------------------------------------------------------------------------
// Strategies: hostile forwarding headers
// ---------------------------------------------------------------------------

/// A byte `http::HeaderValue` accepts (no control bytes but tab, no DEL),
/// biased towards the bytes the two header grammars care about.
fn header_byte() -> impl Strategy<Value = u8> {
    prop_oneof![
        6 => select(b"0123456789abcdef.:[]\"\\,;= \t_forunkFOR".to_vec()),
        3 => 0x20u8..=0x7e,
        1 => Just(b'\t'),
        1 => 0x80u8..=0xff,
    ]
}

/// Pieces of RFC 7239 and `X-Forwarded-For` syntax, glued at random.
fn fragment() -> impl Strategy<Value = Vec<u8>> {
    const PIECES: &[&str] = &[
        "for=",
        "For=",
        "FOR=",
        "by=",
        "proto=https",
        "host=",
        ";",
        ",",
        ", ",
        " ",
        "\t",
        "\"",
        "\\",
        "\\\"",
        "=",
        "[",
        "]",
        ":",
        "::",
        "unknown",
        "_hidden",
        "_a.b-c",
        ":_port",
        ":80",
        ":99999",
        "%eth0",
        "for=\"[",
        "]:",
        "for=\"_x:_y\"",
        "for=\"unknown:80\"",
    ];
    prop_oneof![
        4 => select(PIECES).prop_map(|piece| piece.as_bytes().to_vec()),
        3 => address().prop_map(|ip| ip.to_string().into_bytes()),
        1 => (address(), any::<u16>())
            .prop_map(|(ip, port)| SocketAddr::new(ip, port).to_string().into_bytes()),
        1 => "[A-Za-z0-9!#$%&'*+.^_`|~-]{1,12}".prop_map(String::into_bytes),
        1 => vec(header_byte(), 1..8),
    ]
}

/// One hop of a chain, in either header's syntax, for repetition.
fn hop_text() -> impl Strategy<Value = String> {
    prop_oneof![
        address().prop_map(|ip| ip.to_string()),
        address().prop_map(|ip| format!("for=\"{}\"", SocketAddr::new(ip, 443))),
        address().prop_map(|ip| format!("for={ip}")),
        Just("for=unknown".to_owned()),
        Just("unknown".to_owned()),
    ]
}

/// A hostile value for `Forwarded` or `X-Forwarded-For`.
fn hostile_value() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        3 => vec(header_byte(), 0..120),
        4 => vec(fragment(), 0..24).prop_map(|pieces| pieces.concat()),
        // Many hops: a long value, and a long walk.
        1 => (hop_text(), 1..400usize, select(vec![",", ", ", " ,\t", ";"]))
            .prop_map(|(hop, count, separator)| vec![hop; count].join(separator).into_bytes()),
        // Very long noise: a random chunk repeated (cheap to generate).
        1 => (vec(header_byte(), 1..64), 16..80usize).prop_map(|(chunk, count)| chunk.repeat(count)),
    ]
}

/// A well-formed line of `name`, sometimes with a fragment spliced in, so
/// the parsers get deep before they meet the damage.
fn damaged_line(name: HeaderName) -> impl Strategy<Value = (HeaderName, Vec<u8>)> {
    let elements = if name == FORWARDED {
        vec(forwarded_element(), 1..6).boxed()
    } else {
        vec(x_forwarded_for_entry(), 1..6).boxed()
    };
    let texts =
        elements.prop_map(|hops| hops.into_iter().map(|(_, text)| text).collect::<Vec<_>>());
    (texts, option::of(fragment()), any::<Index>()).prop_map(move |(texts, damage, at)| {
        let mut line = texts.join(",").into_bytes();
        if let Some(damage) = damage {
            let at = at.index(line.len() + 1);
            line.splice(at..at, damage);
        }
        (name.clone(), line)
    })
}

/// One to four lines of the two forwarding headers, repeats included.
fn hostile_forwarding() -> impl Strategy<Value = Vec<(HeaderName, Vec<u8>)>> {
    let line = prop_oneof![
        2 => (select(vec![FORWARDED, X_FORWARDED_FOR]), hostile_value()),
        1 => damaged_line(FORWARDED),
        1 => damaged_line(X_FORWARDED_FOR),
    ];
    prop_oneof![2 => vec(line.clone(), 1..=1), 1 => vec(line, 2..=4)]
}

/// Every address the lines of `name` could name, read leniently: quoted
/// pairs undone, the text cut at every delimiter of either grammar, each
/// piece read as an address, `v4:port`, `[v6]` or `[v6]:port`. A superset
/// of what a correct parser of that header can extract.
fn addresses_written_in(headers: &[(HeaderName, Vec<u8>)], name: &HeaderName) -> Vec<IpAddr> {
    let mut found = Vec::new();
    // Repeated lines mean one comma-joined list (RFC 9110 section 5.3).
    let lines: Vec<&[u8]> =
        headers.iter().filter(|(n, _)| n == name).map(|(_, v)| v.as_slice()).collect();
    let text = without_quoted_pairs(&String::from_utf8_lossy(&lines.join(&b","[..])));
    for piece in text.split([',', ';', '=', ' ', '\t', '"']) {
        found.extend(read_address(piece));
    }
    found
}

fn without_quoted_pairs(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => out.extend(chars.next()),
            c => out.push(c),
        }
    }
    out
}

fn read_address(piece: &str) -> Option<IpAddr> {
    if let Ok(ip) = piece.parse::<IpAddr>() {
        return Some(ip);
    }
    if let Ok(socket) = piece.parse::<SocketAddr>() {
        return Some(socket.ip());
    }
    if let Some(rest) = piece.strip_prefix('[') {
        let (inner, _) = rest.split_once(']')?;
        return inner.parse::<Ipv6Addr>().ok().map(IpAddr::V6);
    }
    let (host, _) = piece.split_once(':')?;
    host.parse::<Ipv4Addr>().ok().map(IpAddr::V4)
}

// ---------------------------------------------------------------------------
// Strategies: well-formed chains and their expected client
// ---------------------------------------------------------------------------

/// One hop as the spec sees it.
#[derive(Debug, Clone, Copy)]
enum Hop {
    /// The hop names this address.
    Address(IpAddr),
    /// `unknown`, an obfuscated node, or an element without `for`.
    NoAddress,
}

/// The client behind `peer` per the spec: a peer outside the trusted
/// proxies is the client; otherwise walk from the right past trusted hops,
/// the first untrusted address is the client, a hop without an address
/// stops the walk at the farthest trusted address reached (the peer when
/// it is the rightmost hop), and all-trusted means the leftmost hop.
fn expected_client(peer: IpAddr, hops: &[Hop]) -> IpAddr {
    let peer = peer.to_canonical();
    if !is_trusted(peer) {
        return peer;
    }
    let mut farthest_trusted = peer;
    for hop in hops.iter().rev() {
        match *hop {
            Hop::NoAddress => break,
            Hop::Address(ip) => {
                let ip = ip.to_canonical();
                if !is_trusted(ip) {
                    return ip;
                }
                farthest_trusted = ip;
            }
        }
    }
    farthest_trusted
}

/// Optional whitespace around list elements (RFC 9110 `OWS`).
fn ows() -> impl Strategy<Value = &'static str> {
    select(vec!["", "", " ", "\t", "  "])
}

/// Splits `elements` into header lines: a new line starts wherever
/// `breaks` says so.
fn into_lines(
    name: &HeaderName,
    elements: &[String],
    breaks: &[bool],
) -> Vec<(HeaderName, Vec<u8>)> {
    let mut lines: Vec<Vec<String>> = vec![Vec::new()];
    for (i, element) in elements.iter().enumerate() {
        if i > 0 && breaks[i % breaks.len()] {
            lines.push(Vec::new());
        }
        lines.last_mut().unwrap().push(element.clone());
    }
    lines.into_iter().map(|line| (name.clone(), line.join(",").into_bytes())).collect()
}

/// An `X-Forwarded-For` entry: `v4`, `v4:port`, `v6`, `[v6]`, `[v6]:port`.
fn x_forwarded_for_entry() -> impl Strategy<Value = (Hop, String)> {
    (address(), any::<u16>(), 0..3u8, ows(), ows()).prop_map(|(ip, port, style, left, right)| {
        let text = match (ip, style) {
            (IpAddr::V4(_), 0) | (IpAddr::V6(_), 0) => ip.to_string(),
            (IpAddr::V6(v6), 1) => format!("[{v6}]"),
            (_, _) => SocketAddr::new(ip, port).to_string(),
        };
        (Hop::Address(ip), format!("{left}{text}{right}"))
    })
}

/// RFC 7239 `node-port`: up to five digits, or an obfuscated port.
fn node_port() -> impl Strategy<Value = String> {
    prop_oneof!["[0-9]{1,5}", "_[A-Za-z0-9._-]{1,8}"]
}

/// A quoted-string holding `content`, with a quoted-pair wherever `escape`
/// says so (any character may be escaped).
fn quoted(content: &str, escape: &[bool]) -> String {
    let mut out = String::from("\"");
    for (i, c) in content.chars().enumerate() {
        if escape[i % escape.len()] {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

/// The value of a `for=` pair (RFC 7239 section 6) and the hop it names.
fn forwarded_node() -> impl Strategy<Value = (Hop, String)> {
    let escapes = vec(prop::bool::weighted(0.15), 1..16);
    let address_node = (address(), option::of(node_port()), escapes.clone(), any::<bool>())
        .prop_map(|(ip, port, escape, quote_plain)| {
            let text = match (ip, port) {
                (IpAddr::V4(v4), None) if !quote_plain => {
                    return (Hop::Address(ip), v4.to_string());
                }
                (IpAddr::V4(v4), None) => v4.to_string(),
                (IpAddr::V4(v4), Some(port)) => format!("{v4}:{port}"),
                (IpAddr::V6(v6), None) => format!("[{v6}]"),
                (IpAddr::V6(v6), Some(port)) => format!("[{v6}]:{port}"),
            };
            (Hop::Address(ip), quoted(&text, &escape))
        });
    let obfuscated = "_[A-Za-z0-9._-]{1,12}";
    prop_oneof![
        6 => address_node,
        1 => select(vec!["unknown", "\"unknown\""]).prop_map(|n| (Hop::NoAddress, n.to_owned())),
        1 => obfuscated.prop_map(|n| (Hop::NoAddress, n)),
        // `nodename ":" node-port` with a name that is no address.
        1 => (prop_oneof![Just("unknown".to_owned()), obfuscated.boxed()], node_port(), escapes)
            .prop_map(|(name, port, escape)| {
                (Hop::NoAddress, quoted(&format!("{name}:{port}"), &escape))
            }),
    ]
}

/// A `forwarded-element`: pairs joined by `;`, at most one `for`.
fn forwarded_element() -> impl Strategy<Value = (Hop, String)> {
    const OTHER_PAIRS: &[&str] =
        &["proto=https", "by=_proxy", "host=\"example.com:8080\"", "by=\"[2001:db8::7]:443\""];
    let with_for = (
        forwarded_node(),
        select(vec!["for", "For", "FOR"]),
        vec(select(OTHER_PAIRS), 0..3),
        any::<Index>(),
    )
        .prop_map(|((hop, node), name, others, at)| {
            let mut pairs: Vec<String> = others.iter().map(|p| (*p).to_owned()).collect();
            pairs.insert(at.index(pairs.len() + 1), format!("{name}={node}"));
            (hop, pairs.join(";"))
        });
    let without_for =
        vec(select(OTHER_PAIRS), 1..3).prop_map(|pairs| (Hop::NoAddress, pairs.join(";")));
    prop_oneof![6 => with_for, 1 => without_for]
}

// ---------------------------------------------------------------------------
// Strategies: API keys, methods, paths
// ---------------------------------------------------------------------------

/// A byte `http::HeaderValue` accepts, visible or not.
fn any_header_byte() -> impl Strategy<Value = u8> {
    prop_oneof![4 => 0x20u8..=0x7e, 1 => Just(b'\t'), 2 => 0x80u8..=0xff]
}

/// An API key value of 0..=600 bytes, valid ones well represented.
fn api_key() -> impl Strategy<Value = Vec<u8>> {
    let visible = || 0x21u8..=0x7e;
    prop_oneof![
        3 => vec(visible(), 1..=256),
        2 => vec(visible(), 250..=262),
        1 => vec(visible(), 257..=600),
        2 => vec(any_header_byte(), 0..=600),
        // One bad byte (space, tab or non-ASCII) somewhere in a good key.
        2 => (vec(visible(), 0..=255), any_header_byte().prop_filter("not visible", |b| !(0x21..=0x7e).contains(b)), any::<Index>())
            .prop_map(|(mut key, bad, at)| {
                let at = at.index(key.len() + 1);
                key.insert(at, bad);
                key
            }),
        1 => Just(Vec::new()),
    ]
}

/// The spec's rule, written out: exactly one line, 1..=256 bytes, each
/// visible ASCII.
fn is_valid_api_key(lines: &[Vec<u8>]) -> bool {
    match lines {
        [key] => (1..=256).contains(&key.len()) && key.iter().all(|b| (0x21..=0x7e).contains(b)),
        _ => false,
    }
}

const STANDARD_METHODS: [&str; 9] =
    ["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS", "CONNECT", "TRACE"];

/// Standard methods and arbitrary extension tokens (`get` included).
fn method() -> impl Strategy<Value = Method> {
    prop_oneof![
        select(STANDARD_METHODS.to_vec()).prop_map(|m| Method::from_bytes(m.as_bytes()).unwrap()),
        "[A-Za-z0-9!#$%&'*+.^_`|~-]{1,16}".prop_map(|m| Method::from_bytes(m.as_bytes()).unwrap()),
    ]
}

/// The method part of an operation id: a standard method keeps its name,
/// any extension method is `OTHER` (so clients cannot mint operations).
fn method_name(method: &Method) -> &str {
    let name = method.as_str();
    if STANDARD_METHODS.contains(&name) { name } else { "OTHER" }
}

/// One non-empty path segment: unreserved and sub-delimiter characters,
/// `:`, `@`, and percent-encoded bytes (valid UTF-8 or not).
fn segment() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        4 => "[A-Za-z0-9._~!$&'()*+,;=:@-]",
        1 => any::<u8>().prop_map(|b| format!("%{b:02X}")),
        1 => select(vec!["..", ".", "{id}", "%2F", "%00", "%FF"]).prop_map(str::to_owned),
    ];
    prop_oneof![
        8 => vec(piece.clone(), 1..24).prop_map(|pieces| pieces.concat()),
        1 => vec(piece, 200..600).prop_map(|pieces| pieces.concat()),
    ]
}

fn query() -> impl Strategy<Value = Option<String>> {
    option::of("[A-Za-z0-9=&%./-]{0,24}")
}

/// Any origin-form path (and `*`), from pieces that sometimes rebuild the
/// route, kept to what `http::Uri` parses.
fn any_path() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        select(vec![
            "/",
            "api",
            "orders",
            "/api/orders/",
            "1",
            "..",
            ".",
            "//",
            "%2F",
            "%FF",
            "{id}",
            "<unmatched>",
            "x",
            "?",
            "?a=b",
            ";",
            "~",
            "%",
        ])
        .prop_map(str::to_owned),
        "[A-Za-z0-9._~!$&'()*+,;=:@%-]{1,8}",
    ];
    prop_oneof![
        1 => Just("*".to_owned()),
        12 => vec(piece, 0..10).prop_map(|pieces| format!("/{}", pieces.concat())),
    ]
    .prop_filter("a path http::Uri accepts", |path| path.parse::<Uri>().is_ok())
}

fn request_to(method: &Method, path_and_query: &str) -> Request<Body> {
    Request::builder().method(method.clone()).uri(path_and_query).body(Body::empty()).unwrap()
}

// ---------------------------------------------------------------------------
// Properties
// ---------------------------------------------------------------------------

/// The shrunk input `well_formed_forwarded_is_walked_from_the_right` found,
/// kept as a plain test. RFC 7239 section 6: `node = nodename [ ":"
/// node-port ]`, and `unknown` and obfuscated names are nodenames, so
/// `"unknown:0"` and `"_hidden:_port"` are hops that name no address, not
/// syntax errors: walking from the right, the client to their right is
/// found first.
#[test]
fn a_port_on_an_unknown_or_obfuscated_node_keeps_the_chain_well_formed() {
    let edge = Edge::behind(ClientIpHeader::Forwarded);
    let proxy: SocketAddr = "10.0.0.2:443".parse().unwrap();
    let client: IpAddr = "203.0.113.9".parse().unwrap();
    for value in [r#"for="unknown:0", for=203.0.113.9"#, r#"for="_hidden:_port", for=203.0.113.9"#]
    {
        let seen = edge.send(proxy, orders_request(&[(FORWARDED, value.as_bytes().to_vec())]));
        assert_eq!(seen.status, StatusCode::OK);
        assert_eq!(seen.requests[0].subject, edge.ip_digest(client), "{value}");
    }
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn forwarding_headers_from_an_untrusted_peer_change_nothing(
        peer in untrusted_peer(),
        headers in hostile_forwarding(),
    ) {
        let edge = Edge::new();
        let without = edge.send(peer, orders_request(&[]));
        let with = edge.send(peer, orders_request(&headers));
        prop_assert_eq!(with.status, StatusCode::OK);
        prop_assert_eq!(with.handler_runs, 1);
        prop_assert_eq!(only_subject(&with)?, only_subject(&without)?);
        prop_assert_eq!(only_subject(&with)?, &edge.ip_digest(peer.ip()));
    }

    #[test]
    fn forwarding_headers_from_a_trusted_peer_name_the_peer_or_a_written_address(
        peer in trusted_peer(),
        headers in hostile_forwarding(),
        source in select(vec![ClientIpHeader::XForwardedFor, ClientIpHeader::Forwarded]),
    ) {
        let edge = Edge::behind(source);
        let seen = edge.send(peer, orders_request(&headers));
        prop_assert_eq!(seen.status, StatusCode::OK);
        prop_assert_eq!(seen.handler_runs, 1);
        let subject = only_subject(&seen)?;
        let mut candidates = addresses_written_in(&headers, &source.name());
        candidates.push(peer.ip());
        prop_assert!(
            candidates.iter().any(|ip| &edge.ip_digest(*ip) == subject),
            "the subject is neither the peer nor an address in the headers"
        );
    }

    #[test]
    fn well_formed_x_forwarded_for_is_walked_from_the_right(
        peer in prop_oneof![3 => trusted_peer(), 1 => untrusted_peer()],
        entries in vec(x_forwarded_for_entry(), 1..12),
        breaks in vec(prop::bool::weighted(0.3), 1..12),
        decoy in option::of(address()),
    ) {
        let (hops, texts): (Vec<Hop>, Vec<String>) = entries.into_iter().unzip();
        let mut headers = into_lines(&X_FORWARDED_FOR, &texts, &breaks);
        // Beside an `X-Forwarded-For`, a client's `Forwarded` is never read.
        headers.extend(decoy.map(|ip| (FORWARDED, format!("for=\"{ip}\"").into_bytes())));
        let edge = Edge::new();
        let seen = edge.send(peer, orders_request(&headers));
        prop_assert_eq!(seen.status, StatusCode::OK);
        let expected = expected_client(peer.ip(), &hops);
        prop_assert_eq!(only_subject(&seen)?, &edge.ip_digest(expected),
            "expected client {}", expected);
    }

    #[test]
    fn well_formed_forwarded_is_walked_from_the_right(
        peer in prop_oneof![3 => trusted_peer(), 1 => untrusted_peer()],
        elements in vec((forwarded_element(), ows(), ows()), 1..10),
        breaks in vec(prop::bool::weighted(0.3), 1..10),
        decoy in option::of(address()),
    ) {
        let (hops, texts): (Vec<Hop>, Vec<String>) = elements
            .into_iter()
            .map(|((hop, text), left, right)| (hop, format!("{left}{text}{right}")))
            .unzip();
        let mut headers = into_lines(&FORWARDED, &texts, &breaks);
        // Behind proxies that write `Forwarded`, an `X-Forwarded-For` is
        // never consulted.
        headers.extend(decoy.map(|ip| (X_FORWARDED_FOR, ip.to_string().into_bytes())));
        let edge = Edge::behind(ClientIpHeader::Forwarded);
        let seen = edge.send(peer, orders_request(&headers));
        prop_assert_eq!(seen.status, StatusCode::OK);
        let expected = expected_client(peer.ip(), &hops);
        prop_assert_eq!(only_subject(&seen)?, &edge.ip_digest(expected),
            "expected client {}", expected);
    }

    #[test]
    fn junk_left_of_the_client_changes_nothing(
        peer in trusted_peer(),
        client in address().prop_filter("an untrusted client", |ip| !is_trusted(*ip)),
        proxies in vec(address().prop_filter("a trusted proxy", |ip| is_trusted(*ip)), 0..4),
        junk in hostile_value(),
        own_line in any::<bool>(),
        source in select(vec![ClientIpHeader::XForwardedFor, ClientIpHeader::Forwarded]),
    ) {
        // What the proxies appended: the client, then each proxy after it.
        let hop = |ip: IpAddr| match source {
            ClientIpHeader::XForwardedFor => ip.to_string(),
            ClientIpHeader::Forwarded => format!("for=\"{}\"", SocketAddr::new(ip, 443)),
        };
        let appended: Vec<String> = std::iter::once(client).chain(proxies).map(hop).collect();
        let appended = appended.join(", ").into_bytes();
        // The client's junk, on a line of its own or where the first proxy
        // appended to it.
        let name = source.name();
        let headers = if own_line {
            vec![(name.clone(), junk), (name, appended)]
        } else {
            vec![(name, [junk, b", ".to_vec(), appended].concat())]
        };
        let edge = Edge::behind(source);
        let seen = edge.send(peer, orders_request(&headers));
        prop_assert_eq!(seen.status, StatusCode::OK);
        prop_assert_eq!(only_subject(&seen)?, &edge.ip_digest(client), "expected {}", client);
    }

    #[test]
    fn api_keys_are_refused_with_400_exactly_when_invalid(
        peer in untrusted_peer(),
        keys in prop_oneof![4 => vec(api_key(), 1..=1), 1 => vec(api_key(), 2..=3)],
    ) {
        let edge = Edge::new();
        let lines: Vec<(HeaderName, Vec<u8>)> =
            keys.iter().map(|key| (API_KEY, key.clone())).collect();
        let seen = edge.send(peer, orders_request(&lines));
        if is_valid_api_key(&keys) {
            prop_assert_eq!(seen.status, StatusCode::OK);
            prop_assert_eq!(seen.handler_runs, 1);
            let key = std::str::from_utf8(&keys[0]).unwrap();
            let expected = edge.pseudonymizer.pseudonymize(SubjectKind::ApiKey, key);
            prop_assert_eq!(only_subject(&seen)?, &expected);
            prop_assert_eq!(&seen.requests[0].policies, &single("orders"));
        } else {
            prop_assert_eq!(seen.status, StatusCode::BAD_REQUEST);
            prop_assert_eq!(
                seen.content_type,
                Some(HeaderValue::from_static("application/problem+json"))
            );
            let body: serde_json::Value = serde_json::from_slice(&seen.body)
                .map_err(|error| TestCaseError::fail(format!("body is not JSON: {error}")))?;
            prop_assert_eq!(&body["type"], &format!("{DEFAULT_PROBLEM_TYPE_BASE}invalid-api-key"));
            prop_assert_eq!(&body["status"], 400);
            // Nothing charged, nothing served.
            prop_assert!(seen.requests.is_empty());
            prop_assert_eq!(seen.handler_runs, 0);
            // The refusal never echoes the key (short keys could match its
            // prose by chance, so only long ones are checked).
            for key in keys.iter().filter(|key| key.len() >= 16) {
                prop_assert!(!seen.body.windows(key.len()).any(|w| w == key.as_slice()));
            }
        }
    }

    #[test]
    fn any_id_segment_shares_the_bucket_of_orders_1(
        peer in untrusted_peer(),
        method in method(),
        segment in segment(),
        query in query(),
    ) {
        let path = match &query {
            Some(query) => format!("/api/orders/{segment}?{query}"),
            None => format!("/api/orders/{segment}"),
        };
        prop_assume!(path.parse::<Uri>().is_ok(), "http::Uri refuses {}", path);
        let edge = Edge::new();
        let reference = edge.send(peer, request_to(&method, ORDERS_1));
        let seen = edge.send(peer, request_to(&method, &path));
        prop_assert_ne!(seen.status, StatusCode::INTERNAL_SERVER_ERROR);
        prop_assert_eq!(only_subject(&seen)?, only_subject(&reference)?);
        prop_assert_eq!(only_operation(&seen)?, only_operation(&reference)?);
        prop_assert_eq!(&seen.requests[0].policies, &reference.requests[0].policies);
        prop_assert_eq!(only_subject(&seen)?, &edge.ip_digest(peer.ip()));
        if method == Method::GET {
            prop_assert_eq!(only_operation(&seen)?, &operation_digest(ORDER_OPERATION));
            prop_assert_eq!(&seen.requests[0].policies, &single("orders"));
        }
    }

    #[test]
    fn any_method_and_path_names_only_a_template_or_unmatched(
        peer in untrusted_peer(),
        method in method(),
        path in any_path(),
    ) {
        let edge = Edge::new();
        let seen = edge.send(peer, request_to(&method, &path));
        prop_assert_ne!(seen.status, StatusCode::INTERNAL_SERVER_ERROR);
        // The subject is the peer's whatever the path: the pseudonym holds
        // no operation.
        prop_assert_eq!(only_subject(&seen)?, &edge.ip_digest(peer.ip()));
        let operation = only_operation(&seen)?;
        let name = method_name(&method);
        // A HEAD is charged as the GET of its route.
        let template = charged_digest(&format!("{name} {ORDER_ROUTE}"));
        let unmatched = charged_digest(&format!("{name} {UNMATCHED_ROUTE}"));
        prop_assert!(operation == &template || operation == &unmatched, "neither template nor <unmatched>");
        let raw_path = path.parse::<Uri>().unwrap().path().to_owned();
        if !raw_path.starts_with("/api/orders/") {
            prop_assert_eq!(operation, &unmatched);
        }
        let get_or_head = method == Method::GET || method == Method::HEAD;
        let expected_policy =
            if get_or_head && operation == &template { "orders" } else { "default" };
        prop_assert_eq!(&seen.requests[0].policies, &single(expected_policy));
    }
}
