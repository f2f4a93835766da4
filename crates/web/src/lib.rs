//! Weir's web UI and Prometheus endpoint, served by `weir serve` on its own
//! HTTP port (`--ui_port`), behind the same access policy as the Job API.
//!
//! Layer: beside the binary, over `weir-jobs` (it reads the [`JobRegistry`]).
//! Pages are static HTML with a script ([`assets`]) that polls JSON views
//! of the registry ([`views`]) once a second, so running jobs update live.
//!
//! Routes:
//! - `GET /`: the jobs list; `GET /jobs/{id}`: a job's page.
//! - `GET /api/jobs`, `GET /api/jobs/{id}`: jobs as JSON ([`views`]).
//! - `GET /api/jobs/{id}/logs?after=N`: the job's log entries after entry N.
//! - `POST /api/jobs/{id}/cancel`, `POST /api/jobs/{id}/drain`: as CancelJob / DrainJob.
//! - `GET /metrics`: Prometheus text format ([`metrics`]).
//!
//! With a Job API token set, every route needs it: `Authorization: Bearer
//! TOKEN`, or the `weir_token` cookie, which `/?token=TOKEN` sets.

pub mod assets;
pub mod metrics;
pub mod views;

use std::sync::Arc;

use axum::extract::{Path, Query, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use weir_jobs::JobRegistry;

/// The cookie that carries the Job API token for browsers.
pub const TOKEN_COOKIE: &str = "weir_token";

/// The web UI's routes over `registry` (see the module doc).
pub fn router(registry: Arc<JobRegistry>) -> Router {
    Router::new()
        .route("/", get(jobs_page))
        .route("/jobs/{id}", get(job_page))
        .route("/assets/{name}", get(asset))
        .route("/api/jobs", get(list))
        .route("/api/jobs/{id}", get(job))
        .route("/api/jobs/{id}/logs", get(logs))
        .route("/api/jobs/{id}/cancel", post(cancel))
        .route("/api/jobs/{id}/drain", post(drain))
        .route("/metrics", get(prometheus_text))
        .layer(axum::middleware::from_fn_with_state(registry.clone(), access))
        .with_state(registry)
}

/// Serves [`router`] on `listener` until the process ends, its connections
/// guarded as the job server's are (`weir_jobs::connections`), at most
/// [`MAX_UI_CONNECTIONS`] at once: idle browsers or scrapers cannot use up
/// the file descriptors the Job API and the Fn API need.
///
/// # Errors
/// The I/O error that stopped the server.
pub async fn serve(listener: tokio::net::TcpListener, registry: Arc<JobRegistry>) -> std::io::Result<()> {
    let local = listener.local_addr()?;
    let incoming = Box::pin(weir_jobs::connections::incoming_with(
        listener,
        MAX_UI_CONNECTIONS,
        weir_jobs::connections::FIRST_BYTES_WAIT,
    ));
    axum::serve(UiListener { incoming, local }, router(registry)).await
}

/// Connections the web UI holds at once (a browser opens about six).
pub const MAX_UI_CONNECTIONS: usize = 64;

/// The web UI's guarded connections as an axum listener.
struct UiListener {
    incoming: std::pin::Pin<
        Box<dyn tokio_stream::Stream<Item = std::io::Result<weir_jobs::connections::Guarded>> + Send>,
    >,
    local: std::net::SocketAddr,
}

impl axum::serve::Listener for UiListener {
    type Io = weir_jobs::connections::Guarded;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        use tokio_stream::StreamExt;
        loop {
            match self.incoming.next().await {
                Some(Ok(io)) => {
                    let peer = io.peer_addr().unwrap_or(self.local);
                    return (io, peer);
                }
                Some(Err(e)) => tracing::warn!("web UI: accepting a connection failed: {e}"),
                // The guard's accept loop never ends while this listener lives.
                None => std::future::pending::<()>().await,
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}

/// `%XX` escapes decoded and `+` read as a space (as in a query string or
/// our cookie); None when the result is not UTF-8.
fn percent_decode(text: &str) -> Option<String> {
    String::from_utf8(weir_jobs::percent_decode(&text.replace('+', "%20"))).ok()
}

/// Every byte but ASCII letters, digits and `-._~` as `%XX` (a cookie value).
fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|c| match c {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (c as char).to_string(),
            _ => format!("%{c:02X}"),
        })
        .collect()
}

/// The `token=` query parameter, decoded.
fn query_token(query: Option<&str>) -> Option<String> {
    query?.split('&').find_map(|kv| kv.strip_prefix("token=")).and_then(percent_decode)
}

/// The token a request presents: `?token=`, `Authorization: Bearer`, or the cookie.
fn presented_token(headers: &HeaderMap, query: Option<&str>) -> Option<String> {
    if let Some(t) = query_token(query) {
        return Some(t);
    }
    if let Some(v) = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()) {
        return Some(v.strip_prefix("Bearer ").unwrap_or(v).to_string());
    }
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|c| c.trim().strip_prefix(&format!("{TOKEN_COOKIE}=")).and_then(percent_decode))
}

