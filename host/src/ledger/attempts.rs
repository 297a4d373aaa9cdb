//! How a call's attempts are stored: a JSON array in the call's own row
//! (schema v4), so that recording them writes no page besides the call's.
//!
//! Each element is one attempt with the fencing token of the execution
//! that made it:
//! `{"attempt":1,"kind":"send","started_at":…,"finished_at":…,"result":"ok","detail":null,"fence":3}`.

use serde::{Deserialize, Serialize};

use super::{AttemptRecord, LedgerError};

#[derive(Serialize, Deserialize)]
struct Stored<'a> {
    attempt: u32,
    #[serde(borrow)]
    kind: std::borrow::Cow<'a, str>,
    started_at: i64,
    finished_at: i64,
    #[serde(borrow)]
    result: std::borrow::Cow<'a, str>,
    #[serde(borrow)]
    detail: Option<std::borrow::Cow<'a, str>>,
    fence: i64,
}

/// The JSON array of `attempts` (made under fencing token `fence`), as
/// `serde_json` spells [`Stored`], written directly: the committer writes
/// one for nearly every recorded call, and going through `serde` (a
/// `Stored` per attempt, its map of fields) took a tenth of its time.
pub fn to_json(attempts: &[&AttemptRecord], fence: i64) -> String {
    let mut out = String::with_capacity(attempts.len() * 120);
    let mut numbers = itoa::Buffer::new();
    out.push('[');
    for (i, a) in attempts.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str("{\"attempt\":");
        out.push_str(numbers.format(a.attempt));
        out.push_str(",\"kind\":");
        push_str_json(&mut out, &a.kind);
        out.push_str(",\"started_at\":");
        out.push_str(numbers.format(a.started_at_ms));
        out.push_str(",\"finished_at\":");
        out.push_str(numbers.format(a.finished_at_ms));
        out.push_str(",\"result\":");
        push_str_json(&mut out, &a.result);
        out.push_str(",\"detail\":");
        match &a.detail {
            Some(detail) => push_str_json(&mut out, detail),
            None => out.push_str("null"),
        }
        out.push_str(",\"fence\":");
        out.push_str(numbers.format(fence));
        out.push('}');
    }
    out.push(']');
    out
}

/// `text` as a JSON string, escaped as `serde_json` escapes it.
fn push_str_json(out: &mut String, text: &str) {
    if text.bytes().any(|b| b == b'"' || b == b'\\' || b < 0x20) {
        out.push_str(&serde_json::to_string(text).expect("a string serializes"));
    } else {
        out.push('"');
        out.push_str(text);
        out.push('"');
    }
}

/// The attempts of call `seq` from its row's JSON array.
pub fn parse(run_id: &str, seq: u64, json: &str) -> Result<Vec<AttemptRecord>, LedgerError> {
    let stored: Vec<Stored<'_>> = serde_json::from_str(json).map_err(|e| {
        LedgerError::Corrupt(format!(
            "run {run_id}: the attempts of call #{seq} are not a JSON array of attempts: {e}"
        ))
    })?;
    Ok(stored
        .into_iter()
        .map(|a| AttemptRecord {
            seq,
            attempt: a.attempt,
            kind: a.kind.into_owned().into(),
            started_at_ms: a.started_at,
            finished_at_ms: a.finished_at,
            result: a.result.into_owned().into(),
            detail: a.detail.map(std::borrow::Cow::into_owned),
        })
        .collect())
}

/// An SQL expression: the call's `attempts` with the JSON array `?N`
/// appended (either may be NULL). Appending to attempts already recorded
/// is rare (a call reconciled after an earlier execution's attempts), so
/// SQLite's JSON functions rebuild the array, element by element in order.
pub fn append_sql(param: usize) -> String {
    format!(
        "CASE WHEN ?{param} IS NULL THEN attempts WHEN attempts IS NULL THEN ?{param} \
         ELSE (SELECT json_group_array(json(value) ORDER BY part, key) FROM \
             (SELECT 0 AS part, key, value FROM json_each(attempts) \
              UNION ALL SELECT 1, key, value FROM json_each(?{param}))) END"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attempt(n: u32, detail: Option<&str>) -> AttemptRecord {
        AttemptRecord {
            seq: 4,
            attempt: n,
            kind: "send".into(),
            started_at_ms: 10,
            finished_at_ms: 12,
            result: "retryable".into(),
            detail: detail.map(str::to_string),
        }
    }

    #[test]
    fn attempts_round_trip_and_arrays_append_in_order() {
        let first = [attempt(1, Some("a \"quoted\" ] detail"))];
        let second = [attempt(2, None), attempt(3, None)];
        let a = to_json(&first.iter().collect::<Vec<_>>(), 7);
        let b = to_json(&second.iter().collect::<Vec<_>>(), 8);
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE calls (attempts TEXT); INSERT INTO calls VALUES (NULL);")
            .unwrap();
        // Twelve elements: the order must not be the text order of keys.
        let many: Vec<AttemptRecord> = (4..=15).map(|n| attempt(n, None)).collect();
        let c = to_json(&many.iter().collect::<Vec<_>>(), 9);
        let append = format!("UPDATE calls SET attempts = {}", append_sql(1));
        conn.execute(&append, [&a]).unwrap();
        conn.execute(&append, [None::<String>]).unwrap();
        conn.execute(&append, [&b]).unwrap();
        conn.execute(&append, [&c]).unwrap();
        let joined: String = conn
            .query_row(
                "SELECT attempts FROM calls WHERE json_valid(attempts)",
                [],
                |r| r.get(0),
            )
            .unwrap();
        let all: Vec<AttemptRecord> = first.iter().chain(&second).chain(&many).cloned().collect();
        assert_eq!(parse("r", 4, &joined).unwrap(), all);
    }

    #[test]
    fn attempts_are_written_as_serde_json_writes_them() {
        let details = [
            None,
            Some(String::new()),
            Some("plain".to_string()),
            Some("a \"quoted\" \\ back\nslash\t\u{1}, ünïcode \u{7f}".to_string()),
        ];
        let many: Vec<AttemptRecord> = details
            .iter()
            .enumerate()
            .map(|(i, detail)| AttemptRecord {
                attempt: i as u32 + 1,
                started_at_ms: -5 + i as i64,
                finished_at_ms: i64::MAX - i as i64,
                kind: if i % 2 == 0 { "send" } else { "look\"up" }.into(),
                result: "not_found".into(),
                detail: detail.clone(),
                ..attempt(1, None)
            })
            .collect();
        for list in [&many[..0], &many[..1], &many[..]] {
            let refs: Vec<&AttemptRecord> = list.iter().collect();
            let stored: Vec<Stored<'_>> = list
                .iter()
                .map(|a| Stored {
                    attempt: a.attempt,
                    kind: a.kind.as_ref().into(),
                    started_at: a.started_at_ms,
                    finished_at: a.finished_at_ms,
                    result: a.result.as_ref().into(),
                    detail: a.detail.as_deref().map(Into::into),
                    fence: -3,
                })
                .collect();
            let json = to_json(&refs, -3);
            assert_eq!(json, serde_json::to_string(&stored).unwrap());
            assert_eq!(parse("r", 4, &json).unwrap(), list);
        }
    }

    #[test]
    fn a_damaged_array_is_reported_as_corrupt() {
        let err = parse("r", 2, "[{\"attempt\":1}").unwrap_err();
        assert!(matches!(err, LedgerError::Corrupt(_)), "{err}");
    }
}
