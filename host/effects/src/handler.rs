//! What every handler is: the [`Handler`] trait a receiver implements, the
//! [`Request`] it is given, what it answers ([`Reply`], [`Failure`],
//! [`Lookup`]), and an [`Effect`]: a handler with its class, retry policy,
//! receipt pointer and redaction. Also what a call has spent ([`Spend`]),
//! how a receipt is checked ([`check_receipt`]) and how a thread that
//! blocks tells its runtime ([`blocking`]).

use std::sync::Arc;

use stephost_core::CallClass;

use crate::retry::RetryPolicy;

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

    pub fn label(&self) -> &'static str {
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
    /// The answer is a refusal the step reads as it is (a guest's own HTTP
    /// exchange answered with an error status). After an earlier attempt
    /// that may have acted it does not say the operation did not happen (a
    /// 409 "still in progress" comes while the first is being processed),
    /// so the write is settled with the receiver instead.
    pub refusal: bool,
}

impl Reply {
    pub fn new(body: impl Into<String>) -> Self {
        Reply {
            body: body.into(),
            duplicate: false,
            detail: None,
            refusal: false,
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
    pub services: &'a crate::services::Services,
    /// The effect keeps values of its calls out of the ledger: nothing of
    /// an answer is shown while it streams in.
    pub redacted: bool,
    /// The run's trace, when the host reports spans: the request carries
    /// its call's span ([`Request::trace_context`]).
    pub trace: Option<&'a stephost_core::RunTrace>,
    /// What the call's attempts have cost so far (a model's tokens).
    pub spend: &'a Spend,
    /// When the call must be over, its retries and waits included: its
    /// effect's `deadline_ms`, within what is left of its run's
    /// `wall_ms_max`. A handler that waits (for a model's capacity, for a
    /// streamed answer) stops there.
    pub deadline: Option<std::time::Instant>,
    /// The claim the call runs under, when a worker runs it: a handler
    /// that waits before it sends (for a model's capacity) looks again
    /// whether it still holds the run ([`RunControl::holds`]).
    pub control: Option<&'a stephost_core::journal::RunControl>,
}

/// What a paid call's attempts have cost so far: its handler adds each
/// attempt's (the provider's usage, or the host's estimate where there is
/// none), and the call's outcome records the sum, so that a run's model
/// budget charges the same live and replayed.
#[derive(Debug, Default)]
pub struct Spend {
    tokens: std::sync::atomic::AtomicU64,
    micro_usd: std::sync::atomic::AtomicU64,
    estimated: std::sync::atomic::AtomicBool,
}

impl Spend {
    pub const fn new() -> Self {
        Spend {
            tokens: std::sync::atomic::AtomicU64::new(0),
            micro_usd: std::sync::atomic::AtomicU64::new(0),
            estimated: std::sync::atomic::AtomicBool::new(false),
        }
    }

    pub fn add(&self, charged: stephost_models::Charged) {
        use std::sync::atomic::Ordering::Relaxed;
        self.tokens.fetch_add(charged.tokens, Relaxed);
        self.micro_usd.fetch_add(charged.micro_usd, Relaxed);
        self.estimated.fetch_or(charged.estimated, Relaxed);
    }

    pub fn total(&self) -> stephost_models::Charged {
        use std::sync::atomic::Ordering::Relaxed;
        stephost_models::Charged {
            tokens: self.tokens.load(Relaxed),
            micro_usd: self.micro_usd.load(Relaxed),
            estimated: self.estimated.load(Relaxed),
        }
    }

    pub fn spent(&self) -> Option<stephost_core::Spent> {
        let total = self.total();
        let spent = stephost_core::Spent {
            tokens: total.tokens,
            micro_usd: total.micro_usd,
        };
        (!spent.is_zero()).then_some(spent)
    }
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

    /// What a write's answer too large to record is recorded as, when the
    /// handler can say it without its body (an HTTP exchange: its status
    /// and headers): the step sees that the write was done, not an error
    /// it might answer by writing again. `None`: its size and hash.
    fn answer_without_body(&self, _answer: &str) -> Option<String> {
        None
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

    fn answer_without_body(&self, answer: &str) -> Option<String> {
        (**self).answer_without_body(answer)
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

/// What the handlers' unit tests give as a call's spend.
#[cfg(test)]
pub static TEST_SPEND: Spend = Spend::new();

/// A write's request as the handlers' unit tests make it: call #1 of run
/// `run_id` through effect `effect`, under `fence`.
#[cfg(test)]
pub fn test_request<'a>(
    run_id: &'a str,
    effect: &'a str,
    operation_id: &'a str,
    fence: i64,
    body: &'a str,
) -> Request<'a> {
    Request {
        seq: 1,
        services: &crate::services::Services::NONE,
        redacted: false,
        trace: None,
        spend: &TEST_SPEND,
        deadline: None,
        control: None,
        run_id,
        effect,
        class: stephost_core::CallClass::Write,
        operation_id,
        fence,
        body,
    }
}

/// The field of that summary that keeps what the call cost (a model's).
pub const SPENT: &str = "stephost_spent";

pub use crate::section::RECEIPT_OPERATION_POINTER;

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
