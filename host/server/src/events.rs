//! Live updates: one watcher looks for runs whose row changed and sends
//! their ids to every open event stream (server-sent events, event
//! `runs`). A console refreshes what it shows when one arrives. A model's
//! answer streaming in to the server's own worker is sent as it grows
//! (event `model`: the run, the call's sequence number, the text that came
//! since the event before and the offset it begins at, in characters, so a
//! stream opened mid-answer knows it missed the start), and so is what a
//! model call waits for before it is sent (`waiting`); only the assembled
//! answer is recorded. A token holds at most `event_streams_per_token_max`
//! streams open at once.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures_util::Stream;
use serde::Serialize;
use stephost_core::store::RunQuery;
use tokio::sync::broadcast;

use stephost_effects::ModelProgress;

use crate::access::Caller;
use crate::app::App;
use crate::errors::ApiError;

/// What goes to every open event stream.
#[derive(Debug, Clone)]
pub enum Live {
    /// Runs that changed (a JSON array; empty: refresh everything).
    Runs(String),
    /// A piece of a model's answer (a JSON object).
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
    /// Where `text` begins in the answer, in characters.
    #[serde(skip_serializing_if = "Option::is_none")]
    offset: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    text: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    waiting: Option<&'a str>,
}

/// The worker's stream sink: each piece of an answer to every open stream.
pub fn stream_sink(app: &Arc<App>) -> stephost_effects::StreamSink {
    let changes = app.changes.clone();
    stephost_effects::StreamSink(Arc::new(move |run_id, seq, progress| {
        if changes.receiver_count() == 0 {
            return;
        }
        let (offset, text, waiting) = match progress {
            ModelProgress::Text { offset, text } => (Some(offset), Some(text), None),
            ModelProgress::Waiting(why) => (None, None, Some(why)),
        };
        let event = Streaming {
            run_id,
            seq,
            offset,
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
    /// For a child run: the run at the top of its tree.
    #[serde(skip_serializing_if = "Option::is_none")]
    root_run_id: Option<String>,
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
                            root_run_id: r.root_run_id,
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

/// The event streams each token holds open (`None`: the callers of a
/// server without tokens).
#[derive(Debug, Clone, Default)]
pub struct OpenStreams(Arc<Mutex<HashMap<Option<String>, usize>>>);

/// An open event stream, counted against its token until it is dropped
/// (the stream ends, or its connection closes).
#[derive(Debug)]
struct Held {
    streams: OpenStreams,
    token: Option<String>,
}

impl OpenStreams {
    /// One more stream for `caller`'s token, if it holds fewer than `max`.
    fn hold(&self, caller: &Caller, max: usize) -> Result<Held, ApiError> {
        let mut open = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let held = open.entry(caller.name.clone()).or_default();
        if *held >= max {
            let who = match &caller.name {
                Some(name) => format!("token {name:?}"),
                None => "a server without tokens".to_string(),
            };
            return Err(ApiError::new(
                429,
                "too_many_streams",
                format!(
                    "{who} has {held} event streams open already: event_streams_per_token_max \
                     allows {max}"
                ),
                "close an event stream first (each console tab holds one), or raise the \
                 server's event_streams_per_token_max",
            ));
        }
        *held += 1;
        Ok(Held {
            streams: self.clone(),
            token: caller.name.clone(),
        })
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut open = self.streams.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(held) = open.get_mut(&self.token) {
            *held = held.saturating_sub(1);
            if *held == 0 {
                open.remove(&self.token);
            }
        }
    }
}

/// `GET /api/events`: a stream of `runs` events, each the runs that
/// changed (id, status, version), and `model` events, each a piece of an
/// answer streaming in (run id, seq, offset, text) or what a model call
/// waits for (run id, seq, waiting). A token holds at most
/// `event_streams_per_token_max` open at once (429 `too_many_streams`).
pub async fn stream(
    State(app): State<Arc<App>>,
    caller: Caller,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let held = app
        .streams
        .hold(&caller, app.settings.event_streams_per_token_max)?;
    let receiver = app.changes.subscribe();
    // Subscribed first: a server that stops after this look sends CLOSING
    // to this stream; one that stopped before is seen here.
    let stopped = app.stopping.load(Ordering::SeqCst);
    // The stream's state holds its place in the count: dropped with it.
    let state = (receiver, held);
    let events = futures_util::stream::unfold(state, move |(mut receiver, held)| async move {
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
        Some((Ok(event), (receiver, held)))
    });
    Ok(Sse::new(events).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access::Role;

    fn caller(name: Option<&str>) -> Caller {
        Caller {
            name: name.map(str::to_string),
            role: Role::Read,
        }
    }

    #[test]
    fn a_token_holds_at_most_its_streams_and_a_closed_one_frees_its_place() {
        let streams = OpenStreams::default();
        let dash = caller(Some("dash"));
        let mut held: Vec<Held> = (0..3).map(|_| streams.hold(&dash, 3).unwrap()).collect();
        let refused = streams.hold(&dash, 3).unwrap_err();
        assert_eq!((refused.status, refused.code), (429, "too_many_streams"));
        assert!(
            refused
                .message
                .contains("token \"dash\" has 3 event streams open"),
            "{refused:?}"
        );
        // Another token, and the callers of a server without tokens, count
        // apart.
        let other = streams.hold(&caller(Some("ops")), 3).unwrap();
        let open = streams.hold(&caller(None), 3).unwrap();
        held.pop();
        held.push(streams.hold(&dash, 3).unwrap());
        assert!(streams.hold(&dash, 3).is_err());
        drop((held, other, open));
        assert!(streams.0.lock().unwrap().is_empty());
    }
}
