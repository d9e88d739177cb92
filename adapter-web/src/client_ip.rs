//! The client IP: the socket peer, or, behind trusted proxies, the address
//! they forwarded.
//!
//! Only the socket peer cannot be forged. A forwarding header is read only
//! when the peer is a configured trusted proxy, and then from the right:
//! each trusted proxy appends the address it received from, so the
//! rightmost entry that is not itself a trusted proxy is the first address
//! nobody we trust can vouch beyond. Entries left of it are whatever the
//! client chose to send and are never used.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use http::HeaderMap;
use http::header::{FORWARDED, HeaderName};
use ipnet::IpNet;

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// The address a request counts against.
///
/// - `peer` not in `trusted`: `peer`, whatever the headers say.
/// - `peer` trusted: the hops of `Forwarded` (RFC 7239) if that header is
///   present at all, else those of `X-Forwarded-For`. **`Forwarded` wins
///   when both are present**: it is the standard form, and a proxy that
///   writes it is the one we configured. The hops are walked from the
///   right past trusted proxies; the first untrusted address is the client.
///   If every hop is trusted, the leftmost hop is the client.
/// - Falls back to `peer` when the chosen header is malformed (bad syntax,
///   an entry that is not an IP, bytes that are not visible ASCII) or the
///   walk reaches a hop that names no address (`unknown`, an obfuscated
///   `_node`, an element without `for`): the walk cannot see past it, and
///   the proxy we trust is the best identity left.
pub(crate) fn client_ip(peer: IpAddr, headers: &HeaderMap, trusted: &[IpNet]) -> IpAddr {
    let peer = peer.to_canonical();
    if !is_trusted(peer, trusted) {
        return peer;
    }
    let hops = if headers.contains_key(FORWARDED) {
        joined(headers, &FORWARDED).and_then(|text| forwarded_hops(&text))
    } else if headers.contains_key(&X_FORWARDED_FOR) {
        joined(headers, &X_FORWARDED_FOR).and_then(|text| x_forwarded_for_hops(&text))
    } else {
        return peer;
    };
    hops.and_then(|hops| walk_from_right(&hops, trusted)).unwrap_or(peer)
}

fn is_trusted(ip: IpAddr, trusted: &[IpNet]) -> bool {
    trusted.iter().any(|net| net.contains(&ip))
}

/// The values of every line of `name` joined with commas, as HTTP says
/// repeated list headers mean; `None` if a value is not visible ASCII.
fn joined(headers: &HeaderMap, name: &HeaderName) -> Option<String> {
    let values: Option<Vec<&str>> =
        headers.get_all(name).iter().map(|value| value.to_str().ok()).collect();
    Some(values?.join(","))
}

/// `Some(ip)` for the client, `None` to fall back to the peer.
fn walk_from_right(hops: &[Option<IpAddr>], trusted: &[IpNet]) -> Option<IpAddr> {
    let mut farthest_trusted = None;
    for hop in hops.iter().rev() {
        let ip = (*hop)?.to_canonical();
        if !is_trusted(ip, trusted) {
            return Some(ip);
        }
        farthest_trusted = Some(ip);
    }
    farthest_trusted
}

/// `X-Forwarded-For: client, proxy1, proxy2`; entries may carry a port
/// (`192.0.2.1:80`, `[2001:db8::1]:80`). `None` when any entry is bad.
fn x_forwarded_for_hops(text: &str) -> Option<Vec<Option<IpAddr>>> {
    text.split(',')
        .map(|entry| {
            let entry = entry.trim_matches([' ', '\t']);
            if let Ok(ip) = entry.parse::<IpAddr>() {
                return Some(Some(ip));
            }
            if let Ok(socket) = entry.parse::<SocketAddr>() {
                return Some(Some(socket.ip()));
            }
            let bracketed = entry.strip_prefix('[')?.strip_suffix(']')?;
            Some(Some(IpAddr::V6(bracketed.parse().ok()?)))
        })
        .collect()
}

/// The `for` node of each element of a `Forwarded` header (RFC 7239
/// section 4): `Some(ip)`, or `None` for a hop that names no address.
/// `None` overall when the syntax is broken or no element is present.
fn forwarded_hops(text: &str) -> Option<Vec<Option<IpAddr>>> {
    let mut cursor = Cursor { bytes: text.as_bytes(), at: 0 };
    let mut hops = Vec::new();
    loop {
        let mut node: Option<Option<IpAddr>> = None;
        let mut pairs = 0;
        loop {
            cursor.skip_whitespace();
            if matches!(cursor.peek(), None | Some(b',' | b';')) {
                // An empty pair is allowed by the grammar.
            } else {
                let name = cursor.token()?;
                cursor.expect(b'=')?;
                let value = cursor.value()?;
                pairs += 1;
                if name.eq_ignore_ascii_case("for") {
                    // Two `for` in one element leave the hop ambiguous.
                    if node.replace(parse_node(&value)?).is_some() {
                        return None;
                    }
                }
                cursor.skip_whitespace();
            }
            if cursor.peek() == Some(b';') {
                cursor.at += 1;
                continue;
            }
            break;
        }
        // Empty list elements carry nothing and are skipped, as HTTP lists allow.
        if pairs > 0 {
            hops.push(node.flatten());
        }
        match cursor.peek() {
            None => break,
            Some(b',') => cursor.at += 1,
            Some(_) => return None,
        }
    }
    (!hops.is_empty()).then_some(hops)
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
    // `nodename [ ":" node-port ]`: `unknown` and obfuscated names may carry a
    // port too (RFC 7239 section 6), and none of the unbracketed names holds a ':'.
    let (name, port) = match node.split_once(':') {
        Some((name, port)) => (name, Some(port)),
        None => (node, None),
    };
    if port.is_some_and(|port| !is_node_port(port)) {
        return None;
    }
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

/// A byte cursor over a header value, for the RFC 7239 grammar.
struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Cursor<'_> {
    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.at).copied()
    }

    fn skip_whitespace(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t')) {
            self.at += 1;
        }
    }

    fn expect(&mut self, byte: u8) -> Option<()> {
        (self.peek() == Some(byte)).then(|| self.at += 1)
    }

    fn token(&mut self) -> Option<String> {
        let start = self.at;
        while self.peek().is_some_and(is_tchar) {
            self.at += 1;
        }
        (self.at > start).then(|| String::from_utf8_lossy(&self.bytes[start..self.at]).into_owned())
    }

    /// A token or a quoted string with its escapes resolved.
    fn value(&mut self) -> Option<String> {
        if self.peek() != Some(b'"') {
            return self.token();
        }
        self.at += 1;
        let mut value = Vec::new();
        loop {
            match self.peek()? {
                b'"' => {
                    self.at += 1;
                    return String::from_utf8(value).ok();
                }
                b'\\' => {
                    self.at += 1;
                    value.push(self.peek()?);
                    self.at += 1;
                }
                byte => {
                    value.push(byte);
                    self.at += 1;
                }
            }
        }
    }
}

