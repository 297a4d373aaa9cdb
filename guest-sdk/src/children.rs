//! Child runs: a step starts other steps as runs of their own and joins
//! them in join sets (the host's `runs` import, stephost:step@0.3.0).

use crate::bindings::stephost::step::runs;
use crate::ctx::effect_error;
use crate::{Ctx, EffectError};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// A child to start: a step named in the host's configuration
/// (`[steps.NAME] module = "…"`) and its input.
#[derive(Debug, Clone)]
pub struct Child {
    step: String,
    input: String,
    key: Option<String>,
    model_tokens_max: Option<u64>,
    model_cost_micro_usd_max: Option<u64>,
    detach: bool,
}

impl Child {
    /// Step `step` on `input` (encoded as JSON).
    ///
    /// # Errors
    /// [`EffectError::Encode`] if the input does not encode as JSON.
    pub fn new(step: &str, input: &(impl Serialize + ?Sized)) -> Result<Child, EffectError> {
        let input = serde_json::to_string(input).map_err(|e| EffectError::Encode {
            effect: format!("runs.start {step}"),
            message: e.to_string(),
        })?;
        Ok(Child {
            step: step.to_string(),
            input,
            key: None,
            model_tokens_max: None,
            model_cost_micro_usd_max: None,
            detach: false,
        })
    }

    /// A business key, unique among this run's children: the child's run
    /// id is derived from it instead of the start's place in the run, so it
    /// stays the same across builds of this step.
    pub fn key(mut self, key: &str) -> Child {
        self.key = Some(key.to_string());
        self
    }

    /// The most model tokens the child may spend.
    pub fn model_tokens_max(mut self, tokens: u64) -> Child {
        self.model_tokens_max = Some(tokens);
        self
    }

    /// The most model cost, in micro-USD, the child may spend.
    pub fn model_cost_micro_usd_max(mut self, micro_usd: u64) -> Child {
        self.model_cost_micro_usd_max = Some(micro_usd);
        self
    }

    /// Let the child go on if this run ends before joining it (by default
    /// it is cancelled with this run's end).
    pub fn detach(mut self) -> Child {
        self.detach = true;
        self
    }

    fn spec(&self) -> runs::ChildSpec {
        runs::ChildSpec {
            step: self.step.clone(),
            input: self.input.clone(),
            key: self.key.clone(),
            model_tokens_max: self.model_tokens_max,
            model_cost_micro_usd_max: self.model_cost_micro_usd_max,
            detach: self.detach,
        }
    }
}

/// A child's end, as its parent joins it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildEnd {
    /// The child's run id (as [`Ctx::start`] returned it).
    pub run_id: String,
    /// The child's output (JSON), or its error (or, if it was cancelled,
    /// by whom and why).
    pub result: Result<String, String>,
    /// Whether the child was cancelled.
    pub cancelled: bool,
}

impl ChildEnd {
    fn from(end: runs::ChildEnd) -> ChildEnd {
        ChildEnd {
            run_id: end.run_id,
            cancelled: end.status == runs::ChildStatus::Cancelled,
            result: match end.status {
                runs::ChildStatus::Completed => Ok(end.output),
                runs::ChildStatus::Failed | runs::ChildStatus::Cancelled => Err(end.output),
            },
        }
    }

    /// The child's output decoded as `T`.
    ///
    /// # Errors
    /// [`EffectError::Rejected`] with the child's error if it failed, or
    /// [`EffectError::Decode`] if its output is not a `T`.
    pub fn output<T: DeserializeOwned>(&self) -> Result<T, EffectError> {
        let effect = format!("child {}", self.run_id);
        match &self.result {
            Ok(text) => serde_json::from_str(text).map_err(|e| EffectError::Decode {
                effect,
                message: e.to_string(),
            }),
            Err(message) => Err(EffectError::Rejected {
                effect,
                message: message.clone(),
            }),
        }
    }
}

impl Ctx {
    /// Starts `child` in join set `join_set`: its run id. The start is
    /// recorded with the child's run in one commit; a resumed or replayed
    /// run finds it recorded and never starts a second child.
    ///
    /// # Errors
    /// `Invalid` for a step the host does not know, `Budget` past the
    /// host's limits on children: nothing is started.
    pub fn start(&mut self, join_set: &str, child: &Child) -> Result<String, EffectError> {
        runs::start(join_set, &child.spec())
            .map_err(|e| effect_error(&format!("runs.start {}", child.step), e))
    }

    /// The next child of `join_set` to end. The run waits, out of memory,
    /// until one does; the order children are joined in is recorded.
    ///
    /// # Errors
    /// `Invalid` if the set has no child left to join.
    pub fn join_next(&mut self, join_set: &str) -> Result<ChildEnd, EffectError> {
        runs::join_next(join_set)
            .map(ChildEnd::from)
            .map_err(|e| effect_error("runs.join-next", e))
    }

    /// Like [`Ctx::join_next`] without waiting: `None` if no child of the
    /// set has ended yet or none is left.
    ///
    /// # Errors
    /// As the host answers.
    pub fn join_try_next(&mut self, join_set: &str) -> Result<Option<ChildEnd>, EffectError> {
        match runs::join_try_next(join_set).map_err(|e| effect_error("runs.join-try-next", e))? {
            runs::TryNext::Found(end) => Ok(Some(ChildEnd::from(end))),
            runs::TryNext::Pending | runs::TryNext::Empty => Ok(None),
        }
    }

    /// Cancels child `run_id` (one this run started) with the runs below
    /// it: each begins nothing more and ends cancelled, which its join
    /// gives. A child that has ended already is left as it ended.
    ///
    /// # Errors
    /// `Invalid` for a run this run did not start.
    pub fn cancel_child(&mut self, run_id: &str) -> Result<(), EffectError> {
        runs::cancel(run_id).map_err(|e| effect_error("runs.cancel", e))
    }

    /// Starts `child` and waits for its end.
    ///
    /// # Errors
    /// As [`Ctx::start`].
    pub fn call_step(&mut self, child: &Child) -> Result<ChildEnd, EffectError> {
        runs::call(&child.spec())
            .map(ChildEnd::from)
            .map_err(|e| effect_error(&format!("runs.call {}", child.step), e))
    }
}
