//! `stephost:step/models` (stephost:step@0.2.0): a chat turn with a model
//! named in `stephost.toml`. The recorded request is the provider-neutral
//! one, with the alias in `model`, and after the execution's first chat
//! call only what is new since the last
//! ([`stephost_models::RecordedAfter::recorded_after`]); the answer is committed durably before
//! the step sees it ([`stephost_effects::model`]). A call that would take the
//! run past its budget (`[limits] model_tokens_max`,
//! `model_cost_micro_usd_max`) is not sent: it answers `budget`, recorded
//! like any refusal, so a replay sees it again.

use stephost_core::CallClass;
use stephost_core::journal::{CallErrorKind, CallSpec, Compute, Outcome, Stop};
use stephost_core::limits::OverBudget;
use stephost_core::redact::Redaction;
use stephost_models::{ChatRequest, ChatResponse, Message, RecordedAfter};

use crate::bindings::v0_2;
use crate::imports::effects::{Gated, gated_call};
use crate::imports::{StepState, lock, trap};

pub const INTERFACE: &str = "stephost:step/models";

/// What a run's model calls have spent so far in this execution's view:
/// the replayed ones and the live ones, in call order.
pub type Spent = stephost_core::Spent;

/// An execution's last chat call: the next is recorded as what is new
/// since it.
#[derive(Debug, Clone)]
pub struct LastChat {
    pub seq: u64,
    pub request: ChatRequest,
    /// Its answer, as the step got it (if it had content).
    pub answer: Option<Message>,
}

/// `models.chat(model, request)`.
pub fn chat(
    state: &mut StepState,
    alias: &str,
    request: &str,
) -> wasmtime::Result<Result<String, v0_2::CallError>> {
    let live_before = lock(&state.journal).stats.live;
    let outcome = call(state, alias, request)?;
    let live = lock(&state.journal).stats.live > live_before;
    let answer = answered(state, alias, live, outcome);
    if live && crate::imports::runs::in_tree(state) {
        crate::imports::runs::settle_model_spend(state);
    }
    Ok(answer)
}

/// Why a model call that may spend `tokens` and cost `micro_usd` would
/// take the run past its budget, if it would.
pub fn over_budget(state: &StepState, tokens: u64, micro_usd: Option<u64>) -> Option<String> {
    if stephost_core::crash::broken("skip-budget") {
        return None;
    }
    let limits = lock(&state.journal).limits().clone();
    let spent = state.models_spent;
    if spent.tokens.saturating_add(tokens) > limits.model_tokens_max {
        return Some(format!(
            "the run has spent {} model tokens; this call may spend {tokens} more (its input \
             and max_tokens), past model_tokens_max = {}",
            spent.tokens, limits.model_tokens_max
        ));
    }
    let micro_usd = micro_usd?;
    (spent.micro_usd.saturating_add(micro_usd) > limits.model_cost_micro_usd_max).then(|| {
        format!(
            "the run's model calls have cost {} micro-USD; this call may cost {micro_usd} more, \
             past model_cost_micro_usd_max = {}",
            spent.micro_usd, limits.model_cost_micro_usd_max
        )
    })
}

