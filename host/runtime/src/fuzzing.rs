//! What the fuzz targets (`fuzz/`, run with cargo-fuzz) feed arbitrary bytes
//! to: the parsers of what stephost reads from outside, which must answer
//! with an error, never a panic. The property tests below run the same
//! entry points in every test run.

/// The configuration parser, and the effects it builds.
pub fn config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(config) = crate::config::Config::parse(text) {
        let _ = config.effects();
    }
}

/// The exported-run (fixture) parser, and `verify` of what it parsed.
pub fn fixture(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(fixture) = crate::replay::Fixture::parse(text) {
        let run = fixture.run_record();
        let _ = stephost_core::chain::Signer::plain().verify(&fixture.calls, &run);
    }
}

/// The receipt check, and the `Retry-After` parser: the first line is the
/// operation id, the second the JSON pointer, the rest the receiver's
/// answer (also read as a `Retry-After` value).
pub fn receipt(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let mut parts = text.splitn(3, '\n');
    let operation_id = parts.next().unwrap_or("");
    let pointer = parts.next().unwrap_or("/operation_id");
    let answer = parts.next().unwrap_or("");
    let accepted = stephost_effects::check_receipt(
        answer,
        pointer,
        operation_id,
        &stephost_effects::payload_sha256("{}"),
    )
    .is_ok();
    if accepted {
        // Only an answer naming this operation is ever accepted.
        let value: serde_json::Value = serde_json::from_str(answer).expect("accepted JSON");
        assert_eq!(
            value.pointer(pointer).and_then(|v| v.as_str()),
            Some(operation_id)
        );
    }
    let _ = stephost_effects::http::retry_after(answer, std::time::SystemTime::now());
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn the_configuration_parser_never_panics(text in "\\PC{0,400}") {
            super::config(text.as_bytes());
        }

        #[test]
        fn configuration_like_text_never_panics(
            kind in prop::sample::select(vec!["http", "command", "file", "static", "echo", "reject"]),
            url in "[a-z{}:/.%0-9]{0,40}",
            extra in "[a-z_]{0,12} = [0-9\\[\\]\"a-z,]{0,20}",
        ) {
            let text = format!(
                "[effects.e]\nkind = \"{kind}\"\nurl = \"{url}\"\nargv = [\"x\"]\npath = \"p\"\nresponse = '{{}}'\n{extra}\n"
            );
            super::config(text.as_bytes());
        }

        #[test]
        fn the_fixture_parser_never_panics(text in "\\PC{0,400}") {
            super::fixture(text.as_bytes());
        }

        #[test]
        fn fixture_like_json_never_panics(
            seq in 0u64..5,
            state in "[a-z]{0,10}",
            chain in "(k2:|h2:)?[0-9a-f]{0,64}",
            seal in "\\PC{0,40}",
        ) {
            let text = serde_json::json!({
                "format": "stephost-run/1",
                "run_id": "r", "module_digest": "m", "input": "{}", "status": "completed",
                "output": null, "error": null, "seal": seal,
                "calls": [{
                    "seq": seq, "class": "write", "interface": "i", "function": "f",
                    "operation_id": "o", "request": "{}", "request_hash": "x", "state": state,
                    "outcome": null, "started_at_ms": 0, "finished_at_ms": null,
                    "resolved_by": null, "chain": chain
                }]
            })
            .to_string();
            super::fixture(text.as_bytes());
        }

        #[test]
        fn receipts_are_accepted_only_naming_the_operation(
            op in "[a-z0-9-]{0,12}",
            pointer in "(/[a-z_]{0,8}){0,2}",
            answer in "\\PC{0,200}",
        ) {
            super::receipt(format!("{op}\n{pointer}\n{answer}").as_bytes());
        }

        #[test]
        fn receipt_like_json_is_accepted_only_naming_the_operation(
            op in "[a-z0-9-]{1,12}",
            named in "[a-z0-9-]{0,12}",
            key in "(operation_id|id|op)",
        ) {
            let answer = serde_json::json!({ key: named }).to_string();
            super::receipt(format!("{op}\n/operation_id\n{answer}").as_bytes());
        }
    }
}
