//! The HTTP API: JSON bodies of the same serde types as the CLI's `--json`
//! output (the service layer's views), over the same calls.

use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, JsonRejection, PathRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use stephost_core::approvals::{Decision, Verdict};
use stephost_core::notices::Notice;
use stephost_core::settle::Resolution;
use stephost_core::store::RunQuery;
use stephost_core::{LogRecord, RunRecord};
use stephost_runtime::service;

use crate::access::Caller;
use crate::app::{App, Fits, Operator};
use crate::errors::ApiError;

type Api<T> = Result<Json<T>, ApiError>;

pub fn router(app: Arc<App>) -> Router {
    let (module_max, json_max) = (
        app.settings.module_bytes_max,
        app.settings.json_body_bytes_max,
    );
    Router::new()
        .route("/", get(crate::console::page))
        .route("/console.js", get(crate::console::script))
        .route("/console.css", get(crate::console::styles))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready))
        .route("/metrics", get(metrics))
        .route("/openapi.json", get(crate::openapi::document))
        .route("/api/summary", get(summary))
        .route(
            "/api/modules",
            post(upload_module).layer(DefaultBodyLimit::max(module_max)),
        )
        .route("/api/runs", get(list_runs).post(submit))
        .route("/api/runs/{run_id}", get(run))
        .route("/api/runs/{run_id}/calls", get(calls))
        .route("/api/runs/{run_id}/calls/{seq}", get(call))
        .route("/api/runs/{run_id}/export", get(export))
        .route("/api/runs/{run_id}/verify", get(verify))
        .route("/api/runs/{run_id}/replay", post(replay))
        .route("/api/runs/{run_id}/fork", post(fork))
        .route("/api/runs/{run_id}/budget", post(raise_budget))
        .route("/api/runs/{run_id}/tree", get(tree))
        .route("/api/runs/{run_id}/cancel", post(cancel))
        .route("/api/approvals", get(approvals))
        .route("/api/approvals/{run_id}/{seq}", post(decide))
        .route("/api/unknown", get(unknown_calls))
        .route("/api/unknown/{run_id}/{seq}", post(resolve))
        .route("/api/events", get(crate::events::stream))
        .route("/api/promises", get(promises))
        .route("/api/promises/{token}", post(crate::promises::complete))
        .route(
            "/api/schedules",
            get(crate::schedules::list).post(crate::schedules::add),
        )
        .route("/api/schedules/{name}", delete(crate::schedules::remove))
        .route("/api/schedules/{name}/pause", post(crate::schedules::pause))
        .route(
            "/api/schedules/{name}/resume",
            post(crate::schedules::resume),
        )
        .fallback(|| async { ApiError::not_found("no such path") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                405,
                "method_not_allowed",
                "this path does not take this method",
                "see /openapi.json for the methods each path takes",
            )
        })
        .layer(axum::middleware::from_fn(no_nul_in_path))
        .layer(axum::middleware::from_fn_with_state(
            app.clone(),
            crate::access::guard,
        ))
        .layer(DefaultBodyLimit::max(json_max))
        .with_state(app)
}

/// A path naming something with a NUL character names nothing: no text
/// in the ledger holds one (PostgreSQL cannot store it, and ids are
/// checked before they are stored), so it is 404 on either backend, not
/// an error from the database.
async fn no_nul_in_path(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    if request.uri().path().contains("%00") {
        return ApiError::not_found("nothing in the ledger has a name with a NUL character")
            .into_response();
    }
    next.run(request).await
}

/// Whether the ledger can be read: a small read (the metric counters),
/// at most once per `ready_cache_ms` however many ask.
async fn ready(State(app): State<Arc<App>>) -> Response {
    let check = app.with_views(|s| s.counters().map(|_| ()).map_err(ApiError::from));
    match app.ready.get(app.settings.ready_cache_ms, check).await {
        Ok(()) => "ready\n".into_response(),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, Json(e)).into_response(),
    }
}

async fn metrics(State(app): State<Arc<App>>, _caller: Caller) -> Result<Response, ApiError> {
    let text = app
        .with_views(|s| Ok(stephost_runtime::metrics::render(s)?))
        .await?;
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response())
}