/// The host name of a `Host` header value (`name:port`, `[v6]:port`).
fn host_name(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or("");
    }
    host.rsplit_once(':').map_or(host, |(name, port)| if port.chars().all(|c| c.is_ascii_digit()) { name } else { host })
}

/// Whether a `Host` names this machine directly (an IP address, `localhost`
/// or `*.localhost`), not a DNS name that could be rebound to it.
fn direct_host(host: &str) -> bool {
    let name = host_name(host).trim_end_matches('.').to_ascii_lowercase();
    name == "localhost" || name.ends_with(".localhost") || name.parse::<std::net::IpAddr>().is_ok()
}

/// Why a request is refused before the token is even looked at: without a
/// token, a `Host` that is a DNS name (a page could rebind its own name to
/// 127.0.0.1 and read the UI); always, a cross-origin state change (a POST
/// whose `Origin` is not this server, e.g. another localhost port's page).
fn refused_origin(request: &Request, token_set: bool) -> Option<&'static str> {
    let host = request.headers().get(header::HOST).and_then(|v| v.to_str().ok()).unwrap_or("");
    if !token_set && !host.is_empty() && !direct_host(host) {
        return Some("this Weir server has no Job API token, so its web UI answers only to an IP address or localhost in the Host header (not a DNS name that could point anywhere)");
    }
    let origin = request.headers().get(header::ORIGIN).and_then(|v| v.to_str().ok());
    let same = |o: &str| o.split_once("://").is_some_and(|(_, rest)| rest.trim_end_matches('/') == host);
    if request.method() != axum::http::Method::GET && request.method() != axum::http::Method::HEAD && origin.is_some_and(|o| !same(o)) {
        return Some("cross-origin request refused (its Origin is not this server)");
    }
    None
}

/// The access policy: the Job API token when the server has one (see
/// [`refused_origin`] for what is refused first). A valid `?token=` sets
/// the cookie and redirects to the same page without the token in its URL.
async fn access(State(registry): State<Arc<JobRegistry>>, request: Request, next: Next) -> Response {
    let security = registry.security();
    if let Some(why) = refused_origin(&request, security.token.is_some()) {
        return (StatusCode::FORBIDDEN, why).into_response();
    }
    let from_query = query_token(request.uri().query());
    let got = presented_token(request.headers(), request.uri().query());
    if !security.token_matches(got.as_deref()) {
        let why = if got.is_some() {
            "wrong Job API token"
        } else {
            "this Weir server needs its Job API token: open /?token=TOKEN once (it sets a cookie) or send `Authorization: Bearer TOKEN`"
        };
        return (StatusCode::UNAUTHORIZED, why).into_response();
    }
    if let (Some(t), Some(_)) = (from_query, &security.token) {
        let rest: Vec<&str> = request
            .uri()
            .query()
            .unwrap_or("")
            .split('&')
            .filter(|kv| !kv.is_empty() && !kv.starts_with("token="))
            .collect();
        let location = if rest.is_empty() {
            request.uri().path().to_string()
        } else {
            format!("{}?{}", request.uri().path(), rest.join("&"))
        };
        let cookie = format!("{TOKEN_COOKIE}={}; Path=/; HttpOnly; SameSite=Strict", percent_encode(&t));
        return (
            StatusCode::SEE_OTHER,
            [(header::LOCATION, location), (header::SET_COOKIE, cookie), (header::REFERRER_POLICY, "no-referrer".to_string())],
        )
            .into_response();
    }
    let mut response = next.run(request).await;
    response
        .headers_mut()
        .insert(header::REFERRER_POLICY, axum::http::HeaderValue::from_static("no-referrer"));
    response
}

async fn jobs_page() -> Html<&'static str> {
    Html(assets::JOBS_HTML)
}

async fn job_page(Path(_id): Path<String>) -> Html<&'static str> {
    Html(assets::JOB_HTML)
}

async fn asset(Path(name): Path<String>) -> Response {
    match assets::get(&name) {
        Some((body, mime)) => ([(header::CONTENT_TYPE, mime), (header::CACHE_CONTROL, "max-age=300")], body).into_response(),
        None => (StatusCode::NOT_FOUND, format!("no asset {name}")).into_response(),
    }
}

fn no_job(id: &str) -> Response {
    (StatusCode::NOT_FOUND, format!("no job {id} on this server")).into_response()
}

