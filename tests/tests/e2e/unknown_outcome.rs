//! A write whose outcome cannot be established is parked as `unknown` for a
//! person, never guessed: not resent, not marked failed.

use serde_json::Value;
use stephost_tests::{Sandbox, attempts_for, calls, guests};

const BIN: &str = env!("CARGO_BIN_EXE_stephost-crash");

/// A receiver that neither deduplicates nor answers lookups.
const BLIND_RECEIVER: &str = r#"
[effects.orders]
kind = "file"
class = "write"
path = "orders.jsonl"
deduplicate = false
lookup = false
"#;

/// multi-write with count 1: its write is call #3.
const WRITE_SEQ: &str = "3";

fn park(point: &str) -> Sandbox {
    let sb = Sandbox::with_config(BIN, BLIND_RECEIVER);
    let crashed = sb.run_crashing_at(point, guests::MULTI_WRITE, r#"{"count":1}"#, "u");
    assert_eq!(crashed.signal, Some(libc::SIGABRT), "{crashed:?}");
    let resumed = sb.stephost(&["resume", "u"]);
    resumed.expect_code(5);
    assert!(resumed.stderr.contains("parked"), "{}", resumed.stderr);
    assert!(
        resumed.stderr.contains("stephost resolve u"),
        "{}",
        resumed.stderr
    );
    let show = sb.show("u");
    assert_eq!(show["run"]["status"], "parked");
    assert!(
        show["run"]["error"]
            .as_str()
            .unwrap()
            .starts_with("unknown_outcome: call #3"),
        "{show:#}"
    );
    assert_eq!(calls(&show)[2]["state"], "unknown");
    sb
}

#[test]
fn a_write_the_receiver_cannot_vouch_for_is_parked_and_never_resent() {
    let sb = park(&format!("after-send@{WRITE_SEQ}"));
    assert_eq!(sb.received("orders.jsonl").len(), 1);
    // Resuming again changes nothing and sends nothing.
    sb.stephost(&["resume", "u"]).expect_code(5);
    assert_eq!(sb.received("orders.jsonl").len(), 1);
    let show = sb.show("u");
    // No send after the crash (the crashed send's attempt row died with it).
    let sends = attempts_for(&show, 3)
        .iter()
        .filter(|a| a["kind"] == "send")
        .count();
    assert_eq!(sends, 0);
    assert_eq!(show["run"]["status"], "parked");
}

#[test]
fn a_write_started_but_never_sent_is_still_unknown_when_nobody_can_tell() {
    // The host cannot know the request never left: it parks rather than guess.
    let sb = park(&format!("after-started@{WRITE_SEQ}"));
    assert!(sb.received("orders.jsonl").is_empty());
}

#[test]
fn a_person_resolves_an_unknown_write_and_the_run_continues_with_it() {
    let sb = park(&format!("after-send@{WRITE_SEQ}"));
    // Resolving a call that is not unknown is refused.
    let wrong = sb.stephost(&["resolve", "u", "1", "--succeeded", "{}", "--by", "alice"]);
    wrong.expect_code(2);
    assert!(wrong.stderr.contains("not unknown"), "{}", wrong.stderr);
    // A response that is not JSON is refused.
    sb.stephost(&[
        "resolve",
        "u",
        WRITE_SEQ,
        "--succeeded",
        "{oops",
        "--by",
        "alice",
    ])
    .expect_code(2);

    sb.stephost(&[
        "resolve",
        "u",
        WRITE_SEQ,
        "--succeeded",
        r#"{"receipt":"checked-by-phone"}"#,
        "--by",
        "alice",
    ])
    .expect_code(0);
    let show = sb.show("u");
    assert_eq!(show["run"]["status"], "running");
    assert_eq!(calls(&show)[2]["state"], "succeeded");
    assert_eq!(calls(&show)[2]["resolved_by"], "alice");

    let resumed = sb.stephost(&["resume", "u"]);
    resumed.expect_code(0);
    let out: Value = resumed.json();
    assert_eq!(out["receipts"][0]["receipt"], "checked-by-phone");
    // The person's decision is part of the tamper-evident chain.
    sb.stephost(&["verify", "u"]).expect_code(0);
    assert_eq!(
        sb.received("orders.jsonl").len(),
        1,
        "the write was sent again"
    );
    // Resolving twice is refused.
    sb.stephost(&["resolve", "u", WRITE_SEQ, "--failed", "no", "--by", "bob"])
        .expect_code(2);
}

#[test]
fn a_write_resolved_as_failed_reaches_the_step_as_rejected() {
    let sb = park(&format!("after-send@{WRITE_SEQ}"));
    sb.stephost(&[
        "resolve",
        "u",
        WRITE_SEQ,
        "--failed",
        "supplier has no such order",
        "--by",
        "bob",
    ])
    .expect_code(0);
    let resumed = sb.stephost(&["resume", "u"]);
    // multi-write fails the step when a write fails.
    resumed.expect_code(3);
    assert!(
        resumed.stderr.contains("supplier has no such order"),
        "{}",
        resumed.stderr
    );
    assert_eq!(sb.received("orders.jsonl").len(), 1);
}
