//! What every capability's section of `stephost.toml` uses: secrets read
//! from the environment (each one kept, so that no text the host records
//! or sends repeats it), class names, JSON pointers.

use serde::Deserialize;
use stephost_core::CallClass;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClassName {
    Read,
    #[default]
    Write,
}

impl ClassName {
    pub fn class(self) -> CallClass {
        match self {
            ClassName::Read => CallClass::Read,
            ClassName::Write => CallClass::Write,
        }
    }
}

/// Replaces each `${NAME}` with the environment variable NAME.
/// Whether the secrets a configuration names must be set in the
/// environment (to perform calls) or may be missing (for a replay).
/// Every secret read is kept, so that no text the host records or sends
/// repeats it ([`stephost_core::redact::Scrub`]).
#[derive(Debug)]
pub struct Secrets {
    required: bool,
    read: std::cell::RefCell<Vec<String>>,
}

impl Secrets {
    pub fn new(required: bool) -> Self {
        Secrets {
            required,
            read: Default::default(),
        }
    }

    pub fn read(&self, name: &str) -> Result<String, std::env::VarError> {
        let found = match std::env::var(name) {
            Err(std::env::VarError::NotPresent) if !self.required => Ok(String::new()),
            found => found,
        };
        if let Ok(value) = &found {
            self.read.borrow_mut().push(value.clone());
        }
        found
    }
}

pub fn resolve_env(value: &str, what: &str, secrets: &Secrets) -> Result<String, String> {
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

impl Secrets {
    /// Every secret read so far, taken.
    pub fn taken(&self) -> Vec<String> {
        self.read.take()
    }
}

/// `pointer` if it is a JSON pointer (empty, or starting with `/`).
pub fn checked_pointer(pointer: &str, what: &str) -> Result<String, String> {
    if pointer.is_empty() || pointer.starts_with('/') {
        Ok(pointer.to_string())
    } else {
        Err(format!(
            "{what}.receipt_operation_pointer {pointer:?} is not a JSON pointer; write it as \
             \"/operation_id\" or \"/data/id\""
        ))
    }
}

pub fn yes() -> bool {
    true
}

/// The longest wait for an exchange, a command or a server, unless
/// configured, in milliseconds.
pub fn default_timeout_ms() -> u64 {
    30_000
}

/// The longest wait for a model's answer, unless configured, in
/// milliseconds.
pub fn default_llm_timeout_ms() -> u64 {
    120_000
}

/// Where a receipt names its operation, unless an effect says otherwise.
pub const RECEIPT_OPERATION_POINTER: &str = "/operation_id";

/// Where a receipt names its operation, unless configured.
pub fn default_receipt_pointer() -> String {
    RECEIPT_OPERATION_POINTER.to_string()
}
