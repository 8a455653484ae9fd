//! `countersign healthcheck URL`: one GET of a service's `/readyz` (or `/healthz`), for a
//! container's healthcheck. The image has no shell, curl or wget to run one; the operator's
//! binary is in it, so compose runs `countersign healthcheck http://127.0.0.1:PORT/readyz` in
//! each service's container. Ready is a 200 within the timeout; anything else (another status,
//! a refused connection, no answer in time) is not, and the command exits non-zero.

use std::time::Duration;

use http_body_util::Empty;
use hyper::body::Bytes;
use hyper::{StatusCode, Uri};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// Why a service is not ready, or the URL cannot be asked.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HealthcheckError {
    /// Only plain HTTP: the surfaces are served on a local port without TLS.
    #[error("{0} is not an http://HOST:PORT/PATH URL")]
    NotHttp(String),
    #[error("{url} did not answer within {timeout:?}")]
    Timeout { url: Uri, timeout: Duration },
    #[error("{url} cannot be reached: {source}")]
    Unreachable {
        url: Uri,
        #[source]
        source: Box<hyper_util::client::legacy::Error>,
    },
    #[error("{url} answered {status}, not 200 OK")]
    NotReady { url: Uri, status: StatusCode },
}

/// An `http://` URL with a host, for clap.
pub fn parse_url(s: &str) -> Result<Uri, HealthcheckError> {
    let url: Uri = s
        .parse()
        .map_err(|_| HealthcheckError::NotHttp(s.to_owned()))?;
    if url.scheme_str() != Some("http") || url.host().is_none() {
        return Err(HealthcheckError::NotHttp(s.to_owned()));
    }
    Ok(url)
}

/// GETs `url` once; `Ok` only for a 200 within `timeout` (connecting included).
pub async fn check(url: &Uri, timeout: Duration) -> Result<(), HealthcheckError> {
    let client: Client<HttpConnector, Empty<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    let answer = tokio::time::timeout(timeout, client.get(url.clone()))
        .await
        .map_err(|_| HealthcheckError::Timeout {
            url: url.clone(),
            timeout,
        })?
        .map_err(|source| HealthcheckError::Unreachable {
            url: url.clone(),
            source: Box::new(source),
        })?;
    match answer.status() {
        StatusCode::OK => Ok(()),
        status => Err(HealthcheckError::NotReady {
            url: url.clone(),
            status,
        }),
    }
}

/// [`check`], then says so: `URL: ready`.
pub async fn ready(url: &Uri, timeout: Duration) -> anyhow::Result<()> {
    check(url, timeout).await?;
    say!("{url}: ready");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_plain_http_url_with_a_host_is_taken() {
        assert!(parse_url("http://127.0.0.1:9464/readyz").is_ok());
        for bad in [
            "https://127.0.0.1:9464/readyz",
            "127.0.0.1:9464",
            "/readyz",
            "http:///readyz",
            "not a url",
        ] {
            assert!(
                matches!(parse_url(bad), Err(HealthcheckError::NotHttp(_))),
                "{bad}"
            );
        }
    }
}
