//! The operation id: method plus matched route template, never the raw
//! path; and its digest, the only form in which it reaches a key.

use std::collections::HashMap;
use std::ops::Deref;
use std::sync::{Arc, PoisonError, RwLock};

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
#[cfg(test)]
pub(crate) fn operation_id(parts: &Parts) -> String {
    format!("{} {}", METHODS[method_index(&parts.method)], route(parts))
}

fn route(parts: &Parts) -> &str {
    parts.extensions.get::<MatchedPath>().map_or(UNMATCHED_ROUTE, MatchedPath::as_str)
}

/// One operation as the bridge uses it: its id (for log lines), its
/// digest, and the configured policy set it runs under, if any.
#[derive(Debug)]
pub(crate) struct Operation {
    pub(crate) id: Box<str>,
    pub(crate) digest: OperationDigest,
    /// The index of its configured set; `None` for the default set.
    pub(crate) set: Option<usize>,
}

impl Operation {
    fn new(id: String, set: Option<usize>) -> Self {
        Self { digest: charged_digest(&id), id: id.into_boxed_str(), set }
    }
}

/// Operations by method and route template, so a request's operation is
/// found without writing its id and hashing it again: the configured ones
/// from the start, the others (which run under the default set) added the
/// first time one is seen. Route templates are the router's, a fixed
/// handful, so the seen ones stay few; past [`MAX_SEEN_OPERATIONS`]
/// further ones are computed per request instead of kept.
#[derive(Debug)]
pub(crate) struct Operations {
    configured: [Routes<Operation>; METHODS.len()],
    seen: RwLock<Seen>,
}

/// The unconfigured operations seen so far, by method, and how many.
type Seen = ([Routes<Arc<Operation>>; METHODS.len()], usize);

/// Operations of one method by route template. foldhash, not SipHash:
/// every request looks its route up once or twice, and the keys are the
/// router's templates, never a client's text.
type Routes<T> = HashMap<Box<str>, T, foldhash::fast::RandomState>;

/// How many unconfigured operations are kept at most.
const MAX_SEEN_OPERATIONS: usize = 4096;

/// A request's operation: a configured one, or one seen before (or not).
#[derive(Debug)]
pub(crate) enum Found<'a> {
    Configured(&'a Operation),
    Seen(Arc<Operation>),
}

impl Deref for Found<'_> {
    type Target = Operation;

    fn deref(&self) -> &Operation {
        match self {
            Self::Configured(operation) => operation,
            Self::Seen(operation) => operation,
        }
    }
}

impl Operations {
    /// The table of `configured` operation ids (`"<METHOD> <route>"`) with
    /// the index of each one's set. An id no request can have (an unknown
    /// method name, no route) is left out: no request would ever find it.
    pub(crate) fn new<'a>(configured: impl IntoIterator<Item = (&'a str, usize)>) -> Self {
        let mut table: [Routes<Operation>; METHODS.len()] = Default::default();
        for (id, set) in configured {
            let Some((method, route)) = id.split_once(' ') else { continue };
            if let Some(index) = METHODS.iter().position(|known| *known == method) {
                table[index].insert(route.into(), Operation::new(id.to_owned(), Some(set)));
            }
        }
        Self { configured: table, seen: RwLock::default() }
    }

    /// The operation of a request: the method plus axum's `MatchedPath`.
    /// A HEAD is the GET of its route (axum answers it with the GET
    /// handler), unless `HEAD <route>` is configured itself; either way it
    /// is charged under the GET's digest.
    pub(crate) fn find(&self, parts: &Parts) -> Found<'_> {
        let route = route(parts);
        let method = match method_index(&parts.method) {
            HEAD if !self.configured[HEAD].contains_key(route) => GET,
            method => method,
        };
        if let Some(operation) = self.configured[method].get(route) {
            return Found::Configured(operation);
        }
        let read = self.seen.read().unwrap_or_else(PoisonError::into_inner);
        if let Some(operation) = read.0[method].get(route) {
            return Found::Seen(Arc::clone(operation));
        }
        drop(read);
        let operation = Arc::new(Operation::new(format!("{} {route}", METHODS[method]), None));
        let mut seen = self.seen.write().unwrap_or_else(PoisonError::into_inner);
        let (by_method, count) = &mut *seen;
        if *count < MAX_SEEN_OPERATIONS && !by_method[method].contains_key(route) {
            by_method[method].insert(route.into(), Arc::clone(&operation));
            *count += 1;
        }
        Found::Seen(operation)
    }

    #[cfg(test)]
    fn seen(&self) -> usize {
        self.seen.read().unwrap_or_else(PoisonError::into_inner).1
    }
}

