//! `wasi:http/outgoing-handler`: a step's own HTTP client (Rust `wstd`,
//! JavaScript `fetch`, Python over `wasi:http`), each exchange one call
//! through the journal with the protocol of effects.
//!
//! wasmtime-wasi-http serves the resources; its `send_request` hook sends
//! nothing, it hands the request over. The one journal call of an exchange
//! is made inside a guest call, at a point that does not depend on timing:
//! in `handle` when the request's body was already finished, else in
//! `outgoing-body.finish`, once it is. The response the guest waits for is
//! made ready (from the network, or from the ledger on a replay or resume)
//! before the guest can look at it, its body whole in memory.
//!
//! What a guest holds is bounded: a body is read as the guest writes it (up
//! to `payload_bytes_max`), so no write waits for a reader; at most
//! `http_bodies_open_max` bodies are open at once; and a guest that waits
//! for a response while its own body is still open waits only until its
//! run must stop (past `wall_ms_max`, its worker draining, its lease lost).
//!
//! An origin not granted (`[http."ORIGIN"]`) is refused as
//! `HTTP-request-denied`, and the refusal recorded. GET, HEAD and OPTIONS
//! are reads, other methods writes (unless the origin's `classes` say
//! otherwise); a write is recorded `started`, durably, before it leaves,
//! and carries `Idempotency-Key` and `Stephost-Fence`. Headers the host
//! sets are forbidden to the step.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use stephost_core::Limits;
use stephost_core::journal::{Journal, Stop};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use ureq::http;
use ureq::http::request::Parts;
use wasmtime::StoreContextMut;
use wasmtime::component::{Linker, Resource, ResourceTable, ResourceType};
use wasmtime_wasi::runtime::{AbortOnDropJoinHandle, in_tokio, spawn};
use wasmtime_wasi_http::p2::bindings::http::outgoing_handler;
use wasmtime_wasi_http::p2::bindings::http::types::{self as wit, ErrorCode};
use wasmtime_wasi_http::p2::body::{HostOutgoingBody, HyperIncomingBody};
use wasmtime_wasi_http::p2::types::{HostFutureIncomingResponse, HostOutgoingRequest};
use wasmtime_wasi_http::{
    DEFAULT_FORBIDDEN_HEADERS, FieldMap, ForbiddenHeaderFilter, RequestOptions, WasiBody,
    WasiHttpCtx, WasiHttpCtxView, WasiHttpHooks, WasiHttpView,
};

use crate::bindings::CallError;
use crate::imports::effects::{Gated, gated_call};
use crate::imports::{StepState, lock};
use stephost_effects::Effects;
use stephost_effects::origin::{Answered, Body, Exchange, class_of, method_allowed, origin_of};

pub const INTERFACE: &str = "wasi:http/outgoing-handler";

/// The wasi:http version linked (a step importing any 0.2.x is matched to
/// it by semver).
const VERSION: &str = "0.2.12";

/// A run's wasi:http state.
pub struct HttpState {
    ctx: WasiHttpCtx,
    hooks: Hooks,
    /// `outgoing-request` rep → its body, read as the step writes it,
    /// until the request is handed over.
    body_of: HashMap<u32, Collecting>,
    /// `outgoing-body` rep → the `future-incoming-response` rep waiting on it.
    waiting: HashMap<u32, u32>,
    /// `future-incoming-response` rep → its request, the body still open.
    pending: HashMap<u32, Open>,
    /// Largest request body, in bytes (the run's `payload_bytes_max`).
    body_bytes_max: usize,
    /// Outgoing bodies the step holds open (neither finished nor dropped),
    /// each buffering up to two chunks, and its request's body once it is
    /// handed over: at most the run's `http_bodies_open_max`.
    bodies_open: u64,
    bodies_open_max: u64,
}

/// Most bytes a step's client writes to an outgoing body at once; an open
/// body buffers two such chunks before its request is sent.
const BODY_CHUNK_BYTES: usize = 64 * 1024;

impl HttpState {
    pub fn new(effects: &Effects, journal: &Arc<Mutex<Journal>>, limits: &Limits) -> Self {
        HttpState {
            ctx: WasiHttpCtx::new(),
            hooks: Hooks {
                handed: None,
                effects: effects.clone(),
                watch: {
                    let journal = lock(journal);
                    Watch {
                        control: journal.control(),
                        wall_until: journal.wall_deadline(),
                    }
                },
            },
            body_of: HashMap::new(),
            waiting: HashMap::new(),
            pending: HashMap::new(),
            body_bytes_max: limits.payload_bytes_max as usize,
            bodies_open: 0,
            bodies_open_max: limits.http_bodies_open_max,
        }
    }

