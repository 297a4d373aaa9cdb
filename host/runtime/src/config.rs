//! `stephost.toml`: the effects granted to steps and the run limits.
//!
//! ```toml
//! [limits]
//! fuel_max = 1_000_000_000
//!
//! [effects."supplier.order"]
//! kind = "file"        # echo | static | file | http | command | mcp | reject
//! class = "write"      # read | write (default write)
//! path = "orders.jsonl"
//! retry = { attempts_max = 5, backoff_first_ms = 50 }
//! ```
//! Unknown fields are refused with their line named. Deny by default: a step
//! may call only the effects named here.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use std::time::Duration;

use crate::effects::Granted;
use crate::effects::ModelEffect;
use crate::effects::builtin::{Echo, FileReceiver, Reject, Static};
use crate::effects::command::{CommandEffect, CommandOptions};
use crate::effects::http::{HttpEffect, Statuses};
use crate::effects::llm::Llm;
use crate::effects::mcp;
use crate::effects::model::Model;
use crate::effects::origin;
use crate::effects::{Effect, Effects, Handler, RetryPolicy};
use stephost_core::CallClass;
use stephost_core::Limits;
use stephost_core::redact::Redaction;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read configuration {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("configuration {path} is invalid: {message}")]
    Invalid { path: String, message: String },
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub limits: Limits,
    #[serde(default)]
    pub effects: BTreeMap<String, EffectConfig>,
    /// Origins steps' own HTTP clients may reach over `wasi:http`
    /// (`[http."https://api.example.com"]`); any other is denied.
    #[serde(default)]
    pub http: BTreeMap<String, HttpOriginConfig>,
    /// MCP servers whose tools `mcp` effects call (`[mcp.NAME]`).
    #[serde(default)]
    pub mcp: BTreeMap<String, McpServerConfig>,
    /// The model endpoint behind the `llm` import; without it `llm.complete`
    /// is denied.
    pub llm: Option<LlmConfig>,
    /// The models a step may call by alias (`[models.NAME]`, the `models`
    /// import of stephost:step@0.2.0).
    #[serde(default)]
    pub models: BTreeMap<String, ModelConfig>,
    /// Values kept only as keyed hashes, by effect name or `models.ALIAS`
    /// (`[redact."NAME"]`).
    #[serde(default)]
    pub redact: BTreeMap<String, RedactConfig>,
    /// Where `stephost serve` sends notifications: a run parked, waiting
    /// for an approval, failed or diverged.
    #[serde(default)]
    pub webhooks: Vec<WebhookConfig>,
    /// The folder relative paths are resolved against (the file's folder).
    #[serde(skip)]
    pub base_dir: PathBuf,
    /// The file this came from, for messages.
    #[serde(skip)]
    pub path: PathBuf,
    /// Where compiled components are cached (set from the command line).
    #[serde(skip)]
    pub cache_dir: Option<PathBuf>,
    /// Signs chain links and run seals (set from the environment: see
    /// [`signer_from_env`]).
    #[serde(skip)]
    pub signer: stephost_core::chain::Signer,
    /// Where runs' spans are exported (set from the `OTEL_*` environment:
    /// see [`crate::telemetry::Telemetry::from_env`]).
    #[serde(skip)]
    pub telemetry: Option<std::sync::Arc<crate::telemetry::Telemetry>>,
}

/// The variable holding the chain key itself.
pub const CHAIN_KEY_VAR: &str = "STEPHOST_CHAIN_KEY";
/// The variable naming a file that holds the chain key.
pub const CHAIN_KEY_FILE_VAR: &str = "STEPHOST_CHAIN_KEY_FILE";

/// The chain signer the environment asks for: keyed by `STEPHOST_CHAIN_KEY`
/// (the key's text) or `STEPHOST_CHAIN_KEY_FILE` (a file readable by its
/// owner only; surrounding whitespace is not part of the key), plain when
/// neither is set.
pub fn signer_from_env() -> Result<stephost_core::chain::Signer, ConfigError> {
    use stephost_core::chain::Signer;
    let invalid = |path: &str, message: String| ConfigError::Invalid {
        path: path.to_string(),
        message,
    };
    if let Some(key) = std::env::var_os(CHAIN_KEY_VAR) {
        return Signer::keyed(key.as_encoded_bytes()).map_err(|m| invalid(CHAIN_KEY_VAR, m));
    }
    let Some(file) = std::env::var_os(CHAIN_KEY_FILE_VAR) else {
        return Ok(Signer::plain());
    };
    let path = PathBuf::from(file);
    let shown = path.display().to_string();
    let read = |source| ConfigError::Read {
        path: shown.clone(),
        source,
    };
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&path).map_err(read)?.permissions().mode();
    if mode & 0o077 != 0 {
        return Err(invalid(
            &shown,
            format!(
                "the chain key file is readable by others (mode {:o}); make it its owner's \
                 only: chmod 600 {shown}",
                mode & 0o777
            ),
        ));
    }
    let bytes = std::fs::read(&path).map_err(read)?;
    Signer::keyed(bytes.trim_ascii()).map_err(|m| invalid(&shown, m))
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClassName {
    Read,
    #[default]
    Write,
}

