//! The effects granted to a step: named effects (`effects.call`), the
//! `[llm]` endpoint, models by alias, origins of a step's own HTTP client,
//! and what no recorded text may hold. Anything not named here is denied.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::handler::Effect;
use crate::model::ModelEffect;
use crate::origin::Granted;

/// The effects granted to a step. Anything not named here is denied.
#[derive(Default, Clone)]
pub struct Effects {
    granted: Arc<BTreeMap<String, Effect>>,
    llm: Option<Arc<Effect>>,
    models: Arc<BTreeMap<String, ModelEffect>>,
    /// Origins steps' own HTTP clients may reach, by `scheme://host[:port]`.
    origins: Arc<BTreeMap<String, Granted>>,
    /// The secrets the configuration read (keys, injected header values):
    /// no text the host records may hold them.
    scrub: stephost_core::redact::Scrub,
    /// Values of a run's input kept only as keyed hashes
    /// (`[redact."input"]`).
    input_redaction: Option<stephost_core::redact::Redaction>,
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
            scrub: Default::default(),
            input_redaction: None,
        }
    }

    /// These effects, the values at `redaction`'s pointers of each run's
    /// input kept as markers.
    pub fn with_input_redaction(mut self, redaction: stephost_core::redact::Redaction) -> Self {
        self.input_redaction = Some(redaction);
        self
    }

    /// A run's input as the ledger keeps it.
    pub fn kept_input(&self, input: &str) -> String {
        match &self.input_redaction {
            Some(redaction) => redaction.request(input),
            None => input.to_string(),
        }
    }

    /// These effects, their configuration's secrets to scrub.
    pub fn with_scrub(mut self, scrub: stephost_core::redact::Scrub) -> Self {
        self.scrub = scrub;
        self
    }

    /// The secrets no recorded text may hold.
    pub fn scrub(&self) -> &stephost_core::redact::Scrub {
        &self.scrub
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
