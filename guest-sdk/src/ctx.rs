//! The step's handle to its recorded imports.

use crate::EffectError;
use crate::bindings::stephost::step::{
    approvals, clock, effects, llm, models, random, timers, types::CallError,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::time::{Duration, SystemTime};
use stephost_contract::{ChatRequest, ChatResponse};

/// The step's access to the host: effects, models, the clock, randomness,
/// durable timers and approvals.
///
/// Each method is one import call that the host records in the run's ledger
/// and numbers in the order the step makes it. On replay the host returns
/// the recorded result instead of calling out again, so the step must make
/// the same calls, with the same requests, in the same order.
///
/// A `Ctx` is handed to the function exported with
/// [`export_step!`](crate::export_step); it cannot be created otherwise.
#[derive(Debug)]
pub struct Ctx {
    _private: (),
}

impl Ctx {
    pub(crate) fn new() -> Self {
        Ctx { _private: () }
    }

    /// Calls the effect `name` with `request` encoded as JSON and decodes its
    /// JSON response into `Resp` (use [`serde_json::Value`] to take any).
    ///
    /// A `write` effect gets an operation id derived from the run and this
    /// call's sequence number; use [`Ctx::effect_with_key`] when the
    /// operation has a business identity that should survive code changes.
    ///
    /// # Errors
    /// The host's refusal or failure as an [`EffectError`] (retryable
    /// failures have already been retried), or [`EffectError::Encode`] /
    /// [`EffectError::Decode`] when the request or response is not the JSON
    /// the types describe.
    pub fn effect<Req, Resp>(&mut self, name: &str, request: &Req) -> Result<Resp, EffectError>
    where
        Req: Serialize + ?Sized,
        Resp: DeserializeOwned,
    {
        self.call(name, None, request)
    }

    /// Like [`Ctx::effect`], with a business `key` (for example
    /// `"order:WIDGET-7:10"`): the operation id is derived from the run, the
    /// effect name and the key instead of the call's sequence number, so the
    /// same business operation keeps its identity at the receiver even if the
    /// step's code changes around it.
    ///
    /// # Errors
    /// As for [`Ctx::effect`].
    pub fn effect_with_key<Req, Resp>(
        &mut self,
        name: &str,
        key: &str,
        request: &Req,
    ) -> Result<Resp, EffectError>
    where
        Req: Serialize + ?Sized,
        Resp: DeserializeOwned,
    {
        self.call(name, Some(key), request)
    }

    /// Asks the configured model for a chat completion. `request` is an
    /// OpenAI-style body without `model`, e.g.
    /// `{"messages": [{"role": "user", "content": "..."}]}`; the response is
    /// the provider's JSON (`choices`, `usage`, ...). The completion is
    /// recorded: a resumed or replayed run gets it back without new tokens.
    ///
    /// # Errors
    /// As for [`Ctx::effect`]; the effect name in errors is `llm`.
    pub fn llm<Req, Resp>(&mut self, request: &Req) -> Result<Resp, EffectError>
    where
        Req: Serialize + ?Sized,
        Resp: DeserializeOwned,
    {
        self.invoke("llm", request, llm::complete)
    }

    /// One turn of a conversation with the model aliased `model` in
    /// `stephost.toml` (`[models.NAME]`: OpenAI Chat, OpenAI Responses or
    /// Anthropic Messages behind the same provider-neutral request).
    ///
    /// `request.model` may be left empty: the host sets it to `model`. The
    /// answer (text and tool calls, why the model stopped, usage and cost) is
    /// committed durably before the step sees it, so a resumed or replayed
    /// run gets it back and is not billed twice. For a loop that runs the
    /// model's tool calls until it answers, see [`Agent`](crate::Agent).
    ///
    /// ```no_run
    /// use stephost_guest::{ChatRequest, Ctx, Error, Message};
    ///
    /// fn run(ctx: &mut Ctx, question: String) -> Result<String, Error> {
    ///     let request = ChatRequest::new("", vec![Message::user(question)]);
    ///     Ok(ctx.chat("support", &request)?.text())
    /// }
    /// # stephost_guest::export_step!(run);
    /// # fn main() {}
    /// ```
    ///
    /// # Errors
    /// As for [`Ctx::effect`], with the effect named `models.MODEL`:
    /// [`EffectError::Denied`] when no such model is configured,
    /// [`EffectError::Invalid`] when the host refuses the request (for example
    /// a tool call without its result), [`EffectError::Rejected`] or
    /// [`EffectError::Exhausted`] when the provider refused or kept failing,
    /// and [`EffectError::Budget`] when the call would pass the run's budget
    /// (it was not sent).
    pub fn chat(
        &mut self,
        model: &str,
        request: &ChatRequest,
    ) -> Result<ChatResponse, EffectError> {
        self.invoke(&format!("models.{model}"), request, |body| {
            models::chat(model, body)
        })
    }

    fn call<Req, Resp>(
        &mut self,
        name: &str,
        key: Option<&str>,
        request: &Req,
    ) -> Result<Resp, EffectError>
    where
        Req: Serialize + ?Sized,
        Resp: DeserializeOwned,
    {
        self.invoke(name, request, |body| effects::call(name, body, key))
    }

    fn invoke<Req, Resp>(
        &mut self,
        name: &str,
        request: &Req,
        import: impl FnOnce(&str) -> Result<String, CallError>,
    ) -> Result<Resp, EffectError>
    where
        Req: Serialize + ?Sized,
        Resp: DeserializeOwned,
    {
        let request = serde_json::to_string(request).map_err(|e| EffectError::Encode {
            effect: name.to_owned(),
            message: e.to_string(),
        })?;
        let response = import(&request).map_err(|e| effect_error(name, e))?;
        serde_json::from_str(&response).map_err(|e| EffectError::Decode {
            effect: name.to_owned(),
            message: e.to_string(),
        })
    }

    /// The current wall-clock time, as recorded by the host.
    pub fn now(&mut self) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_nanos(self.now_nanos())
    }

    /// The current wall-clock time in nanoseconds since the Unix epoch, as
    /// recorded by the host.
    pub fn now_nanos(&mut self) -> u64 {
        clock::now()
    }

    /// A random 64-bit number, as recorded by the host.
    pub fn random_u64(&mut self) -> u64 {
        random::get_u64()
    }

    /// `len` random bytes, as recorded by the host (which limits `len` to its
    /// payload limit).
    pub fn random_bytes(&mut self, len: u32) -> Vec<u8> {
        random::get_bytes(len)
    }

    /// Sleeps durably: the wake time is recorded, so a crash or restart
    /// neither loses nor repeats the wake-up, and a replay returns at once.
    /// A long sleep takes the run out of memory until it is due.
    pub fn sleep(&mut self, duration: Duration) {
        timers::sleep(u64::try_from(duration.as_millis()).unwrap_or(u64::MAX));
    }

    /// Asks a person to approve `subject`; `details` is the object approved
    /// (the approval is tied to its hash). The run waits, out of memory, until
    /// someone runs `stephost approve` / `stephost reject`, or until `ttl`
    /// passes (verdict [`Verdict::Expired`]).
    ///
    /// An approval is not a licence forever: re-check the business
    /// precondition after it before acting.
    ///
    /// # Errors
    /// [`EffectError::Invalid`] when `details` cannot be encoded or the
    /// request is refused by the host.
    pub fn approval<D>(
        &mut self,
        subject: &str,
        details: &D,
        ttl: Duration,
    ) -> Result<Decision, EffectError>
    where
        D: Serialize + ?Sized,
    {
        let details = serde_json::to_string(details).map_err(|e| EffectError::Encode {
            effect: "approvals".to_owned(),
            message: e.to_string(),
        })?;
        let decision = approvals::request(subject, &details, ttl.as_secs().max(1))
            .map_err(|e| effect_error("approvals", e))?;
        Ok(Decision {
            verdict: match decision.verdict {
                approvals::Verdict::Approved => Verdict::Approved,
                approvals::Verdict::Rejected => Verdict::Rejected,
                approvals::Verdict::Expired => Verdict::Expired,
            },
            by: decision.by,
            note: decision.note,
            at: SystemTime::UNIX_EPOCH + Duration::from_millis(decision.at_ms),
        })
    }
}

/// The host's `call-error` as the step sees it.
pub(crate) fn effect_error(effect: &str, e: CallError) -> EffectError {
    let effect = effect.to_owned();
    match e {
        CallError::Rejected(message) => EffectError::Rejected { effect, message },
        CallError::Denied(message) => EffectError::Denied { effect, message },
        CallError::Exhausted(message) => EffectError::Exhausted { effect, message },
        CallError::Invalid(message) => EffectError::Invalid { effect, message },
        CallError::Budget(message) => EffectError::Budget { effect, message },
    }
}

/// What a person decided about an approval.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Approved,
    Rejected,
    /// Nobody decided before the approval's time to live ran out.
    Expired,
}

/// A decision on an approval: the verdict, who, an optional note, and when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub verdict: Verdict,
    /// Empty when the approval expired.
    pub by: String,
    pub note: Option<String>,
    pub at: SystemTime,
}

impl Decision {
    pub fn approved(&self) -> bool {
        self.verdict == Verdict::Approved
    }
}