async fn list(State(registry): State<Arc<JobRegistry>>) -> Json<serde_json::Value> {
    Json(views::jobs(&registry))
}

async fn job(State(registry): State<Arc<JobRegistry>>, Path(id): Path<String>) -> Response {
    match registry.get(&id) {
        Some(job) => Json(views::job(&job)).into_response(),
        None => no_job(&id),
    }
}

async fn logs(
    State(registry): State<Arc<JobRegistry>>,
    Path(id): Path<String>,
    Query(q): Query<std::collections::HashMap<String, String>>,
) -> Response {
    let after = match q.get("after").map(|a| a.parse()) {
        Some(Err(_)) => {
            let text = format!("after={:?}: expects the index of a log line (a whole number)", q["after"]);
            return (StatusCode::BAD_REQUEST, text).into_response();
        }
        parsed => parsed.and_then(Result::ok),
    };
    match registry.get(&id) {
        Some(job) => Json(views::logs(&job, after)).into_response(),
        None => no_job(&id),
    }
}

fn stop(registry: &JobRegistry, id: &str, drain: bool) -> Response {
    match registry.get(id) {
        Some(job) => {
            if let Some(reason) = drain.then(|| weir_jobs::service::drain_refusal(&job)).flatten() {
                return (StatusCode::CONFLICT, reason).into_response();
            }
            let state = weir_jobs::service::stop_job(&job, drain);
            Json(serde_json::json!({ "state": views::state_name(state) })).into_response()
        }
        None => no_job(id),
    }
}

async fn cancel(State(registry): State<Arc<JobRegistry>>, Path(id): Path<String>) -> Response {
    stop(&registry, &id, false)
}

async fn drain(State(registry): State<Arc<JobRegistry>>, Path(id): Path<String>) -> Response {
    stop(&registry, &id, true)
}

async fn prometheus_text(State(registry): State<Arc<JobRegistry>>) -> Response {
    match metrics::render(&registry) {
        Ok(text) => ([(header::CONTENT_TYPE, prometheus::TEXT_FORMAT)], text).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("cannot encode the metrics: {e}")).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip_through_query_and_cookie() {
        assert_eq!(query_token(Some("a=1&token=s%3Bx%20y")), Some("s;x y".into()));
        assert_eq!(percent_decode(&percent_encode("s;x y,é")), Some("s;x y,é".into()));
        assert_eq!(percent_encode("ab-9_~."), "ab-9_~.");
        assert_eq!(query_token(Some("a=1")), None);
    }

    #[test]
    fn only_direct_hosts_are_trusted_without_a_token() {
        for host in ["127.0.0.1:8074", "localhost:8074", "LOCALHOST", "app.localhost:1", "[::1]:8074", "10.0.0.5"] {
            assert!(direct_host(host), "{host}");
        }
        for host in ["evil.example.com:8074", "example.com", "127.0.0.1.nip.io:8074"] {
            assert!(!direct_host(host), "{host}");
        }
    }

    #[tokio::test]
    async fn the_ui_answers_while_its_connection_cap_is_full_of_silent_sockets() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let url = "127.0.0.1:1".to_string();
        let config = weir_jobs::ServerConfig {
            python_for_docker_images: None,
            staging_root: std::env::temp_dir().join(format!("weir-web-test-{}", std::process::id())),
            engine_workers: 1,
            limits: Default::default(),
            capture_prepare_dir: None,
            security: Default::default(),
            gbk_memory_budget: None,
            user_state_memory_budget: None,
            side_input_memory_budget: None,
            spill_root: std::env::temp_dir().join("weir-spill"),
            min_resume_delay: weir_engine::DEFAULT_MIN_RESUME_DELAY,
        };
        let registry = JobRegistry::new(weir_harness::FnApi::new(url.clone()), config, url);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(serve(listener, registry));
        let mut silent = Vec::new();
        for _ in 0..MAX_UI_CONNECTIONS + 10 {
            silent.push(tokio::net::TcpStream::connect(addr).await.unwrap());
        }
        let mut browser = tokio::net::TcpStream::connect(addr).await.unwrap();
        browser
            .write_all(b"GET /api/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut reply = String::new();
        tokio::time::timeout(std::time::Duration::from_secs(5), browser.read_to_string(&mut reply))
            .await
            .expect("the UI answers within 5 s")
            .unwrap();
        assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
        // The cap holds: of the silent sockets, at most the cap's worth are open.
        let mut open = 0;
        for s in &mut silent {
            let mut b = [0u8; 1];
            if tokio::time::timeout(std::time::Duration::from_millis(20), s.read(&mut b)).await.is_err() {
                open += 1;
            }
        }
        assert!(open < MAX_UI_CONNECTIONS, "{open} silent sockets open");
    }
}