/// RFC 9110 `tchar`.
fn is_tchar(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&byte)
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;

    const PEER_PROXY: &str = "10.0.0.5";
    const UNTRUSTED_PEER: &str = "198.51.100.7";

    fn trusted() -> Vec<IpNet> {
        vec!["10.0.0.0/8".parse().unwrap(), "2001:db8:ffff::/48".parse().unwrap()]
    }

    fn resolve(peer: &str, headers: &[(&'static str, &str)]) -> String {
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            map.append(*name, HeaderValue::from_str(value).unwrap());
        }
        client_ip(peer.parse().unwrap(), &map, &trusted()).to_string()
    }

    #[test]
    fn headers_from_an_untrusted_peer_are_ignored() {
        let spoofed = [("x-forwarded-for", "203.0.113.9"), ("forwarded", "for=203.0.113.9")];
        assert_eq!(resolve(UNTRUSTED_PEER, &spoofed), UNTRUSTED_PEER);
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
    }

    #[test]
    fn forwarded_is_parsed_per_rfc_7239_and_wins_over_x_forwarded_for() {
        let both = [
            ("forwarded", r#"for=192.0.2.60;proto=http;by=203.0.113.43, for="10.3.3.3:8080""#),
            ("x-forwarded-for", "203.0.113.200"),
        ];
        assert_eq!(resolve(PEER_PROXY, &both), "192.0.2.60");
        let v6 = [("forwarded", r#"For="[2001:db8:cafe::17]:4711""#)];
        assert_eq!(resolve(PEER_PROXY, &v6), "2001:db8:cafe::17");
        let trusted_v6_hop = [("forwarded", r#"for=192.0.2.1, for="[2001:db8:ffff::1]""#)];
        assert_eq!(resolve(PEER_PROXY, &trusted_v6_hop), "192.0.2.1");
        let escaped = [("forwarded", r#"for="\192.0.2.61";secret="a\"b,c""#)];
        assert_eq!(resolve(PEER_PROXY, &escaped), "192.0.2.61");
    }

    #[test]
    fn malformed_headers_from_a_trusted_proxy_fall_back_to_the_peer() {
        for (name, value) in [
            ("x-forwarded-for", "not-an-ip"),
            ("x-forwarded-for", "203.0.113.9,,10.1.1.1"),
            ("x-forwarded-for", ""),
            ("forwarded", "for=2001:db8::1"),
            ("forwarded", "for=\"192.0.2.1"),
            ("forwarded", "for=192.0.2.1;for=192.0.2.2"),
            ("forwarded", "for 192.0.2.1"),
            ("forwarded", "for=192.0.2.1:99999"),
            ("forwarded", ", ,"),
            ("forwarded", "for=\"[2001:db8::1]x\""),
        ] {
            assert_eq!(resolve(PEER_PROXY, &[(name, value)]), PEER_PROXY, "{name}: {value}");
        }
        // A malformed Forwarded still wins: a well-formed X-Forwarded-For
        // beside it is not consulted.
        let both = [("forwarded", "garbage"), ("x-forwarded-for", "203.0.113.9")];
        assert_eq!(resolve(PEER_PROXY, &both), PEER_PROXY);
    }

    #[test]
    fn a_hop_without_an_address_stops_the_walk_at_the_peer() {
        for value in
            ["for=unknown, for=10.1.1.1", "for=_hidden", "proto=https", "for=192.0.2.1, by=_p"]
        {
            assert_eq!(resolve(PEER_PROXY, &[("forwarded", value)]), PEER_PROXY, "{value}");
        }
    }

    #[test]
    fn non_ascii_header_bytes_fall_back_to_the_peer() {
        let mut map = HeaderMap::new();
        map.insert("x-forwarded-for", HeaderValue::from_bytes(b"203.0.113.9\xff").unwrap());
        let ip = client_ip(PEER_PROXY.parse().unwrap(), &map, &trusted());
        assert_eq!(ip.to_string(), PEER_PROXY);
    }

    #[test]
    fn ipv4_mapped_peers_are_matched_as_ipv4() {
        let chain = [("x-forwarded-for", "203.0.113.9")];
        assert_eq!(resolve("::ffff:10.0.0.5", &chain), "203.0.113.9");
    }
}
