//! The operation id: method plus matched route template, never the raw
//! path; and its digest, the only form in which it reaches a key.

use axum::extract::MatchedPath;
use http::Method;
use http::request::Parts;
use sha2::{Digest, Sha256};
use shared_contract::OperationDigest;

/// Route placeholder of a request no route matched: raw paths never make
/// buckets, so every unmatched request of a method shares one operation.
pub const UNMATCHED_ROUTE: &str = "<unmatched>";

/// `"<METHOD> <route template>"`, e.g. `GET /api/orders/{id}`. Standard
/// methods keep their name; any extension method becomes `OTHER`, so a
/// client inventing methods cannot mint operations either.
pub(crate) fn operation_id(parts: &Parts) -> String {
    let route = parts.extensions.get::<MatchedPath>().map_or(UNMATCHED_ROUTE, MatchedPath::as_str);
    format!("{} {route}", method_name(&parts.method))
}

/// Bytes of SHA-256 kept in an [`OperationDigest`]: 64 bits tell apart the
/// few hundred operations one service has with no realistic collision, and
/// keep every operation-scoped key 16 characters short.
const OPERATION_DIGEST_BYTES: usize = 8;

/// The digest of an operation id: the lowercase hex of the first 8 bytes of
/// SHA-256 over its UTF-8 text (`"GET /api/orders/{id}"` gives
/// `6979b49c614fd4c4`), 16 hex digits. Unkeyed: route templates are no
/// secret, and every provider and tool can recompute it. It tells the keys
/// of operation-scoped policies apart.
pub fn operation_digest(operation: &str) -> OperationDigest {
    let hash = Sha256::digest(operation.as_bytes());
    OperationDigest::new(hex::encode(&hash[..OPERATION_DIGEST_BYTES]))
        .expect("16 lowercase hex digits form a valid operation digest")
}

fn method_name(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::PATCH => "PATCH",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        Method::CONNECT => "CONNECT",
        Method::TRACE => "TRACE",
        _ => "OTHER",
    }
}

#[cfg(test)]
mod tests {
    use http::Request;

    use super::*;

    #[test]
    fn without_a_matched_route_the_path_is_not_used() {
        let (parts, ()) = Request::get("/api/orders/123").body(()).unwrap().into_parts();
        assert_eq!(operation_id(&parts), "GET <unmatched>");
        let custom = Method::from_bytes(b"BREW").unwrap();
        let (parts, ()) = Request::builder().method(custom).body(()).unwrap().into_parts();
        assert_eq!(operation_id(&parts), "OTHER <unmatched>");
    }

    #[test]
    fn digests_match_vectors_computed_with_python_hashlib() {
        // python3 -c 'import hashlib; print(hashlib.sha256(OPERATION.encode()).hexdigest()[:16])'
        for (operation, expected) in [
            ("GET /api/orders/{id}", "6979b49c614fd4c4"),
            ("GET <unmatched>", "8c13b2e43046bcc7"),
            ("POST /api/orders", "6b48c5c57a698e41"),
        ] {
            assert_eq!(operation_digest(operation).as_str(), expected, "{operation}");
        }
    }
}
