//! The spans of an execution, made from the ledger once it has ended, with
//! the ids its run's trace derives.

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use opentelemetry::trace::{
    Span as _, SpanContext, SpanId, SpanKind, Status, TraceContextExt as _, TraceFlags, TraceId,
    TraceState, Tracer as _,
};
use opentelemetry::{Array, Context, KeyValue, StringValue, Value};
use opentelemetry_sdk::trace::{SamplingDecision, ShouldSample, Span};
use stephost_core::trace::CallTiming;
use stephost_core::{
    AttemptRecord, CallClass, CallRecord, CallState, ClaimedFrom, Outcome, RunRecord, RunStatus,
    RunTrace, StoreError, Views,
};

use super::{Execution, Telemetry, export};
use stephost_effects::Effects;

/// How an execution ended.
pub(super) struct Ended<'a> {
    /// When it went through each call but observe calls.
    pub timings: &'a [CallTiming],
    /// Its counts of calls, when it ended its claim itself (else the
    /// execution that takes the run over reports it).
    pub stats: Option<stephost_core::journal::Stats>,
    pub end_unix_ns: i64,
}

/// Whether `sampler` samples a new trace with `trace`'s id.
pub(super) fn samples(sampler: &dyn ShouldSample, trace: &RunTrace) -> bool {
    let Ok(id) = TraceId::from_hex(&trace.trace_id) else {
        return false;
    };
    matches!(
        sampler
            .should_sample(None, id, "run", &SpanKind::Internal, &[], &[])
            .decision,
        SamplingDecision::RecordAndSample
    )
}

pub(super) fn report(
    telemetry: &Telemetry,
    store: &dyn Views,
    effects: &Effects,
    execution: &Execution,
    ended: &Ended<'_>,
) -> Result<(), StoreError> {
    let run = store.run(&execution.run_id)?;
    let trace = run.trace();
    if !trace.sampled {
        return Ok(());
    }
    let maker = Maker::new(telemetry, &trace, &run)?;
    let run_id = run.run_id.as_str();
    // The execution before, if it never ended its claim: its calls are
    // those recorded under its fencing token (the ledger holds no more of
    // them once the claim has moved on).
    let lost = execution
        .from
        .as_ref()
        .filter(|from| from.status == RunStatus::Running && from.owner.is_some());
    let first_seq = match lost {
        Some(_) => Some(1),
        None => ended.timings.iter().map(|t| t.seq).min(),
    };
    // Up to the last call timed, or every call for a lost execution.
    let last_seq = match lost {
        Some(_) => None,
        None => ended.timings.iter().map(|t| t.seq).max(),
    };
    let calls = match (first_seq, last_seq) {
        (Some(first), Some(last)) => store.calls(
            run_id,
            first,
            usize::try_from(last - first + 1).unwrap_or(usize::MAX),
        )?,
        (Some(first), None) => store.calls(
            run_id,
            first,
            stephost_core::records::CALLS_PER_RUN_MAX as usize,
        )?,
        _ => Vec::new(),
    };
    // The calls are read in order from `first_seq`, one row a seq.
    let first = first_seq.unwrap_or(1);
    let call = |seq: u64| {
        seq.checked_sub(first)
            .and_then(|i| calls.get(usize::try_from(i).ok()?))
            .filter(|c| c.seq == seq)
    };
    if let Some(from) = lost {
        let theirs: Vec<&CallRecord> = calls.iter().filter(|c| c.fence == from.fence).collect();
        maker.lost_execution(store, effects, execution, from, &theirs)?;
    }
    if let Some(from) = &execution.from {
        let first_live = ended
            .timings
            .iter()
            .find(|t| !t.replayed)
            .and_then(|t| call(t.seq));
        // A person's decision leaves the run running with no owner.
        let decided = (from.status == RunStatus::Running && from.owner.is_none())
            .then(|| calls.iter().rfind(|c| c.resolved_by.is_some()))
            .flatten();
        maker.wait(execution, from, first_live, decided);
    }
    let Some(stats) = ended.stats else {
        return Ok(());
    };
    let exec_id = trace.execution_span_id(run_id, execution.fence);
    let exec_cx = maker.context(&exec_id);
    // This execution's attempts, read once (a call left in flight has the
    // earlier ones too).
    let since_ms = execution.start_unix_ns / 1_000_000;
    let mut attempts = if ended.timings.iter().any(|t| !t.replayed) {
        by_call(store.attempts(run_id, None)?, since_ms)
    } else {
        HashMap::new()
    };
    for timing in ended.timings {
        let Some(record) = call(timing.seq) else {
            continue;
        };
        let own = match timing.replayed {
            true => Vec::new(),
            false => attempts.remove(&timing.seq).unwrap_or_default(),
        };
        let span_id = trace.call_span_id(run_id, timing.seq, execution.fence);
        let times = (ns_time(timing.start_unix_ns), ns_time(timing.end_unix_ns));
        maker.call(
            &exec_cx,
            &span_id,
            record,
            timing.replayed,
            &own,
            times,
            effects,
        );
    }
    let mut attributes = maker.run_attributes();
    attributes.extend([
        KeyValue::new("stephost.execution.fence", execution.fence),
        KeyValue::new("stephost.worker", execution.owner.clone()),
        KeyValue::new("stephost.execution.end", end_of(run.status)),
    ]);
    attributes.extend([
        KeyValue::new("stephost.execution.calls_replayed", stats.replayed as i64),
        KeyValue::new("stephost.execution.calls_live", stats.live as i64),
    ]);
    if let Some(wake) = run.wake_at_ms.filter(|_| run.status == RunStatus::Waiting) {
        attributes.push(KeyValue::new(
            "stephost.run.wake_at",
            stephost_core::clock::format_time(wake),
        ));
    }
    let mut span = maker.start(
        format!("execute {}", maker.step),
        SpanKind::Internal,
        &maker.run_cx,
        &exec_id,
        ns_time(execution.start_unix_ns),
        attributes,
    );
    span.set_status(run_status(&run));
    span.end_with_timestamp(ns_time(ended.end_unix_ns));
    if run.status.is_finished() {
        maker.run_span(&run);
    }
    Ok(())
}