/// The summary, computed at most once per `summary_cache_ms` however many
/// ask (it counts over the ledger).
async fn summary(State(app): State<Arc<App>>, _caller: Caller) -> Api<serde_json::Value> {
    let compute = app.with_views(|s| {
        serde_json::to_value(service::summary(s)?)
            .map_err(|e| ApiError::internal(format!("cannot encode the summary: {e}")))
    });
    Ok(Json(
        app.summary
            .get(app.settings.summary_cache_ms, compute)
            .await?,
    ))
}

/// A module given by digest (already stored) or as base64 bytes.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModuleRef {
    pub module_digest: Option<String>,
    pub module_base64: Option<String>,
}

impl ModuleRef {
    /// The module's bytes and how messages name it; `None` if neither is
    /// given.
    pub(crate) fn bytes(
        &self,
        host: &stephost_runtime::Host,
    ) -> Result<Option<(Vec<u8>, String)>, ApiError> {
        match (&self.module_digest, &self.module_base64) {
            (Some(_), Some(_)) => Err(ApiError::bad_input(
                "give module_digest or module_base64, not both",
            )),
            (Some(digest), None) => Ok(Some((host.store().module(digest)?, digest.clone()))),
            // As /openapi.json's pattern says: the standard alphabet,
            // padded, nothing around it.
            (None, Some(b64)) => base64::engine::general_purpose::STANDARD
                .decode(b64)
                .map(|b| Some((b, "the uploaded module".to_string())))
                .map_err(|e| {
                    ApiError::bad_input(format!(
                        "module_base64 is not base64 (the standard alphabet, padded with =, \
                         no spaces or line breaks): {e}"
                    ))
                }),
            (None, None) => Ok(None),
        }
    }
}

#[derive(Debug, Serialize)]
pub struct StoredModule {
    pub module_digest: String,
    pub step: Option<String>,
    pub world: String,
}

/// Stores a module (the raw bytes of a component or core module) for runs
/// to be submitted by digest.
async fn upload_module(
    State(app): State<Arc<App>>,
    _operator: Operator,
    _fits: Fits,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<StoredModule>), ApiError> {
    let body = body?;
    let stored = app
        .with_host(move |host| {
            let loaded = host.load(&body, "the uploaded module")?;
            Ok(StoredModule {
                module_digest: loaded.digest.clone(),
                step: loaded.step.clone(),
                world: loaded.world().to_string(),
            })
        })
        .await?;
    Ok((StatusCode::CREATED, Json(stored)))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubmitBody {
    #[serde(flatten)]
    pub module: ModuleRef,
    #[serde(default)]
    pub input: serde_json::Value,
    pub run_id: Option<String>,
    /// The run's own model budget.
    #[serde(default)]
    pub budget: Option<Budget>,
}

/// A run's own model budget as a body gives it: a JSON object whose bounds
/// are whole numbers. JSON (and /openapi.json's `integer`) does not tell
/// `5000` from `5000.0`, so a bound written with a zero fraction or an
/// exponent is the whole number it spells, up to 2^53 (a double spells
/// every whole number up to there, and no reader of doubles can tell the
/// ones past it apart); past 2^53 it is refused, with how to write it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Budget(pub stephost_core::RunBudget);

/// The largest whole number a bound may be written as with a fraction or
/// an exponent: 2^53.
const WHOLE_DOUBLE_MAX: f64 = 9_007_199_254_740_992.0;

/// 2^64: the first whole number past a `u64`.
const U64_END: f64 = 18_446_744_073_709_551_616.0;

impl<'de> Deserialize<'de> for Budget {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error as _;
        let mut value = serde_json::Value::deserialize(d)?;
        // serde would read an array as the bounds in order.
        let Some(bounds) = value.as_object_mut() else {
            return Err(D::Error::custom(
                "a budget is a JSON object, e.g. {\"model_tokens_max\": 5000}",
            ));
        };
        for (name, bound) in bounds.iter_mut() {
            let Some(number) = bound.as_number() else {
                continue;
            };
            // What is not a whole number serde says is not.
            match whole_number(number) {
                Whole::Is(whole) => *bound = serde_json::Value::from(whole),
                Whole::PastDoubles => {
                    return Err(D::Error::custom(format!(
                        "{name}: {}",
                        past_doubles(number)
                    )));
                }
                Whole::Not => {}
            }
        }
        stephost_core::RunBudget::deserialize(value)
            .map(Budget)
            .map_err(D::Error::custom)
    }
}