impl ClassName {
    fn class(self) -> CallClass {
        match self {
            ClassName::Read => CallClass::Read,
            ClassName::Write => CallClass::Write,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum EffectConfig {
    /// Answers with the request.
    Echo {
        #[serde(default)]
        class: ClassName,
        #[serde(default)]
        retry: RetryPolicy,
    },
    /// Answers with `response`, a JSON document.
    Static {
        #[serde(default)]
        class: ClassName,
        response: String,
        #[serde(default)]
        retry: RetryPolicy,
    },
    /// Appends to the file at `path`, deduplicating by operation id.
    File {
        #[serde(default)]
        class: ClassName,
        path: PathBuf,
        /// Wait this long after committing before replying (a slow receiver).
        #[serde(default)]
        reply_delay_ms: u64,
        /// Whether the receiver ignores an operation id it has seen (default
        /// true). A receiver that does not cannot be resent to safely.
        #[serde(default = "yes")]
        deduplicate: bool,
        /// Whether the receiver answers lookups by operation id (default true).
        #[serde(default = "yes")]
        lookup: bool,
        #[serde(default)]
        retry: RetryPolicy,
    },
    /// An HTTP request per attempt; `{field}` in `url` and `lookup` comes
    /// from the request JSON, `{operation_id}` and `{run_id}` from the call.
    Http {
        #[serde(default)]
        class: ClassName,
        #[serde(default = "default_method")]
        method: String,
        url: String,
        /// Header values may name environment variables as `${NAME}`; they
        /// are read when the configuration is loaded and never recorded.
        #[serde(default)]
        headers: BTreeMap<String, String>,
        #[serde(default = "default_timeout_ms")]
        timeout_ms: u64,
        /// The receiver deduplicates by `Idempotency-Key`.
        #[serde(default)]
        idempotent: bool,
        /// URL answering 200 + receipt (done) or 404 (not found) for an operation.
        lookup: Option<String>,
        #[serde(default)]
        retry: RetryPolicy,
        /// Retryable statuses that say the request was turned away before
        /// it could act (default 429 and 503).
        #[serde(default = "default_not_received_statuses")]
        not_received_statuses: Vec<u16>,
        /// Refusals that are final even after an earlier attempt may have
        /// acted (default none).
        #[serde(default)]
        final_statuses: Vec<u16>,
        /// Lookup statuses that mean "no record of the operation" (default
        /// 404 and 410).
        #[serde(default = "default_lookup_not_found_statuses")]
        lookup_not_found_statuses: Vec<u16>,
        /// Where a lookup's receipt names the operation (a JSON pointer).
        #[serde(default = "default_receipt_pointer")]
        receipt_operation_pointer: String,
    },
    /// A program: request JSON on stdin, result JSON on stdout.
    Command {
        #[serde(default)]
        class: ClassName,
        argv: Vec<String>,
        #[serde(default = "default_timeout_ms")]
        timeout_ms: u64,
        #[serde(default)]
        idempotent: bool,
        /// A program answering exit 0 + receipt (done) or exit 3 (not found).
        lookup: Option<Vec<String>>,
        #[serde(default)]
        retry: RetryPolicy,
        /// Variables of the host's environment the command gets, by name
        /// (it gets no others).
        #[serde(default)]
        env: Vec<String>,
        /// Exit codes that are final refusals even after an earlier attempt
        /// may have acted (default none).
        #[serde(default)]
        final_exit_codes: Vec<i32>,
        /// The lookup's exit code for "no record of the operation".
        #[serde(default = "default_lookup_not_found_exit")]
        lookup_not_found_exit: i32,
        /// Where a lookup's receipt names the operation (a JSON pointer).
        #[serde(default = "default_receipt_pointer")]
        receipt_operation_pointer: String,
    },
    /// A tool of an MCP server declared in `[mcp.NAME]` (the request is its
    /// arguments, a JSON object), or the server's tool list.
    Mcp {
        /// Read or write; without it the tool's annotations decide
        /// (`readOnlyHint` makes a read, anything else a write).
        class: Option<ClassName>,
        /// The `[mcp.NAME]` server.
        server: String,
        /// The tool called; leave it out and set `list_tools` for the
        /// server's `tools/list`, a read.
        tool: Option<String>,
        #[serde(default)]
        list_tools: bool,
        /// The server deduplicates by `_meta`'s `dev.stephost/operation_id`,
        /// so a write whose answer was lost may be sent again.
        #[serde(default)]
        idempotent: bool,
        #[serde(default)]
        retry: RetryPolicy,
    },
    /// Refuses every request with `message`.
    Reject {
        #[serde(default)]
        class: ClassName,
        message: String,
    },
}

/// An OpenAI-compatible chat-completions endpoint.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LlmConfig {
    /// e.g. `https://api.openai.com/v1/chat/completions`
    pub url: String,
    /// Put into every request as `model`.
    pub model: String,
    /// The environment variable holding the API key (sent as a bearer token).
    pub api_key_env: Option<String>,
    #[serde(default = "default_llm_timeout_ms")]
    pub timeout_ms: u64,
    #[serde(default)]
    pub retry: RetryPolicy,
}

/// A model a step calls by its alias (`[models.NAME]`). Changing the
/// provider behind an alias is a change here, not in the step: runs record
/// the provider-neutral request, so old runs replay whichever API serves it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// `openai-chat`, `openai-responses` or `anthropic-messages`.
    pub api: String,
    /// The provider's base URL, before `/v1/...` (e.g.
    /// `https://api.openai.com`, `https://api.anthropic.com`).
    pub url: String,
    /// The provider's model id (e.g. `gpt-4.1-mini`,
    /// `claude-sonnet-4-5`).
    pub model: String,
    /// The environment variable holding the API key: sent as a bearer
    /// token (OpenAI) or `x-api-key` (Anthropic), never recorded, never in
    /// a log or an error.
    pub key_env: Option<String>,
    /// Extra headers sent with every request (e.g. `anthropic-version`;
    /// Anthropic's is sent as `2023-06-01` unless given here).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// USD per million tokens, for each call's cost and the run's budget.
    #[serde(default)]
    pub prices: stephost_models::Prices,
    /// The ceiling every call's `max_tokens` is clamped to, and the value
    /// of a call that sets none, in tokens.
    #[serde(default = "default_model_max_tokens")]
    pub max_tokens: u32,
    /// One attempt's bound, in milliseconds.
    #[serde(default = "default_llm_timeout_ms")]
    pub timeout_ms: u64,
    #[serde(default = "default_model_retry")]
    pub retry: RetryPolicy,
    /// Calls of this model in flight at once, shared by every process on
    /// the ledger (none: unbounded).
    pub concurrency_max: Option<u32>,
    /// Requests a minute, shared by every process on the ledger (none:
    /// unbounded).
    pub requests_per_minute: Option<u32>,
    /// Tokens a minute (input and output), shared by every process on the
    /// ledger (none: unbounded).
    pub tokens_per_minute: Option<u64>,
}

fn default_model_max_tokens() -> u32 {
    4096
}

/// A provider's 429s and 529s pass within seconds to a minute: more
/// attempts, over a longer deadline, than an effect's default.
fn default_model_retry() -> RetryPolicy {
    RetryPolicy {
        attempts_max: 6,
        backoff_first_ms: 500,
        backoff_max_ms: 20_000,
        deadline_ms: 120_000,
        ..RetryPolicy::default()
    }
}

/// The values of one effect's (or model's) calls that the ledger keeps
/// only as a keyed hash: JSON pointers into its requests and its responses.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedactConfig {
    #[serde(default)]
    pub request: Vec<String>,
    #[serde(default)]
    pub response: Vec<String>,
}