/// `attempts` begun at `since_ms` or later, by their call.
fn by_call(attempts: Vec<AttemptRecord>, since_ms: i64) -> HashMap<u64, Vec<AttemptRecord>> {
    let mut grouped: HashMap<u64, Vec<AttemptRecord>> = HashMap::new();
    for attempt in attempts.into_iter().filter(|a| a.started_at_ms >= since_ms) {
        grouped.entry(attempt.seq).or_default().push(attempt);
    }
    grouped
}

/// What an execution that ended its claim left the run as.
fn end_of(status: RunStatus) -> &'static str {
    match status {
        // Its claim released for another worker (a shutdown).
        RunStatus::Pending | RunStatus::Running => "released",
        other => other.as_str(),
    }
}

fn run_status(run: &RunRecord) -> Status {
    match run.status {
        RunStatus::Completed => Status::Ok,
        RunStatus::Failed | RunStatus::Diverged | RunStatus::Parked => {
            Status::error(run.error.clone().unwrap_or_default())
        }
        _ => Status::Unset,
    }
}

fn ns_time(ns: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_nanos(u64::try_from(ns).unwrap_or_default())
}

fn ms_time(ms: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or_default())
}

/// Starts spans of one run's trace.
struct Maker<'a> {
    telemetry: &'a Telemetry,
    trace: &'a RunTrace,
    trace_id: TraceId,
    flags: TraceFlags,
    run: &'a RunRecord,
    step: &'a str,
    /// The run's span, the parent of its executions and waits.
    run_cx: Context,
}

impl<'a> Maker<'a> {
    fn new(
        telemetry: &'a Telemetry,
        trace: &'a RunTrace,
        run: &'a RunRecord,
    ) -> Result<Self, StoreError> {
        let trace_id = TraceId::from_hex(&trace.trace_id).map_err(|_| {
            StoreError::Corrupt(format!(
                "run {} has trace id {:?}",
                run.run_id, trace.trace_id
            ))
        })?;
        let mut maker = Maker {
            telemetry,
            trace,
            trace_id,
            flags: if trace.sampled {
                TraceFlags::SAMPLED
            } else {
                TraceFlags::default()
            },
            run,
            step: run.step.as_deref().unwrap_or("step"),
            run_cx: Context::new(),
        };
        maker.run_cx = maker.context(&trace.run_span_id(&run.run_id));
        Ok(maker)
    }

    /// A context whose span is `span_id` of this trace, made elsewhere.
    fn context(&self, span_id: &str) -> Context {
        let span = SpanId::from_hex(span_id).unwrap_or(SpanId::INVALID);
        Context::new().with_remote_span_context(SpanContext::new(
            self.trace_id,
            span,
            self.flags,
            true,
            TraceState::NONE,
        ))
    }

