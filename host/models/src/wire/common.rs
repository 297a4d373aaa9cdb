//! Helpers shared by the three mappings.

use super::WireError;
use crate::api::Api;
use crate::chat::{ChatRequest, Part, validate};
use serde_json::{Map, Value};

/// `validate`, as a wire error.
pub(crate) fn validated(api: Api, req: &ChatRequest) -> Result<(), WireError> {
    validate(req).map_err(|message| WireError::InvalidRequest { api, message })
}

/// An `f32` as the JSON number a person wrote (`0.2`, not `0.20000000298023224`).
pub(crate) fn f32_json(value: f32) -> Value {
    // `Display` for f32 prints the shortest text that reads back to the same f32.
    let text = value.to_string();
    text.parse::<f64>()
        .ok()
        .and_then(serde_json::Number::from_f64)
        .map_or(Value::Null, Value::Number)
}

/// Merges `raw` into `body`; refuses any key in `owned` (the mapping's fields, present or not).
pub(crate) fn merge_raw(
    api: Api,
    body: &mut Map<String, Value>,
    raw: Option<&Map<String, Value>>,
    owned: &[&str],
) -> Result<(), WireError> {
    for (key, value) in raw.into_iter().flatten() {
        if owned.contains(&key.as_str()) || body.contains_key(key) {
            return Err(WireError::RawCollision {
                api,
                key: key.clone(),
            });
        }
        body.insert(key.clone(), value.clone());
    }
    Ok(())
}

/// The text parts of a message, in order.
pub(crate) fn texts(content: &[Part]) -> Vec<&str> {
    content
        .iter()
        .filter_map(|p| match p {
            Part::Text { text } => Some(text.as_str()),
            _ => None,
        })
        .collect()
}

/// A non-negative integer at `path`, 0 when absent or null.
pub(crate) fn count(v: &Value, path: &[&str]) -> u64 {
    let mut at = v;
    for key in path {
        match at.get(key) {
            Some(next) => at = next,
            None => return 0,
        }
    }
    at.as_u64().unwrap_or(0)
}

/// A string at `key`, "" when absent.
pub(crate) fn string(v: &Value, key: &str) -> String {
    v.get(key)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

/// Parses a reply body as JSON.
pub(crate) fn json_body(api: Api, body: &[u8]) -> Result<Value, WireError> {
    let v: Value = serde_json::from_slice(body).map_err(|e| WireError::Malformed {
        api,
        message: format!("body is not JSON: {e}"),
    })?;
    if !v.is_object() {
        return Err(WireError::Malformed {
            api,
            message: "body is not a JSON object".into(),
        });
    }
    Ok(v)
}

/// Parses one event's data as JSON.
pub(crate) fn json_event(api: Api, data: &str) -> Result<Value, WireError> {
    serde_json::from_str(data).map_err(|e| WireError::Malformed {
        api,
        message: format!("stream event data is not JSON: {e}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn f32_temperatures_become_the_decimal_written() {
        assert_eq!(f32_json(0.2), json!(0.2));
        assert_eq!(f32_json(1.0), json!(1.0));
        assert_eq!(f32_json(0.7), json!(0.7));
        assert_eq!(f32_json(f32::NAN), Value::Null);
    }

    #[test]
    fn raw_keys_merge_unless_owned_or_present() {
        let mut body = Map::new();
        body.insert("model".into(), json!("m"));
        let mut raw = Map::new();
        raw.insert("seed".into(), json!(1));
        merge_raw(Api::OpenAiChat, &mut body, Some(&raw), &["model", "stop"]).unwrap();
        assert_eq!(body["seed"], json!(1));
        let mut owned = Map::new();
        owned.insert("stop".into(), json!([]));
        assert_eq!(
            merge_raw(Api::OpenAiChat, &mut body, Some(&owned), &["model", "stop"]),
            Err(WireError::RawCollision {
                api: Api::OpenAiChat,
                key: "stop".into()
            })
        );
    }
}