/// A receiver of notifications (`[[webhooks]]`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookConfig {
    /// Names the webhook in delivery ids and the ledger.
    pub name: String,
    /// Where each notification is POSTed (JSON).
    pub url: String,
    /// The environment variable holding the secret each body is signed
    /// with (HMAC-SHA256, header `Stephost-Signature: sha256=HEX`).
    pub secret_env: String,
    /// Which events it is sent: `parked`, `approval`, `failed`,
    /// `diverged` (default all).
    #[serde(default = "all_events")]
    pub events: Vec<String>,
    /// One delivery attempt's time limit.
    #[serde(default = "default_webhook_timeout_ms")]
    pub timeout_ms: u64,
    /// Attempts before a notification is abandoned.
    #[serde(default = "default_webhook_attempts_max")]
    pub attempts_max: u32,
    /// The wait after the first failed attempt, doubling after each.
    #[serde(default = "default_webhook_backoff_first_ms")]
    pub backoff_first_ms: u64,
    /// The longest wait between attempts.
    #[serde(default = "default_webhook_backoff_max_ms")]
    pub backoff_max_ms: u64,
}

fn all_events() -> Vec<String> {
    stephost_core::notices::NoticeEvent::ALL
        .iter()
        .map(|e| e.as_str().to_string())
        .collect()
}

fn default_webhook_timeout_ms() -> u64 {
    10_000
}

fn default_webhook_attempts_max() -> u32 {
    20
}

fn default_webhook_backoff_first_ms() -> u64 {
    1_000
}

fn default_webhook_backoff_max_ms() -> u64 {
    300_000
}

/// A webhook ready to send: its settings, the events it takes and its
/// secret read from the environment.
#[derive(Debug, Clone)]
pub struct Webhook {
    pub config: WebhookConfig,
    pub events: Vec<stephost_core::notices::NoticeEvent>,
    pub secret: Vec<u8>,
}

fn default_not_received_statuses() -> Vec<u16> {
    crate::effects::http::Statuses::default().not_received
}

fn default_lookup_not_found_statuses() -> Vec<u16> {
    crate::effects::http::Statuses::default().lookup_not_found
}

fn default_lookup_not_found_exit() -> i32 {
    crate::effects::command::EXIT_NOT_FOUND
}

fn default_receipt_pointer() -> String {
    crate::effects::RECEIPT_OPERATION_POINTER.to_string()
}

fn default_method() -> String {
    "POST".to_string()
}

/// An origin granted to steps' own HTTP clients (`[http."ORIGIN"]`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpOriginConfig {
    /// Added to every request; values may name environment variables as
    /// `${NAME}`. A step cannot set or read them, and they are never
    /// recorded.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// The origin deduplicates writes by `Idempotency-Key`.
    #[serde(default)]
    pub idempotent: bool,
    /// URL answering 2xx + receipt (done) or 404 (not found) for an
    /// operation (`{operation_id}`).
    pub lookup: Option<String>,
    /// Where a lookup's receipt names the operation (a JSON pointer).
    #[serde(default = "default_receipt_pointer")]
    pub receipt_operation_pointer: String,
    /// Longest exchange, in milliseconds.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    #[serde(default)]
    pub retry: RetryPolicy,
    /// Classes by method and path prefix, the first match winning; without
    /// one GET, HEAD and OPTIONS are reads and other methods writes.
    #[serde(default)]
    pub classes: Vec<ClassRuleConfig>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClassRuleConfig {
    pub method: Option<String>,
    /// A path prefix such as `/v1/search`.
    pub path: Option<String>,
    pub class: ClassName,
}

/// An MCP server (`[mcp.NAME]`): a program over stdio (`command`) or a
/// streamable HTTP endpoint (`url`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpServerConfig {
    /// The program, found on the host's `PATH` unless a path; it runs in
    /// the configuration's folder.
    pub command: Option<String>,
    #[serde(default)]
    pub args: Vec<String>,
    /// Variables of the host's environment the program gets, by name (it
    /// gets no others).
    #[serde(default)]
    pub env: Vec<String>,
    /// The server's streamable HTTP endpoint (`http://` or `https://`).
    pub url: Option<String>,
    /// Sent with every HTTP request; values may name environment variables
    /// as `${NAME}`, read when the configuration is loaded and never
    /// recorded.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Longest wait for the connection and for each request.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
}

