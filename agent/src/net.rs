//! The outbound network path of every client the agent builds (providers, the summarizer,
//! S3, MCP servers over HTTP): which certificate authorities it trusts and which forward
//! proxy it goes through.
//!
//! Trust is the platform's native roots plus the bundled Mozilla roots, plus PEM bundles: the
//! fleet's inline in `CAIRN_CA_BUNDLE_PEM` and the session's file named by `CAIRN_CA_BUNDLE`
//! (a TLS-inspecting corporate proxy's CA). Proxies follow the
//! usual variables — `HTTPS_PROXY`, `HTTP_PROXY`, `NO_PROXY` (or their lower-case forms) —
//! read from the agent's configuration environment and applied explicitly to each client, so
//! the provider clients and the S3 client agree on them.

use std::sync::Arc;

use aws_smithy_http_client::proxy::ProxyConfig;
use aws_smithy_http_client::tls::{TlsContext, TrustStore};

/// A setting of the network path that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error("CA bundle {path}: {reason}")]
    Bundle { path: String, reason: String },
    #[error("{var} {value:?}: {reason}")]
    Proxy {
        var: &'static str,
        value: String,
        reason: String,
    },
    #[error("{0}")]
    Client(String),
}

/// `e` and its sources, each said once: the reason a TLS handshake failed (an unknown
/// issuer, an expired certificate) is usually only in the innermost one.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut parts = vec![e.to_string()];
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        source = s.source();
    }
    parts.join(": ")
}

/// How the agent's clients reach the outside.
#[derive(Clone, Debug, Default)]
pub struct NetPath {
    /// Extra trusted certificate authorities, PEM.
    pub ca_bundle: Option<Arc<Vec<u8>>>,
    /// Proxy for `http://` URLs.
    pub http_proxy: Option<String>,
    /// Proxy for `https://` URLs (tunnelled with CONNECT).
    pub https_proxy: Option<String>,
    /// Hosts (comma-separated, as curl reads `NO_PROXY`) reached directly.
    pub no_proxy: Option<String>,
}

impl NetPath {
    /// Reads the path from an environment lookup; the bundle file is read and checked here,
    /// so a wrong path is an error at start-up, not a TLS failure on the first turn.
    pub fn from_env(env: impl Fn(&str) -> Option<String>) -> Result<Self, NetError> {
        let var = |upper: &str, lower: &str| {
            env(upper)
                .or_else(|| env(lower))
                .filter(|v| !v.trim().is_empty())
        };
        // The fleet's bundle inline, then the session's mounted one.
        let mut pem = Vec::new();
        if let Some(inline) = env("CAIRN_CA_BUNDLE_PEM").filter(|p| !p.trim().is_empty()) {
            pem.extend(checked("CAIRN_CA_BUNDLE_PEM", inline.into_bytes())?);
            pem.push(b'\n');
        }
        if let Some(path) = env("CAIRN_CA_BUNDLE").filter(|p| !p.trim().is_empty()) {
            let bytes = std::fs::read(&path).map_err(|e| NetError::Bundle {
                path: path.clone(),
                reason: e.to_string(),
            })?;
            pem.extend(checked(&path, bytes)?);
        }
        let ca_bundle = (!pem.is_empty()).then(|| Arc::new(pem));
        let net = Self {
            ca_bundle,
            http_proxy: var("HTTP_PROXY", "http_proxy"),
            https_proxy: var("HTTPS_PROXY", "https_proxy"),
            no_proxy: var("NO_PROXY", "no_proxy"),
        };
        for (name, value) in [
            ("HTTP_PROXY", &net.http_proxy),
            ("HTTPS_PROXY", &net.https_proxy),
        ] {
            if let Some(v) = value {
                reqwest::Proxy::all(v.as_str()).map_err(|e| NetError::Proxy {
                    var: name,
                    value: v.clone(),
                    reason: e.to_string(),
                })?;
            }
        }
        Ok(net)
    }

    /// `builder` with this path's trust and proxies (and nothing read from the process
    /// environment behind the configuration's back).
    pub fn reqwest(&self, builder: reqwest::ClientBuilder) -> reqwest::ClientBuilder {
        let mut b = builder.no_proxy();
        if let Some(pem) = &self.ca_bundle {
            // Checked when the path was read.
            for cert in reqwest::Certificate::from_pem_bundle(pem).unwrap_or_default() {
                b = b.add_root_certificate(cert);
            }
        }
        let no_proxy = || {
            self.no_proxy
                .as_deref()
                .and_then(reqwest::NoProxy::from_string)
        };
        if let Some(p) = self
            .http_proxy
            .as_deref()
            .and_then(|u| reqwest::Proxy::http(u).ok())
        {
            b = b.proxy(p.no_proxy(no_proxy()));
        }
        if let Some(p) = self
            .https_proxy
            .as_deref()
            .and_then(|u| reqwest::Proxy::https(u).ok())
        {
            b = b.proxy(p.no_proxy(no_proxy()));
        }
        b
    }

