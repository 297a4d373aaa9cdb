//! Effects: the handlers behind `effects.call`, the retry loop that owns all
//! retries, and reconciliation of a call found in flight.
//!
//! Live I/O happens only in [`EffectCall`], which the journal invokes from its
//! one durable wrapper; nothing else reaches a handler.

pub mod builtin;
pub mod command;
pub mod flow;
pub mod http;
pub mod llm;
pub mod mcp;
pub mod model;
pub mod origin;
pub mod retry;

use std::collections::BTreeMap;
use std::sync::Arc;

use stephost_core::CallClass;
use stephost_core::journal::{
    Attempts, CallErrorKind, LiveCall, OpContext, Outcome, Performed, Reconciled,
};

pub use retry::RetryPolicy;

/// Why a handler could not perform a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// The receiver refused with an answer the effect declares final:
    /// retrying will not help, and nothing was done.
    Rejected(String),
    /// The receiver refused with an answer the effect does not declare
    /// final (e.g. a 409 "still in progress"): a rejection when no earlier
    /// attempt may have acted; after one that may have, the call is still
    /// in doubt and the receiver is asked (or the call parked).
    Refused(String),
    /// Timeouts, connection errors, overload: worth another attempt, no
    /// sooner than `retry_after` when the receiver said so.
    Retryable {
        message: String,
        retry_after: Option<std::time::Duration>,
        /// Whether the receiver may have acted (a timeout or a lost reply)
        /// rather than certainly not (connection refused, 429, 503).
        maybe_received: bool,
    },
    /// The request is not what the effect accepts.
    Invalid(String),
}

impl Failure {
    /// A retryable failure after which the receiver may have acted.
    pub fn retryable(message: impl Into<String>) -> Self {
        Failure::Retryable {
            message: message.into(),
            retry_after: None,
            maybe_received: true,
        }
    }

    /// A retryable failure where the request certainly did not take effect.
    pub fn not_received(message: impl Into<String>) -> Self {
        Failure::Retryable {
            message: message.into(),
            retry_after: None,
            maybe_received: false,
        }
    }

    pub fn message(&self) -> &str {
        match self {
            Failure::Rejected(m) | Failure::Refused(m) | Failure::Invalid(m) => m,
            Failure::Retryable { message, .. } => message,
        }
    }

    fn label(&self) -> &'static str {
        match self {
            Failure::Rejected(_) | Failure::Refused(_) => "rejected",
            Failure::Retryable { .. } => "retryable",
            Failure::Invalid(_) => "invalid",
        }
    }
}

/// A receiver's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// The response, JSON text.
    pub body: String,
    /// The receiver said it had already seen this operation id.
    pub duplicate: bool,
    /// What the receiver said beside its answer, recorded with the attempt
    /// (a model's request id and rate-limit headers).
    pub detail: Option<String>,
}

impl Reply {
    pub fn new(body: impl Into<String>) -> Self {
        Reply {
            body: body.into(),
            duplicate: false,
            detail: None,
        }
    }
}

/// What a receiver says about an operation id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// Done; here is the receipt (the response the guest would have seen).
    Found(String),
    NotFound,
    /// This receiver cannot answer lookups.
    Unsupported,
}

/// What a handler is told about the operation it performs.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    pub run_id: &'a str,
    /// The call's sequence number in its run.
    pub seq: u64,
    pub effect: &'a str,
    pub class: CallClass,
    pub operation_id: &'a str,
    pub fence: i64,
    /// The guest's request, JSON text.
    pub body: &'a str,
    /// What the call uses besides its effect (a stream sink, shared flow
    /// state).
    pub services: &'a crate::options::Services,
    /// The effect keeps values of its calls out of the ledger: nothing of
    /// an answer is shown while it streams in.
    pub redacted: bool,
    /// The run's trace, when the host reports spans: the request carries
    /// its call's span ([`Request::trace_context`]).
    pub trace: Option<&'a stephost_core::RunTrace>,
}

impl<'a> Request<'a> {
    /// The `traceparent` and `tracestate` of this call's span, when the
    /// host reports spans. Sent, never recorded or hashed.
    pub fn trace_context(&self) -> Option<(String, Option<&'a str>)> {
        Some(self.trace?.call_context(self.run_id, self.seq, self.fence))
    }
}