/// The call itself: recorded, refused or sent.
fn call(state: &mut StepState, alias: &str, request: &str) -> wasmtime::Result<Outcome> {
    let effects = state.effects.clone();
    let model = effects.model(alias);
    let redaction = model.and_then(|m| m.effect.redaction.as_ref());
    let parsed = serde_json::from_str::<ChatRequest>(request)
        .map_err(|e| format!("the chat request is not one: {e}"))
        .and_then(|mut chat| {
            chat.model = alias.to_string();
            stephost_models::validate(&chat)?;
            Ok(chat)
        });
    let chat = match parsed {
        Ok(chat) => chat,
        // Recorded as sent (it may not even be JSON), refused.
        Err(message) => {
            return refuse(state, request, redaction, CallErrorKind::Invalid, message);
        }
    };
    let whole = chat.canonical_json();
    // The ledger keeps what is new since the execution's last chat call (a
    // refusal too: a replay without the model configured makes the same
    // text); the provider gets the whole request.
    let seq = lock(&state.journal).calls_made() + 1;
    let after = state
        .last_chat
        .as_ref()
        .and_then(|last| chat.recorded_after(&last.request, last.answer.as_ref(), last.seq));
    let recorded = after.unwrap_or_else(|| whole.clone());
    let sent = (recorded != whole).then_some(whole.as_str());
    state.last_chat = Some(LastChat {
        seq,
        request: chat.clone(),
        answer: None,
    });
    let Some(model) = model else {
        return refuse(
            state,
            &recorded,
            None,
            CallErrorKind::Denied,
            format!(
                "model `{alias}` is not configured; add [models.{alias}] to stephost.toml \
                 (api, url, model, key_env)"
            ),
        );
    };
    // What the call may spend: its input, sent whole (about four bytes a
    // token), and its max_tokens; its worst cost prices all of it as output.
    let max_tokens = model.model.max_tokens_of(&chat);
    let tokens = (whole.len() / 4) as u64 + u64::from(max_tokens);
    let worst_cost = model.model.worst_cost_micro_usd(whole.len(), max_tokens);
    if let Some(message) = over_budget(state, tokens, Some(worst_cost)) {
        let limits = lock(&state.journal).limits().clone();
        // Parked only when the call is live: a recorded call replays what
        // it answered, whatever today's budget.
        if limits.model_budget_exceeded == OverBudget::Park
            && seq > lock(&state.journal).history_len()
        {
            return Err(state.fail(Stop::OverBudget {
                seq,
                name: format!("models.{alias}"),
                reason: format!(
                    "{message}; raise the run's budget with `stephost resume RUN_ID \
                     --model-tokens-max N --model-cost-micro-usd-max N` (or in [limits])"
                ),
            }));
        }
        return refuse(
            state,
            &recorded,
            redaction,
            CallErrorKind::Budget,
            format!(
                "{message}; the call was not sent (raise the run's budget when it is submitted, \
                 or in [limits])"
            ),
        );
    }
    let live = seq > lock(&state.journal).history_len();
    // In a tree, the call is held against the root's budget, which every
    // run of the tree shares; refused like any call over budget.
    if live && crate::imports::runs::in_tree(state) {
        let call = stephost_core::Spent {
            tokens,
            micro_usd: worst_cost,
        };
        if let Some(message) =
            crate::imports::runs::hold_model_spend(state, call).map_err(|stop| state.fail(stop))?
        {
            return refuse(
                state,
                &recorded,
                redaction,
                CallErrorKind::Budget,
                format!("{message}; the call was not sent (raise the root's budget)"),
            );
        }
    }
    // A live call that would wait long for its model's capacity leaves
    // memory instead, holding no thread: the run waits (a worker wakes it
    // when due) and asks again from its recorded calls.
    if seq > lock(&state.journal).history_len()
        && let Some(wait_ms) = model
            .model
            .expected_wait(&state.services, &chat, whole.len())
            .filter(|ms| *ms > crate::imports::timers::SLEEP_IN_PLACE_MS_MAX)
    {
        let wake_at_ms = stephost_core::clock::now_ms().saturating_add(wait_ms);
        let reason = format!(
            "model {alias} has no capacity (its rate limit or the provider's pause) until {}",
            stephost_core::clock::format_time(wake_at_ms)
        );
        if let Some(sink) = &state.services.stream_sink {
            let run_id = lock(&state.journal).run_id().to_string();
            (sink.0)(
                &run_id,
                seq,
                stephost_effects::ModelProgress::Waiting(&reason),
            );
        }
        return Err(state.fail(Stop::Suspended {
            seq,
            wake_at_ms: Some(wake_at_ms),
            reason,
        }));
    }
    let call = Gated {
        interface: INTERFACE,
        function: "chat",
        effect: Some(&model.effect),
        class: None,
        request: &recorded,
        sent,
        key: None,
    };
    gated_call(state, &call, String::new)
}