    /// One more outgoing body open: past `http_bodies_open_max`, the run
    /// stops.
    fn body_opened(&mut self) -> Result<(), Stop> {
        if self.bodies_open >= self.bodies_open_max {
            return Err(Stop::Limit(format!(
                "the step holds more than http_bodies_open_max = {} outgoing HTTP bodies open \
                 at once; finish or drop each request's body before opening the next, or raise \
                 [limits] http_bodies_open_max",
                self.bodies_open_max
            )));
        }
        self.bodies_open += 1;
        Ok(())
    }

    fn body_closed(&mut self) {
        self.bodies_open = self.bodies_open.saturating_sub(1);
    }

    /// The body `rep` was finished or dropped: its reading is ending.
    fn body_ended(&mut self, rep: u32) {
        if let Some(collecting) = self.body_of.values_mut().find(|c| c.body_rep == rep) {
            collecting.ended = true;
        }
    }
}

impl WasiHttpView for StepState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http.ctx,
            table: &mut self.table,
            hooks: &mut self.http.hooks,
        }
    }
}

/// The hooks: the host's headers are forbidden to the step, and
/// `send_request` hands the request to the `handle` wrapper.
struct Hooks {
    handed: Option<(Parts, WasiBody)>,
    effects: Effects,
    watch: Watch,
}

/// When a run must stop, as a wait outside the guest's calls can tell
/// without its journal: past its wall time, its worker draining, its lease
/// lost. Each is the journal's own rule ([`Journal::interrupted`]), read
/// from the same instant and flags, so once this says stop the journal
/// does too and the guest's `get` traps with the stop.
#[derive(Clone)]
struct Watch {
    control: Option<Arc<stephost_core::journal::RunControl>>,
    wall_until: Option<std::time::Instant>,
}

impl Watch {
    fn must_stop(&self) -> bool {
        use std::sync::atomic::Ordering;
        self.wall_until
            .is_some_and(|until| std::time::Instant::now() >= until)
            || self
                .control
                .as_ref()
                .is_some_and(|c| c.drain.load(Ordering::SeqCst) || c.lost.load(Ordering::SeqCst))
    }
}

type IoFuture = Box<dyn Future<Output = Result<(), wasmtime_wasi_http::Error>> + Send>;

impl WasiHttpHooks for Hooks {
    fn forbidden_header_filter(&mut self) -> ForbiddenHeaderFilter {
        let effects = self.effects.clone();
        Arc::new(move |name| {
            DEFAULT_FORBIDDEN_HEADERS.contains(name) || effects.host_sets_header(name.as_str())
        })
    }

    fn p2_outgoing_body_chunk_size(&mut self) -> usize {
        BODY_CHUNK_BYTES
    }

    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        _options: Option<RequestOptions>,
        _io: IoFuture,
    ) -> Box<
        dyn Future<Output = wasmtime_wasi_http::Result<(http::Response<WasiBody>, IoFuture)>>
            + Send,
    > {
        let (parts, body) = request.into_parts();
        self.handed = Some((parts, body));
        // The wrapper makes the response ready (dropping this task) before
        // the guest can look at it, unless the guest waits for it with its
        // body still open. That wait ends when the run must stop; the guest
        // never sees how: its `get` of the response traps with the run's
        // stop ([`link`]).
        let watch = self.watch.clone();
        Box::new(async move {
            let tick = std::time::Duration::from_millis(crate::limiter::EPOCH_TICK_MS);
            while !watch.must_stop() {
                tokio::time::sleep(tick).await;
            }
            Err(wasmtime_wasi_http::Error::InternalError(Some(
                "the run must stop".to_string(),
            )))
        })
    }
}

/// A body being read as the guest writes it (whole, or an error).
type Reading = AbortOnDropJoinHandle<Result<Vec<u8>, ErrorCode>>;

/// A request's body, its request not yet handed over.
struct Collecting {
    body_rep: u32,
    /// Finished or dropped: its reading ends at once.
    ended: bool,
    reading: Reading,
}

/// A request whose body the guest is still writing.
struct Open {
    parts: Parts,
    body: Reading,
}

/// An empty body, left in a request whose body is read elsewhere.
fn empty() -> WasiBody {
    http_body_util::Empty::<Bytes>::new()
        .map_err(|e: Infallible| match e {})
        .boxed_unsync()
}

