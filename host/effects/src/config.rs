//! The sections of `stephost.toml` the effects own, composed: `[effects.NAME]`
//! (their kinds are below), `[http."ORIGIN"]` ([`crate::origin`]),
//! `[mcp.NAME]` ([`crate::mcp`]), `[llm]` ([`crate::llm`]), `[models.NAME]`
//! ([`crate::model`]) and `[redact."NAME"]`. The host's configuration holds
//! them as these types and hands them to [`build`]; it knows none of their
//! fields.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use stephost_core::mac::MacKey;
use stephost_core::redact::Redaction;

use crate::builtin::{Echo, FileReceiver, Reject, Static};
use crate::command::{CommandEffect, CommandOptions};
use crate::granted::Effects;
use crate::handler::{Effect, Handler};
use crate::http::{HttpEffect, Statuses};
use crate::model::ModelEffect;
use crate::retry::RetryPolicy;
use crate::section::{
    ClassName, Secrets, checked_pointer, default_receipt_pointer, default_timeout_ms, resolve_env,
    yes,
};
use crate::{llm, mcp, model, origin};

pub use crate::llm::LlmConfig;
pub use crate::mcp::McpServerConfig;
pub use crate::model::ModelConfig;
pub use crate::origin::{ClassRuleConfig, HttpOriginConfig};

/// The effects' sections of one configuration.
#[derive(Debug, Clone, Copy)]
pub struct Sections<'a> {
    pub effects: &'a BTreeMap<String, EffectConfig>,
    pub http: &'a BTreeMap<String, HttpOriginConfig>,
    pub mcp: &'a BTreeMap<String, McpServerConfig>,
    pub llm: Option<&'a LlmConfig>,
    pub models: &'a BTreeMap<String, ModelConfig>,
    pub redact: &'a BTreeMap<String, RedactConfig>,
}

/// What building them takes from the host.
#[derive(Debug, Clone, Copy)]
pub struct Context<'a> {
    /// The folder relative paths are resolved against.
    pub base_dir: &'a Path,
    /// Largest answer a command may print, in bytes.
    pub payload_bytes_max: usize,
    /// The operator's key, which redacted values are hashed with.
    pub key: Option<&'a MacKey>,
    /// How to set the operator's key, for an error without it.
    pub key_hint: &'a str,
    /// Whether the secrets a section names must be set (to perform calls),
    /// or may be missing (for a replay, which performs none).
    pub secrets_required: bool,
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
        /// Read or write; without it a write, unless the server is declared
        /// with `trust_annotations = true`: then the tool's annotations
        /// decide (`readOnlyHint` makes a read, anything else a write).
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

fn default_not_received_statuses() -> Vec<u16> {
    crate::http::Statuses::default().not_received
}

fn default_lookup_not_found_statuses() -> Vec<u16> {
    crate::http::Statuses::default().lookup_not_found
}

fn default_lookup_not_found_exit() -> i32 {
    crate::command::EXIT_NOT_FOUND
}

fn default_method() -> String {
    "POST".to_string()
}
/// The name under `[redact]` of the run's input.
pub const INPUT_REDACTION: &str = "input";

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

/// Checks what parsing alone cannot: a static response is JSON.
pub fn check(effects: &BTreeMap<String, EffectConfig>) -> Result<(), String> {
    for (name, effect) in effects {
        if let EffectConfig::Static { response, .. } = effect
            && let Err(e) = serde_json::from_str::<serde_json::Value>(response)
        {
            return Err(format!("effects.\"{name}\".response is not JSON: {e}"));
        }
    }
    Ok(())
}

