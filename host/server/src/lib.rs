//! `stephost serve`: one process that runs a worker and serves the HTTP API
//! ([`api`]), the web console ([`console`]), live updates ([`events`]) and
//! webhook notifications ([`notifier`]) over one ledger. Several servers
//! may share a PostgreSQL ledger. Access is by bearer token ([`access`]);
//! errors are JSON with a stable code ([`errors`]).

pub mod access;
pub mod api;
pub mod app;
pub mod console;
pub mod errors;
pub mod events;
pub mod http;
pub mod notifier;
pub mod openapi;
pub mod promises;
pub mod schedules;
pub mod settings;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use stephost_core::store::Opener;
use stephost_core::store::PoolOptions;
use stephost_runtime::config::Webhook;
use stephost_runtime::worker::{EndHook, WorkerOptions, WorkerReport};
use stephost_runtime::{Host, HostError, HostOptions};

pub use access::Tokens;
pub use settings::ServeSettings;

/// Serves until `shutdown` is set, then drains the worker like `stephost
/// worker` does and returns its report.
pub fn serve(
    ledger: &dyn Opener,
    make_options: &(dyn Fn() -> HostOptions + Sync),
    webhooks: Vec<Webhook>,
    tokens: Tokens,
    settings: ServeSettings,
    shutdown: Arc<AtomicBool>,
) -> Result<WorkerReport, HostError> {
    let addr = settings.listen;
    if !addr.ip().is_loopback() && tokens.is_empty() {
        return Err(HostError::BadInput(format!(
            "refusing to serve on {addr} without tokens: anyone who can reach it could approve \
             and resolve. Set {} (or {}) to lines `NAME ROLE TOKEN`, or listen on 127.0.0.1",
            access::TOKENS_VAR,
            access::TOKENS_FILE_VAR
        )));
    }
    let listener = std::net::TcpListener::bind(addr).map_err(|e| {
        HostError::BadInput(format!(
            "cannot listen on {addr}: {e}; choose another address with --listen"
        ))
    })?;
    listener
        .set_nonblocking(true)
        .map_err(|e| HostError::Internal(format!("cannot set up the listener: {e}")))?;
    let tokenless = tokens.is_empty();
    let pool = ledger.open(PoolOptions::default())?;
    let host = Host::open(pool.clone(), make_options())?;
    let app = Arc::new(app::App::new(pool.clone(), host, tokens, settings.clone()));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_io()
        .enable_time()
        .thread_name("stephost-serve")
        .build()
        .map_err(|e| HostError::Internal(format!("cannot start the server's runtime: {e}")))?;
    let listener = {
        let _entered = runtime.enter();
        tokio::net::TcpListener::from_std(listener)
            .map_err(|e| HostError::Internal(format!("cannot set up the listener: {e}")))?
    };
    let local = listener.local_addr().unwrap_or(addr);
    if tokenless {
        stephost_runtime::logs::warn(
            "serve",
            None,
            access::TOKENLESS_WARNING.trim_start_matches("stephost serve: "),
        );
    }
    stephost_runtime::logs::info(
        "serve",
        None,
        format_args!(
            "listening on http://{local}/ (API under /api, /openapi.json); ledger {}",
            ledger.url()
        ),
    );
    let ended = app.clone();
    let worker_options = WorkerOptions {
        // A request waiting for a run's end looks again when one ends.
        on_end: Some(EndHook(Arc::new(move |_| ended.ended.notify_waiters()))),
        retention: settings.retention.clone(),
        ..WorkerOptions::new(
            settings.concurrency,
            settings.lease_ms,
            settings.worker_id.clone(),
        )
        .polling(settings.poll_ms)
    };
    let every = Duration::from_millis(settings.watch_ms.max(10));
    // The worker's answers streaming in go to the event streams.
    let sink = events::stream_sink(&app);
    let worker_options_of = move || {
        let mut options = make_options();
        options.services.stream_sink = Some(sink.clone());
        options
    };
    std::thread::scope(|scope| {
        let worker = scope.spawn(|| {
            let report = stephost_runtime::worker::run(
                ledger,
                &worker_options_of,
                &worker_options,
                &shutdown,
            );
            // A worker that cannot go on takes the server down with it.
            shutdown.store(true, Ordering::Relaxed);
            report
        });
        let watcher = app.clone();
        scope.spawn(|| events::watch(watcher, shutdown.clone()));
        let notifier = notifier::Notifier::new(
            webhooks,
            settings.notify_lookback_ms,
            settings.notify_page_runs_max,
        );
        scope.spawn(|| notifier.run(pool.clone(), every, &shutdown));
        let router = api::router(app.clone());
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let stop = shutdown.clone();
        let http_settings = settings.clone();
        let stopped = runtime.block_on(async move {
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                let _ = stop_tx.send(true);
            });
            http::serve(listener, router, &http_settings, stop_rx).await
        });
        if stopped.dropped > 0 {
            stephost_runtime::logs::warn(
                "serve",
                None,
                format_args!(
                    "{} connection(s) still open after the {} ms grace were dropped",
                    stopped.dropped, settings.shutdown_grace_ms
                ),
            );
        }
        // Open event streams end with the runtime.
        runtime.shutdown_timeout(Duration::from_secs(1));
        shutdown.store(true, Ordering::Relaxed);
        let report = worker
            .join()
            .map_err(|_| HostError::Internal("the server's worker panicked".into()))??;
        Ok(report)
    })
}