    /// The MCP streamable-HTTP client (rmcp's own reqwest) with this path's trust and
    /// proxies, the same as [`Self::reqwest`] gives the provider clients.
    pub fn mcp_client(&self) -> Result<reqwest_mcp::Client, NetError> {
        // rmcp's reqwest takes its TLS crypto from the process-wide provider; ring is the one
        // the rest of the agent uses. Installing it twice is harmless.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut b = reqwest_mcp::Client::builder().no_proxy();
        if let Some(pem) = &self.ca_bundle {
            let certs =
                reqwest_mcp::Certificate::from_pem_bundle(pem).map_err(|e| NetError::Bundle {
                    path: "CA bundle".into(),
                    reason: e.to_string(),
                })?;
            b = b.tls_certs_merge(certs);
        }
        let no_proxy = || {
            self.no_proxy
                .as_deref()
                .and_then(reqwest_mcp::NoProxy::from_string)
        };
        let proxies = [
            ("HTTP_PROXY", &self.http_proxy, false),
            ("HTTPS_PROXY", &self.https_proxy, true),
        ];
        for (var, url, https) in proxies {
            let Some(url) = url.as_deref() else { continue };
            let proxy = if https {
                reqwest_mcp::Proxy::https(url)
            } else {
                reqwest_mcp::Proxy::http(url)
            }
            .map_err(|e| NetError::Proxy {
                var,
                value: url.to_owned(),
                reason: e.to_string(),
            })?;
            b = b.proxy(proxy.no_proxy(no_proxy()));
        }
        b.build()
            .map_err(|e| NetError::Client(format!("the MCP HTTP client: {e}")))
    }

    /// The S3 client's TLS context: native roots plus the bundle.
    pub fn s3_tls(&self) -> Option<TlsContext> {
        let pem = self.ca_bundle.as_ref()?;
        let store = TrustStore::default()
            .with_native_roots(true)
            .with_pem_certificate(pem.as_slice());
        TlsContext::builder()
            .with_trust_store(store)
            .build()
            .map_err(|e| tracing::warn!(error = %e, "the CA bundle cannot be used for S3"))
            .ok()
    }

    /// The S3 client's proxies.
    pub fn s3_proxy(&self) -> Option<ProxyConfig> {
        let (uri, https_only) = match (&self.http_proxy, &self.https_proxy) {
            (None, None) => return None,
            (Some(h), Some(s)) if h == s => (h, false),
            // One proxy serves both schemes here; an https one wins for TLS endpoints.
            (_, Some(s)) => (s, true),
            (Some(h), None) => (h, false),
        };
        let config = if https_only {
            ProxyConfig::https(uri.as_str())
        } else {
            ProxyConfig::all(uri.as_str())
        };
        match config {
            Ok(c) => Some(match &self.no_proxy {
                Some(n) => c.no_proxy(n.as_str()),
                None => c,
            }),
            Err(e) => {
                tracing::warn!(error = %e, "the proxy cannot be used for S3");
                None
            }
        }
    }
}

/// `pem` when it holds at least one certificate; `from` names it in the error.
fn checked(from: &str, pem: Vec<u8>) -> Result<Vec<u8>, NetError> {
    let err = |reason: String| NetError::Bundle {
        path: from.to_owned(),
        reason,
    };
    match reqwest::Certificate::from_pem_bundle(&pem) {
        Ok(certs) if !certs.is_empty() => Ok(pem),
        Ok(_) => Err(err("holds no PEM certificate".into())),
        Err(e) => Err(err(e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| pairs.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
    }

    #[test]
    fn proxies_come_from_either_case_and_bad_settings_are_named() {
        let net = NetPath::from_env(env(&[
            ("https_proxy", "http://127.0.0.1:3128"),
            ("NO_PROXY", "localhost"),
        ]))
        .unwrap();
        assert_eq!(net.https_proxy.as_deref(), Some("http://127.0.0.1:3128"));
        assert_eq!(net.http_proxy, None);
        assert!(net.s3_proxy().is_some());
        let e = NetPath::from_env(env(&[("CAIRN_CA_BUNDLE", "/nonexistent/ca.pem")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("/nonexistent/ca.pem"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let not_pem = dir.path().join("ca.pem");
        std::fs::write(&not_pem, "hello").unwrap();
        let e = NetPath::from_env(env(&[("CAIRN_CA_BUNDLE", not_pem.to_str().unwrap())]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("no PEM certificate"), "{e}");
        assert!(NetPath::from_env(env(&[("HTTP_PROXY", "::not a url")])).is_err());
    }
}
