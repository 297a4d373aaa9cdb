//! The server's settings, each with its unit last and a default.

use std::net::SocketAddr;

#[derive(Debug, Clone)]
pub struct ServeSettings {
    pub listen: SocketAddr,
    /// Runs the server's worker executes at once.
    pub concurrency: usize,
    /// Lease of each claim, renewed in the background.
    pub lease_ms: i64,
    /// Owner name in claims.
    pub worker_id: String,
    /// The largest request body (an uploaded module).
    pub request_bytes_max: usize,
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
    /// On start, runs that failed or diverged this long ago or less are
    /// checked for notifications owed.
    pub notify_lookback_ms: i64,
}

impl Default for ServeSettings {
    fn default() -> Self {
        ServeSettings {
            listen: SocketAddr::from(([127, 0, 0, 1], 7070)),
            concurrency: 4,
            lease_ms: 30_000,
            worker_id: stephost_host::owner::this_process(),
            request_bytes_max: 64 << 20,
            runs_page_max: 1_000,
            calls_page_max: 1_000,
            timeline_body_bytes_max: 2_048,
            watch_ms: 500,
            notify_lookback_ms: 24 * 3_600_000,
        }
    }
}
