//! The three provider wire APIs a model alias can use (`api = "…"` in `stephost.toml`).

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// A provider wire API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Api {
    /// OpenAI Chat Completions, `POST /v1/chat/completions`.
    #[serde(rename = "openai-chat")]
    OpenAiChat,
    /// OpenAI Responses, `POST /v1/responses`.
    #[serde(rename = "openai-responses")]
    OpenAiResponses,
    /// Anthropic Messages, `POST /v1/messages`.
    #[serde(rename = "anthropic-messages")]
    AnthropicMessages,
}

impl Api {
    /// Every API, in a fixed order.
    pub const ALL: [Api; 3] = [
        Api::OpenAiChat,
        Api::OpenAiResponses,
        Api::AnthropicMessages,
    ];

    /// The configuration spelling: `openai-chat`, `openai-responses`, `anthropic-messages`.
    pub fn as_str(self) -> &'static str {
        match self {
            Api::OpenAiChat => "openai-chat",
            Api::OpenAiResponses => "openai-responses",
            Api::AnthropicMessages => "anthropic-messages",
        }
    }

    /// The request path under the provider's base URL (which ends before `/v1`).
    pub fn path(self) -> &'static str {
        match self {
            Api::OpenAiChat => "/v1/chat/completions",
            Api::OpenAiResponses => "/v1/responses",
            Api::AnthropicMessages => "/v1/messages",
        }
    }

    /// The API served at `path`, if any.
    pub fn from_path(path: &str) -> Option<Api> {
        Api::ALL.into_iter().find(|api| api.path() == path)
    }

    /// The response header holding the provider's request id.
    pub fn request_id_header(self) -> &'static str {
        match self {
            Api::OpenAiChat | Api::OpenAiResponses => "x-request-id",
            Api::AnthropicMessages => "request-id",
        }
    }

    /// Whether this is one of OpenAI's APIs (same auth, errors and headers).
    pub fn is_openai(self) -> bool {
        matches!(self, Api::OpenAiChat | Api::OpenAiResponses)
    }
}

impl fmt::Display for Api {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An `api` value that is none of the three.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown model api `{0}`: expected `openai-chat`, `openai-responses` or `anthropic-messages`"
)]
pub struct UnknownApi(pub String);

impl FromStr for Api {
    type Err = UnknownApi;

    fn from_str(s: &str) -> Result<Api, UnknownApi> {
        Api::ALL
            .into_iter()
            .find(|api| api.as_str() == s)
            .ok_or_else(|| UnknownApi(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_parses_its_three_spellings_and_round_trips() {
        for api in Api::ALL {
            assert_eq!(api.as_str().parse::<Api>(), Ok(api));
            assert_eq!(api.to_string(), api.as_str());
            let json = serde_json::to_string(&api).unwrap();
            assert_eq!(json, format!("\"{}\"", api.as_str()));
            assert_eq!(serde_json::from_str::<Api>(&json).unwrap(), api);
            assert_eq!(Api::from_path(api.path()), Some(api));
        }
    }

    #[test]
    fn unknown_api_is_refused_with_the_choices() {
        let err = "openai".parse::<Api>().unwrap_err();
        assert!(err.to_string().contains("`openai-chat`"));
        assert_eq!(Api::from_path("/v1/completions"), None);
    }
}
