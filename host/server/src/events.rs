//! Live updates: one watcher looks for runs whose row changed and sends
//! their ids to every open event stream (server-sent events, event
//! `runs`). A console refreshes what it shows when one arrives. A model's
//! answer streaming in to the server's own worker is sent as it grows
//! (event `model`: the run, the call's sequence number and the text so
//! far), and so is what a model call waits for before it is sent
//! (`waiting`); only the assembled answer is recorded.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures_util::Stream;
use serde::Serialize;
use stephost_core::store::RunQuery;
use tokio::sync::broadcast;

use stephost_runtime::options::ModelProgress;

use crate::access::Caller;
use crate::app::App;

/// What goes to every open event stream.
#[derive(Debug, Clone)]
pub enum Live {
    /// Runs that changed (a JSON array; empty: refresh everything).
    Runs(String),
    /// A model's answer so far (a JSON object).
    Model(String),
    /// The server stops: each stream ends, so a draining server is not held
    /// open by a console left on a page (a stream opened after it sees
    /// [`App::stopping`]).
    Closing,
}

#[derive(Debug, Serialize)]
struct Streaming<'a> {
    run_id: &'a str,
    seq: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    text: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    waiting: Option<&'a str>,
}

/// The worker's stream sink: each answer so far to every open stream.
pub fn stream_sink(app: &Arc<App>) -> stephost_runtime::options::StreamSink {
    let changes = app.changes.clone();
    stephost_runtime::options::StreamSink(Arc::new(move |run_id, seq, progress| {
        if changes.receiver_count() == 0 {
            return;
        }
        let (text, waiting) = match progress {
            ModelProgress::Text(text) => (Some(text), None),
            ModelProgress::Waiting(why) => (None, Some(why)),
        };
        let event = Streaming {
            run_id,
            seq,
            text,
            waiting,
        };
        if let Ok(json) = serde_json::to_string(&event) {
            let _ = changes.send(Live::Model(json));
        }
    }))
}

/// Changed runs one look takes, at most.
const CHANGED_MAX: usize = 1_000;

/// Rows changed this long before a look are looked at again (a commit can
/// land with a time slightly before the look that would miss it).
const OVERLAP_MS: i64 = 2_000;

#[derive(Debug, Serialize)]
struct Changed {
    run_id: String,
    status: &'static str,
    version: i64,
}

/// Looks for changed runs every `watch_ms` until `shutdown`.
pub fn watch(app: Arc<App>, shutdown: Arc<AtomicBool>) {
    let mut seen: HashMap<String, (i64, i64)> = HashMap::new();
    let mut since = stephost_core::clock::now_ms();
    let mut store = None;
    while !shutdown.load(Ordering::Relaxed) {
        let Some(store) = store.as_ref() else {
            match app.pool.store() {
                Ok(opened) => store = Some(opened),
                Err(e) => {
                    stephost_runtime::logs::warn(
                        "serve",
                        None,
                        format_args!("live updates wait for the ledger: {e}"),
                    );
                    std::thread::sleep(Duration::from_secs(1));
                }
            }
            continue;
        };
        let look = stephost_core::clock::now_ms();
        let query = RunQuery {
            updated_after_ms: Some(since - OVERLAP_MS),
            limit: Some(CHANGED_MAX),
            ..RunQuery::default()
        };
        match store.runs(&query) {
            Ok(runs) => {
                let mut changed = Vec::new();
                // More changed than one look takes: everyone refreshes
                // everything (an empty list says so).
                let all = runs.len() == CHANGED_MAX;
                for r in runs {
                    let known = seen.insert(r.run_id.clone(), (r.version, r.updated_at_ms));
                    if known.map(|k| k.0) != Some(r.version) {
                        changed.push(Changed {
                            status: r.status.as_str(),
                            run_id: r.run_id,
                            version: r.version,
                        });
                    }
                }
                seen.retain(|_, (_, at)| *at > since - 2 * OVERLAP_MS);
                if all {
                    changed.clear();
                }
                if (all || !changed.is_empty())
                    && let Ok(text) = serde_json::to_string(&changed)
                {
                    // No receivers is fine: nobody is watching.
                    let _ = app.changes.send(Live::Runs(text));
                }
                since = look;
            }
            Err(e) => {
                stephost_runtime::logs::warn("serve", None, format_args!("live updates: {e}"))
            }
        }
        std::thread::sleep(Duration::from_millis(app.settings.watch_ms));
    }
    app.stopping.store(true, Ordering::SeqCst);
    let _ = app.changes.send(Live::Closing);
}

/// `GET /api/events`: a stream of `runs` events, each the runs that
/// changed (id, status, version), and `model` events, each an answer so far
/// (run id, seq, text).
pub async fn stream(
    State(app): State<Arc<App>>,
    _caller: Caller,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let receiver = app.changes.subscribe();
    // Subscribed first: a server that stops after this look sends CLOSING
    // to this stream; one that stopped before is seen here.
    let stopped = app.stopping.load(Ordering::SeqCst);
    let events = futures_util::stream::unfold(receiver, move |mut receiver| async move {
        if stopped {
            return None;
        }
        let event = match receiver.recv().await {
            Ok(Live::Closing) | Err(broadcast::error::RecvError::Closed) => return None,
            Ok(Live::Runs(text)) => Event::default().event("runs").data(text),
            Ok(Live::Model(text)) => Event::default().event("model").data(text),
            // A slow reader missed some: it refreshes everything.
            Err(broadcast::error::RecvError::Lagged(_)) => {
                Event::default().event("runs").data("[]")
            }
        };
        Some((Ok(event), receiver))
    });
    Sse::new(events).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
}