    fn start(
        &self,
        name: String,
        kind: SpanKind,
        parent: &Context,
        span_id: &str,
        start: SystemTime,
        attributes: Vec<KeyValue>,
    ) -> Span {
        let tracer = &self.telemetry.tracer;
        let id = SpanId::from_hex(span_id).unwrap_or(SpanId::INVALID);
        export::with_ids(self.trace_id, id, || {
            tracer
                .span_builder(name)
                .with_kind(kind)
                .with_start_time(start)
                .with_attributes(attributes)
                .start_with_context(tracer, parent)
        })
    }

    fn run_attributes(&self) -> Vec<KeyValue> {
        let mut attributes = vec![
            KeyValue::new("stephost.run.id", self.run.run_id.clone()),
            KeyValue::new("stephost.module.digest", self.run.module_digest.clone()),
        ];
        if let Some(step) = &self.run.step {
            attributes.push(KeyValue::new("stephost.step", step.clone()));
        }
        attributes
    }

    /// The run as a whole, once it has finished: from its record to its
    /// end, a child of the caller's span when it was submitted in a trace.
    fn run_span(&self, run: &RunRecord) {
        let parent = match &self.trace.parent_span_id {
            Some(caller) => self.context(caller),
            None => Context::new(),
        };
        let mut attributes = self.run_attributes();
        attributes.push(KeyValue::new("stephost.run.status", run.status.as_str()));
        let mut span = self.start(
            format!("run {}", self.step),
            SpanKind::Internal,
            &parent,
            &self.trace.run_span_id(&run.run_id),
            ms_time(run.created_at_ms),
            attributes,
        );
        span.set_status(run_status(run));
        span.end_with_timestamp(ms_time(run.updated_at_ms.max(run.created_at_ms)));
    }

    /// The time the run spent between its last execution and this one:
    /// waiting for a timer or an approval (from the call that waited), for
    /// a person's decision, a model's capacity, or a worker.
    fn wait(
        &self,
        execution: &Execution,
        from: &ClaimedFrom,
        first_live: Option<&CallRecord>,
        decided: Option<&CallRecord>,
    ) {
        // The call that waited: an approval or a timer this execution
        // completed, or a call a person decided (then replayed).
        let waited = first_live
            .filter(|c| c.class == CallClass::Suspend)
            .or(decided);
        let (what, since) = match (waited, from.status) {
            (Some(c), _) if c.class == CallClass::Suspend && c.interface.contains("approvals") => {
                ("approval", c.started_at_ms)
            }
            (Some(c), _) if c.class == CallClass::Suspend => ("timer", c.started_at_ms),
            (Some(c), _) => ("person", c.started_at_ms),
            (None, RunStatus::Parked) => ("person", from.updated_at_ms),
            (None, RunStatus::Waiting) => ("model_capacity", from.updated_at_ms),
            (None, RunStatus::Pending) => ("worker", from.updated_at_ms),
            _ => return,
        };
        let mut attributes = self.run_attributes();
        attributes.extend([
            KeyValue::new("stephost.wait.for", what),
            KeyValue::new("stephost.wait.status", from.status.as_str()),
        ]);
        if let Some(who) = waited.and_then(|c| c.resolved_by.clone()) {
            attributes.push(KeyValue::new("stephost.wait.decided_by", who));
        }
        if let Some(error) = &from.error {
            attributes.push(KeyValue::new("stephost.wait.reason", error.clone()));
        }
        let mut span = self.start(
            format!("wait {what}"),
            SpanKind::Internal,
            &self.run_cx,
            &self.trace.wait_span_id(&self.run.run_id, execution.fence),
            ms_time(since),
            attributes,
        );
        span.end_with_timestamp(ns_time(execution.start_unix_ns).max(ms_time(since)));
    }

