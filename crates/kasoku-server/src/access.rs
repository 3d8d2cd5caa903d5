//! Who may call the server, checked before any route runs: the `Host` must name the server
//! (its loopback names or bound address, at its port, or a configured name), so that a web
//! page cannot reach it through a DNS name it controls (DNS rebinding); a browser's `Origin`
//! must be the server's own or an allowed one (`--cors-origin`), so that no other web page can
//! make it generate (CSRF); and a POST body must not be of a type a page may send without
//! asking first (`text/plain`, forms' `multipart/form-data`). Clients that are not browsers
//! (curl, SDKs) send the server's own Host and no Origin, and are unaffected.

use std::net::{IpAddr, SocketAddr};

use axum::http::{header, HeaderMap, HeaderValue, Method, Request, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;

/// The rules, made once per server from its bound address and configuration.
#[derive(Clone, Debug)]
pub struct Access {
    bound: SocketAddr,
    /// Extra host names, lowercase, each with its port (`None`: any).
    hosts: Vec<(String, Option<u16>)>,
    /// Allowed origins, lowercase without a trailing slash; `any` for `*`.
    origins: Vec<String>,
    any_origin: bool,
}

/// What a request that passed may need on its answer: the CORS header for an allowed origin.
pub struct Passed {
    pub allow_origin: Option<HeaderValue>,
}

impl Access {
    pub fn new(bound: SocketAddr, allowed_hosts: &[String], cors_origins: &[String]) -> Access {
        let hosts = allowed_hosts
            .iter()
            .filter_map(|h| {
                let (name, port) = split_host(h)?;
                Some((name, port))
            })
            .collect();
        let any_origin = cors_origins.iter().any(|o| o.trim() == "*");
        let origins = cors_origins
            .iter()
            .map(|o| normalize_origin(o))
            .filter(|o| o != "*")
            .collect();
        Access {
            bound,
            hosts,
            origins,
            any_origin,
        }
    }

    /// Checks a request's Host, Origin and body type. `Err` is the answer to send instead
    /// (a 403 or 415; for an allowed preflight, its 204).
    pub fn check<B>(&self, request: &Request<B>) -> Result<Passed, Box<Response>> {
        let headers = request.headers();
        let host = request_host(request);
        if let Some(host) = &host {
            if !self.host_allowed(host) {
                return Err(ApiError::forbidden(
                    "host_not_allowed",
                    format!(
                        "the Host '{host}' does not name this server (allowed: localhost, \
                         loopback addresses and {} at port {}, or a name given with --allowed-host)",
                        self.bound.ip(),
                        self.bound.port()
                    ),
                )
                .into_response()
                .into());
            }
        }
        let mut allow_origin = None;
        if let Some(origin) = headers.get(header::ORIGIN) {
            let text = origin.to_str().unwrap_or("");
            let same = host.as_deref().is_some_and(|h| {
                normalize_origin(text) == format!("http://{}", h.to_ascii_lowercase())
            });
            let listed = self.any_origin || self.origins.contains(&normalize_origin(text));
            if !same && !listed {
                return Err(ApiError::forbidden(
                    "origin_not_allowed",
                    format!(
                        "requests from the web origin '{text}' are not allowed \
                         (start the server with --cors-origin {text} to allow them)"
                    ),
                )
                .into_response()
                .into());
            }
            if listed {
                allow_origin = Some(origin.clone());
            }
        }
        if request.method() == Method::OPTIONS
            && headers.contains_key(header::ACCESS_CONTROL_REQUEST_METHOD)
        {
            return Err(preflight(allow_origin, headers).into());
        }
        if request.method() == Method::POST {
            check_body_type(headers).map_err(|e| Box::new(e.into_response()))?;
        }
        Ok(Passed { allow_origin })
    }

    fn host_allowed(&self, host: &str) -> bool {
        let Some((name, port)) = split_host(host) else {
            return false;
        };
        let extra = self
            .hosts
            .iter()
            .any(|(n, p)| *n == name && p.is_none_or(|p| Some(p) == port));
        if extra {
            return true;
        }
        if port.unwrap_or(80) != self.bound.port() {
            return false;
        }
        if name == "localhost" {
            return true;
        }
        let literal = name.trim_start_matches('[').trim_end_matches(']');
        match literal.parse::<IpAddr>() {
            Ok(ip) => ip.is_loopback() || ip == self.bound.ip() || self.bound.ip().is_unspecified(),
            Err(_) => false,
        }
    }
}

/// The request's host: the `Host` header, else the authority of an absolute URI; `None` when
/// neither is there (an HTTP/1.0 client: no browser sends such a request).
fn request_host<B>(request: &Request<B>) -> Option<String> {
    match request.headers().get(header::HOST) {
        Some(v) => Some(v.to_str().unwrap_or("\u{fffd}").trim().to_string()),
        None => request.uri().authority().map(|a| a.as_str().to_string()),
    }
}

/// `name[:port]` (names lowercase, a trailing dot dropped; IPv6 literals keep their brackets).
fn split_host(host: &str) -> Option<(String, Option<u16>)> {
    let host = host.trim().to_ascii_lowercase();
    let (name, port) = if let Some(rest) = host.strip_prefix('[') {
        let (ip, tail) = rest.split_once(']')?;
        let port = match tail.strip_prefix(':') {
            Some(p) => Some(p.parse().ok()?),
            None if tail.is_empty() => None,
            None => return None,
        };
        (format!("[{ip}]"), port)
    } else {
        match host.rsplit_once(':') {
            Some((n, p)) => (n.to_string(), Some(p.parse().ok()?)),
            None => (host.clone(), None),
        }
    };
    let name = name.strip_suffix('.').unwrap_or(&name).to_string();
    (!name.is_empty()).then_some((name, port))
}

fn normalize_origin(origin: &str) -> String {
    origin.trim().trim_end_matches('/').to_ascii_lowercase()
}

/// Body types kasoku reads: JSON, none named, or what `curl -d` names (a browser page can
/// send form-encoded bodies too, but always with an Origin, which is checked first). The
/// others a page may send cross-site without a preflight (`text/plain`, `multipart/form-data`)
/// and every other type are refused.
fn check_body_type(headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(value) = headers.get(header::CONTENT_TYPE) else {
        return Ok(());
    };
    let text = value.to_str().unwrap_or("");
    let essence = text
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    match essence.as_str() {
        "application/json" | "application/x-www-form-urlencoded" => Ok(()),
        _ => Err(ApiError {
            status: StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ..ApiError::bad_request(
                "unsupported_media_type",
                format!("the body must be JSON (Content-Type: application/json), not '{text}'"),
            )
        }),
    }
}

/// The answer to a CORS preflight: 204 with the permissions for an allowed origin (an
/// unlisted one was refused before; one without an Origin gets no permissions).
fn preflight(allow_origin: Option<HeaderValue>, headers: &HeaderMap) -> Response {
    let mut response = StatusCode::NO_CONTENT.into_response();
    if let Some(origin) = allow_origin {
        let h = response.headers_mut();
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
        h.insert(
            header::ACCESS_CONTROL_ALLOW_METHODS,
            HeaderValue::from_static("GET, POST, OPTIONS"),
        );
        let asked = headers
            .get(header::ACCESS_CONTROL_REQUEST_HEADERS)
            .cloned()
            .unwrap_or_else(|| HeaderValue::from_static("authorization, content-type"));
        h.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, asked);
        h.insert(
            header::ACCESS_CONTROL_MAX_AGE,
            HeaderValue::from_static("600"),
        );
        h.insert(header::VARY, HeaderValue::from_static("Origin"));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn access(bound: &str) -> Access {
        Access::new(
            bound.parse().unwrap(),
            &["myhost.lan".into(), "proxy.example:443".into()],
            &["http://localhost:3000".into()],
        )
    }

    fn request(
        host: Option<&str>,
        origin: Option<&str>,
        content_type: Option<&str>,
    ) -> Request<()> {
        let mut b = Request::builder()
            .method(Method::POST)
            .uri("/v1/completions");
        if let Some(h) = host {
            b = b.header(header::HOST, h);
        }
        if let Some(o) = origin {
            b = b.header(header::ORIGIN, o);
        }
        if let Some(c) = content_type {
            b = b.header(header::CONTENT_TYPE, c);
        }
        b.body(()).unwrap()
    }

    fn status(a: &Access, r: &Request<()>) -> u16 {
        match a.check(r) {
            Ok(_) => 200,
            Err(resp) => resp.status().as_u16(),
        }
    }

    #[test]
    fn hosts_must_name_the_server_at_its_port() {
        let a = access("127.0.0.1:8000");
        for (host, expected) in [
            ("127.0.0.1:8000", 200),
            ("localhost:8000", 200),
            ("LOCALHOST.:8000", 200),
            ("[::1]:8000", 200),
            ("127.0.0.2:8000", 200),
            ("myhost.lan:1234", 200),
            ("proxy.example:443", 200),
            ("proxy.example:80", 403),
            ("localhost:8001", 403),
            ("localhost", 403),
            ("attacker.example:8000", 403),
            ("192.168.1.5:8000", 403),
            ("127.0.0.1:notaport", 403),
            ("", 403),
        ] {
            assert_eq!(
                status(&a, &request(Some(host), None, None)),
                expected,
                "{host}"
            );
        }
        // Bound to every interface: any address literal names it, DNS names still do not.
        let all = access("0.0.0.0:8000");
        assert_eq!(
            status(&all, &request(Some("192.168.1.5:8000"), None, None)),
            200
        );
        assert_eq!(
            status(&all, &request(Some("evil.example:8000"), None, None)),
            403
        );
        // No Host at all (HTTP/1.0): not a browser.
        assert_eq!(status(&a, &request(None, None, None)), 200);
    }

    #[test]
    fn browser_origins_must_be_the_servers_own_or_allowed() {
        let a = access("127.0.0.1:8000");
        let host = Some("127.0.0.1:8000");
        for (origin, expected) in [
            ("http://127.0.0.1:8000", 200),
            ("http://localhost:3000", 200),
            ("http://localhost:3000/", 200),
            ("https://evil.example", 403),
            ("null", 403),
            ("http://localhost:8000", 403),
        ] {
            assert_eq!(
                status(&a, &request(host, Some(origin), None)),
                expected,
                "{origin}"
            );
        }
        let ok = a.check(&request(host, Some("http://localhost:3000"), None));
        assert!(ok.unwrap().allow_origin.is_some());
        let any = Access::new("127.0.0.1:8000".parse().unwrap(), &[], &["*".into()]);
        assert_eq!(
            status(&any, &request(host, Some("https://evil.example"), None)),
            200
        );
    }

    #[test]
    fn bodies_a_page_may_send_unasked_are_refused() {
        let a = access("127.0.0.1:8000");
        let host = Some("127.0.0.1:8000");
        for (ct, expected) in [
            ("application/json", 200),
            ("application/json; charset=utf-8", 200),
            ("application/x-www-form-urlencoded", 200),
            ("text/plain", 415),
            ("text/plain;charset=UTF-8", 415),
            ("multipart/form-data; boundary=x", 415),
        ] {
            assert_eq!(status(&a, &request(host, None, Some(ct))), expected, "{ct}");
        }
    }
}
