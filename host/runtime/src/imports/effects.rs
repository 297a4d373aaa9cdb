//! `stephost:step/effects`: the single gate for side effects.

use wasmtime::StoreContextMut;
use wasmtime::component::Linker;

use crate::bindings::CallError;
use crate::bindings::stephost::step::effects::Host;
use crate::imports::{StepState, lock, trap};
use stephost_core::journal::{
    Call, CallErrorKind, CallSpec, Compute, Journal, LiveCall, Outcome, Stop, WriteStarted,
};
use stephost_core::{CallClass, StoreResult};
use stephost_effects::{Effect, EffectCall, Effects};

pub const INTERFACE: &str = "stephost:step/effects";

/// The interface's instance name in the step world.
const INSTANCE: &str = "stephost:step/effects@0.1.0";

/// Longest business key accepted, in bytes.
pub const KEY_BYTES_MAX: usize = 1024;

impl Host for StepState {
    fn call(
        &mut self,
        name: String,
        request: String,
        key: Option<String>,
    ) -> wasmtime::Result<Result<String, CallError>> {
        let max = lock(&self.journal).limits().effect_name_bytes_max;
        if name.len() as u64 > max {
            return Err(self.fail(Stop::Limit(format!(
                "the step called an effect whose name is {} bytes; effect_name_bytes_max = {max}",
                name.len()
            ))));
        }
        let effects = self.effects.clone();
        let call = Gated::effect(&effects, &name, &request, key.as_deref());
        Ok(to_guest(gated_call(self, &call, || not_granted(&name))?))
    }
}

/// One call of an effect (or of `llm.complete`) as the guest made it, and
/// the effect it names, if granted.
pub struct Gated<'a> {
    pub interface: &'a str,
    pub function: &'a str,
    pub effect: Option<&'a Effect>,
    /// The call's class, when the caller decides it (a step's HTTP
    /// request, by its method); else the effect's.
    pub class: Option<CallClass>,
    /// The request as the ledger keeps it.
    pub request: &'a str,
    /// What is sent, when it is not `request` (a model's whole conversation,
    /// of which the ledger keeps what is new).
    pub sent: Option<&'a str>,
    pub key: Option<&'a str>,
}

impl<'a> Gated<'a> {
    /// A call of `effects.call` to the effect `name`.
    fn effect(effects: &'a Effects, name: &'a str, request: &'a str, key: Option<&'a str>) -> Self {
        Gated {
            interface: INTERFACE,
            function: name,
            effect: effects.get(name),
            class: None,
            request,
            sent: None,
            key,
        }
    }
}

fn not_granted(name: &str) -> String {
    format!(
        "effect `{name}` is not granted to this step; grant it with [effects.\"{name}\"] in \
         stephost.toml"
    )
}

/// `effects.call` for runs executed as tasks (see
/// [`crate::engine::StepEngine::task_pre`]), in both worlds: a write's
/// durable `started` commit, when another thread makes it, is awaited, so
/// that the thread goes on with other runs meanwhile; a call of an effect
/// that may block tells the runtime first ([`Effect::call_on`]).
pub fn link_call_as_task(linker: &mut Linker<StepState>) -> wasmtime::Result<()> {
    link_task_call(linker, INSTANCE, |answer| answer)?;
    link_task_call(linker, INSTANCE_0_2, |answer| {
        answer.map_err(crate::imports::v0_2::call_error)
    })?;
    link_task_call(linker, INSTANCE_0_3, |answer| {
        answer.map_err(|e| crate::imports::v0_3::call_error(crate::imports::v0_2::call_error(e)))
    })
}

/// The 0.2.0 world's instance of this interface.
const INSTANCE_0_2: &str = "stephost:step/effects@0.2.0";
/// The 0.3.0 world's.
const INSTANCE_0_3: &str = "stephost:step/effects@0.3.0";

fn link_task_call<E>(
    linker: &mut Linker<StepState>,
    instance: &str,
    spell: fn(Result<String, CallError>) -> Result<String, E>,
) -> wasmtime::Result<()>
where
    Result<String, E>: wasmtime::component::ComponentType + wasmtime::component::Lower,
    E: Send + Sync + 'static,
{
    linker.instance(instance)?.func_wrap_async(
        "call",
        move |mut store: StoreContextMut<'_, StepState>,
              (name, request, key): (String, String, Option<String>)| {
            Box::new(async move {
                let state = store.data_mut();
                let effects = state.effects.clone();
                let call = Gated::effect(&effects, &name, &request, key.as_deref());
                let began = Effect::call_on(call.effect, || {
                    through_journal(state, &call, || not_granted(&name), Journal::begin)
                })
                .map_err(trap)?;
                let outcome = match began {
                    Call::Done(outcome) => outcome,
                    Call::Durable(pending) => {
                        let (write, commit) = pending.into_parts();
                        let answered = commit.await;
                        let state = store.data_mut();
                        Effect::call_on(call.effect, || send_call(state, &call, write, answered))
                            .map_err(trap)?
                    }
                };
                Ok((spell(to_guest(outcome)),))
            })
        },
    )
}

/// One call through a configured effect (or its refusal), recorded by the
/// journal: its outcome, as recorded or as performed. Each interface
/// spells it for the guest in its own world's words (a recorded `budget`
/// refusal is `budget` to a 0.2.0 model call, live or replayed alike).
pub fn gated_call(
    state: &mut StepState,
    call: &Gated<'_>,
    denied: impl FnOnce() -> String,
) -> wasmtime::Result<Outcome> {
    Effect::call_on(call.effect, || {
        through_journal(state, call, denied, |journal, spec, live| {
            journal.call(spec, live)
        })
    })
    .map_err(trap)
}

