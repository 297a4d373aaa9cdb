//! What every request handler shares: the ledger, a host for submissions
//! and replays, the tokens and the server's settings. Ledger work is
//! blocking, so handlers hand it to tokio's blocking threads with a store
//! from a small free list: at most `ledger_stores_max` are in use at once
//! (a request waits for one) and as many are kept open.

use std::future::Future;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use stephost_core::chain::Signer;
use stephost_core::{Pool, Store, Views};
use stephost_runtime::Host;
use tokio::sync::{Semaphore, broadcast};

use crate::access::{Caller, Role, Tokens};
use crate::errors::ApiError;
use crate::settings::ServeSettings;

pub struct App {
    pub pool: Arc<dyn Pool>,
    idle_stores: Mutex<Vec<Box<dyn Store>>>,
    /// One per store the handlers may use at once.
    store_permits: Arc<Semaphore>,
    /// `/readyz`'s last answer.
    pub ready: Cached<Result<(), ApiError>>,
    /// `/api/summary`'s last answer.
    pub summary: Cached<Result<serde_json::Value, ApiError>>,
    /// Submissions, uploads and replays compile modules: one host, taken in
    /// turn.
    host: Mutex<Host>,
    pub tokens: Tokens,
    pub settings: ServeSettings,
    /// Runs that changed and answers streaming in, as server-sent events
    /// (see [`crate::events`]).
    pub changes: broadcast::Sender<crate::events::Live>,
    /// Set once the server stops: event streams end.
    pub stopping: AtomicBool,
    /// The event streams each token holds open.
    pub streams: crate::events::OpenStreams,
    /// Woken each time an execution of the server's worker ends: requests
    /// waiting for a run's end look at it again.
    pub ended: tokio::sync::Notify,
    /// Signs decisions made through the API.
    pub signer: Signer,
    /// Sizes a resolved response is held to.
    pub limits: stephost_core::Limits,
    /// Promise completions this second.
    pub promise_pace: crate::promises::Pace,
}

impl App {
    pub fn new(pool: Arc<dyn Pool>, host: Host, tokens: Tokens, settings: ServeSettings) -> Self {
        let signer = host.options().signer.clone();
        let limits = host.options().limits.clone();
        App {
            pool,
            idle_stores: Mutex::default(),
            store_permits: Arc::new(Semaphore::new(settings.ledger_stores_max.max(1))),
            ready: Cached::default(),
            summary: Cached::default(),
            host: Mutex::new(host),
            tokens,
            settings,
            changes: broadcast::channel(64).0,
            stopping: AtomicBool::new(false),
            streams: crate::events::OpenStreams::default(),
            ended: tokio::sync::Notify::new(),
            signer,
            limits,
            promise_pace: Default::default(),
        }
    }

    /// Runs `work` with a store on a blocking thread.
    pub async fn with_store<T, F>(self: &Arc<Self>, work: F) -> Result<T, ApiError>
    where
        T: Send + 'static,
        F: FnOnce(&dyn Store) -> Result<T, ApiError> + Send + 'static,
    {
        let app = self.clone();
        let permit = self
            .store_permits
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| ApiError::internal("the server is stopping"))?;
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            let taken = app
                .idle_stores
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .pop();
            let store = match taken {
                Some(store) => store,
                None => app.pool.store()?,
            };
            let result = work(store.as_ref());
            app.idle_stores
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(store);
            result
        })
        .await
        .map_err(|e| ApiError::internal(format!("a request's work stopped: {e}")))?
    }

    /// Runs `work` with the ledger's views (reads alone) on a blocking
    /// thread: what every route a read-only caller may use gets.
    pub async fn with_views<T, F>(self: &Arc<Self>, work: F) -> Result<T, ApiError>
    where
        T: Send + 'static,
        F: FnOnce(&dyn Views) -> Result<T, ApiError> + Send + 'static,
    {
        self.with_store(move |store| work(store)).await
    }

    /// Runs `work` with the host on a blocking thread.
    pub async fn with_host<T, F>(self: &Arc<Self>, work: F) -> Result<T, ApiError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Host) -> Result<T, ApiError> + Send + 'static,
    {
        let app = self.clone();
        tokio::task::spawn_blocking(move || {
            let mut host = app.host.lock().unwrap_or_else(|p| p.into_inner());
            work(&mut host)
        })
        .await
        .map_err(|e| ApiError::internal(format!("a request's work stopped: {e}")))?
    }
}

/// A value computed at most once per period, shared by every caller in
/// between and by callers that come while it is computed.
pub struct Cached<T>(tokio::sync::Mutex<Option<(Instant, T)>>);

impl<T> Default for Cached<T> {
    fn default() -> Self {
        Cached(tokio::sync::Mutex::new(None))
    }
}

impl<T: Clone> Cached<T> {
    /// The value, computed by `compute` if the last one is older than
    /// `period_ms`.
    pub async fn get(&self, period_ms: u64, compute: impl Future<Output = T>) -> T {
        let mut last = self.0.lock().await;
        if let Some((at, value)) = last.as_ref()
            && at.elapsed() < Duration::from_millis(period_ms)
        {
            return value.clone();
        }
        let value = compute.await;
        *last = Some((Instant::now(), value.clone()));
        value
    }
}

/// A request's caller, from its bearer token; refused (401) if the server
/// has tokens and the request names none of them.
impl FromRequestParts<Arc<App>> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, app: &Arc<App>) -> Result<Self, ApiError> {
        let header = parts
            .headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        app.tokens.caller(header).ok_or_else(ApiError::unauthorized)
    }
}

/// A caller with the operator role. Checked from the request's head,
/// before its body is read: a read-only or unknown caller is refused (403,
/// 401) however large a body it sends, and the body is never read.
pub struct Operator(pub Caller);

impl FromRequestParts<Arc<App>> for Operator {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, app: &Arc<App>) -> Result<Self, ApiError> {
        let caller = Caller::from_request_parts(parts, app).await?;
        match caller.role {
            Role::Operator => Ok(Operator(caller)),
            Role::Read => Err(ApiError::forbidden(caller.name.as_deref().unwrap_or("-"))),
        }
    }
}

/// A request whose declared length (`Content-Length`) is within its
/// route's limit: `module_bytes_max` for a module upload,
/// `json_body_bytes_max` for any other body. Checked from the head, after
/// the caller: a body too large is refused (413) before any of it is read.
/// A body sent without a length is cut at the limit as it is read.
pub struct Fits;

impl FromRequestParts<Arc<App>> for Fits {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, app: &Arc<App>) -> Result<Self, ApiError> {
        let limit = match parts.uri.path() {
            "/api/modules" => app.settings.module_bytes_max,
            _ => app.settings.json_body_bytes_max,
        };
        let declared = parts
            .headers
            .get(axum::http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        match declared {
            Some(length) if length > limit as u64 => Err(ApiError::too_large(format!(
                "the body is {length} bytes; this route takes at most {limit}"
            ))),
            _ => Ok(Fits),
        }
    }
}