/// The effects these sections grant, their secrets read from the
/// environment.
pub fn build(sections: &Sections<'_>, context: &Context<'_>) -> Result<Effects, String> {
    let secrets = &Secrets::new(context.secrets_required);
    let servers = mcp::servers(sections.mcp, secrets, context.base_dir)?;
    let origins = origin::grants(sections.http, secrets)?;
    let mut granted = BTreeMap::new();
    for (name, config) in sections.effects {
        let effect = effect(name, config, secrets, &servers, context)?;
        granted.insert(name.clone(), effect);
    }
    let llm = match sections.llm {
        Some(llm) => Some(llm::build(llm, secrets)?),
        None => None,
    };
    let mut models = BTreeMap::new();
    for (alias, config) in sections.models {
        let model = model::build(alias, config, secrets)?;
        models.insert(alias.clone(), model);
    }
    let mut origins = origins;
    let mut input_redaction = None;
    for (name, config) in sections.redact {
        if name == INPUT_REDACTION {
            input_redaction = Some(redact_input(config, context)?);
            continue;
        }
        if name.starts_with("models.") {
            let checked = config
                .request
                .iter()
                .map(|p| (p, false))
                .chain(config.response.iter().map(|p| (p, true)))
                .try_for_each(|(pointer, response)| {
                    stephost_models::check_redactable(pointer, response)
                });
            if let Err(message) = checked {
                return Err(format!("[redact.\"{name}\"]: {message}"));
            }
        }
        let effect = match name.strip_prefix("models.") {
            Some(alias) => models
                .get_mut(alias)
                .map(|m: &mut ModelEffect| &mut m.effect),
            None => match origin::origin_of(name) {
                Some(origin) => origins.get_mut(&origin).map(|g| &mut g.effect),
                None => granted.get_mut(name),
            },
        };
        let Some(effect) = effect else {
            return Err(format!(
                "[redact.\"{name}\"] names no effect (nor a model, as models.ALIAS, nor a \
                 granted origin, as \"https://HOST\", nor the run's input, as input)"
            ));
        };
        let Some(key) = context.key else {
            return Err(format!(
                "[redact.\"{name}\"] needs the operator's key to hash values with: {}",
                context.key_hint
            ));
        };
        let redaction =
            Redaction::new(config.request.clone(), config.response.clone(), key.clone())
                .map_err(|message| format!("[redact.\"{name}\"]: {message}"))?;
        effect.redaction = Some(redaction);
    }
    let scrub = stephost_core::redact::Scrub::new(secrets.taken());
    let effects = Effects::new(granted, llm, models)
        .with_origins(origins)
        .with_scrub(scrub);
    Ok(match input_redaction {
        Some(redaction) => effects.with_input_redaction(redaction),
        None => effects,
    })
}

/// `[redact."input"]`: pointers into each run's input (its `request`;
/// an input has no response).
fn redact_input(config: &RedactConfig, context: &Context<'_>) -> Result<Redaction, String> {
    let invalid = |message: String| format!("[redact.\"{INPUT_REDACTION}\"]: {message}");
    if !config.response.is_empty() {
        return Err(invalid(
            "a run's input has no response; name its pointers in `request`".to_string(),
        ));
    }
    let key = context.key.ok_or_else(|| {
        invalid(format!(
            "needs the operator's key to hash values with: {}",
            context.key_hint
        ))
    })?;
    Redaction::new(config.request.clone(), Vec::new(), key.clone()).map_err(invalid)
}

/// The effect `[effects.NAME]` configures.
fn effect(
    name: &str,
    config: &EffectConfig,
    secrets: &Secrets,
    servers: &mcp::Servers,
    context: &Context<'_>,
) -> Result<Effect, String> {
    let mut receipt_pointer = crate::handler::RECEIPT_OPERATION_POINTER.to_string();
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
                FileReceiver::new(context.base_dir.join(path))
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
                dir: Some(context.base_dir.to_path_buf()).filter(|d| !d.as_os_str().is_empty()),
                env: env.clone(),
                output_bytes_max: context.payload_bytes_max,
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
            let handler = mcp::McpEffect::new(found.clone(), operation, *idempotent, configured);
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
