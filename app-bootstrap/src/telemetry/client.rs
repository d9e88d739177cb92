//! The exporter's HTTP client: hyper, with rustls (ring, no OpenSSL) for
//! an `https` collector, trusting a pinned CA file or the OS store.

use std::sync::Arc;

use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use opentelemetry_http::hyper::HyperClient;
use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};

use crate::config::OtlpConfig;

/// The client, run on the application's runtime: the batch processor
/// exports from a thread of its own, which has none for hyper.
#[derive(Debug)]
pub(super) struct OnRuntime {
    client: Arc<HyperClient<HttpsConnector<HttpConnector>>>,
    runtime: tokio::runtime::Handle,
}

#[async_trait::async_trait]
impl HttpClient for OnRuntime {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let client = Arc::clone(&self.client);
        self.runtime.spawn(async move { client.send_bytes(request).await }).await?
    }
}

/// The client for the collector at `uri`, or (the part that failed, what
/// is wrong). Call it inside the tokio runtime.
pub(super) fn for_collector(
    uri: &axum::http::Uri,
    otlp: &OtlpConfig,
) -> Result<OnRuntime, (&'static str, String)> {
    const CLIENT: &str = "the OTLP exporter's HTTP client";
    // An http endpoint never starts TLS: no root is ever consulted.
    let roots = match uri.scheme_str() {
        Some("https") => trusted(otlp.ca_file.as_deref(), |name| std::env::var(name).ok())
            .map_err(|reason| ("the OTLP exporter's TLS roots", reason))?,
        _ => rustls::RootCertStore::empty(),
    };
    let ring = rustls::crypto::ring::default_provider();
    let tls = rustls::ClientConfig::builder_with_provider(ring.into())
        .with_safe_default_protocol_versions()
        .map_err(|error| (CLIENT, error.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector =
        HttpsConnectorBuilder::new().with_tls_config(tls).https_or_http().enable_http1().build();
    let runtime =
        tokio::runtime::Handle::try_current().map_err(|error| (CLIENT, error.to_string()))?;
    Ok(OnRuntime { client: Arc::new(HyperClient::new(connector, otlp.timeout, None)), runtime })
}

/// The exporter's standard variables naming a collector's CA file, which
/// its HTTP client does not read itself.
const CERTIFICATE_VARIABLES: [&str; 2] =
    ["OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", "OTEL_EXPORTER_OTLP_CERTIFICATE"];

/// The roots an `https` collector is checked against: the PEM file of
/// `telemetry.otlp.ca-file` (the key wins, as keys do), else of a
/// [`CERTIFICATE_VARIABLES`], alone; else the OS store as
/// rustls-native-certs reads it (`SSL_CERT_FILE`, `SSL_CERT_DIR`).
fn trusted(
    ca_file: Option<&str>,
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<rustls::RootCertStore, String> {
    // An empty variable is an unset one (the OpenTelemetry convention).
    let set = |name: &'static str| lookup(name).filter(|value| !value.is_empty());
    let pinned = ca_file
        .map(|path| ("telemetry.otlp.ca-file", path.to_owned()))
        .or_else(|| CERTIFICATE_VARIABLES.into_iter().find_map(|name| Some((name, set(name)?))));
    if let Some((source, path)) = pinned {
        return pem_roots(&path).map_err(|problem| format!("{source} ({path}) {problem}"));
    }
    let named: Vec<&str> =
        ["SSL_CERT_FILE", "SSL_CERT_DIR"].into_iter().filter(|name| set(name).is_some()).collect();
    let place =
        if named.is_empty() { "the OS certificate store".into() } else { named.join(" / ") };
    let found = rustls_native_certs::load_native_certs();
    // The OS store may hold an unreadable entry; a named place may not.
    if !named.is_empty() && !found.errors.is_empty() {
        let errors: Vec<String> = found.errors.iter().map(ToString::to_string).collect();
        return Err(format!("{place}: {}", errors.join("; ")));
    }
    let mut roots = rustls::RootCertStore::empty();
    roots.add_parsable_certificates(found.certs);
    if roots.is_empty() {
        return Err(format!("no root certificate found in {place}"));
    }
    Ok(roots)
}

/// The CA certificates of the PEM file at `path`, or what is wrong with
/// it (said after the file's name).
pub(crate) fn pem_roots(path: &str) -> Result<rustls::RootCertStore, String> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let pem = std::fs::read(path).map_err(|error| format!("cannot be read: {error}"))?;
    let mut roots = rustls::RootCertStore::empty();
    for (at, certificate) in CertificateDer::pem_slice_iter(&pem).enumerate() {
        let number = at + 1;
        let certificate = certificate
            .map_err(|error| format!("has a broken PEM certificate (number {number}): {error}"))?;
        roots.add(certificate).map_err(|error| {
            format!("has a certificate (number {number}) that is no usable CA: {error}")
        })?;
    }
    if roots.is_empty() {
        return Err("holds no PEM certificate (-----BEGIN CERTIFICATE-----)".to_owned());
    }
    Ok(roots)
}

#[cfg(test)]
mod tests {
    use super::trusted;

    fn only(name: &'static str, value: &'static str) -> impl Fn(&str) -> Option<String> {
        move |asked: &str| (asked == name).then(|| value.to_owned())
    }

    #[test]
    fn the_ca_file_key_wins_over_a_certificate_variable() {
        let lookup = only("OTEL_EXPORTER_OTLP_CERTIFICATE", "/etc/collector-ca.pem");
        let missing = trusted(Some("/nonexistent/ca.pem"), lookup).unwrap_err();
        assert!(
            missing.starts_with("telemetry.otlp.ca-file (/nonexistent/ca.pem) cannot be read"),
            "{missing}"
        );
        // An empty variable is an unset one.
        let empty = only("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", "");
        let variable = |name: &str| match name {
            "OTEL_EXPORTER_OTLP_CERTIFICATE" => Some("/nonexistent/general.pem".to_owned()),
            _ => empty(name),
        };
        let missing = trusted(None, variable).unwrap_err();
        assert!(missing.starts_with("OTEL_EXPORTER_OTLP_CERTIFICATE (/nonexistent"), "{missing}");
    }
}