/// Takes one frame of a body: `Some` at its end (or an error).
fn take_frame(
    frame: Option<Result<http_body::Frame<Bytes>, wasmtime_wasi_http::Error>>,
    buf: &mut Vec<u8>,
    max: usize,
) -> Option<Result<(), ErrorCode>> {
    match frame {
        None => Some(Ok(())),
        // Dropped without `finish`, or a content-length it did not keep.
        Some(Err(_)) => Some(Err(ErrorCode::HttpProtocolError)),
        Some(Ok(frame)) => {
            // Trailers are not sent.
            if let Ok(data) = frame.into_data() {
                if buf.len() + data.len() > max {
                    let n = (buf.len() + data.len()) as u64;
                    return Some(Err(ErrorCode::HttpRequestBodySize(Some(n))));
                }
                buf.extend_from_slice(&data);
            }
            None
        }
    }
}

/// The whole body, read as the guest writes it (so its writes never wait
/// on a full channel).
async fn collect(mut body: WasiBody, mut buf: Vec<u8>, max: usize) -> Result<Vec<u8>, ErrorCode> {
    loop {
        if let Some(done) = take_frame(body.frame().await, &mut buf, max) {
            return done.map(|()| buf);
        }
    }
}

/// The one journal call of an exchange whose body is complete: the
/// response, or the error the guest's client sees. A trap (the run must
/// stop) is an `Err`.
fn exchange(
    state: &mut StepState,
    parts: &Parts,
    body: Result<Vec<u8>, ErrorCode>,
) -> wasmtime::Result<Result<Answered, ErrorCode>> {
    // A body the guest aborted or made too large: nothing was sent, and a
    // replay reaches the same error without the ledger.
    let body = match body {
        Ok(body) => body,
        Err(code) => return Ok(Err(code)),
    };
    let url = parts.uri.to_string();
    let method = parts.method.as_str();
    let exchange = Exchange {
        method: method.to_string(),
        url: url.clone(),
        headers: parts
            .headers
            .iter()
            .filter(|(k, _)| **k != http::header::HOST)
            .map(|(k, v)| {
                (
                    k.as_str().to_string(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect(),
        body: Body::of(body),
    };
    let request = serde_json::to_string(&exchange)?;
    let origin = origin_of(&url).unwrap_or_else(|| url.clone());
    let effects = state.effects.clone();
    let granted = effects.origin(&origin);
    // A method the origin does not take is refused as an origin not
    // granted is: its credentials never ride on it.
    let refused_method = granted.is_some_and(|g| !method_allowed(g.methods.as_deref(), method));
    let granted = granted.filter(|_| !refused_method);
    let call = Gated {
        interface: INTERFACE,
        function: "handle",
        effect: granted.map(|g| &g.effect),
        class: granted.map(|g| class_of(&g.classes, method, parts.uri.path())),
        request: &request,
        sent: None,
        key: None,
    };
    let outcome = gated_call(state, &call, || {
        if refused_method {
            format!(
                "origin {origin} does not take {method} from this step's HTTP client; list it \
                 in [http.\"{origin}\"] methods (TRACE and CONNECT are refused unless listed)"
            )
        } else {
            format!(
                "origin {origin} is not granted to this step's HTTP client; grant it with \
                 [http.\"{origin}\"] in stephost.toml"
            )
        }
    })?;
    Ok(match crate::imports::effects::to_guest(outcome) {
        Ok(text) => answered(&text),
        Err(CallError::Denied(_)) => Err(ErrorCode::HttpRequestDenied),
        Err(CallError::Rejected(m) | CallError::Exhausted(m) | CallError::Invalid(m)) => {
            Err(ErrorCode::InternalError(Some(m)))
        }
    })
}

/// The response a recorded answer stands for: the origin's response; for
/// one too large to record (kept by its size and hash), the error the
/// guest's client gets; else the receipt a lookup found for a write in
/// doubt (a 200 with the receipt as its JSON body).
fn answered(text: &str) -> Result<Answered, ErrorCode> {
    if let Ok(answer) = serde_json::from_str::<Answered>(text) {
        return Ok(answer);
    }
    let value = serde_json::from_str::<serde_json::Value>(text).unwrap_or_default();
    if let Some(bytes) = value
        .get(stephost_effects::RESPONSE_TOO_LARGE)
        .and_then(|n| n.as_u64())
    {
        return Err(ErrorCode::HttpResponseBodySize(Some(bytes)));
    }
    Ok(Answered {
        status: 200,
        headers: vec![("content-type".to_string(), "application/json".to_string())],
        body: Body::Text {
            body: text.to_string(),
        },
    })
}

/// A response from an answer: no network.
fn response_of(
    answer: &Answered,
) -> Result<http::Response<HyperIncomingBody>, wasmtime_wasi_http::Error> {
    let internal = |e: String| wasmtime_wasi_http::Error::InternalError(Some(e));
    let mut builder = http::Response::builder().status(answer.status);
    for (name, value) in &answer.headers {
        builder = builder.header(name.as_str(), value.as_str());
    }
    let bytes = answer.body.bytes().map_err(internal)?;
    let body = Full::new(Bytes::from(bytes))
        .map_err(|e: Infallible| match e {})
        .boxed_unsync();
    builder.body(body).map_err(|e| internal(e.to_string()))
}

/// Puts the exchange's outcome into the guest's future-incoming-response.
fn make_ready(
    table: &mut ResourceTable,
    future: u32,
    outcome: Result<Answered, ErrorCode>,
) -> wasmtime::Result<()> {
    // `get` keeps this alive beside the body; there is no I/O left to drive.
    let worker: AbortOnDropJoinHandle<()> = spawn(async {});
    let ready = match outcome {
        Ok(answer) => response_of(&answer).map(|response| (response, worker)),
        Err(code) => Err(code.into()),
    };
    *table.get_mut(&Resource::<HostFutureIncomingResponse>::new_borrow(future))? =
        HostFutureIncomingResponse::Ready(ready);
    Ok(())
}

/// Links `wasi:http/types` and `wasi:http/outgoing-handler` with the
/// journaled exchange, on a linker with WASI already (`sync`: its sync
/// bindings; else its async ones).
pub fn link(linker: &mut Linker<StepState>, sync: bool) -> wasmtime::Result<()> {
    if sync {
        wasmtime_wasi_http::p2::add_only_http_to_linker_sync(linker)?;
    } else {
        wasmtime_wasi_http::p2::add_only_http_to_linker_async(linker)?;
    }
    linker.allow_shadowing(true);
    let mut types = linker.instance(&format!("wasi:http/types@{VERSION}"))?;
    // A future dropped while its body is open: the exchange is abandoned
    // (nothing sent, nothing recorded); the table may reuse its rep.
    types.resource(
        "future-incoming-response",
        ResourceType::host::<HostFutureIncomingResponse>(),
        |mut store: StoreContextMut<'_, StepState>, rep: u32| {
            let state = store.data_mut();
            if state.http.pending.remove(&rep).is_some() {
                state.http.waiting.retain(|_, future| *future != rep);
            }
            wit::HostFutureIncomingResponse::drop(&mut state.http(), Resource::new_own(rep))
        },
    )?;
    // A body dropped without `finish` aborts it: its exchange ends with an
    // error, nothing sent.
    types.resource(
        "outgoing-body",
        ResourceType::host::<HostOutgoingBody>(),
        |mut store: StoreContextMut<'_, StepState>, rep: u32| {
            let state = store.data_mut();
            state.http.body_closed();
            state.http.body_ended(rep);
            wit::HostOutgoingBody::drop(&mut state.http(), Resource::new_own(rep))?;
            if let Some(future) = state.http.waiting.remove(&rep) {
                state.http.pending.remove(&future);
                make_ready(&mut state.table, future, Err(ErrorCode::HttpProtocolError))?;
            }
            Ok(())
        },
    )?;
    // A response looked at after the run must stop (a wait for it ended
    // so): the run stops here, with the journal's stop.
    types.func_wrap(
        "[method]future-incoming-response.get",
        |mut store: StoreContextMut<'_, StepState>,
         (future,): (Resource<HostFutureIncomingResponse>,)| {
            let state = store.data_mut();
            let got = wit::HostFutureIncomingResponse::get(&mut state.http(), future)?;
            let stop = lock(&state.journal).interrupted();
            match stop {
                Some(stop) => Err(state.fail(stop)),
                None => Ok((got,)),
            }
        },
    )?;
    types.func_wrap(
        "[method]outgoing-request.body",
        |mut store: StoreContextMut<'_, StepState>, (req,): (Resource<HostOutgoingRequest>,)| {
            let state = store.data_mut();
            let request = req.rep();
            let body = wit::HostOutgoingRequest::body(&mut state.http(), req)?;
            if let Ok(body) = &body {
                if let Err(stop) = state.http.body_opened() {
                    return Err(state.fail(stop));
                }
                // Read as the step writes it, up to the payload limit, so
                // that no write waits for a reader, however long the step
                // keeps the body open or its request unsent.
                let max = state.http.body_bytes_max;
                let req = state
                    .table
                    .get_mut(&Resource::<HostOutgoingRequest>::new_borrow(request))?;
                if let Some(written) = req.body.replace(empty()) {
                    let reading = spawn(collect(written, Vec::new(), max));
                    state.http.body_of.insert(
                        request,
                        Collecting {
                            body_rep: body.rep(),
                            ended: false,
                            reading,
                        },
                    );
                }
            }
            Ok((body,))
        },
    )?;
    types.func_wrap(
        "[static]outgoing-body.finish",
        |mut store: StoreContextMut<'_, StepState>,
         (body, trailers): (Resource<HostOutgoingBody>, Option<Resource<FieldMap>>)| {
            let state = store.data_mut();
            let body_rep = body.rep();
            state.http.body_closed();
            state.http.body_ended(body_rep);
            let finished = match wit::HostOutgoingBody::finish(&mut state.http(), body, trailers) {
                Ok(()) => Ok(()),
                Err(e) => Err(e.downcast()?),
            };
            if let Some(future) = state.http.waiting.remove(&body_rep) {
                let open =
                    state.http.pending.remove(&future).ok_or_else(|| {
                        wasmtime::Error::msg("an exchange waits on a body it lost")
                    })?;
                // The body's channel is closed now: its reader ends at once.
                let body = stephost_effects::blocking(|| in_tokio(open.body));
                let outcome = exchange(state, &open.parts, body)?;
                make_ready(&mut state.table, future, outcome)?;
            }
            Ok((finished,))
        },
    )?;
    linker
        .instance(&format!("{INTERFACE}@{VERSION}"))?
        .func_wrap(
            "handle",
            |mut store: StoreContextMut<'_, StepState>,
             (req, options): (
                Resource<HostOutgoingRequest>,
                Option<Resource<RequestOptions>>,
            )| {
                let state = store.data_mut();
                let collecting = state.http.body_of.remove(&req.rep());
                let future = match outgoing_handler::Host::handle(&mut state.http(), req, options) {
                    Ok(future) => future,
                    Err(e) => return Ok((Err(e.downcast()?),)),
                };
                let (parts, _empty) = state
                    .http
                    .hooks
                    .handed
                    .take()
                    .ok_or_else(|| wasmtime::Error::msg("handle sent no request"))?;
                match collecting {
                    // No body: an empty one.
                    None => {
                        let outcome = exchange(state, &parts, Ok(Vec::new()))?;
                        make_ready(&mut state.table, future.rep(), outcome)?;
                    }
                    // Its body ended: read to its end at once.
                    Some(Collecting {
                        ended: true,
                        reading,
                        ..
                    }) => {
                        let body = stephost_effects::blocking(|| in_tokio(reading));
                        let outcome = exchange(state, &parts, body)?;
                        make_ready(&mut state.table, future.rep(), outcome)?;
                    }
                    // Still open: the exchange is made when it is finished.
                    Some(Collecting {
                        body_rep, reading, ..
                    }) => {
                        state.http.waiting.insert(body_rep, future.rep());
                        state.http.pending.insert(
                            future.rep(),
                            Open {
                                parts,
                                body: reading,
                            },
                        );
                    }
                }
                Ok((Ok(future),))
            },
        )?;
    linker.allow_shadowing(false);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recorded_answer_is_a_response_a_size_error_or_a_receipt() {
        let response = r#"{"status":503,"headers":[["retry-after","1"]],"body":"busy"}"#;
        let answer = answered(response).unwrap();
        assert_eq!(answer.status, 503);
        assert_eq!(answer.body.bytes().unwrap(), b"busy");
        let too_large = r#"{"stephost_response_bytes":2000000,"stephost_response_sha256":"ab"}"#;
        assert!(matches!(
            answered(too_large),
            Err(ErrorCode::HttpResponseBodySize(Some(2_000_000)))
        ));
        let receipt = r#"{"operation_id":"op-1","order_id":"ORD-1"}"#;
        let answer = answered(receipt).unwrap();
        assert_eq!(answer.status, 200);
        assert_eq!(answer.body.bytes().unwrap(), receipt.as_bytes());
    }
}
