//! The client IP: the socket peer, or, behind trusted proxies, the address
//! they forwarded.
//!
//! Only the socket peer cannot be forged. A forwarding header is read only
//! when the peer is a configured trusted proxy, and only the one header
//! those proxies write ([`ClientIpHeader`]): a proxy that appends to one
//! passes the other through as the client sent it. That header is read
//! from the right: each trusted proxy appends the address it received
//! from, so the rightmost entry that is not itself a trusted proxy is the
//! first address nobody we trust can vouch beyond. Entries left of it are
//! whatever the client chose to send: they are never parsed, so nothing
//! written there changes the subject.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use http::{HeaderMap, HeaderValue};
use ipnet::IpNet;

use crate::settings::ClientIpHeader;

/// The address a request counts against.
///
/// - `peer` not in `trusted`: `peer`, whatever the headers say.
/// - `peer` trusted: the hops of `header` (`X-Forwarded-For`, or RFC 7239
///   `Forwarded`; the other header is never read), every line of it as one
///   comma-separated list, walked from the right: a trusted address is
///   passed, and **the first untrusted address is the client**. Nothing
///   left of it is parsed.
/// - The walk stops early at a hop it cannot read: an entry that is not an
///   address (bad syntax, bytes that are not visible ASCII, an empty
///   `X-Forwarded-For` entry) or a `Forwarded` hop that names no address
///   (`unknown`, an obfuscated `_node`, an element without `for`). Only a
///   trusted proxy writes the entries the walk reaches, so such a hop is a
///   proxy hiding or garbling the client it received from; the client is
///   then **the nearest address the walk could vouch for: the trusted hop
///   right of it**, which is the proxy that wrote it (the peer when it is
///   the rightmost entry). That is the narrowest budget left: the clients of
///   that one proxy, not of every proxy in front of it.
/// - No header, or every hop trusted: the farthest trusted address reached
///   (the leftmost hop; the peer when there is none).
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
    // Repeated lines are one list (RFC 9110 section 5.3): the last line's
    // last entry is the rightmost hop. Each line is split on its own, so a
    // client's broken line cannot swallow a proxy's well-formed one.
    let lines = headers.get_all(header.name()).iter().rev().map(HeaderValue::as_bytes);
    match header {
        ClientIpHeader::XForwardedFor => {
            let hops = lines.flat_map(|line| line.rsplit(|&byte| byte == b','));
            walk_from_right(peer, hops.map(x_forwarded_for_hop), trusted)
        }
        ClientIpHeader::Forwarded => {
            let hops = lines.flat_map(ForwardedElements::new).filter_map(forwarded_hop);
            walk_from_right(peer, hops, trusted)
        }
    }
}

fn is_trusted(ip: IpAddr, trusted: &[IpNet]) -> bool {
    trusted.iter().any(|net| net.contains(&ip))
}

/// The first untrusted address of `hops` (rightmost first), else the
/// farthest trusted one the walk reached before the hops ran out or one
/// named no address (`None`), else `peer`. Lazy: it pulls, and so parses,
/// no hop past the one it stops at.
fn walk_from_right(
    peer: IpAddr,
    hops: impl Iterator<Item = Option<IpAddr>>,
    trusted: &[IpNet],
) -> IpAddr {
    let mut farthest_trusted = peer;
    for hop in hops {
        let Some(ip) = hop else { break };
        let ip = ip.to_canonical();
        if !is_trusted(ip, trusted) {
            return ip;
        }
        farthest_trusted = ip;
    }
    farthest_trusted
}

/// One `X-Forwarded-For` entry: `client`, possibly with a port
/// (`192.0.2.1:80`, `[2001:db8::1]:80`) or brackets (`[2001:db8::1]`);
/// `None` for anything else, the empty entry included.
fn x_forwarded_for_hop(entry: &[u8]) -> Option<IpAddr> {
    let entry = std::str::from_utf8(entry).ok()?.trim_matches([' ', '\t']);
    if let Ok(ip) = entry.parse::<IpAddr>() {
        return Some(ip);
    }
    if let Ok(socket) = entry.parse::<SocketAddr>() {
        return Some(socket.ip());
    }
    let bracketed = entry.strip_prefix('[')?.strip_suffix(']')?;
    Some(IpAddr::V6(bracketed.parse().ok()?))
}

