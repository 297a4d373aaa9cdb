//! `stephost:step/models` (stephost:step@0.2.0): a chat turn with a model
//! named in `stephost.toml`. The recorded request is the provider-neutral
//! one, with the alias in `model`, and after the execution's first chat
//! call only what is new since the last
//! ([`stephost_models::ChatRequest::recorded_after`]); the answer is committed durably before
//! the step sees it ([`crate::effects::model`]). A call that would take the
//! run past its budget (`[limits] model_tokens_max`,
//! `model_cost_micro_usd_max`) is not sent: it answers `budget`, recorded
//! like any refusal, so a replay sees it again.

use stephost_core::CallClass;
use stephost_core::journal::{CallErrorKind, CallSpec, Compute, Outcome, Stop};
use stephost_core::limits::OverBudget;
use stephost_models::{ChatRequest, ChatResponse, Message};

use crate::bindings::v0_2;
use crate::imports::effects::{Gated, gated_call};
use crate::imports::{StepState, lock, trap};

pub const INTERFACE: &str = "stephost:step/models";

/// What a run's model calls have spent so far in this execution's view:
/// the replayed ones and the live ones, in call order.
#[derive(Debug, Default, Clone, Copy)]
pub struct Spent {
    pub tokens: u64,
    pub micro_usd: u64,
}

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
    let answer = call(state, alias, request)?;
    let live = lock(&state.journal).stats.live > live_before;
    Ok(answered(state, alias, live, answer))
}

/// The call itself: recorded, refused or sent.
fn call(
    state: &mut StepState,
    alias: &str,
    request: &str,
) -> wasmtime::Result<Result<String, v0_2::CallError>> {
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
        Err(message) => return refuse(state, request, CallErrorKind::Invalid, message),
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
    let effects = state.effects.clone();
    let Some(model) = effects.model(alias) else {
        return refuse(
            state,
            &recorded,
            CallErrorKind::Denied,
            format!(
                "model `{alias}` is not configured; add [models.{alias}] to stephost.toml \
                 (api, url, model, key_env)"
            ),
        );
    };
    let max_tokens = model.model.max_tokens_of(&chat);
    let limits = lock(&state.journal).limits().clone();
    let worst_cost = model.model.worst_cost_micro_usd(0, max_tokens);
    let over = if state
        .models_spent
        .tokens
        .saturating_add(u64::from(max_tokens))
        > limits.model_tokens_max
    {
        Some(format!(
            "the run has spent {} model tokens; this call may spend {max_tokens} more \
             (its max_tokens), past model_tokens_max = {}",
            state.models_spent.tokens, limits.model_tokens_max
        ))
    } else if state.models_spent.micro_usd.saturating_add(worst_cost)
        > limits.model_cost_micro_usd_max
    {
        Some(format!(
            "the run's model calls have cost {} micro-USD; this call may cost {worst_cost} more, \
             past model_cost_micro_usd_max = {}",
            state.models_spent.micro_usd, limits.model_cost_micro_usd_max
        ))
    } else {
        None
    };
    if let Some(message) = over {
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
            CallErrorKind::Budget,
            format!(
                "{message}; the call was not sent (raise the run's budget when it is submitted, \
                 or in [limits])"
            ),
        );
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
                crate::options::ModelProgress::Waiting(&reason),
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
    let answer = gated_call(state, &call, String::new)?;
    Ok(answer.map_err(crate::imports::v0_2::call_error))
}

/// What the step gets, noted: an answer's spending counts toward the
/// budget, and its message is what the next call is recorded after (a
/// replay without the model configured gets its recorded answers through a
/// refusal's path: they are noted the same way); a `live` one (not
/// replayed) counts in the model metrics.
fn answered(
    state: &mut StepState,
    alias: &str,
    live: bool,
    answer: Result<String, v0_2::CallError>,
) -> Result<String, v0_2::CallError> {
    if live && let Err(v0_2::CallError::Budget(_)) = &answer {
        lock(&state.journal).count(crate::metrics::model_budget_refusal(alias));
    }
    if let Ok(text) = &answer
        && let Ok(response) = serde_json::from_str::<ChatResponse>(text)
    {
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
        let spent = &mut state.models_spent;
        spent.tokens = spent.tokens.saturating_add(response.usage.total());
        spent.micro_usd = spent
            .micro_usd
            .saturating_add(response.cost.map_or(0, |c| c.micro_usd));
    }
    answer
}

/// A call refused before it was sent, recorded as such (so a replay gives
/// the step the same answer).
fn refuse(
    state: &mut StepState,
    request: &str,
    kind: CallErrorKind,
    message: String,
) -> wasmtime::Result<Result<String, v0_2::CallError>> {
    let outcome = Outcome::error(kind, message);
    let spec = CallSpec {
        class: CallClass::Observe,
        interface: INTERFACE,
        function: "chat",
        request,
        key: None,
        paid: false,
        redact: None,
    };
    let recorded = lock(&state.journal)
        .call(&spec, &mut Compute(|| outcome.clone()))
        .map_err(trap)?;
    Ok(crate::imports::v0_2::to_guest(recorded))
}