/// A receiver of effect requests.
pub trait Handler: Send + Sync {
    fn perform(&self, request: &Request<'_>) -> Result<Reply, Failure>;

    /// Asks the receiver whether the operation already happened.
    fn lookup(&self, _request: &Request<'_>) -> Result<Lookup, Failure> {
        Ok(Lookup::Unsupported)
    }

    /// Whether the receiver deduplicates by operation id, so that a resend
    /// with the same id cannot cause a second effect.
    fn idempotent(&self) -> bool {
        false
    }

    /// Whether a call may hold its thread for long (I/O, a child process,
    /// waits between attempts): a run executed as a task then tells its
    /// runtime, which moves the other runs off the thread meanwhile.
    fn blocks(&self) -> bool {
        true
    }

    /// Whether an answer costs money (a model's tokens): it is committed
    /// durably before the step sees it, so it is never asked for twice.
    fn paid(&self) -> bool {
        false
    }

    /// Whether the receiver declares the class of each new call
    /// ([`Handler::declared_class`]) rather than the configuration.
    fn declares_class(&self) -> bool {
        false
    }

    /// The class of a new call as the receiver declares it (an MCP tool's
    /// annotations, which it may have to be asked for). Asked only for a
    /// call about to go live, never for one the ledger answers.
    fn declared_class(&self) -> Option<CallClass> {
        None
    }

    /// The hex sha256 of the payload a request sends, which a receipt's
    /// `payload_sha256` must match: of `body` itself, unless the handler
    /// sends something else (an HTTP exchange sends its body).
    fn payload_sha256(&self, body: &str) -> String {
        payload_sha256(body)
    }
}

/// A handler shared (a model serves every run of a process).
impl<H: Handler + ?Sized> Handler for Arc<H> {
    fn perform(&self, request: &Request<'_>) -> Result<Reply, Failure> {
        (**self).perform(request)
    }

    fn lookup(&self, request: &Request<'_>) -> Result<Lookup, Failure> {
        (**self).lookup(request)
    }

    fn idempotent(&self) -> bool {
        (**self).idempotent()
    }

    fn blocks(&self) -> bool {
        (**self).blocks()
    }

    fn paid(&self) -> bool {
        (**self).paid()
    }

    fn declares_class(&self) -> bool {
        (**self).declares_class()
    }

    fn declared_class(&self) -> Option<CallClass> {
        (**self).declared_class()
    }

    fn payload_sha256(&self, body: &str) -> String {
        (**self).payload_sha256(body)
    }
}

/// The hex sha256 of a request body, sent as `Stephost-Payload-Sha256` and
/// checked against a receipt's `payload_sha256`.
pub fn payload_sha256(body: impl AsRef<[u8]>) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(body.as_ref()))
}

/// The field of the answer recorded in place of a response larger than
/// `payload_bytes_max`: its size in bytes (beside its sha256).
pub const RESPONSE_TOO_LARGE: &str = "stephost_response_bytes";

/// Where a receipt names its operation, unless an effect says otherwise.
pub const RECEIPT_OPERATION_POINTER: &str = "/operation_id";

/// Checks that a lookup's answer is a receipt for this operation: a JSON
/// document naming `operation_id` at `pointer` (a JSON pointer) and, when it
/// carries a `payload_sha256`, this request's (`ours`). Anything else
/// proves nothing: the call stays in doubt.
pub fn check_receipt(
    receipt: &str,
    pointer: &str,
    operation_id: &str,
    ours: &str,
) -> Result<(), String> {
    let value = serde_json::from_str::<serde_json::Value>(receipt)
        .map_err(|_| "the receiver's lookup answer is not JSON".to_string())?;
    match value.pointer(pointer).and_then(|v| v.as_str()) {
        Some(found) if found == operation_id => {}
        Some(found) => {
            return Err(format!(
                "the receiver's receipt names operation {found}, not {operation_id}"
            ));
        }
        None => {
            return Err(format!(
                "the receiver's lookup answer names no operation at {pointer}, so it proves \
                 nothing about {operation_id}"
            ));
        }
    }
    if let Some(found) = value.get("payload_sha256").and_then(|v| v.as_str())
        && found != ours
    {
        return Err(format!(
            "the receiver's receipt is for payload {found}, not this request's {ours}"
        ));
    }
    Ok(())
}

