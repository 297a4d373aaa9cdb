//! Who may do what: bearer tokens with a name and a role, read from the
//! environment or a file. Tokens are kept as sha256 digests and compared in
//! constant time; a token's name (never the token) is what the ledger
//! records as who decided.
//!
//! Deny by default: a server that listens on anything but loopback refuses
//! to start without tokens; with tokens, every request but the health
//! checks and the console's page needs one.

use sha2::{Digest, Sha256};
use stephost_core::mac::ct_eq;

/// The variable holding token lines.
pub const TOKENS_VAR: &str = "STEPHOST_API_TOKENS";
/// The variable naming a file of token lines (readable by its owner only).
pub const TOKENS_FILE_VAR: &str = "STEPHOST_API_TOKENS_FILE";
/// What a server without tokens says when it starts.
pub const TOKENLESS_WARNING: &str = "stephost serve: WARNING: no API tokens are configured, so every \
    process and user on this machine can submit, approve and resolve as an operator. This is for \
    trying stephost out, not for production: set STEPHOST_API_TOKENS or STEPHOST_API_TOKENS_FILE \
    (lines `NAME ROLE TOKEN`).";

/// The shortest token accepted.
pub const TOKEN_CHARS_MIN: usize = 16;

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Read runs, approvals, unknown calls and metrics.
    Read,
    /// Also submit, replay, approve, reject and resolve.
    Operator,
}

/// Who a request is from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The token's name; `None` on a loopback server without tokens, where
    /// a decision must name who made it.
    pub name: Option<String>,
    pub role: Role,
}

#[derive(Clone)]
struct Token {
    name: String,
    role: Role,
    digest: [u8; 32],
}

/// The configured tokens; none means loopback-only, open access.
#[derive(Clone, Default)]
pub struct Tokens(Vec<Token>);

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.0.iter().map(|t| t.name.as_str()).collect();
        write!(f, "Tokens({names:?})")
    }
}

impl Tokens {
    /// Parses token lines: `NAME ROLE TOKEN`, ROLE `read` or `operator`;
    /// blank lines and `#` comments are skipped. `;` also ends a line (for
    /// one environment variable).
    pub fn parse(text: &str, source: &str) -> Result<Self, String> {
        let mut tokens = Vec::new();
        for (i, line) in text.split(['\n', ';']).enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let fields: Vec<&str> = line.split_whitespace().collect();
            let at = format!("{source}, entry {}", i + 1);
            let [name, role, token] = fields[..] else {
                return Err(format!(
                    "{at}: expected `NAME ROLE TOKEN` (ROLE read or operator), found {} field(s)",
                    fields.len()
                ));
            };
            let role = match role {
                "read" => Role::Read,
                "operator" => Role::Operator,
                other => {
                    return Err(format!("{at}: role {other:?} is neither read nor operator"));
                }
            };
            if token.len() < TOKEN_CHARS_MIN {
                return Err(format!(
                    "{at}: token {name:?} is shorter than {TOKEN_CHARS_MIN} characters; use a \
                     random one, e.g. `openssl rand -hex 32`"
                ));
            }
            if tokens.iter().any(|t: &Token| t.name == name) {
                return Err(format!("{at}: token name {name:?} is used twice"));
            }
            tokens.push(Token {
                name: name.to_string(),
                role,
                digest: Sha256::digest(token.as_bytes()).into(),
            });
        }
        Ok(Tokens(tokens))
    }

    /// The tokens the environment gives: `STEPHOST_API_TOKENS`, or the file
    /// `STEPHOST_API_TOKENS_FILE` names (owner-only).
    pub fn from_env() -> Result<Self, String> {
        if let Ok(text) = std::env::var(TOKENS_VAR) {
            return Self::parse(&text, TOKENS_VAR);
        }
        let Some(path) = std::env::var_os(TOKENS_FILE_VAR) else {
            return Ok(Tokens::default());
        };
        let path = std::path::PathBuf::from(path);
        let shown = path.display().to_string();
        use std::os::unix::fs::PermissionsExt;
        let meta = std::fs::metadata(&path).map_err(|e| format!("cannot read {shown}: {e}"))?;
        let mode = meta.permissions().mode();
        if mode & 0o077 != 0 {
            return Err(format!(
                "the token file {shown} is readable by others (mode {:o}); make it its \
                 owner's only: chmod 600 {shown}",
                mode & 0o777
            ));
        }
        let text =
            std::fs::read_to_string(&path).map_err(|e| format!("cannot read {shown}: {e}"))?;
        Self::parse(&text, &shown)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The caller a request's `Authorization` header names; `None` if it
    /// names no configured token. Every token is compared, in constant
    /// time, whichever matches.
    pub fn caller(&self, authorization: Option<&str>) -> Option<Caller> {
        if self.0.is_empty() {
            return Some(Caller {
                name: None,
                role: Role::Operator,
            });
        }
        let presented = authorization?.strip_prefix("Bearer ")?.trim();
        let digest: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        let mut found = None;
        for token in &self.0 {
            if ct_eq(&token.digest, &digest) {
                found = Some(Caller {
                    name: Some(token.name.clone()),
                    role: token.role,
                });
            }
        }
        found
    }
}

