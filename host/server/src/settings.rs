//! The server's settings, each with its unit last and a default.

use std::net::SocketAddr;

/// Defaults the command line shows (`stephost serve --help`).
pub mod defaults {
    pub const MODULE_BYTES_MAX: usize = 64 << 20;
    pub const JSON_BODY_BYTES_MAX: usize = 1 << 20;
    pub const HEADER_READ_TIMEOUT_MS: u64 = 10_000;
    pub const CONNECTIONS_MAX: usize = 512;
    pub const SHUTDOWN_GRACE_MS: u64 = 5_000;
    pub const WAIT_MS_MAX: u64 = 60_000;
}

#[derive(Debug, Clone)]
pub struct ServeSettings {
    pub listen: SocketAddr,
    /// Runs the server's worker executes at once.
    pub concurrency: usize,
    /// Lease of each claim, renewed in the background.
    pub lease_ms: i64,
    /// Owner name in claims.
    pub worker_id: String,
    /// The largest module upload (`POST /api/modules`, raw bytes).
    pub module_bytes_max: usize,
    /// The largest JSON body (every other POST). A `module_base64` in a
    /// submission or a replay counts against it: upload large modules
    /// first and name them by digest.
    pub json_body_bytes_max: usize,
    /// A connection that has not sent a whole request head (request line
    /// and headers) this long after the server began to wait for one is
    /// closed; an idle kept-alive connection too.
    pub header_read_timeout_ms: u64,
    /// Connections served at once; more wait to be accepted.
    pub connections_max: usize,
    /// Event streams (`GET /api/events`) one token holds open at once (a
    /// server without tokens: all callers together); the next is refused
    /// with 429 `too_many_streams`, so that no reader holds every
    /// connection.
    pub event_streams_per_token_max: usize,
    /// Promise completions (`POST /api/promises/{token}`, which takes no
    /// bearer token) the server accepts a second, all callers together;
    /// more are refused with 429 `too_many_completions`.
    pub promise_completions_per_second_max: usize,
    /// On SIGTERM, requests in flight have this long to finish; then the
    /// connections still open are dropped.
    pub shutdown_grace_ms: u64,
    /// Ledger connections the request handlers use at once (and keep
    /// open between requests); more requests wait for one.
    pub ledger_stores_max: usize,
    /// `/readyz` reads the ledger at most this often; callers in between
    /// (and at once) share the last answer.
    pub ready_cache_ms: u64,
    /// `/api/summary` is computed at most this often; callers in between
    /// (and at once) share the last one.
    pub summary_cache_ms: u64,
    /// Runs in one page of a listing, at most.
    pub runs_page_max: usize,
    /// Calls in one page of a timeline, at most.
    pub calls_page_max: usize,
    /// A request or response in a timeline page is cut at this size; the
    /// call's own page has it whole.
    pub timeline_body_bytes_max: usize,
    /// How often the server looks for changed runs (live updates) and for
    /// notifications to owe and send.
    pub watch_ms: u64,
    /// On start, runs that changed this long ago or less are checked for
    /// notifications owed.
    pub notify_lookback_ms: i64,
    /// Changed runs the notifier reads in one look, at most (the rest at
    /// the next looks).
    pub notify_page_runs_max: usize,
    /// The longest `POST /api/runs?wait=MS` holds its request; a longer
    /// wait asked for is cut to it.
    pub wait_ms_max: u64,
    /// The worker looks for runnable runs at least this often (none: its
    /// default for the ledger).
    pub poll_ms: Option<u64>,
    /// Finished runs the server's worker deletes in the background
    /// (`[retention]` in `stephost.toml`).
    pub retention: Option<stephost_runtime::retention::RetentionConfig>,
}

impl Default for ServeSettings {
    fn default() -> Self {
        ServeSettings {
            listen: SocketAddr::from(([127, 0, 0, 1], 7070)),
            concurrency: 4,
            lease_ms: 30_000,
            worker_id: stephost_runtime::owner::this_process(),
            module_bytes_max: defaults::MODULE_BYTES_MAX,
            json_body_bytes_max: defaults::JSON_BODY_BYTES_MAX,
            header_read_timeout_ms: defaults::HEADER_READ_TIMEOUT_MS,
            connections_max: defaults::CONNECTIONS_MAX,
            event_streams_per_token_max: 8,
            promise_completions_per_second_max: 1_000,
            shutdown_grace_ms: defaults::SHUTDOWN_GRACE_MS,
            ledger_stores_max: 8,
            ready_cache_ms: 1_000,
            summary_cache_ms: 1_000,
            runs_page_max: 1_000,
            calls_page_max: 1_000,
            timeline_body_bytes_max: 2_048,
            watch_ms: 500,
            notify_lookback_ms: 24 * 3_600_000,
            notify_page_runs_max: 500,
            wait_ms_max: defaults::WAIT_MS_MAX,
            poll_ms: None,
            retention: None,
        }
    }
}