/// A configured effect.
pub struct Effect {
    pub class: CallClass,
    pub retry: RetryPolicy,
    pub handler: Box<dyn Handler>,
    /// Where a receipt names its operation (a JSON pointer).
    pub receipt_pointer: String,
    /// Values of its requests and responses kept only as keyed hashes
    /// (`[redact."NAME"]`).
    pub redaction: Option<stephost_core::redact::Redaction>,
}

impl Effect {
    /// The class of the next call: the receiver's declaration when the
    /// call goes live and the receiver declares one, else the configured
    /// class (a call the ledger answers keeps its recorded class anyway).
    pub fn class_of_next(&self, journal: &mut stephost_core::journal::Journal) -> CallClass {
        if self.handler.declares_class() && journal.next_goes_live() {
            self.handler.declared_class().unwrap_or(self.class)
        } else {
            self.class
        }
    }

    /// Runs `f`, a call of this effect (or of none, a refusal), telling a
    /// multi-threaded tokio runtime this thread runs on, if any, that it
    /// may block ([`Handler::blocks`]).
    pub fn call_on<R>(effect: Option<&Effect>, f: impl FnOnce() -> R) -> R {
        if effect.is_some_and(|e| e.handler.blocks()) {
            blocking(f)
        } else {
            f()
        }
    }
}

/// Runs `f`, which may hold its thread for long (I/O, a sleep, a wait for
/// an fsync, a compile), telling a multi-threaded tokio runtime this thread
/// runs on, if any, so that it moves its other tasks to another thread
/// meanwhile (a worker's runs: see `Host::execute_claimed_task`).
pub fn blocking<R>(f: impl FnOnce() -> R) -> R {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current() {
        Ok(runtime) if runtime.runtime_flavor() == RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}

/// The effects granted to a step. Anything not named here is denied.
#[derive(Default, Clone)]
pub struct Effects {
    granted: Arc<BTreeMap<String, Effect>>,
    llm: Option<Arc<Effect>>,
    models: Arc<BTreeMap<String, ModelEffect>>,
    /// Origins steps' own HTTP clients may reach, by `scheme://host[:port]`.
    origins: Arc<BTreeMap<String, Granted>>,
}

/// An origin granted to steps' own HTTP clients (`wasi:http`).
pub struct Granted {
    /// Its exchanges' effect (the class of each comes from `classes`).
    pub effect: Effect,
    pub classes: Vec<origin::ClassRule>,
    /// The names of the headers the host adds (lower case): a step may not
    /// set them.
    pub headers: Vec<String>,
}

/// A model a step may call by its alias: the effect the journal performs,
/// and the model it is, for the budget's arithmetic.
pub struct ModelEffect {
    pub effect: Effect,
    pub model: Arc<model::Model>,
}

impl Effects {
    pub fn new(
        granted: BTreeMap<String, Effect>,
        llm: Option<Effect>,
        models: BTreeMap<String, ModelEffect>,
    ) -> Self {
        Effects {
            granted: Arc::new(granted),
            llm: llm.map(Arc::new),
            models: Arc::new(models),
            origins: Arc::default(),
        }
    }

    /// These effects with `origins` granted to steps' HTTP clients.
    pub fn with_origins(mut self, origins: BTreeMap<String, Granted>) -> Self {
        self.origins = Arc::new(origins);
        self
    }

    /// The grant of `origin` (`scheme://host[:port]`), if any.
    pub fn origin(&self, origin: &str) -> Option<&Granted> {
        self.origins.get(origin)
    }

    /// Whether a step may not set header `name` (lower case) on its own
    /// HTTP requests: the host sets it.
    pub fn host_sets_header(&self, name: &str) -> bool {
        name == "idempotency-key"
            || name.starts_with("stephost-")
            || self
                .origins
                .values()
                .any(|g| g.headers.iter().any(|h| h == name))
    }

    /// The model aliased `alias`, when configured.
    pub fn model(&self, alias: &str) -> Option<&ModelEffect> {
        self.models.get(alias)
    }

    /// The model endpoint, when configured.
    pub fn llm(&self) -> Option<&Effect> {
        self.llm.as_deref()
    }

    pub fn get(&self, name: &str) -> Option<&Effect> {
        self.granted.get(name)
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.granted.keys().map(String::as_str)
    }
}

/// One `effects.call` going through the journal.
pub struct EffectCall<'a> {
    pub effect: &'a Effect,
    pub name: &'a str,
    pub body: &'a str,
    /// Largest response recorded, in bytes.
    pub payload_bytes_max: usize,
    /// Wait between attempts; tests pass a no-op.
    pub sleep: &'a dyn Fn(std::time::Duration),
    /// What is left of the execution's `wall_ms_max`: retries stop there
    /// too, whatever the effect's own deadline.
    pub wall_left: std::time::Duration,
    /// What the call uses besides its effect.
    pub services: &'a crate::options::Services,
}

