//! An OpenTelemetry collector's OTLP/HTTP trace endpoint on 127.0.0.1, for
//! the tests: it answers every `POST /v1/traces` with 200 and keeps the
//! spans, decoded from protobuf by `opentelemetry-proto`.

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, any_value};
use prost::Message;
use receiver_http::{Conn, Request, Response, Server, Service};
use serde_json::{Value, json};

/// One span as the collector received it, ids in lowercase hex.
#[derive(Debug, Clone)]
pub struct Span {
    pub service: String,
    pub trace_id: String,
    pub span_id: String,
    /// Empty for a root span.
    pub parent_span_id: String,
    pub name: String,
    /// OTLP's numbering: 1 internal, 3 client.
    pub kind: i32,
    pub start_ns: u64,
    pub end_ns: u64,
    pub attributes: BTreeMap<String, Value>,
    pub events: Vec<(String, BTreeMap<String, Value>)>,
    /// OTLP's numbering: 0 unset, 1 ok, 2 error.
    pub status_code: i32,
    pub status_message: String,
}

impl Span {
    pub fn attr(&self, key: &str) -> &Value {
        self.attributes.get(key).unwrap_or(&Value::Null)
    }
}

#[derive(Default)]
struct Seen {
    requests: usize,
    spans: Vec<Span>,
}

/// The collector; dropping it stops it.
pub struct Collector {
    url: String,
    kept: Arc<Kept>,
    _server: Server,
}

/// What the collector got.
#[derive(Default)]
struct Kept(Mutex<Seen>);

impl Collector {
    pub fn start() -> Collector {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a collector");
        let kept = Arc::new(Kept::default());
        let server = Server::start(listener, "otlp-collector", 64 << 20, kept.clone())
            .expect("start a collector");
        Collector {
            url: server.url(),
            kept,
            _server: server,
        }
    }

    /// What `OTEL_EXPORTER_OTLP_ENDPOINT` is set to.
    pub fn endpoint(&self) -> &str {
        &self.url
    }

    /// How many exports arrived.
    pub fn requests(&self) -> usize {
        self.kept.0.lock().unwrap().requests
    }

    pub fn spans(&self) -> Vec<Span> {
        self.kept.0.lock().unwrap().spans.clone()
    }
}

impl Service for Kept {
    fn serve(&self, req: Request, conn: &mut Conn<'_>) -> bool {
        let request = ExportTraceServiceRequest::decode(req.body.as_slice())
            .expect("an export decodes as ExportTraceServiceRequest");
        {
            let mut seen = self.0.lock().unwrap();
            seen.requests += 1;
            seen.spans.extend(spans_of(&request));
        }
        let answer = Response::empty(200).with_header("content-type", "application/x-protobuf");
        conn.reply(&answer, req.keep_alive())
    }
}

fn spans_of(request: &ExportTraceServiceRequest) -> Vec<Span> {
    let mut spans = Vec::new();
    for resource in &request.resource_spans {
        let service = resource
            .resource
            .as_ref()
            .and_then(|r| r.attributes.iter().find(|a| a.key == "service.name"))
            .map(|a| value_of(a.value.as_ref()))
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        for scope in &resource.scope_spans {
            for span in &scope.spans {
                let attributes = |list: &[opentelemetry_proto::tonic::common::v1::KeyValue]| {
                    list.iter()
                        .map(|a| (a.key.clone(), value_of(a.value.as_ref())))
                        .collect::<BTreeMap<_, _>>()
                };
                spans.push(Span {
                    service: service.clone(),
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent_span_id: hex(&span.parent_span_id),
                    name: span.name.clone(),
                    kind: span.kind,
                    start_ns: span.start_time_unix_nano,
                    end_ns: span.end_time_unix_nano,
                    attributes: attributes(&span.attributes),
                    events: span
                        .events
                        .iter()
                        .map(|e| (e.name.clone(), attributes(&e.attributes)))
                        .collect(),
                    status_code: span.status.as_ref().map_or(0, |s| s.code),
                    status_message: span
                        .status
                        .as_ref()
                        .map(|s| s.message.clone())
                        .unwrap_or_default(),
                });
            }
        }
    }
    spans
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn value_of(value: Option<&AnyValue>) -> Value {
    match value.and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => json!(s),
        Some(any_value::Value::BoolValue(b)) => json!(b),
        Some(any_value::Value::IntValue(i)) => json!(i),
        Some(any_value::Value::DoubleValue(d)) => json!(d),
        Some(any_value::Value::ArrayValue(a)) => {
            Value::Array(a.values.iter().map(|v| value_of(Some(v))).collect())
        }
        _ => Value::Null,
    }
}
