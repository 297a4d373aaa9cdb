//! The HTTP/1 server under the API: an accept loop of its own, so that
//! what callers hold open is bounded and the server stops when told.
//!
//! - A connection must send a whole request head within
//!   `header_read_timeout_ms` of the server waiting for one (also an idle
//!   kept-alive connection), or it is closed.
//! - At most `connections_max` connections are served at once; further
//!   ones wait in the listen queue until one closes.
//! - On stop, the listener closes, each connection finishes the request it
//!   is answering and closes, and after `shutdown_grace_ms` the ones still
//!   open (a half-sent request, a body trickling in, an event stream) are
//!   dropped.

use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;

use crate::settings::ServeSettings;

/// How the server stopped.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Stopped {
    /// Connections still open when the grace ran out, dropped.
    pub dropped: usize,
}

/// Serves `router` on `listener` until `stop` holds `true` (or its sender
/// is gone).
pub async fn serve(
    listener: TcpListener,
    router: axum::Router,
    settings: &ServeSettings,
    mut stop: watch::Receiver<bool>,
) -> Stopped {
    let permits = Arc::new(Semaphore::new(settings.connections_max.max(1)));
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_millis(
            settings.header_read_timeout_ms.max(1),
        ));
    let mut connections = JoinSet::new();
    loop {
        while connections.try_join_next().is_some() {}
        let permit = tokio::select! {
            permit = permits.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
            _ = stop.wait_for(|s| *s) => break,
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of descriptors, or a peer that left before it
                    // was accepted: try again shortly.
                    if !matches!(
                        e.kind(),
                        std::io::ErrorKind::ConnectionAborted | std::io::ErrorKind::ConnectionReset
                    ) {
                        stephost_runtime::logs::warn(
                            "serve",
                            None,
                            format_args!("cannot accept a connection: {e}"),
                        );
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    continue;
                }
            },
            _ = stop.wait_for(|s| *s) => break,
        };
        let _ = stream.set_nodelay(true);
        let connection = builder.serve_connection(
            TokioIo::new(stream),
            TowerToHyperService::new(router.clone()),
        );
        let mut stop = stop.clone();
        connections.spawn(async move {
            let _permit = permit;
            let mut connection = std::pin::pin!(connection);
            tokio::select! {
                _ = connection.as_mut() => return,
                _ = stop.wait_for(|s| *s) => {}
            }
            // Finish the request in flight, if any, then close.
            connection.as_mut().graceful_shutdown();
            let _ = connection.await;
        });
    }
    drop(listener);
    let grace = tokio::time::sleep(Duration::from_millis(settings.shutdown_grace_ms));
    tokio::select! {
        _ = async { while connections.join_next().await.is_some() {} } => Stopped::default(),
        _ = grace => {
            let dropped = connections.len();
            connections.shutdown().await;
            Stopped { dropped }
        }
    }
}