/// What asking the receiver about an operation established.
enum Answer {
    /// A receipt for this operation: it happened.
    Receipt(String),
    /// The receiver says it has no record of the operation (yet).
    NotFound,
    /// Nothing either way (no lookup, the lookup failed, or its answer
    /// proves nothing), and why.
    CannotTell(String),
}

impl EffectCall<'_> {
    /// After a write that may have acted failed and will not be sent again:
    /// asks the receiver. A receipt makes it a success; anything else
    /// leaves it `unknown` (the journal parks the run) rather than a guess.
    /// "No record" is no proof either: asked right after a timeout, a
    /// receiver that got the request and has not committed it yet says the
    /// same as one that never got it.
    fn settle(&mut self, op: &OpContext<'_>, attempts: &mut Attempts<'_>, last: &str) -> Performed {
        let reason = match self.ask(op, attempts) {
            Answer::Receipt(receipt) => {
                return Outcome::Ok(serde_json::Value::String(receipt)).into();
            }
            Answer::NotFound => "the receiver has no record of the operation yet, which does \
                                 not prove it never will (it may not have committed it)"
                .to_string(),
            Answer::CannotTell(reason) => reason,
        };
        Performed::Unknown(format!("{last}; {reason}"))
    }

    /// Asks the receiver about the operation, again under the effect's
    /// retry policy while the lookup fails for a reason that may pass.
    fn ask(&mut self, op: &OpContext<'_>, attempts: &mut Attempts<'_>) -> Answer {
        let first = std::time::Instant::now();
        let mut started = stephost_core::clock::now_ms();
        let mut lookup = self.effect.handler.lookup(&self.request(op));
        let mut n = 1;
        while let Err(Failure::Retryable { message, .. }) = &lookup {
            let pause = self.effect.retry.backoff(n + 1, 0.5);
            if n >= self.effect.retry.attempts_max.max(1)
                || first.elapsed().saturating_add(pause) > self.wall_left
            {
                break;
            }
            attempts.record("lookup", started, "error", Some(message));
            n += 1;
            (self.sleep)(pause);
            started = stephost_core::clock::now_ms();
            lookup = self.effect.handler.lookup(&self.request(op));
        }
        match lookup {
            Ok(Lookup::Found(receipt)) => {
                match check_receipt(
                    &receipt,
                    &self.effect.receipt_pointer,
                    op.operation_id,
                    &self.effect.handler.payload_sha256(self.body),
                ) {
                    Ok(()) => {
                        attempts.record("lookup", started, "found", None);
                        Answer::Receipt(receipt)
                    }
                    Err(reason) => {
                        attempts.record("lookup", started, "foreign_receipt", Some(&reason));
                        Answer::CannotTell(reason)
                    }
                }
            }
            Ok(Lookup::NotFound) => {
                attempts.record("lookup", started, "not_found", None);
                Answer::NotFound
            }
            Ok(Lookup::Unsupported) => {
                Answer::CannotTell("the receiver offers no lookup".to_string())
            }
            Err(failure) => {
                attempts.record("lookup", started, "error", Some(failure.message()));
                Answer::CannotTell(format!("the lookup failed: {}", failure.message()))
            }
        }
    }

    fn request<'r>(&'r self, op: &'r OpContext<'_>) -> Request<'r> {
        Request {
            run_id: op.run_id,
            seq: op.seq,
            effect: self.name,
            class: op.class,
            operation_id: op.operation_id,
            fence: op.fence,
            body: self.body,
            services: self.services,
            redacted: self.effect.redaction.is_some(),
            trace: op.trace,
        }
    }
}