/// The elements of one `Forwarded` line, rightmost first: the line split at
/// its commas outside quoted strings, found scanning from the right. A
/// quoted string there ends at its last `"` and starts at the nearest `"`
/// left of that which follows an even run of backslashes (an odd run
/// escapes it). In well-formed text that is exact, so the elements a
/// trusted proxy appended are found whatever precedes them; junk further
/// left may be cut oddly, but then it fails to parse as an element, and
/// the walk stops there.
struct ForwardedElements<'a> {
    /// What is left to split: `line[..end]`.
    line: &'a [u8],
    end: Option<usize>,
}

impl<'a> ForwardedElements<'a> {
    fn new(line: &'a [u8]) -> Self {
        Self { line, end: Some(line.len()) }
    }
}

impl<'a> Iterator for ForwardedElements<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        let end = self.end?;
        let mut at = end;
        while at > 0 {
            at -= 1;
            match self.line[at] {
                b',' => {
                    self.end = Some(at);
                    return Some(&self.line[at + 1..end]);
                }
                b'"' => match opening_quote(&self.line[..at]) {
                    Some(open) => at = open,
                    // An unbalanced quote: the rest is one (broken) element.
                    None => break,
                },
                _ => {}
            }
        }
        self.end = None;
        Some(&self.line[..end])
    }
}

/// Where the quoted string that ends just after `text` opens: the last `"`
/// of `text` not escaped by an odd run of backslashes before it.
fn opening_quote(text: &[u8]) -> Option<usize> {
    let mut at = text.len();
    while at > 0 {
        at -= 1;
        if text[at] == b'"' {
            let backslashes = text[..at].iter().rev().take_while(|&&b| b == b'\\').count();
            if backslashes % 2 == 0 {
                return Some(at);
            }
        }
    }
    None
}

/// The hop one `Forwarded` element (RFC 7239 section 4) names:
/// `Some(Some(ip))`, `Some(None)` for an element that names no address
/// (no `for`, `unknown`, an obfuscated node) or is malformed, and `None`
/// for an element with no pairs at all, which HTTP lists allow and which
/// carries nothing.
fn forwarded_hop(element: &[u8]) -> Option<Option<IpAddr>> {
    let mut cursor = Cursor { bytes: element, at: 0 };
    let mut node: Option<Option<IpAddr>> = None;
    let mut pairs = 0;
    loop {
        cursor.skip_whitespace();
        match cursor.peek() {
            None => break,
            // An empty pair is allowed by the grammar.
            Some(b';') => {}
            Some(_) => {
                let Some((name, value)) = cursor.pair() else { return Some(None) };
                pairs += 1;
                if name.eq_ignore_ascii_case(b"for") {
                    let node_text = std::str::from_utf8(&value).ok();
                    let Some(parsed) = node_text.and_then(parse_node) else { return Some(None) };
                    // Two `for` in one element leave the hop ambiguous.
                    if node.replace(parsed).is_some() {
                        return Some(None);
                    }
                }
                cursor.skip_whitespace();
            }
        }
        match cursor.peek() {
            Some(b';') => cursor.at += 1,
            None => break,
            Some(_) => return Some(None),
        }
    }
    (pairs > 0).then(|| node.flatten())
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

/// A byte cursor over one `Forwarded` element, for the RFC 7239 grammar.
struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.at).copied()
    }

    fn skip_whitespace(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t')) {
            self.at += 1;
        }
    }

    /// `token "=" value`, the value with its escapes resolved.
    fn pair(&mut self) -> Option<(&'a [u8], Vec<u8>)> {
        let name = self.token()?;
        (self.peek() == Some(b'=')).then(|| self.at += 1)?;
        let value = if self.peek() == Some(b'"') { self.quoted()? } else { self.token()?.to_vec() };
        Some((name, value))
    }

    fn token(&mut self) -> Option<&'a [u8]> {
        let start = self.at;
        while self.peek().is_some_and(is_tchar) {
            self.at += 1;
        }
        (self.at > start).then(|| &self.bytes[start..self.at])
    }

    /// A quoted string, its escapes resolved.
    fn quoted(&mut self) -> Option<Vec<u8>> {
        self.at += 1;
        let mut value = Vec::new();
        loop {
            match self.peek()? {
                b'"' => {
                    self.at += 1;
                    return Some(value);
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
