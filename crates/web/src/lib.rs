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

/// Serves [`router`] on `listener` until the process ends.
///
/// # Errors
/// The I/O error that stopped the server.
pub async fn serve(listener: tokio::net::TcpListener, registry: Arc<JobRegistry>) -> std::io::Result<()> {
    axum::serve(listener, router(registry)).await
}

fn presented_token(headers: &HeaderMap, query: Option<&str>) -> Option<String> {
    if let Some(t) = query
        .into_iter()
        .flat_map(|q| q.split('&'))
        .find_map(|kv| kv.strip_prefix("token="))
    {
        return Some(t.to_string());
    }
    if let Some(v) = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()) {
        return Some(v.strip_prefix("Bearer ").unwrap_or(v).to_string());
    }
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|c| c.trim().strip_prefix(&format!("{TOKEN_COOKIE}=")).map(str::to_string))
}

/// The access policy: the Job API token when the server has one. A valid
/// `?token=` also sets the cookie, so links inside the UI need no token.
async fn access(State(registry): State<Arc<JobRegistry>>, request: Request, next: Next) -> Response {
    let security = registry.security();
    let from_query = request.uri().query().is_some_and(|q| q.split('&').any(|kv| kv.starts_with("token=")));
    let got = presented_token(request.headers(), request.uri().query());
    if !security.token_matches(got.as_deref()) {
        let why = if got.is_some() {
            "wrong Job API token"
        } else {
            "this Weir server needs its Job API token: open /?token=TOKEN once (it sets a cookie) or send `Authorization: Bearer TOKEN`"
        };
        return (StatusCode::UNAUTHORIZED, why).into_response();
    }
    let mut response = next.run(request).await;
    if let (true, Some(t), Some(_)) = (from_query, got, &security.token) {
        if let Ok(v) = format!("{TOKEN_COOKIE}={t}; Path=/; HttpOnly; SameSite=Strict").parse() {
            response.headers_mut().insert(header::SET_COOKIE, v);
        }
    }
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
    let after = q.get("after").and_then(|a| a.parse().ok());
    match registry.get(&id) {
        Some(job) => Json(views::logs(&job, after)).into_response(),
        None => no_job(&id),
    }
}

fn stop(registry: &JobRegistry, id: &str, drain: bool) -> Response {
    match registry.get(id) {
        Some(job) => {
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