impl Caller {
    /// Who a decision is recorded as made by: the token's name, or (with
    /// no tokens) the name the request gives.
    pub fn who(&self, given: Option<&str>) -> Result<String, String> {
        match (&self.name, given.map(str::trim).filter(|g| !g.is_empty())) {
            (Some(name), _) => Ok(name.clone()),
            (None, Some(given)) => Ok(given.to_string()),
            (None, None) => Err(
                "`by` must name who decided (a server without tokens records the name given)"
                    .to_string(),
            ),
        }
    }
}

/// Refuses what a browser could be tricked into sending: on a server
/// without tokens, a request whose `Host` is not a loopback name (a page
/// that rebinds its own name to 127.0.0.1); and on any server, a request
/// other than GET whose `Origin` is another site.
pub async fn guard(
    axum::extract::State(app): axum::extract::State<std::sync::Arc<crate::app::App>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let headers = request.headers();
    let host = headers
        .get(axum::http::header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if app.tokens.is_empty() && !is_loopback_host(host) {
        return crate::errors::ApiError::new(
            403,
            "forbidden",
            format!("a server without tokens answers only loopback names, not Host {host:?}"),
            "use http://127.0.0.1:PORT/ or http://localhost:PORT/, or configure tokens",
        )
        .into_response();
    }
    let safe = matches!(
        *request.method(),
        axum::http::Method::GET | axum::http::Method::HEAD
    );
    if !safe && let Some(origin) = headers.get(axum::http::header::ORIGIN) {
        let origin = origin.to_str().unwrap_or_default();
        let same = origin
            .split_once("://")
            .is_some_and(|(_, authority)| authority == host);
        if !same {
            return crate::errors::ApiError::new(
                403,
                "forbidden",
                format!("a request from another site ({origin}) may not change anything"),
                "send it from the console's own page, or without an Origin header",
            )
            .into_response();
        }
    }
    next.run(request).await
}

/// Whether `host` (a `Host` header: name and port) names this machine.
fn is_loopback_host(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or_default(),
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    };
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_name_their_caller_and_role_and_nothing_else_passes() {
        let tokens = Tokens::parse(
            "# ops\nalice operator aaaaaaaaaaaaaaaaaaaa\nbob read bbbbbbbbbbbbbbbbbbbb",
            "test",
        )
        .unwrap();
        let alice = tokens.caller(Some("Bearer aaaaaaaaaaaaaaaaaaaa")).unwrap();
        assert_eq!(alice.name.as_deref(), Some("alice"));
        assert_eq!(alice.role, Role::Operator);
        assert_eq!(
            tokens
                .caller(Some("Bearer bbbbbbbbbbbbbbbbbbbb"))
                .unwrap()
                .role,
            Role::Read
        );
        for bad in [
            None,
            Some("Bearer aaaaaaaaaaaaaaaaaaab"),
            Some("aaaaaaaaaaaaaaaaaaaa"),
            Some("Bearer "),
        ] {
            assert_eq!(tokens.caller(bad), None, "{bad:?}");
        }
        // The token's name is who decided, whatever the request says.
        assert_eq!(alice.who(Some("mallory")).unwrap(), "alice");
    }

    #[test]
    fn bad_token_lines_are_refused_with_their_place() {
        for (text, says) in [
            ("alice operator", "expected `NAME ROLE TOKEN`"),
            (
                "alice admin aaaaaaaaaaaaaaaaaaaa",
                "neither read nor operator",
            ),
            ("alice read short", "shorter than 16"),
            (
                "a read aaaaaaaaaaaaaaaaaaaa; a read bbbbbbbbbbbbbbbbbbbb",
                "used twice",
            ),
        ] {
            let e = Tokens::parse(text, "X").unwrap_err();
            assert!(e.contains(says), "{text}: {e}");
        }
    }

    #[test]
    fn only_loopback_names_are_loopback_hosts() {
        for yes in [
            "127.0.0.1:7070",
            "localhost:80",
            "LOCALHOST",
            "[::1]:7070",
            "127.1.2.3",
        ] {
            assert!(is_loopback_host(yes), "{yes}");
        }
        for no in [
            "evil.example:7070",
            "10.0.0.1:7070",
            "",
            "[::2]:1",
            "localhost.evil:1",
        ] {
            assert!(!is_loopback_host(no), "{no}");
        }
    }

    #[test]
    fn without_tokens_a_decision_must_name_who() {
        let open = Tokens::default().caller(None).unwrap();
        assert_eq!(open.role, Role::Operator);
        assert!(open.who(None).is_err());
        assert!(open.who(Some("  ")).is_err());
        assert_eq!(open.who(Some("carol")).unwrap(), "carol");
    }
}