    /// The execution before this one, which lost its claim without ending
    /// it, rebuilt from what it recorded.
    fn lost_execution(
        &self,
        store: &dyn Views,
        effects: &Effects,
        execution: &Execution,
        from: &ClaimedFrom,
        calls: &[&CallRecord],
    ) -> Result<(), StoreError> {
        let run_id = self.run.run_id.as_str();
        let first = calls.iter().map(|c| c.started_at_ms).min();
        let last = calls
            .iter()
            .map(|c| c.finished_at_ms.unwrap_or(c.started_at_ms))
            .max();
        let start = first.map_or(from.updated_at_ms, |f| f.min(from.updated_at_ms));
        let end = last.map_or(start, |l| l.max(start));
        let span_id = self.trace.execution_span_id(run_id, from.fence);
        let cx = self.context(&span_id);
        let mut all = by_call(store.attempts(run_id, None)?, i64::MIN);
        for call in calls.iter().filter(|c| c.class != CallClass::Observe) {
            let attempts = all.remove(&call.seq).unwrap_or_default();
            let times = (
                ms_time(call.started_at_ms),
                ms_time(call.finished_at_ms.unwrap_or(call.started_at_ms)),
            );
            let call_id = self.trace.call_span_id(run_id, call.seq, from.fence);
            self.call(&cx, &call_id, call, false, &attempts, times, effects);
        }
        let mut attributes = self.run_attributes();
        attributes.extend([
            KeyValue::new("stephost.execution.fence", from.fence),
            KeyValue::new("stephost.execution.end", "lost_claim"),
            KeyValue::new("stephost.execution.calls_live", calls.len() as i64),
        ]);
        if let Some(owner) = &from.owner {
            attributes.push(KeyValue::new("stephost.worker", owner.clone()));
        }
        let mut span = self.start(
            format!("execute {}", self.step),
            SpanKind::Internal,
            &self.run_cx,
            &span_id,
            ms_time(start),
            attributes,
        );
        span.set_status(Status::error(format!(
            "the execution stopped holding its claim without ending it (its process ended, or \
             its lease ran out); {} took the run over under fence {}",
            execution.owner, execution.fence
        )));
        span.end_with_timestamp(ms_time(end));
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn call(
        &self,
        parent: &Context,
        span_id: &str,
        call: &CallRecord,
        replayed: bool,
        attempts: &[AttemptRecord],
        (start, end): (SystemTime, SystemTime),
        effects: &Effects,
    ) {
        let mut attributes = vec![
            KeyValue::new("stephost.call.seq", call.seq as i64),
            KeyValue::new("stephost.call.class", call.class.as_str()),
            KeyValue::new("stephost.call.interface", call.interface.clone()),
            KeyValue::new("stephost.call.function", call.function.clone()),
            KeyValue::new("stephost.call.state", call.state.as_str()),
            KeyValue::new("stephost.call.replayed", replayed),
        ];
        if !call.operation_id.is_empty() {
            attributes.push(KeyValue::new(
                "stephost.call.operation_id",
                call.operation_id.clone(),
            ));
        }
        if let Some(who) = &call.resolved_by {
            attributes.push(KeyValue::new("stephost.call.resolved_by", who.clone()));
        }
        let outcome = call.outcome.as_deref().and_then(|o| Outcome::parse(o).ok());
        let chat = call.interface == crate::imports::models::INTERFACE && call.function == "chat";
        let name = if chat {
            let model = gen_ai(
                call,
                outcome.as_ref(),
                effects,
                self.telemetry.capture_content,
            );
            attributes.extend(model.attributes);
            format!("chat {}", model.request_model)
        } else {
            let interface = call.interface.rsplit('/').next().unwrap_or(&call.interface);
            let interface = interface.split('@').next().unwrap_or(interface);
            format!("{interface} {}", call.function)
        };
        let kind = match call.class {
            CallClass::Read | CallClass::Write => SpanKind::Client,
            CallClass::Observe | CallClass::Suspend => SpanKind::Internal,
        };
        let mut span = self.start(name, kind, parent, span_id, start, attributes);
        let mut previous_end: Option<i64> = None;
        for attempt in attempts {
            let mut fields = vec![
                KeyValue::new("stephost.attempt", i64::from(attempt.attempt)),
                KeyValue::new("stephost.attempt.kind", attempt.kind.clone()),
                KeyValue::new("stephost.attempt.result", attempt.result.clone()),
                KeyValue::new(
                    "stephost.attempt.duration_ms",
                    attempt.finished_at_ms - attempt.started_at_ms,
                ),
            ];
            if let Some(before) = previous_end {
                fields.push(KeyValue::new(
                    "stephost.attempt.delay_ms",
                    (attempt.started_at_ms - before).max(0),
                ));
            }
            if let Some(detail) = &attempt.detail {
                fields.push(KeyValue::new("stephost.attempt.detail", detail.clone()));
            }
            previous_end = Some(attempt.finished_at_ms);
            span.add_event_with_timestamp("attempt", ms_time(attempt.started_at_ms), fields);
        }
        match (call.state, &outcome) {
            (CallState::Failed, Some(Outcome::Err(e))) => {
                span.set_attribute(KeyValue::new("error.type", kind_name(e.kind)));
                span.set_status(Status::error(e.message.clone()));
            }
            (CallState::Unknown, _) => span.set_status(Status::error(
                "its outcome is unknown: a person must resolve it",
            )),
            _ => {}
        }
        span.end_with_timestamp(end.max(start));
    }
}

fn kind_name(kind: stephost_core::CallErrorKind) -> String {
    serde_json::to_value(kind)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_else(|| "_OTHER".into())
}

/// A model call's GenAI attributes, and the model it asked for.
struct GenAi {
    request_model: String,
    attributes: Vec<KeyValue>,
}

/// The GenAI semantic conventions' attributes of chat call `call`: from its
/// request and answer as the ledger keeps them, and the model's
/// configuration where this process has it. Messages only when
/// `content` (as recorded: a redacted value is a marker there).
fn gen_ai(call: &CallRecord, outcome: Option<&Outcome>, effects: &Effects, content: bool) -> GenAi {
    let request: serde_json::Value = serde_json::from_str(&call.request).unwrap_or_default();
    let alias = request["model"].as_str().unwrap_or_default();
    let configured = effects.model(alias).map(|m| m.model.clone());
    let answer = match outcome {
        Some(Outcome::Ok(serde_json::Value::String(text))) => {
            serde_json::from_str(text).unwrap_or_default()
        }
        Some(Outcome::Ok(value)) => value.clone(),
        _ => serde_json::Value::Null,
    };
    let api = answer["api"]
        .as_str()
        .map(str::to_string)
        .or_else(|| configured.as_ref().map(|m| m.api.as_str().to_string()))
        .unwrap_or_default();
    let provider = if api.starts_with("openai") {
        "openai"
    } else if api.starts_with("anthropic") {
        "anthropic"
    } else {
        "_OTHER"
    };
    let request_model = configured
        .as_ref()
        .map(|m| m.model.clone())
        .unwrap_or_else(|| alias.to_string());
    let mut attributes = vec![
        KeyValue::new("gen_ai.operation.name", "chat"),
        KeyValue::new("gen_ai.provider.name", provider),
        KeyValue::new("gen_ai.request.model", request_model.clone()),
    ];
    if let Some(m) = &configured
        && let Some((host, port)) = server_of(&m.url)
    {
        attributes.push(KeyValue::new("server.address", host));
        attributes.push(KeyValue::new("server.port", port));
    }
    if let Some(n) = request["max_tokens"].as_i64() {
        attributes.push(KeyValue::new("gen_ai.request.max_tokens", n));
    }
    if let Some(t) = request["temperature"].as_f64() {
        attributes.push(KeyValue::new("gen_ai.request.temperature", t));
    }
    if let Some(model) = answer["model"].as_str() {
        attributes.push(KeyValue::new("gen_ai.response.model", model.to_string()));
    }
    if let Some(id) = answer["id"].as_str() {
        attributes.push(KeyValue::new("gen_ai.response.id", id.to_string()));
    }
    if let Some(stop) = answer["stop_raw"].as_str().or(answer["stop"].as_str()) {
        attributes.push(KeyValue::new(
            "gen_ai.response.finish_reasons",
            Value::Array(Array::String(vec![StringValue::from(stop.to_string())])),
        ));
    }
    let usage = &answer["usage"];
    for (key, field) in [
        ("gen_ai.usage.input_tokens", "input"),
        ("gen_ai.usage.output_tokens", "output"),
        ("gen_ai.usage.cache_read.input_tokens", "cached_input"),
        ("gen_ai.usage.cache_creation.input_tokens", "cache_write"),
        ("gen_ai.usage.reasoning.output_tokens", "reasoning"),
    ] {
        if let Some(n) = usage[field].as_i64() {
            attributes.push(KeyValue::new(key, n));
        }
    }
    if content {
        attributes.push(KeyValue::new("gen_ai.input.messages", call.request.clone()));
        if !answer["content"].is_null() {
            attributes.push(KeyValue::new(
                "gen_ai.output.messages",
                answer["content"].to_string(),
            ));
        }
    }
    GenAi {
        request_model,
        attributes,
    }
}

/// The host and port of a base URL (parsed as origins are).
fn server_of(url: &str) -> Option<(String, i64)> {
    let uri: ureq::http::Uri = url.parse().ok()?;
    let port = match (uri.port_u16(), uri.scheme_str()?) {
        (Some(port), _) => port,
        (None, "https") => 443,
        (None, _) => 80,
    };
    Some((
        uri.host()?.trim_matches(['[', ']']).to_string(),
        i64::from(port),
    ))
}
