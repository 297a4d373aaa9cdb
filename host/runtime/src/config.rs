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
//! may call only the effects named here. The sections of the effects
//! (`[effects]`, `[http]`, `[mcp]`, `[llm]`, `[models]`, `[redact]`) are
//! `stephost-effects`' own types: this file composes them and knows none of
//! their fields.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use stephost_core::Limits;
use stephost_effects::Effects;
use stephost_effects::config::{
    EffectConfig, HttpOriginConfig, LlmConfig, McpServerConfig, ModelConfig, RedactConfig,
};

pub use crate::error::ConfigError;

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
    /// The steps runs may start as children (`[steps.NAME] module =
    /// "PATH"`, the `runs` import of stephost:step@0.3.0).
    #[serde(default)]
    pub steps: BTreeMap<String, StepConfig>,
    /// Finished runs workers delete in the background (`[retention]`);
    /// without it nothing is deleted but by `stephost prune`.
    pub retention: Option<crate::retention::RetentionConfig>,
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

/// A step runs may start as a child (`[steps.NAME]`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepConfig {
    /// Its component, relative to the configuration file's folder.
    pub module: PathBuf,
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
        stephost_effects::config::check(&config.effects)?;
        if let Some(retention) = &config.retention {
            retention
                .rule(stephost_core::clock::now_ms())
                .map_err(|e| format!("[retention]: {e}"))?;
        }
        Ok(config)
    }

    /// The steps runs may start as children: their module files, by name.
    pub fn steps(&self) -> BTreeMap<String, PathBuf> {
        self.steps
            .iter()
            .map(|(name, step)| (name.clone(), self.base_dir.join(&step.module)))
            .collect()
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
        self.effects_with(true)
    }

    /// The effects for a replay, which performs none: a secret whose
    /// variable is not set is left empty rather than refused, so that a
    /// replay needs no key.
    pub fn offline_effects(&self) -> Result<Effects, ConfigError> {
        self.effects_with(false)
    }

    fn effects_with(&self, secrets_required: bool) -> Result<Effects, ConfigError> {
        let sections = stephost_effects::config::Sections {
            effects: &self.effects,
            http: &self.http,
            mcp: &self.mcp,
            llm: self.llm.as_ref(),
            models: &self.models,
            redact: &self.redact,
        };
        let key_hint = format!("set {CHAIN_KEY_FILE_VAR} (or {CHAIN_KEY_VAR})");
        let context = stephost_effects::config::Context {
            base_dir: &self.base_dir,
            payload_bytes_max: self.limits.payload_bytes_max as usize,
            key: self.signer.mac_key(),
            key_hint: &key_hint,
            secrets_required,
        };
        stephost_effects::config::build(&sections, &context).map_err(|message| {
            ConfigError::Invalid {
                path: self.shown(),
                message,
            }
        })
    }

    fn shown(&self) -> String {
        if self.path.as_os_str().is_empty() {
            "(none: the defaults)".to_string()
        } else {
            self.path.display().to_string()
        }
    }
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
    use stephost_core::CallClass;

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
    fn an_mcp_tool_call_is_a_write_unless_configured_a_read_or_its_server_trusted() {
        let effect = |server: &str, class: &str| {
            let text = format!(
                "[mcp.s]\ncommand = \"/nonexistent/server\"\n{server}[effects.t]\nkind = \"mcp\"\n\
                 server = \"s\"\ntool = \"t\"\n{class}"
            );
            let effects = Config::parse(&text).unwrap().effects().unwrap();
            let t = effects.get("t").unwrap();
            (t.class, t.handler.declares_class())
        };
        // By default the tool's annotations are not asked for.
        assert_eq!(effect("", ""), (CallClass::Write, false));
        assert_eq!(effect("", "class = \"read\"\n"), (CallClass::Read, false));
        // A trusted server's annotations decide, unless a class is configured.
        assert_eq!(
            effect("trust_annotations = true\n", ""),
            (CallClass::Write, true)
        );
        assert_eq!(
            effect("trust_annotations = true\n", "class = \"read\"\n"),
            (CallClass::Read, false)
        );
    }

    #[test]
    fn an_mcp_server_s_settings_have_their_defaults() {
        let config = Config::parse("[mcp.s]\ncommand = \"x\"\n").unwrap();
        let server = &config.mcp["s"];
        assert_eq!(server.timeout_ms, 30_000);
        assert_eq!(server.start_timeout_ms, 120_000);
        assert_eq!(server.stderr_line_bytes_max, 4_096);
        assert!(!server.trust_annotations);
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