impl LiveCall for EffectCall<'_> {
    fn perform(&mut self, op: &OpContext<'_>, attempts: &mut Attempts<'_>) -> Performed {
        let policy = &self.effect.retry;
        let first = std::time::Instant::now();
        let attempts_max = policy.attempts_max.max(1);
        let mut n = 1;
        let mut ambiguous = false;
        loop {
            let started = stephost_core::clock::now_ms();
            let result = self.effect.handler.perform(&self.request(op));
            match &result {
                Ok(reply) => attempts.record("send", started, "ok", reply.detail.as_deref()),
                Err(f) => attempts.record("send", started, f.label(), Some(f.message())),
            }
            match result {
                Ok(reply) if reply.body.len() > self.payload_bytes_max => {
                    // The receiver acted: the call succeeded even though its
                    // response is too large to record in full.
                    let summary = serde_json::json!({
                        RESPONSE_TOO_LARGE: reply.body.len(),
                        "stephost_response_sha256": payload_sha256(&reply.body),
                    });
                    return Outcome::Ok(serde_json::Value::String(summary.to_string())).into();
                }
                Ok(reply) => {
                    if reply.duplicate {
                        attempts.count("idempotency_key_hit_total");
                    }
                    return Outcome::Ok(serde_json::Value::String(reply.body)).into();
                }
                Err(Failure::Rejected(m)) => {
                    attempts.count("non_retryable_failure_total");
                    return Outcome::error(CallErrorKind::Rejected, m).into();
                }
                // After an attempt that may have acted, a refusal that is not
                // declared final does not say the operation did not happen.
                Err(Failure::Refused(m)) if op.class == CallClass::Write && ambiguous => {
                    return self.settle(op, attempts, &m);
                }
                Err(Failure::Refused(m)) => {
                    attempts.count("non_retryable_failure_total");
                    return Outcome::error(CallErrorKind::Rejected, m).into();
                }
                Err(Failure::Invalid(m)) => {
                    attempts.count("non_retryable_failure_total");
                    return Outcome::error(CallErrorKind::Invalid, m).into();
                }
                Err(Failure::Retryable {
                    message,
                    retry_after,
                    maybe_received,
                }) => {
                    let write = op.class == CallClass::Write;
                    let idempotent = self.effect.handler.idempotent();
                    ambiguous |= maybe_received;
                    // A write the receiver may have acted on is resent only
                    // where the receiver deduplicates; otherwise ask it.
                    if write && maybe_received && !idempotent {
                        return self.settle(op, attempts, &message);
                    }
                    let deadline =
                        std::time::Duration::from_millis(policy.deadline_ms).min(self.wall_left);
                    let mut pause = policy.backoff(
                        n + 1,
                        (stephost_core::clock::now_ns() % 1000) as f64 / 1000.0,
                    );
                    // A receiver's hint is followed up to the deadline, never
                    // past it; no sum of durations can overflow.
                    if let Some(hint) = retry_after {
                        pause = pause.max(hint.min(deadline));
                    }
                    let elapsed = first.elapsed();
                    if n >= attempts_max || elapsed.saturating_add(pause) > deadline {
                        attempts.count("retry_exhausted_total");
                        if write && ambiguous {
                            // "Exhausted" would claim it did not happen.
                            return self.settle(op, attempts, &message);
                        }
                        return Outcome::error(
                            CallErrorKind::Exhausted,
                            format!("{n} attempt(s) failed; last: {message}"),
                        )
                        .into();
                    }
                    n += 1;
                    attempts.count("activity_retry_total");
                    (self.sleep)(pause);
                }
            }
        }
    }

    fn reconciles_writes(&self) -> bool {
        true
    }

    fn resend_is_harmless(&self) -> bool {
        self.effect.handler.idempotent()
    }

    fn reconcile(&mut self, op: &OpContext<'_>, attempts: &mut Attempts<'_>) -> Reconciled {
        attempts.count("reconciliation_total");
        // The class recorded with the call decides, not today's configuration.
        if op.class != CallClass::Write {
            return Reconciled::PerformAgain;
        }
        let idempotent = self.effect.handler.idempotent();
        match self.ask(op, attempts) {
            Answer::Receipt(receipt) => {
                Reconciled::Outcome(Outcome::Ok(serde_json::Value::String(receipt)))
            }
            // A receiver that deduplicates may be sent the request again with
            // the same operation id: it acts at most once.
            Answer::NotFound | Answer::CannotTell(_) if idempotent => Reconciled::PerformAgain,
            Answer::NotFound => Reconciled::Unknown(
                "the receiver has no record of the operation but does not deduplicate, so \
                 resending could act twice"
                    .to_string(),
            ),
            Answer::CannotTell(reason) => {
                Reconciled::Unknown(format!("{reason}, and the receiver does not deduplicate"))
            }
        }
    }
}
