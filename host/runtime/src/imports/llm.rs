//! `stephost:step/llm`: completions through the configured model endpoint,
//! each a recorded read. A completion counts against the run's model token
//! budget as a chat does (`[limits] model_tokens_max`): one that would take
//! the run past it (its input, about four bytes a token, and its
//! `max_tokens`) is not sent, and answers `rejected` (0.1.0 has no `budget`
//! error), recorded as a `budget` refusal; what an answer spent is its
//! `usage.total_tokens`, or an estimate where it reports none. The endpoint
//! has no prices: the cost budget does not apply.

use stephost_core::journal::{CallErrorKind, Outcome, Stop};
use stephost_core::limits::OverBudget;

use crate::bindings::CallError;
use crate::bindings::stephost::step::llm::Host;
use crate::imports::StepState;
use crate::imports::effects::{Gated, gated_call, to_guest};
use crate::imports::lock;
use crate::imports::models::{Spent, over_budget, refuse_in};

pub const INTERFACE: &str = "stephost:step/llm";

impl Host for StepState {
    fn complete(&mut self, request: String) -> wasmtime::Result<Result<String, CallError>> {
        let effects = self.effects.clone();
        let effect = effects.llm();
        if let Some(effect) = effect
            && let Some(message) = over_budget(self, tokens_asked(&request), None)
        {
            let seq = lock(&self.journal).calls_made() + 1;
            let limits = lock(&self.journal).limits().clone();
            if limits.model_budget_exceeded == OverBudget::Park
                && seq > lock(&self.journal).history_len()
            {
                return Err(self.fail(Stop::OverBudget {
                    seq,
                    name: "llm.complete".to_string(),
                    reason: format!(
                        "{message}; raise the run's budget with `stephost resume RUN_ID \
                         --model-tokens-max N` (or in [limits])"
                    ),
                }));
            }
            // A recorded call replays what it answered, whatever today's
            // budget.
            let outcome = refuse_in(
                self,
                INTERFACE,
                "complete",
                &request,
                effect.redaction.as_ref(),
                CallErrorKind::Budget,
                format!("{message}; the completion was not sent"),
            )?;
            return Ok(self.completed(&request, outcome));
        }
        // In a tree, held against the root's budget (see models.chat).
        let live = {
            let journal = lock(&self.journal);
            journal.calls_made() >= journal.history_len()
        };
        let in_tree = effect.is_some() && live && crate::imports::runs::in_tree(self);
        if in_tree {
            let call = Spent {
                tokens: tokens_asked(&request),
                micro_usd: 0,
            };
            if let Some(message) = crate::imports::runs::hold_model_spend(self, call)
                .map_err(|stop| self.fail(stop))?
            {
                let outcome = refuse_in(
                    self,
                    INTERFACE,
                    "complete",
                    &request,
                    effect.and_then(|e| e.redaction.as_ref()),
                    CallErrorKind::Budget,
                    format!("{message}; the completion was not sent"),
                )?;
                return Ok(self.completed(&request, outcome));
            }
        }
        let call = Gated {
            interface: INTERFACE,
            function: "complete",
            effect,
            class: None,
            request: &request,
            sent: None,
            key: None,
        };
        let outcome = gated_call(self, &call, || {
            "no model endpoint is configured; add an [llm] section to stephost.toml".to_string()
        })?;
        let answer = self.completed(&request, outcome);
        if in_tree {
            crate::imports::runs::settle_model_spend(self);
        }
        Ok(answer)
    }
}

impl StepState {
    /// What the step gets of a completion, its spending counted.
    fn completed(&mut self, request: &str, outcome: Outcome) -> Result<String, CallError> {
        if let Outcome::Ok(serde_json::Value::String(answer)) = &outcome {
            let tokens = stephost_effects::llm::total_tokens(answer)
                .unwrap_or_else(|| tokens_of(request.len()) + tokens_of(answer.len()));
            self.models_spent = self.models_spent.plus(Spent {
                tokens,
                micro_usd: 0,
            });
        }
        to_guest(outcome)
    }
}

/// What a completion request may spend: its input and its `max_tokens`
/// (or `max_completion_tokens`).
fn tokens_asked(request: &str) -> u64 {
    let asked = serde_json::from_str::<serde_json::Value>(request)
        .ok()
        .and_then(|r| {
            r.get("max_tokens")
                .or_else(|| r.get("max_completion_tokens"))
                .and_then(|n| n.as_u64())
        })
        .unwrap_or(0);
    tokens_of(request.len()).saturating_add(asked)
}

/// About how many tokens `bytes` of text hold (four bytes a token).
fn tokens_of(bytes: usize) -> u64 {
    (bytes / 4) as u64
}
