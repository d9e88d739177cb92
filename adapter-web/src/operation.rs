//! The operation id: method plus matched route template, never the raw path.

use axum::extract::MatchedPath;
use http::Method;
use http::request::Parts;

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
}