/// The digest of an operation id: the first 8 bytes of SHA-256 over its
/// UTF-8 text as a big-endian 64-bit number, printed as 16 hex digits
/// (`"GET /api/orders/{id}"` gives `6979b49c614fd4c4`). 64 bits tell apart
/// the few hundred operations one service has with no realistic collision,
/// and keep every operation-scoped key 16 characters short. Unkeyed: route
/// templates are no secret, and every provider and tool can recompute it.
/// It tells the keys of operation-scoped policies apart.
pub fn operation_digest(operation: &str) -> OperationDigest {
    let hash: [u8; 32] = Sha256::digest(operation.as_bytes()).into();
    let (first, _) = hash.split_first_chunk::<8>().unwrap_or((&[0; 8], &[]));
    OperationDigest::from_u64(u64::from_be_bytes(*first))
}

/// The digest a request of `operation` is charged under: its own, except
/// that a HEAD is charged as the GET of its route (`"HEAD /api/orders/{id}"`
/// gives the digest of `"GET /api/orders/{id}"`), so a HEAD spends the
/// GET's operation-scoped budget even when it is mapped to a set of its
/// own. The admin routes name budgets by operation with it.
pub fn charged_digest(operation: &str) -> OperationDigest {
    match operation.strip_prefix("HEAD ") {
        Some(route) => operation_digest(&format!("GET {route}")),
        None => operation_digest(operation),
    }
}

/// The indexes of the two methods a HEAD is found between.
const GET: usize = 0;
const HEAD: usize = 5;

/// The method names an operation id can start with; a method's index in
/// it is [`method_index`]. Every extension method is charged as `OTHER`.
pub const METHODS: [&str; 10] =
    ["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS", "CONNECT", "TRACE", "OTHER"];

fn method_index(method: &Method) -> usize {
    match *method {
        Method::GET => GET,
        Method::POST => 1,
        Method::PUT => 2,
        Method::DELETE => 3,
        Method::PATCH => 4,
        Method::HEAD => HEAD,
        Method::OPTIONS => 6,
        Method::CONNECT => 7,
        Method::TRACE => 8,
        _ => 9,
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
    fn an_unconfigured_operation_is_kept_once_with_its_digest_and_the_default_set() {
        let operations = Operations::new([("POST <unmatched>", 3), ("BREW <unmatched>", 4)]);
        let (get, ()) = Request::get("/api/orders/123").body(()).unwrap().into_parts();
        for _ in 0..3 {
            let found = operations.find(&get);
            assert_eq!((&*found.id, found.set), ("GET <unmatched>", None));
            assert_eq!(found.digest.to_string(), "8c13b2e43046bcc7");
        }
        assert_eq!(operations.seen(), 1);
        let (post, ()) = Request::post("/").body(()).unwrap().into_parts();
        let found = operations.find(&post);
        assert_eq!((&*found.id, found.set), ("POST <unmatched>", Some(3)));
        assert_eq!(found.digest, operation_digest("POST <unmatched>"));
        // An extension method is OTHER, never the configured "BREW" id.
        let brew = Method::from_bytes(b"BREW").unwrap();
        let (brew, ()) = Request::builder().method(brew).body(()).unwrap().into_parts();
        let found = operations.find(&brew);
        assert_eq!((&*found.id, found.set), ("OTHER <unmatched>", None));
        assert_eq!(operations.seen(), 2);
    }

    #[test]
    fn a_head_is_the_get_of_its_route_unless_mapped_itself_and_always_charged_as_it() {
        let get = || Request::get("/x").body(()).unwrap().into_parts().0;
        let head = || Request::head("/x").body(()).unwrap().into_parts().0;
        let operations = Operations::new([("GET <unmatched>", 1)]);
        let found = operations.find(&head());
        assert_eq!((&*found.id, found.set), ("GET <unmatched>", Some(1)));
        assert_eq!(found.digest, operation_digest("GET <unmatched>"));
        // Mapped itself: its own set, the GET's budget key.
        let operations = Operations::new([("GET <unmatched>", 1), ("HEAD <unmatched>", 2)]);
        let found = operations.find(&head());
        assert_eq!((&*found.id, found.set), ("HEAD <unmatched>", Some(2)));
        assert_eq!(found.digest, operation_digest("GET <unmatched>"));
        assert_eq!(operations.find(&get()).set, Some(1));
        // Neither configured: one seen operation for both methods.
        let operations = Operations::new([]);
        assert_eq!(operations.find(&head()).digest, operations.find(&get()).digest);
        assert_eq!(operations.seen(), 1);
        assert_eq!(
            charged_digest("HEAD /api/orders/{id}"),
            operation_digest("GET /api/orders/{id}")
        );
        assert_eq!(charged_digest("POST /api/orders"), operation_digest("POST /api/orders"));
    }

    #[test]
    fn digests_match_vectors_computed_with_python_hashlib() {
        // python3 -c 'import hashlib; print(hashlib.sha256(OPERATION.encode()).hexdigest()[:16])'
        for (operation, expected) in [
            ("GET /api/orders/{id}", "6979b49c614fd4c4"),
            ("GET <unmatched>", "8c13b2e43046bcc7"),
            ("POST /api/orders", "6b48c5c57a698e41"),
        ] {
            assert_eq!(operation_digest(operation).to_string(), expected, "{operation}");
        }
    }
}