/// A call through the journal by `go` (all of it, [`Journal::call`], or up
/// to a write's durable commit if that is left pending,
/// [`Journal::begin`]), or its refusal. A request refused before it is sent
/// is still a recorded call: the guest saw the refusal and replay must show
/// it again.
fn through_journal<T: From<Outcome>>(
    state: &mut StepState,
    call: &Gated<'_>,
    denied: impl FnOnce() -> String,
    go: impl FnOnce(&mut Journal, &CallSpec<'_>, &mut dyn LiveCall) -> Result<T, Stop>,
) -> Result<T, Stop> {
    let Gated {
        interface,
        function,
        effect,
        class,
        request,
        sent,
        key,
    } = *call;
    let mut journal = lock(&state.journal);
    let max = journal.limits().payload_bytes_max as usize;
    let refusal = if request.len() > max {
        Some(Outcome::error(
            CallErrorKind::Invalid,
            format!(
                "request is {} bytes; payload_bytes_max is {max}",
                request.len()
            ),
        ))
    } else if let Err(e) = serde_json::from_str::<serde::de::IgnoredAny>(request) {
        Some(Outcome::error(
            CallErrorKind::Invalid,
            format!("request is not JSON: {e}"),
        ))
    } else if key.is_some_and(|k| k.len() > KEY_BYTES_MAX) {
        Some(Outcome::error(
            CallErrorKind::Invalid,
            format!("business key is longer than {KEY_BYTES_MAX} bytes"),
        ))
    } else if effect.is_none() {
        Some(Outcome::error(CallErrorKind::Denied, denied()))
    } else {
        None
    };
    match (refusal, effect) {
        (None, Some(effect)) => {
            // What is sent whole (a model's conversation) may hold a marker
            // the part the ledger keeps does not.
            if let Some(sent) = sent
                && journal.next_goes_live()
                && stephost_core::redact::is_redacted(sent)
            {
                let stop = Stop::RedactedValue {
                    seq: journal.calls_made() + 1,
                    name: function.to_string(),
                };
                journal.set_stop(stop.clone());
                return Err(stop);
            }
            let spec = CallSpec {
                class: class.unwrap_or_else(|| effect.class_of_next(&mut journal)),
                interface,
                function,
                request,
                key,
                paid: effect.handler.paid(),
                redact: effect.redaction.as_ref(),
            };
            let body = sent.unwrap_or(request);
            let mut live = effect_call(state, effect, function, body, &journal);
            go(&mut journal, &spec, &mut live)
        }
        (refusal, effect) => {
            let outcome = refusal.unwrap_or_else(|| {
                Outcome::error(CallErrorKind::Denied, format!("{function} is not granted"))
            });
            // A refused request is redacted as a sent one would be. One
            // too large, or one that cannot be redacted (not JSON), is
            // recorded by its size only.
            let redact = effect.and_then(|e| e.redaction.as_ref());
            let opaque = request.len() > max
                || (redact.is_some()
                    && serde_json::from_str::<serde::de::IgnoredAny>(request).is_err());
            let recorded = if opaque {
                opaque_request(request)
            } else {
                request.to_string()
            };
            let spec = CallSpec {
                class: CallClass::Observe,
                interface,
                function,
                request: &recorded,
                key,
                paid: false,
                redact,
            };
            journal
                .call(&spec, &mut Compute(|| outcome.clone()))
                .map(T::from)
        }
    }
}

/// What the ledger keeps of a request it cannot keep whole (too large, or
/// not JSON where values must be redacted): its size.
pub fn opaque_request(request: &str) -> String {
    format!("{{\"stephost_request_bytes\":{}}}", request.len())
}

/// The rest of a write [`Journal::begin`] left pending, once its commit is
/// answered: the request is sent if the commit succeeded.
fn send_call(
    state: &StepState,
    call: &Gated<'_>,
    write: WriteStarted,
    answered: StoreResult<()>,
) -> Result<Outcome, Stop> {
    let Gated {
        function,
        effect,
        request,
        sent,
        ..
    } = *call;
    let Some(effect) = effect else {
        return Err(Stop::Corrupt(format!(
            "a write of {function} was left pending though the effect is not granted"
        )));
    };
    let mut journal = lock(&state.journal);
    let mut live = effect_call(state, effect, function, sent.unwrap_or(request), &journal);
    journal.send(write, answered, &mut live)
}

/// The live I/O of one call of `effect`.
fn effect_call<'a>(
    state: &'a StepState,
    effect: &'a Effect,
    name: &'a str,
    body: &'a str,
    journal: &Journal,
) -> EffectCall<'a> {
    EffectCall {
        effect,
        name,
        body,
        payload_bytes_max: journal.limits().payload_bytes_max as usize,
        sleep: &state.sleep,
        wall_left: journal.wall_left(),
        services: &state.services,
        spend: Default::default(),
        deadline: None,
        resent: false,
    }
}

/// The guest's view of a recorded outcome.
pub fn to_guest(outcome: Outcome) -> Result<String, CallError> {
    match outcome {
        Outcome::Ok(serde_json::Value::String(s)) => Ok(s),
        Outcome::Ok(other) => Ok(other.to_string()),
        Outcome::Err(e) => Err(match e.kind {
            CallErrorKind::Rejected => CallError::Rejected(e.message),
            CallErrorKind::Denied => CallError::Denied(e.message),
            CallErrorKind::Exhausted => CallError::Exhausted(e.message),
            CallErrorKind::Invalid => CallError::Invalid(e.message),
            // Only 0.2.0's model calls have a budget ([`crate::imports::v0_2`]).
            CallErrorKind::Budget => CallError::Rejected(e.message),
        }),
    }
}