fn default_timeout_ms() -> u64 {
    30_000
}

fn default_llm_timeout_ms() -> u64 {
    120_000
}

/// Replaces each `${NAME}` with the environment variable NAME.
/// Whether the secrets a configuration names must be set in the
/// environment (to perform calls) or may be missing (for a replay).
#[derive(Debug, Clone, Copy)]
enum Secrets {
    Required,
    Optional,
}

impl Secrets {
    fn read(self, name: &str) -> Result<String, std::env::VarError> {
        match (std::env::var(name), self) {
            (Err(std::env::VarError::NotPresent), Secrets::Optional) => Ok(String::new()),
            (found, _) => found,
        }
    }
}

fn resolve_env(value: &str, what: &str, secrets: Secrets) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = value;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after
            .find('}')
            .ok_or_else(|| format!("{what}: unclosed ${{ in {value:?}"))?;
        let name = &after[..end];
        let found = secrets.read(name).map_err(|_| {
            format!("{what} needs the environment variable {name}, which is not set")
        })?;
        out.push_str(&found);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

impl Config {
    /// Reads and checks a configuration file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: shown.clone(),
            source,
        })?;
        let mut config = Self::parse(&text).map_err(|message| ConfigError::Invalid {
            path: shown,
            message,
        })?;
        config.base_dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
        config.path = path.to_path_buf();
        Ok(config)
    }

    /// Parses configuration text; the error names the line.
    pub fn parse(text: &str) -> Result<Self, String> {
        let config: Config = toml::from_str(text).map_err(|e| describe(text, &e))?;
        for (name, effect) in &config.effects {
            if let EffectConfig::Static { response, .. } = effect
                && let Err(e) = serde_json::from_str::<serde_json::Value>(response)
            {
                return Err(format!("effects.\"{name}\".response is not JSON: {e}"));
            }
        }
        Ok(config)
    }

    /// The webhooks, their secrets read from the environment.
    pub fn webhooks(&self) -> Result<Vec<Webhook>, ConfigError> {
        let invalid = |message: String| ConfigError::Invalid {
            path: self.shown(),
            message,
        };
        let mut names = std::collections::BTreeSet::new();
        self.webhooks
            .iter()
            .map(|w| {
                let what = format!("webhook {:?}", w.name);
                if w.name.trim().is_empty() || !names.insert(w.name.as_str()) {
                    return Err(invalid(format!(
                        "{what}: each webhook needs a name of its own"
                    )));
                }
                if !(w.url.starts_with("http://") || w.url.starts_with("https://")) {
                    return Err(invalid(format!(
                        "{what}: url {:?} is not http:// or https://",
                        w.url
                    )));
                }
                let events = w
                    .events
                    .iter()
                    .map(|e| {
                        stephost_core::notices::NoticeEvent::parse(e).ok_or_else(|| {
                            invalid(format!(
                                "{what}: unknown event {e:?}; use parked, approval, failed or \
                                 diverged"
                            ))
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                let secret = std::env::var(&w.secret_env).map_err(|_| {
                    invalid(format!(
                        "{what}: secret_env names {}, which is not set; set it to the secret \
                         the receiver checks signatures with",
                        w.secret_env
                    ))
                })?;
                if secret.len() < 16 {
                    return Err(invalid(format!(
                        "{what}: the secret in {} is shorter than 16 bytes",
                        w.secret_env
                    )));
                }
                Ok(Webhook {
                    config: w.clone(),
                    events,
                    secret: secret.into_bytes(),
                })
            })
            .collect()
    }

    /// Builds the granted effects, reading secrets from the environment.
    pub fn effects(&self) -> Result<Effects, ConfigError> {
        self.effects_with(Secrets::Required)
    }

    /// The effects for a replay, which performs none: a secret whose
    /// variable is not set is left empty rather than refused, so that a
    /// replay needs no key.
    pub fn offline_effects(&self) -> Result<Effects, ConfigError> {
        self.effects_with(Secrets::Optional)
    }

    fn effects_with(&self, secrets: Secrets) -> Result<Effects, ConfigError> {
        let servers = self
            .mcp_servers(secrets)
            .map_err(|message| ConfigError::Invalid {
                path: self.shown(),
                message,
            })?;
        let origins = self
            .origins(secrets)
            .map_err(|message| ConfigError::Invalid {
                path: self.shown(),
                message,
            })?;
        let mut granted = BTreeMap::new();
        for (name, config) in &self.effects {
            let effect = self
                .build(name, config, secrets, &servers)
                .map_err(|message| ConfigError::Invalid {
                    path: self.shown(),
                    message,
                })?;
            granted.insert(name.clone(), effect);
        }
        let llm = match &self.llm {
            Some(llm) => Some(
                build_llm(llm, secrets).map_err(|message| ConfigError::Invalid {
                    path: self.shown(),
                    message,
                })?,
            ),
            None => None,
        };
        let mut models = BTreeMap::new();
        for (alias, config) in &self.models {
            let model =
                build_model(alias, config, secrets).map_err(|message| ConfigError::Invalid {
                    path: self.shown(),
                    message,
                })?;
            models.insert(alias.clone(), model);
        }
        for (name, config) in &self.redact {
            let effect = match name.strip_prefix("models.") {
                Some(alias) => models
                    .get_mut(alias)
                    .map(|m: &mut ModelEffect| &mut m.effect),
                None => granted.get_mut(name),
            };
            let Some(effect) = effect else {
                return Err(ConfigError::Invalid {
                    path: self.shown(),
                    message: format!(
                        "[redact.\"{name}\"] names no effect (nor a model, as models.ALIAS)"
                    ),
                });
            };
            let Some(key) = self.signer.mac_key() else {
                return Err(ConfigError::Invalid {
                    path: self.shown(),
                    message: format!(
                        "[redact.\"{name}\"] needs the operator's key to hash values with: set \
                         {CHAIN_KEY_FILE_VAR} (or {CHAIN_KEY_VAR})"
                    ),
                });
            };
            let redaction =
                Redaction::new(config.request.clone(), config.response.clone(), key.clone())
                    .map_err(|message| ConfigError::Invalid {
                        path: self.shown(),
                        message: format!("[redact.\"{name}\"]: {message}"),
                    })?;
            effect.redaction = Some(redaction);
        }
        Ok(Effects::new(granted, llm, models).with_origins(origins))
    }

    /// The granted origins, by their `scheme://host[:port]`.
    fn origins(&self, secrets: Secrets) -> Result<BTreeMap<String, Granted>, String> {
        let mut origins = BTreeMap::new();
        for (given, config) in &self.http {
            let what = format!("http.\"{given}\"");
            let Some(origin) = origin::origin_of(given) else {
                return Err(format!(
                    "{what} is not an origin; write it as \"https://api.example.com\" or \
                     \"http://127.0.0.1:8080\""
                ));
            };
            if given
                .parse::<ureq::http::Uri>()
                .ok()
                .and_then(|u| u.path_and_query().map(|p| p.as_str() != "/"))
                .unwrap_or(false)
            {
                return Err(format!(
                    "{what} has a path; an origin is scheme, host and port only ({origin})"
                ));
            }
            let receipt_pointer = checked_pointer(&config.receipt_operation_pointer, &what)?;
            let headers = config
                .headers
                .iter()
                .map(|(k, v)| Ok((k.clone(), resolve_env(v, &what, secrets)?)))
                .collect::<Result<Vec<_>, String>>()?;
            let handler = origin::Origin::new(
                headers,
                config.lookup.clone(),
                config.idempotent,
                Duration::from_millis(config.timeout_ms),
            )
            .map_err(|e| format!("{what}: {e}"))?;
            let classes = config
                .classes
                .iter()
                .map(|r| origin::ClassRule {
                    method: r.method.as_ref().map(|m| m.to_ascii_uppercase()),
                    path: r.path.clone(),
                    class: r.class.class(),
                })
                .collect();
            let granted = Granted {
                effect: Effect {
                    class: CallClass::Write,
                    retry: config.retry.clone(),
                    handler: Box::new(handler),
                    receipt_pointer,
                    redaction: None,
                },
                classes,
                headers: config
                    .headers
                    .keys()
                    .map(|k| k.to_ascii_lowercase())
                    .collect(),
            };
            if origins.insert(origin.clone(), granted).is_some() {
                return Err(format!("{what} grants {origin} a second time"));
            }
        }
        Ok(origins)
    }

    fn shown(&self) -> String {
        if self.path.as_os_str().is_empty() {
            "(none: the defaults)".to_string()
        } else {
            self.path.display().to_string()
        }
    }

    /// The declared MCP servers, none connected yet.
    fn mcp_servers(&self, secrets: Secrets) -> Result<mcp::Servers, String> {
        let mut servers = mcp::Servers::new();
        for (name, config) in &self.mcp {
            let what = format!("mcp.\"{name}\"");
            let transport = match (&config.command, &config.url) {
                (Some(program), None) => {
                    if !config.headers.is_empty() {
                        return Err(format!(
                            "{what}.headers are for a server over HTTP (url); a program gets \
                             variables by name in env"
                        ));
                    }
                    mcp::Transport::Stdio {
                        program: program.clone(),
                        args: config.args.clone(),
                        env: config.env.clone(),
                        dir: Some(self.base_dir.clone()).filter(|d| !d.as_os_str().is_empty()),
                    }
                }
                (None, Some(url)) => {
                    if !(url.starts_with("http://") || url.starts_with("https://")) {
                        return Err(format!(
                            "{what}.url {url:?} is not an http:// or https:// URL"
                        ));
                    }
                    if !config.args.is_empty() || !config.env.is_empty() {
                        return Err(format!(
                            "{what}: args and env are for a program (command), not a server \
                             over HTTP"
                        ));
                    }
                    let headers = config
                        .headers
                        .iter()
                        .map(|(k, v)| Ok((k.clone(), resolve_env(v, &what, secrets)?)))
                        .collect::<Result<Vec<_>, String>>()?;
                    mcp::Transport::Http {
                        url: url.clone(),
                        headers,
                    }
                }
                _ => {
                    return Err(format!(
                        "{what} needs exactly one of command (a program over stdio) and url (a \
                         server over streamable HTTP)"
                    ));
                }
            };
            let server =
                mcp::McpServer::new(name, transport, Duration::from_millis(config.timeout_ms));
            servers.insert(name.clone(), std::sync::Arc::new(server));
        }
        Ok(servers)
    }

    fn build(
        &self,
        name: &str,
        config: &EffectConfig,
        secrets: Secrets,
        servers: &mcp::Servers,
    ) -> Result<Effect, String> {
        let mut receipt_pointer = crate::effects::RECEIPT_OPERATION_POINTER.to_string();
        let (class, retry, handler): (ClassName, RetryPolicy, Box<dyn Handler>) = match config {
            EffectConfig::Echo { class, retry } => (*class, retry.clone(), Box::new(Echo)),
            EffectConfig::Static {
                class,
                response,
                retry,
            } => (
                *class,
                retry.clone(),
                Box::new(Static {
                    response: response.clone(),
                }),
            ),
            EffectConfig::File {
                class,
                path,
                reply_delay_ms,
                deduplicate,
                lookup,
                retry,
            } => (
                *class,
                retry.clone(),
                Box::new(
                    FileReceiver::new(self.base_dir.join(path))
                        .with_reply_delay(std::time::Duration::from_millis(*reply_delay_ms))
                        .with_deduplication(*deduplicate)
                        .with_lookup(*lookup),
                ),
            ),
            EffectConfig::Http {
                class,
                method,
                url,
                headers,
                timeout_ms,
                idempotent,
                lookup,
                retry,
                not_received_statuses,
                final_statuses,
                lookup_not_found_statuses,
                receipt_operation_pointer,
            } => {
                let what = format!("effects.\"{name}\"");
                receipt_pointer = checked_pointer(receipt_operation_pointer, &what)?;
                let headers = headers
                    .iter()
                    .map(|(k, v)| Ok((k.clone(), resolve_env(v, &what, secrets)?)))
                    .collect::<Result<Vec<_>, String>>()?;
                let handler = HttpEffect::new(
                    method,
                    url.clone(),
                    headers,
                    lookup.clone(),
                    *idempotent,
                    Duration::from_millis(*timeout_ms),
                    Statuses {
                        not_received: not_received_statuses.clone(),
                        final_refusals: final_statuses.clone(),
                        lookup_not_found: lookup_not_found_statuses.clone(),
                    },
                )
                .map_err(|e| format!("{what}: {e}"))?;
                (*class, retry.clone(), Box::new(handler))
            }
            EffectConfig::Command {
                class,
                argv,
                timeout_ms,
                idempotent,
                lookup,
                retry,
                env,
                final_exit_codes,
                lookup_not_found_exit,
                receipt_operation_pointer,
            } => {
                let what = format!("effects.\"{name}\"");
                if argv.is_empty() {
                    return Err(format!("{what}.argv is empty"));
                }
                receipt_pointer = checked_pointer(receipt_operation_pointer, &what)?;
                let handler = CommandEffect::new(CommandOptions {
                    argv: argv.clone(),
                    lookup: lookup.clone(),
                    idempotent: *idempotent,
                    timeout: Duration::from_millis(*timeout_ms),
                    dir: Some(self.base_dir.clone()).filter(|d| !d.as_os_str().is_empty()),
                    env: env.clone(),
                    output_bytes_max: self.limits.payload_bytes_max as usize,
                    final_exit_codes: final_exit_codes.clone(),
                    lookup_not_found_exit: *lookup_not_found_exit,
                });
                (*class, retry.clone(), Box::new(handler))
            }
            EffectConfig::Mcp {
                class,
                server,
                tool,
                list_tools,
                idempotent,
                retry,
            } => {
                let what = format!("effects.\"{name}\"");
                let Some(found) = servers.get(server) else {
                    return Err(format!(
                        "{what}.server names {server:?}, which no [mcp.\"{server}\"] declares"
                    ));
                };
                let operation = match (tool, list_tools) {
                    (Some(tool), false) => mcp::Operation::Call { tool: tool.clone() },
                    (None, true) => {
                        if *class == Some(ClassName::Write) {
                            return Err(format!("{what}: a tool list is a read, not a write"));
                        }
                        mcp::Operation::List
                    }
                    _ => {
                        return Err(format!(
                            "{what} needs exactly one of tool = \"NAME\" (a tools/call) and \
                             list_tools = true (the server's tools/list)"
                        ));
                    }
                };
                let configured = class.map(|c| c.class());
                let default = match operation {
                    mcp::Operation::List => ClassName::Read,
                    mcp::Operation::Call { .. } => class.unwrap_or(ClassName::Write),
                };
                let handler =
                    mcp::McpEffect::new(found.clone(), operation, *idempotent, configured);
                (default, retry.clone(), Box::new(handler))
            }
            EffectConfig::Reject { class, message } => (
                *class,
                RetryPolicy::default(),
                Box::new(Reject {
                    message: message.clone(),
                }),
            ),
        };
        Ok(Effect {
            class: class.class(),
            retry,
            handler,
            receipt_pointer,
            redaction: None,
        })
    }
}

/// `pointer` if it is a JSON pointer (empty, or starting with `/`).
fn checked_pointer(pointer: &str, what: &str) -> Result<String, String> {
    if pointer.is_empty() || pointer.starts_with('/') {
        Ok(pointer.to_string())
    } else {
        Err(format!(
            "{what}.receipt_operation_pointer {pointer:?} is not a JSON pointer; write it as \
             \"/operation_id\" or \"/data/id\""
        ))
    }
}

fn build_llm(llm: &LlmConfig, secrets: Secrets) -> Result<Effect, String> {
    let mut headers = Vec::new();
    if let Some(var) = &llm.api_key_env {
        let key = secrets
            .read(var)
            .map_err(|_| format!("llm.api_key_env names {var}, which is not set"))?;
        headers.push(("Authorization".to_string(), format!("Bearer {key}")));
    }
    let http = HttpEffect::new(
        "POST",
        llm.url.clone(),
        headers,
        None,
        true,
        Duration::from_millis(llm.timeout_ms),
        Statuses::default(),
    )?;
    Ok(Effect {
        class: CallClass::Read,
        retry: llm.retry.clone(),
        handler: Box::new(Llm {
            http,
            model: llm.model.clone(),
        }),
        receipt_pointer: crate::effects::RECEIPT_OPERATION_POINTER.to_string(),
        redaction: None,
    })
}

fn build_model(alias: &str, config: &ModelConfig, secrets: Secrets) -> Result<ModelEffect, String> {
    let what = format!("models.{alias}");
    let api: stephost_models::Api = config.api.parse().map_err(|e| format!("{what}.api: {e}"))?;
    config
        .prices
        .validate()
        .map_err(|e| format!("{what}.prices: {e}"))?;
    if config.max_tokens == 0 {
        return Err(format!("{what}.max_tokens must be at least 1"));
    }
    if config.concurrency_max == Some(0) {
        return Err(format!(
            "{what}.concurrency_max must be at least 1 (leave it out for no bound)"
        ));
    }
    if config.requests_per_minute == Some(0) || config.tokens_per_minute == Some(0) {
        return Err(format!(
            "{what}.requests_per_minute and tokens_per_minute must be at least 1 (leave them out \
             for no bound)"
        ));
    }
    let mut headers: Vec<(String, String)> = Vec::new();
    if let Some(var) = &config.key_env {
        let key = secrets
            .read(var)
            .map_err(|_| format!("{what}.key_env names {var}, which is not set"))?;
        match api {
            stephost_models::Api::AnthropicMessages => headers.push(("x-api-key".into(), key)),
            _ => headers.push(("authorization".into(), format!("Bearer {key}"))),
        }
    }
    if api == stephost_models::Api::AnthropicMessages
        && !config
            .headers
            .keys()
            .any(|h| h.eq_ignore_ascii_case("anthropic-version"))
    {
        headers.push(("anthropic-version".into(), "2023-06-01".into()));
    }
    headers.extend(config.headers.iter().map(|(k, v)| (k.clone(), v.clone())));
    let model = std::sync::Arc::new(Model::new(
        alias.to_string(),
        api,
        config.url.clone(),
        config.model.clone(),
        headers,
        config.prices,
        config.max_tokens,
        Duration::from_millis(config.timeout_ms),
        stephost_core::flow::FlowCaps {
            concurrency_max: config.concurrency_max,
            requests_per_minute: config.requests_per_minute,
            tokens_per_minute: config.tokens_per_minute,
        },
    ));
    Ok(ModelEffect {
        effect: Effect {
            class: CallClass::Read,
            retry: config.retry.clone(),
            handler: Box::new(model.clone()),
            receipt_pointer: crate::effects::RECEIPT_OPERATION_POINTER.to_string(),
            redaction: None,
        },
        model,
    })
}

fn yes() -> bool {
    true
}

fn describe(text: &str, e: &toml::de::Error) -> String {
    let message = e.message().to_string();
    let Some(span) = e.span() else {
        return message;
    };
    let start = span.start.min(text.len());
    let mut line = text[..start].matches('\n').count() + 1;
    // For a table the span points at the table (an effect's table always:
    // its `kind` decides its fields, and serde reads it whole). Name the
    // offending key's own line (up to the next table header): the unknown
    // field the message names, or else the key without which the table's
    // error goes away.
    let field = message
        .strip_prefix("unknown field `")
        .and_then(|rest| rest.split('`').next())
        .map(str::to_string)
        .or_else(|| key_at_fault(text, start));
    if let Some(field) = field {
        let from = table_start(text, start);
        line = text[..from].matches('\n').count() + 1;
        let mut table = text[from..]
            .lines()
            .enumerate()
            .take_while(|(i, l)| *i == 0 || !l.trim_start().starts_with('['));
        if let Some((offset, _)) = table.find(|(_, l)| {
            let l = l.trim_start().trim_start_matches('"');
            l.strip_prefix(field.as_str()).is_some_and(|after| {
                after.trim_start().starts_with(['=', '"', ' ']) || after.is_empty()
            })
        }) {
            line += offset;
        }
    }
    format!("line {line}: {message}")
}

/// Where the table holding offset `at` begins: its header line, or the
/// line of `at` if no header comes before it.
fn table_start(text: &str, at: usize) -> usize {
    let own = text[..at].rfind('\n').map_or(0, |n| n + 1);
    let mut pos = own;
    loop {
        if text[pos..].trim_start().starts_with('[') {
            return pos;
        }
        if pos == 0 {
            return own;
        }
        pos = text[..pos - 1].rfind('\n').map_or(0, |n| n + 1);
    }
}

/// The key of the table holding offset `at` without which the
/// configuration no longer fails as it did: the key at fault (left out, the
/// configuration loads, or misses only that key).
fn key_at_fault(text: &str, at: usize) -> Option<String> {
    let header = text[table_start(text, at)..].lines().next()?.trim();
    if !header.starts_with('[') || header.starts_with("[[") {
        return None;
    }
    // The header's dotted path, as TOML reads it.
    let mut path = Vec::new();
    let mut level: toml::Table = toml::from_str(&format!("{header}\n")).ok()?;
    while let Some((key, value)) = level.into_iter().next() {
        path.push(key);
        match value {
            toml::Value::Table(inner) if !inner.is_empty() => level = inner,
            _ => break,
        }
    }
    let doc: toml::Table = toml::from_str(text).ok()?;
    let table_at = |doc: &toml::Table| -> Option<toml::Table> {
        let mut table = doc.clone();
        for key in &path {
            table = table.get(key)?.as_table()?.clone();
        }
        Some(table)
    };
    // An effect's `kind` is its tag: without it every table fails anew.
    let keys: Vec<String> = table_at(&doc)?
        .keys()
        .filter(|key| *key != "kind")
        .cloned()
        .collect();
    keys.into_iter().find(|key| {
        let mut without = doc.clone();
        let mut table = &mut without;
        for step in &path {
            match table.get_mut(step).and_then(toml::Value::as_table_mut) {
                Some(inner) => table = inner,
                None => return false,
            }
        }
        table.remove(key);
        let Ok(again) = toml::to_string(&without) else {
            return false;
        };
        match toml::from_str::<Config>(&again) {
            Ok(_) => true,
            Err(e) => e.message() == format!("missing field `{key}`"),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_field_is_refused_with_its_line() {
        let err =
            Config::parse("[effects.orders]\nkind = \"echo\"\nclass = \"write\"\nretries = 3\n")
                .unwrap_err();
        assert!(err.contains("line 4"), "{err}");
        assert!(err.contains("retries"), "{err}");
    }

    #[test]
    fn a_value_of_the_wrong_type_in_an_effect_names_its_own_line() {
        let err = Config::parse(
            "[limits]\nfuel_max = 5\n\n[effects.x]\nkind = \"static\"\nclass = \"read\"\n\
             response = { a = 1 }\n",
        )
        .unwrap_err();
        assert!(err.starts_with("line 7:"), "{err}");
        assert!(err.contains("expected a string"), "{err}");
    }

    #[test]
    fn a_replay_needs_no_secret_a_live_call_does() {
        let config = Config::parse(
            r#"
[models.m]
api = "openai-chat"
url = "http://127.0.0.1:9"
model = "x"
key_env = "STEPHOST_TEST_UNSET_KEY_7d1f"

[effects.hook]
kind = "http"
url = "http://127.0.0.1:9/hook"
headers = { Authorization = "Bearer ${STEPHOST_TEST_UNSET_KEY_7d1f}" }
"#,
        )
        .unwrap();
        let refused = config.effects().err().expect("refused").to_string();
        assert!(
            refused.contains("STEPHOST_TEST_UNSET_KEY_7d1f"),
            "{refused}"
        );
        let offline = config.offline_effects().unwrap();
        assert!(offline.get("hook").is_some() && offline.model("m").is_some());
    }

    #[test]
    fn the_example_configurations_load() {
        for text in [
            include_str!("../../../examples/supplier-order/stephost.toml"),
            include_str!("../../../examples/supplier-order/stephost-http.toml"),
        ] {
            let config = Config::parse(text).unwrap();
            let effects = config.effects().unwrap();
            assert_eq!(
                effects.get("inventory.read").unwrap().class,
                CallClass::Read
            );
            assert_eq!(
                effects.get("supplier.order").unwrap().class,
                CallClass::Write
            );
        }
    }

    #[test]
    fn a_header_naming_a_missing_environment_variable_is_refused() {
        let config = Config::parse(
            "[effects.x]\nkind = \"http\"\nurl = \"http://h/\"\nheaders = { Authorization = \"Bearer ${STEPHOST_TEST_UNSET_VAR}\" }\n",
        )
        .unwrap();
        let err = config.effects().err().expect("refused");
        assert!(err.to_string().contains("STEPHOST_TEST_UNSET_VAR"), "{err}");
    }

    /// What loading the effects of `text` refuses with.
    fn refusal(text: &str) -> String {
        let config = Config::parse(text).unwrap();
        config.effects().err().expect("refused").to_string()
    }

    #[test]
    fn an_mcp_server_and_its_effects_are_checked_when_loaded() {
        let both = refusal("[mcp.s]\ncommand = \"x\"\nurl = \"http://h/mcp\"\n");
        assert!(both.contains("exactly one of command"), "{both}");
        let scheme = refusal("[mcp.s]\nurl = \"ftp://h/mcp\"\n");
        assert!(
            scheme.contains("not an http:// or https:// URL"),
            "{scheme}"
        );
        let headers = refusal("[mcp.s]\ncommand = \"x\"\nheaders = { A = \"b\" }\n");
        assert!(
            headers.contains("headers are for a server over HTTP"),
            "{headers}"
        );
        let undeclared = refusal("[effects.t]\nkind = \"mcp\"\nserver = \"nope\"\ntool = \"t\"\n");
        assert!(
            undeclared.contains("no [mcp.\"nope\"] declares"),
            "{undeclared}"
        );
        let server = "[mcp.s]\ncommand = \"x\"\n";
        let neither = refusal(&format!(
            "{server}[effects.t]\nkind = \"mcp\"\nserver = \"s\"\n"
        ));
        assert!(neither.contains("exactly one of tool"), "{neither}");
        let list_write = refusal(&format!(
            "{server}[effects.t]\nkind = \"mcp\"\nserver = \"s\"\nlist_tools = true\nclass = \"write\"\n"
        ));
        assert!(list_write.contains("a tool list is a read"), "{list_write}");
        let secret = refusal(
            "[mcp.s]\nurl = \"http://h/mcp\"\nheaders = { A = \"${STEPHOST_TEST_UNSET_VAR}\" }\n",
        );
        assert!(secret.contains("STEPHOST_TEST_UNSET_VAR"), "{secret}");
        // Declared, nothing is started: building the effects connects to no
        // server (the program does not exist).
        let ok = Config::parse(
            "[mcp.s]\ncommand = \"/nonexistent/server\"\n[effects.t]\nkind = \"mcp\"\nserver = \"s\"\ntool = \"t\"\n",
        )
        .unwrap();
        let effects = ok.effects().unwrap();
        assert_eq!(effects.get("t").unwrap().class, CallClass::Write);
    }

    #[test]
    fn a_static_response_must_be_json() {
        let err =
            Config::parse("[effects.x]\nkind = \"static\"\nresponse = \"{oops\"\n").unwrap_err();
        assert!(err.contains("not JSON"), "{err}");
    }

    #[test]
    fn effects_default_to_the_write_class_and_limits_to_their_defaults() {
        let config = Config::parse("[effects.orders]\nkind = \"echo\"\n").unwrap();
        let effects = config.effects().unwrap();
        assert_eq!(effects.get("orders").unwrap().class, CallClass::Write);
        assert!(effects.get("other").is_none());
        assert_eq!(config.limits, Limits::default());
    }
}