/// What a JSON number is as a whole number of 0 or more.
enum Whole {
    Is(u64),
    /// Written with a fraction or an exponent past 2^53.
    PastDoubles,
    Not,
}

/// `number` as a whole number of 0 or more: digits, or written with a zero
/// fraction or an exponent up to 2^53 (see [`Budget`]).
fn whole_number(number: &serde_json::Number) -> Whole {
    if let Some(whole) = number.as_u64() {
        return Whole::Is(whole);
    }
    match number.as_f64().filter(|f| f.fract() == 0.0 && *f >= 0.0) {
        Some(whole) if whole <= WHOLE_DOUBLE_MAX => Whole::Is(whole as u64),
        Some(whole) if whole < U64_END => Whole::PastDoubles,
        _ => Whole::Not,
    }
}

fn past_doubles(number: &serde_json::Number) -> String {
    format!(
        "{number} is written with a fraction or an exponent and is past 2^53, where that no \
         longer says which whole number it is; write it as digits alone"
    )
}

/// A body's whole number, written as [`Budget`]'s bounds may be.
pub(crate) fn whole<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    use serde::de::Error as _;
    let number = serde_json::Number::deserialize(d)?;
    match whole_number(&number) {
        Whole::Is(whole) => Ok(whole),
        Whole::PastDoubles => Err(D::Error::custom(past_doubles(&number))),
        Whole::Not => Err(D::Error::custom(format!(
            "{number} is not a whole number of 0 or more"
        ))),
    }
}

