//! OpenTelemetry traces of runs, exported by OTLP (http/protobuf) as the
//! standard `OTEL_*` environment variables say; off, and free, when no
//! endpoint is set.
//!
//! Spans are made from what the ledger holds, when an execution ends: a
//! span for the execution, one for each call it went through (replayed or
//! live, its attempts as events, a model call's GenAI attributes), one for
//! the wait before it (a timer, a person, a model's capacity, the queue),
//! one for the run once it finishes, and one for an execution that lost
//! its claim without ending it (rebuilt by the execution that took the run
//! over). Their ids are derived ([`stephost_core::trace`]), so every
//! execution of a run, on whichever worker, reports into the run's one
//! trace, and the `traceparent` a receiver got names a span that exists.
//! What each span holds is in docs/operations.md ("Traces").

mod export;
mod spans;

use std::sync::Arc;
use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{SpanExporter, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{BatchSpanProcessor, SdkTracer, SdkTracerProvider, ShouldSample};
use stephost_core::trace::CallTiming;
use stephost_core::{ClaimedFrom, RunTrace, Views};

use crate::error::HostError;
use stephost_effects::Effects;

/// How long an export waits for the collector unless
/// `OTEL_EXPORTER_OTLP_TIMEOUT` says otherwise.
pub const EXPORT_TIMEOUT_MS_DEFAULT: u64 = 10_000;

/// The environment variable that puts model calls' messages on their spans.
pub const CAPTURE_CONTENT_ENV: &str = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT";

/// The exporter of one process.
pub struct Telemetry {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
    sampler: Box<dyn ShouldSample>,
    /// Whether a model call's span carries its messages (as the ledger
    /// keeps them: redacted values never).
    capture_content: bool,
}

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Telemetry")
            .field("capture_content", &self.capture_content)
            .finish_non_exhaustive()
    }
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

fn env_ms(name: &str) -> Result<Option<u64>, HostError> {
    env(name)
        .map(|v| {
            v.trim().parse::<u64>().map_err(|_| {
                HostError::BadInput(format!(
                    "{name}={v:?} is not a number of milliseconds; set it to one (the default \
                     is {EXPORT_TIMEOUT_MS_DEFAULT})"
                ))
            })
        })
        .transpose()
}

fn is_true(name: &str) -> bool {
    env(name).is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
}

impl Telemetry {
    /// The exporter the environment asks for, or none: no
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` (or `..._TRACES_ENDPOINT`),
    /// `OTEL_SDK_DISABLED=true`, or `OTEL_TRACES_EXPORTER=none`. A setting
    /// this build cannot honour is refused, named.
    pub fn from_env() -> Result<Option<Arc<Telemetry>>, HostError> {
        if is_true("OTEL_SDK_DISABLED") {
            return Ok(None);
        }
        match env("OTEL_TRACES_EXPORTER").map(|v| v.trim().to_ascii_lowercase()) {
            Some(v) if v == "none" => return Ok(None),
            Some(v) if v != "otlp" => {
                return Err(HostError::BadInput(format!(
                    "OTEL_TRACES_EXPORTER={v} is not supported; stephost exports traces by \
                     otlp (or set it to none)"
                )));
            }
            _ => {}
        }
        if env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_none()
            && env("OTEL_EXPORTER_OTLP_ENDPOINT").is_none()
        {
            return Ok(None);
        }
        let protocol = env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
            .or_else(|| env("OTEL_EXPORTER_OTLP_PROTOCOL"))
            .unwrap_or_else(|| "http/protobuf".into());
        if !protocol.trim().eq_ignore_ascii_case("http/protobuf") {
            return Err(HostError::BadInput(format!(
                "OTEL_EXPORTER_OTLP_PROTOCOL={protocol} is not supported; stephost exports \
                 over http/protobuf (point the endpoint at the collector's HTTP port, 4318)"
            )));
        }
        let timeout_ms = match env_ms("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT")? {
            Some(ms) => ms,
            None => env_ms("OTEL_EXPORTER_OTLP_TIMEOUT")?.unwrap_or(EXPORT_TIMEOUT_MS_DEFAULT),
        };
        let timeout = Duration::from_millis(timeout_ms);
        // Endpoint, headers and compression from the environment.
        let exporter = SpanExporter::builder()
            .with_http()
            .with_http_client(export::UreqClient::new(timeout))
            .with_timeout(timeout)
            .build()
            .map_err(|e| {
                HostError::BadInput(format!(
                    "the OTLP trace exporter cannot be set up from OTEL_EXPORTER_OTLP_*: {e}"
                ))
            })?;
        let mut resource = Resource::builder();
        if env("OTEL_SERVICE_NAME").is_none() {
            resource = resource.with_service_name("stephost");
        }
        let provider = SdkTracerProvider::builder()
            .with_span_processor(BatchSpanProcessor::builder(exporter).build())
            .with_id_generator(export::ChosenIds::default())
            .with_resource(resource.build())
            .build();
        let tracer = provider.tracer_with_scope(
            opentelemetry::InstrumentationScope::builder("stephost")
                .with_version(env!("CARGO_PKG_VERSION"))
                .build(),
        );
        Ok(Some(Arc::new(Telemetry {
            provider,
            tracer,
            // `OTEL_TRACES_SAMPLER` and its argument, as the provider reads them.
            sampler: opentelemetry_sdk::trace::Config::default().sampler,
            capture_content: is_true(CAPTURE_CONTENT_ENV),
        })))
    }

    /// The trace of a new run nobody's trace contains, sampled as
    /// `OTEL_TRACES_SAMPLER` decides for its trace id.
    pub fn new_trace(&self) -> RunTrace {
        let mut trace = RunTrace::new(true);
        trace.sampled = spans::samples(self.sampler.as_ref(), &trace);
        trace
    }

    /// Sends what is queued and stops the exporter (at most a few seconds).
    pub fn shutdown(&self) {
        if let Err(e) = self.provider.shutdown() {
            crate::logs::warn(
                "stephost",
                None,
                format_args!("exporting the last spans: {e}"),
            );
        }
    }

    /// Reports an execution that has ended, from the ledger: its own spans
    /// if it ended its claim itself (`ended`, its counts of calls: the run
    /// finished, waits, was parked or released; otherwise the execution
    /// that takes the run over reports it), and the wait before it and an execution before it
    /// that lost its claim, either way. Nothing for a run whose trace is not
    /// sampled. Spans that cannot be made (the ledger cannot be read) are
    /// left out, said on stderr; the run is not affected.
    pub fn execution_ended(
        &self,
        store: &dyn Views,
        effects: &Effects,
        execution: &Execution,
        timings: &[CallTiming],
        ended: Option<stephost_core::journal::Stats>,
    ) {
        let ended = spans::Ended {
            timings,
            stats: ended,
            end_unix_ns: stephost_core::trace::unix_ns(),
        };
        if let Err(e) = spans::report(self, store, effects, execution, &ended) {
            crate::logs::warn(
                "stephost",
                Some(&execution.run_id),
                format_args!("the spans of this execution are left out: {e}"),
            );
        }
    }
}

/// An execution as spans need it, noted when it starts.
#[derive(Debug, Clone)]
pub struct Execution {
    pub run_id: String,
    pub fence: i64,
    pub owner: String,
    /// How the last execution left the run, from the claim.
    pub from: Option<ClaimedFrom>,
    pub start_unix_ns: i64,
}