/// What a recorded model call spent, by its outcome: what the host
/// charged for it (an answer's `charged`, else its usage and cost; a
/// failure's `spent`; an answer too large to keep, what its summary
/// kept).
pub fn spent_by(outcome: &Outcome) -> Spent {
    match outcome {
        Outcome::Ok(serde_json::Value::String(text)) => {
            if let Ok(response) = serde_json::from_str::<ChatResponse>(text) {
                return match response.charged {
                    Some(charged) => Spent {
                        tokens: charged.tokens,
                        micro_usd: charged.micro_usd,
                    },
                    None => Spent {
                        tokens: response.usage.total(),
                        micro_usd: response.cost.map_or(0, |c| c.micro_usd),
                    },
                };
            }
            serde_json::from_str::<serde_json::Value>(text)
                .ok()
                .and_then(|summary| {
                    serde_json::from_value(summary.get(stephost_effects::SPENT)?.clone()).ok()
                })
                .unwrap_or_default()
        }
        Outcome::Err(error) => error.spent.unwrap_or_default(),
        Outcome::Ok(_) => Spent::default(),
    }
}

/// What the step gets, noted: an answer's spending counts toward the
/// budget, and its message is what the next call is recorded after (a
/// replay without the model configured gets its recorded answers through a
/// refusal's path: they are noted the same way); a `live` one (not
/// replayed) counts in the model metrics. The host's note of what it
/// charged is not the step's to see.
fn answered(
    state: &mut StepState,
    alias: &str,
    live: bool,
    outcome: Outcome,
) -> Result<String, v0_2::CallError> {
    let spent = spent_by(&outcome);
    state.models_spent = state.models_spent.plus(spent);
    let outcome = match outcome {
        Outcome::Ok(serde_json::Value::String(text)) => {
            match serde_json::from_str::<ChatResponse>(&text) {
                Ok(mut response) => {
                    if let Some(last) = &mut state.last_chat
                        && !response.content.is_empty()
                    {
                        last.answer = Some(Message::assistant(response.content.clone()));
                    }
                    if live {
                        let mut journal = lock(&state.journal);
                        crate::metrics::model_answer(
                            alias,
                            &response.usage,
                            response.cost.map(|c| c.micro_usd),
                            |name, n| journal.add(name, n),
                        );
                    }
                    let text = match response.charged.take() {
                        Some(_) => serde_json::to_string(&response).unwrap_or(text),
                        None => text,
                    };
                    Outcome::Ok(serde_json::Value::String(text))
                }
                Err(_) => Outcome::Ok(serde_json::Value::String(text)),
            }
        }
        other => other,
    };
    let answer = match crate::imports::v0_2::to_guest(outcome) {
        // The `budget-replayed-as-other` break (test builds only).
        Err(v0_2::CallError::Budget(m))
            if !live && stephost_core::crash::broken("budget-replayed-as-other") =>
        {
            Err(v0_2::CallError::Exhausted(m))
        }
        answer => answer,
    };
    if live && let Err(v0_2::CallError::Budget(_)) = &answer {
        lock(&state.journal).count(crate::metrics::model_budget_refusal(alias));
    }
    answer
}

/// A call refused before it was sent, recorded as such (so a replay gives
/// the step the same answer), its request redacted as a sent one would be:
/// where it cannot be (it is not JSON), kept by its size and hash only.
pub fn refuse(
    state: &mut StepState,
    request: &str,
    redaction: Option<&Redaction>,
    kind: CallErrorKind,
    message: String,
) -> wasmtime::Result<Outcome> {
    refuse_in(state, INTERFACE, "chat", request, redaction, kind, message)
}

/// [`refuse`] for any interface's call.
pub fn refuse_in(
    state: &mut StepState,
    interface: &str,
    function: &str,
    request: &str,
    redaction: Option<&Redaction>,
    kind: CallErrorKind,
    message: String,
) -> wasmtime::Result<Outcome> {
    let outcome = Outcome::error(kind, message);
    let opaque;
    let request = match redaction {
        Some(_) if serde_json::from_str::<serde::de::IgnoredAny>(request).is_err() => {
            opaque = crate::imports::effects::opaque_request(request);
            opaque.as_str()
        }
        _ => request,
    };
    let spec = CallSpec {
        class: CallClass::Observe,
        interface,
        function,
        request,
        key: None,
        paid: false,
        redact: redaction,
    };
    lock(&state.journal)
        .call(&spec, &mut Compute(|| outcome.clone()))
        .map_err(trap)
}