/// [`whole`], for a field that may be null or absent.
pub(crate) fn whole_or_none<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<u64>, D::Error> {
    #[derive(Deserialize)]
    struct Wrapped(#[serde(deserialize_with = "whole")] u64);
    Ok(Option::<Wrapped>::deserialize(d)?.map(|Wrapped(n)| n))
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubmitParams {
    /// Wait up to this many ms for the run's end before answering.
    pub wait: Option<u64>,
}

/// How often a request waiting for a run's end reads it again when no
/// execution of the server's own worker ended meanwhile (the run may be
/// another worker's), in ms.
const WAIT_RECHECK_MS: u64 = 100;

/// Records a run for the server's worker (or any worker on the ledger);
/// with `wait`, answers with the run as it ended, if it ends (or waits for
/// a person or a timer, or is parked) within that many ms.
async fn submit(
    State(app): State<Arc<App>>,
    _operator: Operator,
    _fits: Fits,
    headers: axum::http::HeaderMap,
    query: Result<Query<SubmitParams>, QueryRejection>,
    body: Result<Json<SubmitBody>, JsonRejection>,
) -> Result<(StatusCode, Json<RunRecord>), ApiError> {
    let Query(params) = query?;
    let Json(body) = body?;
    let trace = caller_trace(&headers)?;
    let run = app
        .with_host(move |host| {
            let (bytes, what) = body.module.bytes(host)?.ok_or_else(|| {
                ApiError::bad_input("a submission names module_digest or module_base64")
            })?;
            let input = serde_json::to_string(&body.input)
                .map_err(|e| ApiError::bad_input(format!("input: {e}")))?;
            Ok(host.submit_with(
                &bytes,
                &what,
                &input,
                body.run_id.as_deref(),
                stephost_runtime::options::RunOptions {
                    budget: body.budget.unwrap_or_default().0,
                    trace,
                },
            )?)
        })
        .await?;
    let run = match params.wait {
        Some(ms) => wait_for_end(&app, run, ms.min(app.settings.wait_ms_max)).await?,
        None => run,
    };
    Ok((StatusCode::CREATED, Json(run)))
}

/// The trace a submission continues: its request's W3C `traceparent` and
/// `tracestate` headers, if it has them.
fn caller_trace(
    headers: &axum::http::HeaderMap,
) -> Result<Option<stephost_core::RunTrace>, ApiError> {
    let text = |name: &str| {
        headers
            .get(name)
            .map(|v| {
                v.to_str()
                    .map_err(|_| ApiError::bad_input(format!("the {name} header is not ASCII")))
            })
            .transpose()
    };
    let Some(traceparent) = text("traceparent")? else {
        return Ok(None);
    };
    stephost_core::RunTrace::from_traceparent(traceparent, text("tracestate")?)
        .map(Some)
        .map_err(ApiError::bad_input)
}

/// `run` once it answers a wait ([`stephost_core::RunStatus::answers_a_wait`]),
/// or as it is after `wait_ms`.
async fn wait_for_end(app: &Arc<App>, run: RunRecord, wait_ms: u64) -> Result<RunRecord, ApiError> {
    let until = tokio::time::Instant::now() + std::time::Duration::from_millis(wait_ms);
    let mut run = run;
    loop {
        // Listening before the look: an end between the look and the wait
        // is not missed.
        let ended = app.ended.notified();
        tokio::pin!(ended);
        ended.as_mut().enable();
        if run.status.answers_a_wait() || tokio::time::Instant::now() >= until {
            return Ok(run);
        }
        let recheck =
            tokio::time::Instant::now() + std::time::Duration::from_millis(WAIT_RECHECK_MS);
        tokio::select! {
            _ = ended => {}
            _ = tokio::time::sleep_until(recheck.min(until)) => {}
        }
        let run_id = run.run_id.clone();
        run = app.with_views(move |views| Ok(views.run(&run_id)?)).await?;
    }
}

/// Raises a run's own model budget (each bound given); a run parked over
/// its budget is due again, for the server's worker to go on with.
async fn raise_budget(
    State(app): State<Arc<App>>,
    _operator: Operator,
    _fits: Fits,
    path: Result<Path<String>, PathRejection>,
    body: Result<Json<Budget>, JsonRejection>,
) -> Result<Json<RunRecord>, ApiError> {
    let Path(run_id) = path?;
    let Json(Budget(raised)) = body?;
    let run = app
        .with_host(move |host| Ok(host.set_budget(&run_id, &raised)?))
        .await?;
    Ok(Json(run))
}

/// A run and the runs below it (`stephost tree`).
async fn tree(
    State(app): State<Arc<App>>,
    _caller: Caller,
    path: Result<Path<String>, PathRejection>,
) -> Api<service::TreeNode> {
    let Path(run_id) = path?;
    Ok(Json(
        app.with_views(move |s| Ok(service::tree(s, &run_id)?))
            .await?,
    ))
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CancelBody {
    /// Who cancels, on a server without tokens (else the token's name).
    pub by: Option<String>,
    pub reason: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct Cancelled {
    /// The runs marked cancelled now, top down (none if the tree was
    /// cancelled already). The server's worker ends those pending or
    /// waiting at once; one held by a worker stops at its next call.
    pub cancelled: Vec<String>,
    pub by: String,
}

/// Cancels a run and every run below it.
async fn cancel(
    State(app): State<Arc<App>>,
    Operator(caller): Operator,
    _fits: Fits,
    path: Result<Path<String>, PathRejection>,
    body: Result<Json<CancelBody>, JsonRejection>,
) -> Api<Cancelled> {
    let (Path(run_id), Json(body)) = (path?, body?);
    let by = caller
        .who(body.by.as_deref())
        .map_err(ApiError::bad_input)?;
    let request = stephost_core::CancelRequest {
        at_ms: stephost_core::clock::now_ms(),
        by: by.clone(),
        reason: body.reason,
    };
    let cancelled = app
        .with_store(move |s| Ok(s.cancel(&run_id, &request)?))
        .await?;
    Ok(Json(Cancelled { cancelled, by }))
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunsParams {
    pub status: Option<String>,
    pub module: Option<String>,
    pub step: Option<String>,
    pub created_after_ms: Option<i64>,
    pub created_before_ms: Option<i64>,
    /// The `next` of the page before.
    pub after: Option<String>,
    pub limit: Option<usize>,
}

#[derive(Debug, Serialize)]
pub struct RunsPage {
    pub runs: Vec<RunRecord>,
    /// Pass as `after` for the next page; none on the last.
    pub next: Option<String>,
}

async fn list_runs(
    State(app): State<Arc<App>>,
    _caller: Caller,
    query: Result<Query<RunsParams>, QueryRejection>,
) -> Api<RunsPage> {
    let Query(p) = query?;
    let limit = p.limit.unwrap_or(50).clamp(1, app.settings.runs_page_max);
    // A filter with a NUL character matches no run (see no_nul_in_path).
    let texts = [&p.module, &p.step, &p.after];
    if texts
        .iter()
        .any(|t| t.as_deref().is_some_and(|t| t.contains('\0')))
    {
        return Ok(Json(RunsPage {
            runs: vec![],
            next: None,
        }));
    }
    let query = RunQuery {
        status: p.status.as_deref().map(service::parse_status).transpose()?,
        module_digest: p.module.filter(|m| !m.is_empty()),
        step: p.step.filter(|s| !s.is_empty()),
        created_after_ms: p.created_after_ms,
        created_before_ms: p.created_before_ms,
        updated_after_ms: None,
        after_run_id: p.after.filter(|a| !a.is_empty()),
        limit: Some(limit),
    };
    let runs = app
        .with_views(move |s| Ok(service::runs(s, &query)?))
        .await?;
    let next = match runs.len() == limit {
        true => runs.last().map(|r| r.run_id.clone()),
        false => None,
    };
    Ok(Json(RunsPage { runs, next }))
}

/// A run: its row, log and notifications (its calls come a page at a time
/// from `/calls`).
#[derive(Debug, Serialize)]
pub struct RunView {
    pub run: RunRecord,
    pub logs: Vec<LogRecord>,
    pub notices: Vec<Notice>,
    /// The runs forked from it.
    pub forks: Vec<service::ForkView>,
}

async fn run(
    State(app): State<Arc<App>>,
    _caller: Caller,
    Path(run_id): Path<String>,
) -> Api<RunView> {
    Ok(Json(
        app.with_views(move |s| {
            Ok(RunView {
                run: s.run(&run_id)?,
                logs: s.logs(&run_id)?,
                notices: s.notices(Some(&run_id), 1_000)?,
                forks: service::forks(s, &run_id)?,
            })
        })
        .await?,
    ))
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CallsParams {
    pub from_seq: Option<u64>,
    pub limit: Option<usize>,
}

async fn calls(
    State(app): State<Arc<App>>,
    _caller: Caller,
    Path(run_id): Path<String>,
    query: Result<Query<CallsParams>, QueryRejection>,
) -> Api<service::CallsPage> {
    let Query(p) = query?;
    let limit = p.limit.unwrap_or(100).clamp(1, app.settings.calls_page_max);
    let cut = app.settings.timeline_body_bytes_max;
    let from = p.from_seq.unwrap_or(1);
    Ok(Json(
        app.with_views(move |s| Ok(service::calls_page(s, &run_id, from, limit, cut)?))
            .await?,
    ))
}

async fn call(
    State(app): State<Arc<App>>,
    _caller: Caller,
    path: Result<Path<(String, u64)>, PathRejection>,
) -> Api<service::CallView> {
    let Path((run_id, seq)) = path?;
    let page = app
        .with_views(move |s| Ok(service::calls_page(s, &run_id, seq, 1, usize::MAX)?))
        .await?;
    page.calls
        .into_iter()
        .find(|c| c.call.seq == seq)
        .map(Json)
        .ok_or_else(|| ApiError::not_found(format!("the run has no call #{seq}")))
}

async fn export(
    State(app): State<Arc<App>>,
    _caller: Caller,
    Path(run_id): Path<String>,
) -> Api<stephost_runtime::replay::Fixture> {
    Ok(Json(
        app.with_views(move |s| Ok(service::export(s, &run_id)?))
            .await?,
    ))
}

async fn verify(
    State(app): State<Arc<App>>,
    _caller: Caller,
    Path(run_id): Path<String>,
) -> Api<service::Verification> {
    Ok(Json(
        app.with_host(move |host| {
            Ok(service::verify_in(
                host.store(),
                &host.options().signer,
                &run_id,
            )?)
        })
        .await?,
    ))
}

/// Replays a run offline (no I/O) against its own build or another.
async fn replay(
    State(app): State<Arc<App>>,
    _operator: Operator,
    _fits: Fits,
    path: Result<Path<String>, PathRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Api<stephost_runtime::replay::ReplayReport> {
    let (Path(run_id), body) = (path?, body?);
    // No body: the recorded build. A body is JSON (whitespace alone is
    // not: it is refused like any other text that is not).
    let module: ModuleRef = match body.is_empty() {
        true => ModuleRef::default(),
        false => serde_json::from_slice(&body)
            .map_err(|e| ApiError::bad_input(format!("the body is not a module reference: {e}")))?,
    };
    Ok(Json(
        app.with_host(move |host| {
            let module = module.bytes(host)?;
            let given = module.as_ref().map(|(b, w)| (b.as_slice(), w.as_str()));
            Ok(host.replay(&run_id, given)?)
        })
        .await?,
    ))
}

/// A fork to make: the first call it makes live, its build (default the
/// run's own) and its run id (default a new one).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ForkBody {
    #[serde(deserialize_with = "whole")]
    pub at: u64,
    #[serde(flatten)]
    pub module: ModuleRef,
    pub run_id: Option<String>,
}

/// Forks a run at a call ([`stephost_core::fork`]): the new run, pending.
async fn fork(
    State(app): State<Arc<App>>,
    _operator: Operator,
    _fits: Fits,
    path: Result<Path<String>, PathRejection>,
    body: Result<Json<ForkBody>, JsonRejection>,
) -> Result<(StatusCode, Json<RunRecord>), ApiError> {
    let (Path(run_id), Json(body)) = (path?, body?);
    let forked = app
        .with_host(move |host| {
            let module = body.module.bytes(host)?;
            let given = module.as_ref().map(|(b, w)| (b.as_slice(), w.as_str()));
            Ok(host.fork(&run_id, body.at, given, body.run_id.as_deref())?)
        })
        .await?;
    Ok((StatusCode::CREATED, Json(forked)))
}

async fn approvals(
    State(app): State<Arc<App>>,
    _caller: Caller,
) -> Api<Vec<service::ApprovalView>> {
    Ok(Json(app.with_views(|s| Ok(service::approvals(s)?)).await?))
}

async fn promises(State(app): State<Arc<App>>, _caller: Caller) -> Api<Vec<service::PromiseView>> {
    Ok(Json(app.with_views(|s| Ok(service::promises(s)?)).await?))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecideBody {
    /// `approved` or `rejected`.
    pub verdict: String,
    /// The sha256 of the details the person saw (at least 8 characters);
    /// required to approve.
    pub details_sha256: Option<String>,
    pub note: Option<String>,
    /// Who decided, on a server without tokens (else the token's name).
    pub by: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct Decided {
    pub run_id: String,
    pub seq: u64,
    pub decision: String,
    pub by: String,
}

impl Decided {
    /// A decision on call `seq` of `run_id`, made by `caller` (named by the
    /// token, or by `by` on a server without tokens).
    fn by(
        caller: &Caller,
        by: Option<&str>,
        run_id: &str,
        seq: u64,
        decision: &str,
    ) -> Result<Self, ApiError> {
        Ok(Decided {
            run_id: run_id.to_string(),
            seq,
            decision: decision.to_string(),
            by: caller.who(by).map_err(ApiError::bad_input)?,
        })
    }
}

async fn decide(
    State(app): State<Arc<App>>,
    Operator(caller): Operator,
    _fits: Fits,
    path: Result<Path<(String, u64)>, PathRejection>,
    body: Result<Json<DecideBody>, JsonRejection>,
) -> Api<Decided> {
    let (Path((run_id, seq)), Json(body)) = (path?, body?);
    let verdict = match body.verdict.as_str() {
        "approved" => Verdict::Approved,
        "rejected" => Verdict::Rejected,
        other => {
            return Err(ApiError::bad_input(format!(
                "verdict {other:?} is neither approved nor rejected"
            )));
        }
    };
    let decided = Decided::by(&caller, body.by.as_deref(), &run_id, seq, verdict.as_str())?;
    let by = decided.by.clone();
    let signer = app.signer.clone();
    app.with_store(move |s| {
        let decision = Decision {
            verdict,
            by: &by,
            note: body.note.as_deref(),
            details_sha256: body.details_sha256.as_deref(),
        };
        Ok(service::decide(s, &signer, &run_id, seq, &decision)?)
    })
    .await?;
    Ok(Json(decided))
}

async fn unknown_calls(
    State(app): State<Arc<App>>,
    _caller: Caller,
) -> Api<Vec<service::UnknownCallView>> {
    Ok(Json(
        app.with_views(|s| Ok(service::unknown_calls(s)?)).await?,
    ))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResolveBody {
    /// `succeeded` (with `response`, the receipt the step sees) or
    /// `failed` (with `message`).
    pub outcome: String,
    pub response: Option<serde_json::Value>,
    pub message: Option<String>,
    pub by: Option<String>,
}

async fn resolve(
    State(app): State<Arc<App>>,
    Operator(caller): Operator,
    _fits: Fits,
    path: Result<Path<(String, u64)>, PathRejection>,
    body: Result<Json<ResolveBody>, JsonRejection>,
) -> Api<Decided> {
    let (Path((run_id, seq)), Json(body)) = (path?, body?);
    let resolution = match (body.outcome.as_str(), body.response, body.message) {
        ("succeeded", Some(response), None) => Resolution::Succeeded(response.to_string()),
        ("failed", None, Some(message)) => Resolution::Failed(message),
        ("succeeded", ..) => {
            return Err(ApiError::bad_input(
                "outcome succeeded takes `response` (the receipt, JSON) and no `message`",
            ));
        }
        ("failed", ..) => {
            return Err(ApiError::bad_input(
                "outcome failed takes `message` and no `response`",
            ));
        }
        (other, ..) => {
            return Err(ApiError::bad_input(format!(
                "outcome {other:?} is neither succeeded nor failed"
            )));
        }
    };
    let decided = Decided::by(&caller, body.by.as_deref(), &run_id, seq, &body.outcome)?;
    let by = decided.by.clone();
    let (signer, limits) = (app.signer.clone(), app.limits.clone());
    app.with_store(move |s| {
        Ok(service::resolve(
            s,
            &signer,
            &limits,
            &run_id,
            seq,
            &resolution,
            &by,
        )?)
    })
    .await?;
    Ok(Json(decided))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(json: &str) -> Result<stephost_core::RunBudget, String> {
        serde_json::from_str::<Budget>(json)
            .map(|b| b.0)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn a_bound_written_as_a_whole_number_with_a_fraction_or_an_exponent_is_that_number() {
        for (json, tokens) in [
            (r#"{"model_tokens_max": 198492709}"#, 198_492_709),
            (r#"{"model_tokens_max": 198492709.0}"#, 198_492_709),
            (r#"{"model_tokens_max": 1.98492709e8}"#, 198_492_709),
            (r#"{"model_tokens_max": 0.0}"#, 0),
            (r#"{"model_tokens_max": 9007199254740992.0}"#, 1 << 53),
            (r#"{"model_tokens_max": 18446744073709551615}"#, u64::MAX),
        ] {
            assert_eq!(
                budget(json).unwrap().model_tokens_max,
                Some(tokens),
                "{json}"
            );
        }
        let both = budget(r#"{"model_tokens_max": null, "model_cost_micro_usd_max": 5e3}"#);
        assert_eq!(
            both.unwrap(),
            stephost_core::RunBudget {
                model_tokens_max: None,
                model_cost_micro_usd_max: Some(5_000),
            }
        );
    }

    #[test]
    fn a_bound_that_is_not_a_whole_number_it_can_tell_is_refused_with_why() {
        for (json, says) in [
            (r#"{"model_tokens_max": 1.5}"#, "floating point"),
            (r#"{"model_tokens_max": -1.0}"#, "floating point"),
            (r#"{"model_tokens_max": -1}"#, "invalid value"),
            (
                r#"{"model_tokens_max": 9007199254740994.0}"#,
                "write it as digits alone",
            ),
            (r#"{"model_tokens_max": 1e19}"#, "write it as digits alone"),
            (
                r#"{"model_tokens_max": 18446744073709551616}"#,
                "floating point",
            ),
            (r#"{"model_tokens_max": "5"}"#, "invalid type: string"),
            (r#"{"tokens": 5}"#, "unknown field"),
            // Not read as the bounds in order.
            (r#"[5, 6]"#, "a budget is a JSON object"),
        ] {
            let e = budget(json).unwrap_err();
            assert!(e.contains(says), "{json}: {e}");
        }
    }

    #[test]
    fn a_forks_call_number_is_a_whole_number_however_it_is_written() {
        let at = |json: &str| serde_json::from_str::<ForkBody>(json).map(|b| b.at);
        assert_eq!(at(r#"{"at": 3}"#).unwrap(), 3);
        assert_eq!(at(r#"{"at": 3.0}"#).unwrap(), 3);
        assert_eq!(at(r#"{"at": 3e2}"#).unwrap(), 300);
        assert!(at(r#"{"at": 3.5}"#).is_err());
        assert!(at(r#"{"at": -1}"#).is_err());
        assert!(
            at(r#"{"at": 1e17}"#)
                .unwrap_err()
                .to_string()
                .contains("2^53")
        );
    }
}
