//! How spans leave the process: the OTLP exporter's HTTP client (ureq, on
//! the batch processor's own thread), and span ids chosen by the host
//! rather than drawn.

use std::cell::Cell;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use opentelemetry::trace::{SpanId, TraceId};
use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use opentelemetry_sdk::trace::{IdGenerator, RandomIdGenerator};

/// The most bytes of a collector's answer read.
const ANSWER_BYTES_MAX: u64 = 4 * 1024 * 1024;

/// The exporter's client. The batch processor runs each export on its own
/// thread, so a blocking client is what it needs; any status is an answer
/// (the exporter decides what to retry).
#[derive(Debug, Clone)]
pub struct UreqClient(ureq::Agent);

impl UreqClient {
    pub fn new(timeout: Duration) -> Self {
        let config = ureq::Agent::config_builder()
            .timeout_global(Some(timeout))
            .http_status_as_error(false)
            // A redirect is an answer, and the export failed: following it
            // would send the spans and OTEL_EXPORTER_OTLP_HEADERS (a
            // collector's token) wherever the answer says.
            .max_redirects(0)
            .build();
        UreqClient(ureq::Agent::new_with_config(config))
    }
}

#[async_trait::async_trait]
impl HttpClient for UreqClient {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let (parts, body) = request.into_parts();
        let url = parts.uri.to_string();
        let answer = self
            .0
            .run(ureq::http::Request::from_parts(parts, &body[..]))
            .and_then(|response| {
                let (parts, mut body) = response.into_parts();
                let bytes = body.with_config().limit(ANSWER_BYTES_MAX).read_to_vec()?;
                Ok(Response::from_parts(parts, Bytes::from(bytes)))
            });
        match &answer {
            Ok(response) if !response.status().is_success() => failed(
                &url,
                format_args!("the collector answered {}", response.status()),
            ),
            Err(e) => failed(&url, e),
            Ok(_) => {}
        }
        Ok(answer?)
    }
}

/// The least time between two warnings of a failed export, in ms.
const FAILURE_WARNING_EVERY_MS: i64 = 60_000;

/// Says on stderr that an export to `url` failed, at most once a minute:
/// an operator sees a collector that cannot be reached; no run waits for
/// it (the spans are dropped after the exporter's retries).
fn failed(url: &str, why: impl std::fmt::Display) {
    static LAST: AtomicI64 = AtomicI64::new(i64::MIN);
    let now = stephost_core::clock::now_ms();
    let last = LAST.load(Ordering::Relaxed);
    if now.saturating_sub(last) < FAILURE_WARNING_EVERY_MS
        || LAST
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
    {
        return;
    }
    crate::logs::warn(
        "stephost",
        None,
        format_args!(
            "exporting spans to {url} failed: {why}; check OTEL_EXPORTER_OTLP_ENDPOINT and the \
             collector (said at most once a minute)"
        ),
    );
}

thread_local! {
    static TRACE_ID: Cell<Option<TraceId>> = const { Cell::new(None) };
    static SPAN_ID: Cell<Option<SpanId>> = const { Cell::new(None) };
}

/// Ids as [`with_ids`] sets them for the span being started on this
/// thread, else random ones.
#[derive(Debug, Default)]
pub struct ChosenIds(RandomIdGenerator);

impl IdGenerator for ChosenIds {
    fn new_trace_id(&self) -> TraceId {
        TRACE_ID
            .with(Cell::take)
            .unwrap_or_else(|| self.0.new_trace_id())
    }

    fn new_span_id(&self) -> SpanId {
        SPAN_ID
            .with(Cell::take)
            .unwrap_or_else(|| self.0.new_span_id())
    }
}

/// Runs `start` (which starts one span) with its span id, and its trace id
/// if it has no parent, chosen.
pub fn with_ids<R>(trace: TraceId, span: SpanId, start: impl FnOnce() -> R) -> R {
    TRACE_ID.with(|c| c.set(Some(trace)));
    SPAN_ID.with(|c| c.set(Some(span)));
    let started = start();
    TRACE_ID.with(|c| c.set(None));
    SPAN_ID.with(|c| c.set(None));
    started
}
