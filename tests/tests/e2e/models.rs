//! Model calls (stephost:step@0.2.0's `models.chat`) against the scripted
//! model server on 127.0.0.1, in both OpenAI's and Anthropic's wire
//! formats: a tool-calling agent crashed mid-loop asks the model nothing it
//! was already answered and refunds once; a replay asks no model; a call
//! over the budget is never sent; runs sharing `concurrency_max = 1` never
//! overlap at the server; 429s are retried by the host alone; an alias
//! switched to another API keeps old runs replaying; the key is nowhere in
//! the ledger; with traces exported, a call is a span with the GenAI
//! attributes.

use model_server::{Config, ModelServer, Script};
use serde_json::Value;
use stephost_tests::{Ran, Sandbox, calls, guests};

const BIN: &str = env!("CARGO_BIN_EXE_stephost-crash");

const KEY: &str = "sk-test-models-e2e";

const REFUND: &str = r#"{"model":"support","message":"Please refund order A-1001, it arrived broken.","agent":true}"#;

/// The agent's calls: 1 chat (turn 1: lookup_order), 2 orders.lookup,
/// 3 chat (turn 2: refund), 4 payments.refund, 5 chat (turn 3: the answer).
const SECOND_ANSWER_SEQ: u64 = 3;
const REFUND_SEQ: u64 = 4;

fn config(api: &str, url: &str, extra: &str) -> String {
    format!(
        r#"
[models.support]
api = "{api}"
url = "{url}"
model = "scripted-1"
key_env = "STEPHOST_TEST_MODEL_KEY"
max_tokens = 1024

[models.support.prices]
input_per_mtok = 1.0
cached_input_per_mtok = 0.5
cache_write_per_mtok = 1.25
output_per_mtok = 4.0

[models.support.retry]
attempts_max = 6
backoff_first_ms = 10
backoff_max_ms = 200
deadline_ms = 20000

[effects."orders.lookup"]
kind = "static"
class = "read"
response = '{{"order_id": "A-1001", "amount_cents": 2599, "status": "delivered"}}'

[effects."payments.refund"]
kind = "file"
class = "write"
path = "refunds.jsonl"
{extra}"#
    )
}

fn stephost(sb: &Sandbox, args: &[&str]) -> Ran {
    sb.stephost_with_envs(&[("STEPHOST_TEST_MODEL_KEY", KEY.as_ref())], args)
}

fn stephost_crashing_at(sb: &Sandbox, point: &str, args: &[&str]) -> Ran {
    sb.stephost_with_envs(
        &[
            ("STEPHOST_TEST_MODEL_KEY", KEY.as_ref()),
            ("STEPHOST_CRASH_AT", point.as_ref()),
        ],
        args,
    )
}

fn model_requests(server: &ModelServer) -> u64 {
    server.report()["requests_total"].as_u64().unwrap()
}

/// A scripted model server that wants the key (its default script), and a
/// sandbox whose model `support` is it over `api`, with `extra`
/// configuration.
fn keyed_sandbox(api: &str, extra: &str) -> (ModelServer, Sandbox) {
    let server = ModelServer::start_with(Config {
        key: Some(KEY.into()),
        ..Config::default()
    })
    .unwrap();
    let sb = Sandbox::with_config(BIN, &config(api, &server.url(), extra));
    (server, sb)
}

fn server_with(script: &str, hold_ms: u64) -> ModelServer {
    ModelServer::start_with(Config {
        script: Script::from_json(script).unwrap(),
        key: Some(KEY.into()),
        hold: std::time::Duration::from_millis(hold_ms),
        ..Config::default()
    })
    .unwrap()
}

#[test]
fn a_refund_agent_crashed_mid_loop_asks_no_turn_twice_refunds_once_and_replays_offline() {
    for api in ["openai-chat", "anthropic-messages"] {
        for point in [
            format!("after-outcome@{SECOND_ANSWER_SEQ}"),
            format!("after-send@{REFUND_SEQ}"),
        ] {
            let (server, sb) = keyed_sandbox(api, "");
            let args = ["run", guests::CHAT_STEP, "--input", REFUND, "--run-id", "a"];
            let crashed = stephost_crashing_at(&sb, &point, &args);
            assert_eq!(
                crashed.signal,
                Some(libc::SIGABRT),
                "{api} {point}: {crashed:?}"
            );
            let asked = model_requests(&server);
            assert_eq!(asked, 2, "{api} {point}: the model was asked {asked} times");

            let resumed = stephost(&sb, &["resume", "a"]);
            resumed.expect_code(0);
            let out = resumed.json();
            assert_eq!(out["turns"], 3, "{api} {point}: {out}");
            assert_eq!(out["tool_calls"], 2, "{api} {point}: {out}");
            assert!(
                out["text"].as_str().unwrap().contains("A-1001"),
                "{api} {point}: {out}"
            );
            assert_eq!(
                model_requests(&server),
                3,
                "{api} {point}: a turn already answered was asked again"
            );
            let refunds = sb.received("refunds.jsonl");
            assert_eq!(refunds.len(), 1, "{api} {point}: {refunds:#?}");
            assert_eq!(refunds[0]["request"]["order_id"], "A-1001");
            assert_eq!(refunds[0]["request"]["amount_cents"], 2599);

            let show = sb.show("a");
            assert_eq!(calls(&show).len(), 5);
            // Each message is kept once: a later turn's request keeps what
            // is new since the turn before, which the model got whole.
            let requests: Vec<String> = calls(&show)
                .iter()
                .map(|c| c["request"].as_str().unwrap().to_string())
                .collect();
            assert!(requests[0].contains("arrived broken"), "{}", requests[0]);
            for later in [&requests[2], &requests[4]] {
                assert!(!later.contains("arrived broken"), "{later}");
                assert!(later.contains("stephost_after"), "{later}");
            }
            assert!(
                server.report()["requests"][2]
                    .to_string()
                    .contains("arrived broken"),
                "the model did not get the whole conversation"
            );
            assert!(show["tokens_total"].as_u64().unwrap() > 0, "{show}");
            assert!(show["cost_micro_usd_total"].as_u64().unwrap() > 0, "{show}");
            // A replay needs neither the model nor its key.
            sb.set_config("");
            sb.stephost(&["replay", "a"]).expect_code(0);
            assert_eq!(model_requests(&server), 3, "{api}: replay asked the model");
            assert!(!sb.ledger_contains(KEY), "{api}: the key is in the ledger");
        }
    }
}

#[test]
fn a_call_that_would_pass_the_budget_is_not_sent() {
    let (server, sb) = keyed_sandbox("openai-chat", "\n[limits]\nmodel_tokens_max = 500\n");
    let input = r#"{"model":"support","message":"hello","max_tokens":800}"#;
    let ran = stephost(
        &sb,
        &["run", guests::CHAT_STEP, "--input", input, "--run-id", "b"],
    );
    ran.expect_code(0);
    let out = ran.json();
    assert_eq!(out["error"], "budget", "{out}");
    assert!(
        out["message"]
            .as_str()
            .unwrap()
            .contains("model_tokens_max"),
        "{out}"
    );
    assert_eq!(
        model_requests(&server),
        0,
        "a refused call reached the model"
    );
    // The refusal is recorded: a replay gives the step the same answer,
    // `budget`, whatever today's budget.
    stephost(&sb, &["replay", "b"]).expect_code(0);
    sb.set_config(&config(
        "openai-chat",
        &server.url(),
        "\n[limits]\nmodel_tokens_max = 100000\n",
    ));
    stephost(&sb, &["replay", "b"]).expect_code(0);
    // A run's own budget: refused under it, and replayed as refused under
    // [limits] that would let the call through.
    let ran = stephost(
        &sb,
        &[
            "run",
            guests::CHAT_STEP,
            "--input",
            input,
            "--run-id",
            "own",
            "--model-tokens-max",
            "500",
        ],
    );
    ran.expect_code(0);
    assert_eq!(ran.json()["error"], "budget", "{}", ran.stdout);
    stephost(&sb, &["replay", "own"]).expect_code(0);
    assert_eq!(model_requests(&server), 0);
    sb.set_config(&config(
        "openai-chat",
        &server.url(),
        "\n[limits]\nmodel_tokens_max = 500\n",
    ));
    // Within the budget, the same call is sent.
    let input = r#"{"model":"support","message":"hello","max_tokens":300}"#;
    let ran = stephost(
        &sb,
        &["run", guests::CHAT_STEP, "--input", input, "--run-id", "c"],
    );
    ran.expect_code(0);
    assert!(ran.json()["error"].is_null(), "{}", ran.stdout);
    assert_eq!(model_requests(&server), 1);
    // Two refusals counted (`b`, `own`), their replays not; the answer's
    // tokens and cost, once, by model and kind.
    let metrics = stephost(&sb, &["metrics"]);
    metrics.expect_code(0);
    let text = metrics.stdout;
    assert!(
        text.contains("stephost_model_budget_refusals_total{model=\"support\"} 2\n"),
        "{text}"
    );
    let answer = sb.show("c");
    let tokens = |kind: &str| -> u64 {
        let prefix = format!("stephost_model_tokens_total{{model=\"support\",kind=\"{kind}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .map_or(0, |v| v.parse().unwrap())
    };
    assert!(tokens("input") > 0 && tokens("output") > 0, "{text}");
    assert_eq!(
        tokens("input") + tokens("output"),
        answer["tokens_total"].as_u64().unwrap(),
        "{text}"
    );
    assert!(
        text.contains("stephost_model_cost_total{model=\"support\"} 0.0"),
        "{text}"
    );
}

/// The answer call `seq` of run `run_id` was recorded with, parsed.
fn recorded_answer(sb: &Sandbox, run_id: &str, seq: usize) -> Value {
    let show = sb.show(run_id);
    let outcome: Value =
        serde_json::from_str(calls(&show)[seq - 1]["outcome"].as_str().unwrap()).unwrap();
    serde_json::from_str(outcome["ok"].as_str().unwrap()).unwrap()
}

#[test]
fn a_budget_counts_a_calls_input_what_usage_omits_and_a_cut_stream() {
    // A large request: its input, not only its max_tokens, is counted.
    let (server, sb) = keyed_sandbox("openai-chat", "\n[limits]\nmodel_tokens_max = 1000\n");
    let input =
        serde_json::json!({"model": "support", "message": "x".repeat(4000), "max_tokens": 300})
            .to_string();
    let ran = stephost(
        &sb,
        &[
            "run",
            guests::CHAT_STEP,
            "--input",
            &input,
            "--run-id",
            "big",
        ],
    );
    ran.expect_code(0);
    assert_eq!(ran.json()["error"], "budget", "{}", ran.stdout);
    assert_eq!(model_requests(&server), 0, "the large request was sent");

    // An answer the provider reported no usage for: charged by estimate.
    let long = "word ".repeat(400);
    let server = server_with(
        &serde_json::json!({"turns": [{"text": long, "omit_usage": true}]}).to_string(),
        0,
    );
    let sb = Sandbox::with_config(BIN, &config("openai-chat", &server.url(), ""));
    let ask = r#"{"model":"support","message":"hello","max_tokens":900,"quiet":true}"#;
    stephost(
        &sb,
        &[
            "run",
            guests::CHAT_STEP,
            "--input",
            ask,
            "--run-id",
            "nousage",
        ],
    )
    .expect_code(0);
    let answer = recorded_answer(&sb, "nousage", 1);
    assert!(answer.get("usage_raw").is_none(), "{answer:#}");
    assert_eq!(answer["charged"]["estimated"], true, "{answer:#}");
    assert!(
        answer["charged"]["tokens"].as_u64().unwrap() >= 500,
        "{answer:#}"
    );

    // A stream cut after it began, then answered: both attempts charged.
    let server = server_with(
        &serde_json::json!({"turns": [{"text": long, "faults": [{"kind": "cut", "after_events": 3}]}]})
            .to_string(),
        0,
    );
    let sb = Sandbox::with_config(BIN, &config("openai-chat", &server.url(), ""));
    stephost(
        &sb,
        &["run", guests::CHAT_STEP, "--input", ask, "--run-id", "cut"],
    )
    .expect_code(0);
    assert_eq!(model_requests(&server), 2);
    let answer = recorded_answer(&sb, "cut", 1);
    let usage =
        answer["usage"]["input"].as_u64().unwrap() + answer["usage"]["output"].as_u64().unwrap();
    let charged = answer["charged"]["tokens"].as_u64().unwrap();
    assert!(
        charged > usage,
        "the cut attempt was not charged: {answer:#}"
    );
    assert_eq!(answer["charged"]["estimated"], true, "{answer:#}");
    // The step never sees the host's note.
    let ran = stephost(
        &sb,
        &[
            "run",
            guests::CHAT_STEP,
            "--input",
            r#"{"model":"support","message":"hello","max_tokens":900}"#,
            "--run-id",
            "seen",
        ],
    );
    assert!(!ran.stdout.contains("charged"), "{}", ran.stdout);
}

#[test]
fn a_provider_asking_for_an_endless_pause_holds_the_model_no_longer_than_its_deadline() {
    // retry-after beyond what a duration can hold: no panic, and every run
    // of the model held back only up to the retry deadline.
    let server = server_with(
        r#"{"turns": [{"text": "after the pause", "faults": [{"kind": "status", "status": 429, "retry_after": 18446744073709551615}]}]}"#,
        0,
    );
    let sb = Sandbox::with_config(
        BIN,
        &config("openai-chat", &server.url(), "")
            .replace("deadline_ms = 20000", "deadline_ms = 1500"),
    );
    let ask = r#"{"model":"support","message":"hello","max_tokens":100}"#;
    let first = stephost(
        &sb,
        &["run", guests::CHAT_STEP, "--input", ask, "--run-id", "p1"],
    );
    first.expect_code(0);
    assert_eq!(first.json()["error"], "exhausted", "{}", first.stdout);
    // The next run waits out the held-back pause and is answered.
    let second = stephost(
        &sb,
        &["run", guests::CHAT_STEP, "--input", ask, "--run-id", "p2"],
    );
    second.expect_code(0);
    assert!(second.json()["error"].is_null(), "{}", second.stdout);
    assert_eq!(second.json()["text"], "after the pause");
}

#[test]
fn a_call_over_budget_parks_the_run_when_configured_until_a_raised_budget_resumes_it() {
    let limits = |tokens: u64| {
        format!("\n[limits]\nmodel_tokens_max = {tokens}\nmodel_budget_exceeded = \"park\"\n")
    };
    let (server, sb) = keyed_sandbox("openai-chat", &limits(500));
    let with_budget = |tokens: u64| config("openai-chat", &server.url(), &limits(tokens));
    let input = r#"{"model":"support","message":"hello","max_tokens":800}"#;
    let ran = stephost(
        &sb,
        &["run", guests::CHAT_STEP, "--input", input, "--run-id", "pk"],
    );
    ran.expect_code(5);
    assert!(
        ran.stderr.contains("stephost resume pk --model-tokens-max"),
        "{}",
        ran.stderr
    );
    assert_eq!(model_requests(&server), 0, "a call over budget was sent");
    let show = sb.show("pk");
    assert_eq!(show["run"]["status"], "parked");
    assert!(
        show["run"]["error"]
            .as_str()
            .unwrap()
            .starts_with("budget: call #1"),
        "{show:#}"
    );
    assert!(calls(&show).is_empty(), "the call was recorded: {show:#}");
    // A person raises the budget and resumes the run: the call is sent.
    sb.set_config(&with_budget(5_000));
    let resumed = stephost(&sb, &["resume", "pk"]);
    resumed.expect_code(0);
    assert!(resumed.json()["error"].is_null(), "{}", resumed.stdout);
    assert_eq!(model_requests(&server), 1);
    // Its replay needs no budget at all.
    sb.set_config(&with_budget(1));
    stephost(&sb, &["replay", "pk"]).expect_code(0);
    assert_eq!(model_requests(&server), 1);
}

/// [`keyed_sandbox`] whose model calls over a budget park their run
/// (`[limits]`'s budget is the default).
fn parking_over_budget() -> (ModelServer, Sandbox) {
    keyed_sandbox(
        "openai-chat",
        "\n[limits]\nmodel_budget_exceeded = \"park\"\n",
    )
}

#[test]
fn a_run_submitted_with_its_own_budget_is_held_to_it_and_raised_as_it_is_resumed() {
    // [limits] would let the call through; the run's own budget does not.
    let (server, sb) = parking_over_budget();
    let input = r#"{"model":"support","message":"hello","max_tokens":800}"#;
    let submit = |id: &str, budget: &[&str]| {
        let mut args = vec![
            "submit",
            guests::CHAT_STEP,
            "--input",
            input,
            "--run-id",
            id,
        ];
        args.extend_from_slice(budget);
        stephost(&sb, &args).expect_code(0);
    };
    submit("own", &["--model-tokens-max", "500"]);
    submit("other", &[]);
    stephost(&sb, &["worker", "--exit-when-idle"]).expect_code(0);
    let own = sb.show("own");
    assert_eq!(own["run"]["status"], "parked", "{own:#}");
    assert_eq!(own["run"]["budget"]["model_tokens_max"], 500, "{own:#}");
    assert!(
        own["run"]["error"]
            .as_str()
            .unwrap()
            .contains("past model_tokens_max = 500"),
        "{own:#}"
    );
    // The run without one had [limits]'s: its call was the only one sent.
    assert_eq!(sb.show("other")["run"]["status"], "completed");
    assert_eq!(model_requests(&server), 1);
    // A person raises the run's budget as they resume it: the call is sent,
    // and the raised budget is the run's, sealed with it.
    let resumed = stephost(
        &sb,
        &["resume", "own", "--model-tokens-max", "5000", "--json"],
    );
    resumed.expect_code(0);
    assert_eq!(resumed.json()["status"], "completed", "{}", resumed.stdout);
    assert_eq!(model_requests(&server), 2);
    assert_eq!(sb.show("own")["run"]["budget"]["model_tokens_max"], 5000);
    stephost(&sb, &["verify", "own"]).expect_code(0);
    // A finished run's budget cannot be changed.
    let late = stephost(&sb, &["resume", "own", "--model-tokens-max", "9"]);
    assert_ne!(late.code, Some(0), "{}", late.stderr);
    assert_eq!(sb.show("own")["run"]["budget"]["model_tokens_max"], 5000);
}

#[test]
fn a_run_parked_over_its_budget_goes_on_once_the_api_raises_it() {
    let (server, sb) = parking_over_budget();
    let served = sb.serve(&[], &[("STEPHOST_TEST_MODEL_KEY", KEY)]);
    let digest = served.client().upload(guests::CHAT_STEP);
    let input = serde_json::json!({"model": "support", "message": "hello", "max_tokens": 800});
    served
        .post(
            "/api/runs",
            &serde_json::json!({"module_digest": digest, "input": input, "run_id": "api",
                                "budget": {"model_tokens_max": 500}}),
        )
        .expect(201);
    let parked = served.wait_status("api", "parked");
    assert!(
        parked["run"]["error"]
            .as_str()
            .unwrap()
            .starts_with("budget:"),
        "{parked:#}"
    );
    assert_eq!(model_requests(&server), 0);
    // An array is not read as the bounds in order (the run stays parked).
    served
        .post("/api/runs/api/budget", &serde_json::json!([]))
        .expect_error(400, "bad_input");
    // An operator raises it: the server's worker goes on with the run.
    let raised = served
        .post(
            "/api/runs/api/budget",
            &serde_json::json!({"model_tokens_max": 5000}),
        )
        .expect(200);
    assert_eq!(raised["budget"]["model_tokens_max"], 5000);
    served.wait_status("api", "completed");
    assert_eq!(model_requests(&server), 1);
    // An ended run's budget no longer changes: a conflict with its state,
    // not a bad body.
    served
        .post(
            "/api/runs/api/budget",
            &serde_json::json!({"model_tokens_max": 9}),
        )
        .expect_error(409, "run_ended");
    served
        .post("/api/runs/api/budget", &serde_json::json!({"tokens": 9}))
        .expect_error(400, "bad_input");
}

#[test]
fn runs_sharing_a_model_with_concurrency_max_one_never_overlap_at_the_server() {
    // Two worker processes on one ledger, two runs at once each: the slot
    // is the ledger's, so at most one call is at the server at any time.
    let server = server_with(r#"{"turns": [{"text": "Hello."}]}"#, 300);
    let sb = Sandbox::with_config(
        BIN,
        &config("anthropic-messages", &server.url(), "").replace(
            "max_tokens = 1024\n",
            "max_tokens = 1024\nconcurrency_max = 1\n",
        ),
    );
    let input = r#"{"model":"support","message":"hi"}"#;
    let ids = ["r1", "r2", "r3", "r4"];
    for id in ids {
        stephost(
            &sb,
            &[
                "submit",
                guests::CHAT_STEP,
                "--input",
                input,
                "--run-id",
                id,
            ],
        )
        .expect_code(0);
    }
    let workers: Vec<_> = (0..2)
        .map(|_| {
            sb.command(&["worker", "--concurrency", "2", "--exit-when-idle"])
                .env("STEPHOST_TEST_MODEL_KEY", KEY)
                .stdout(std::process::Stdio::null())
                .spawn()
                .expect("a worker starts")
        })
        .collect();
    for mut worker in workers {
        assert!(worker.wait().expect("the worker ends").success());
    }
    for id in ids {
        assert_eq!(sb.show(id)["run"]["status"], "completed", "{id}");
    }
    let report = server.report();
    assert_eq!(report["requests_total"], 4, "{report}");
    assert_eq!(
        report["max_in_flight"], 1,
        "two runs' calls overlapped at the server"
    );
}

#[test]
fn a_429_storm_is_retried_by_the_host_alone_honouring_retry_after() {
    let server = server_with(
        r#"{"turns": [{"text": "At last.",
            "faults": [{"kind": "status", "status": 429, "retry_after_ms": 20, "times": 3}]}]}"#,
        0,
    );
    let sb = Sandbox::with_config(BIN, &config("openai-chat", &server.url(), ""));
    let input = r#"{"model":"support","message":"hi"}"#;
    let ran = stephost(
        &sb,
        &["run", guests::CHAT_STEP, "--input", input, "--run-id", "s"],
    );
    ran.expect_code(0);
    assert_eq!(ran.json()["text"], "At last.");
    assert_eq!(model_requests(&server), 4);
    let show = sb.show("s");
    let attempts: Vec<&str> = show["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["result"].as_str().unwrap())
        .collect();
    assert_eq!(attempts, ["retryable", "retryable", "retryable", "ok"]);
    assert_eq!(calls(&show).len(), 1, "the step saw one call");
    // Each attempt names the provider's request id; a 429's, the rate-limit
    // headers that came with it.
    let details: Vec<&str> = show["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["detail"].as_str().unwrap_or_default())
        .collect();
    assert!(details[0].contains("request id req_test_1"), "{details:?}");
    assert!(details[0].contains("requests left 0"), "{details:?}");
    assert!(details[3].contains("request id req_test_4"), "{details:?}");
}

#[test]
fn a_429_holds_back_every_run_sharing_the_model_not_only_the_one_told() {
    // Two runs, one call in flight at once: the first request is told to
    // wait 1.5 s. The other run, waiting for the slot, must wait too.
    let server = told_to_wait(1500);
    let sb = Sandbox::with_config(
        BIN,
        &config("openai-chat", &server.url(), "").replace(
            "max_tokens = 1024\n",
            "max_tokens = 1024\nconcurrency_max = 1\nrequests_per_minute = 600\n",
        ),
    );
    let input = r#"{"model":"support","message":"hi"}"#;
    for id in ["p1", "p2"] {
        stephost(
            &sb,
            &[
                "submit",
                guests::CHAT_STEP,
                "--input",
                input,
                "--run-id",
                id,
            ],
        )
        .expect_code(0);
    }
    stephost(&sb, &["worker", "--concurrency", "2", "--exit-when-idle"]).expect_code(0);
    for id in ["p1", "p2"] {
        assert_eq!(sb.show(id)["run"]["status"], "completed", "{id}");
    }
    let report = server.report();
    let requests = report["requests"].as_array().unwrap();
    assert_eq!(requests.len(), 3, "{report}");
    assert_eq!(requests[0]["status"], 429, "{report}");
    arrived_after(&report, 1, 1_450);
}

#[test]
fn a_worker_frozen_past_its_lease_between_attempts_does_not_ask_the_model_again() {
    // Worker A's first request is told to wait 1.5 s; A is frozen while it
    // waits, past its 1.2 s lease. Worker B takes the run and gets the
    // answer. A, thawed after its wait is over, must not send its next
    // attempt: by its own clock its lease ran out, and a model, unlike a
    // receiver, checks no fence. (The fault-injection harness found a
    // zombie asking again.)
    let server = told_to_wait(1500);
    let sb = Sandbox::with_config(BIN, &config("openai-chat", &server.url(), ""));
    let input = r#"{"model":"support","message":"hi"}"#;
    stephost(
        &sb,
        &[
            "submit",
            guests::CHAT_STEP,
            "--input",
            input,
            "--run-id",
            "z",
        ],
    )
    .expect_code(0);
    let lease = ["--lease-ms", "1200", "--poll-ms", "100"];
    let log = std::fs::File::create(sb.path("zombie.log")).unwrap();
    let mut zombie = sb
        .command(&[&["worker", "--worker-id", "zombie"][..], &lease[..]].concat())
        .env("STEPHOST_TEST_MODEL_KEY", KEY)
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while model_requests(&server) == 0 {
        assert!(std::time::Instant::now() < deadline, "no request came");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let signal = |name: &str| {
        std::process::Command::new("kill")
            .args([&format!("-{name}"), &zombie.id().to_string()])
            .status()
            .unwrap()
    };
    assert!(signal("STOP").success());
    let frozen = std::time::Instant::now();
    stephost(
        &sb,
        &[&["worker", "--exit-when-idle"][..], &lease[..]].concat(),
    )
    .expect_code(0);
    let done = sb.show("z");
    assert_eq!(done["run"]["status"], "completed", "{done:#}");
    assert_eq!(model_requests(&server), 2, "{}", server.report());
    // Thawed once its 1.5 s wait is over: its next attempt is due at once.
    std::thread::sleep(std::time::Duration::from_millis(2000).saturating_sub(frozen.elapsed()));
    assert!(signal("CONT").success());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let said = loop {
        let said = std::fs::read_to_string(sb.path("zombie.log")).unwrap();
        if said.contains("another worker may own the run") || model_requests(&server) > 2 {
            break said;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the thawed worker never stopped the run: {said}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert!(signal("TERM").success());
    assert!(zombie.wait().unwrap().success(), "{said}");
    assert_eq!(
        model_requests(&server),
        2,
        "the thawed worker asked the model again: {}\n{said}",
        server.report()
    );
    assert_eq!(sb.show("z"), done);
}

/// A model server whose first answer is a 429 asking to wait `ms`.
fn told_to_wait(ms: u64) -> ModelServer {
    server_with(
        &format!(
            r#"{{"turns": [{{"text": "Hello.",
                "faults": [{{"kind": "status", "status": 429, "retry_after_ms": {ms}, "times": 1}}]}}]}}"#
        ),
        0,
    )
}

/// Request `later` reached the server at least `ms` after request 0.
#[track_caller]
fn arrived_after(report: &Value, later: usize, ms: u64) {
    let requests = report["requests"].as_array().unwrap();
    let arrived = |i: usize| requests[i]["arrived_ms"].as_u64().unwrap();
    assert!(
        arrived(later) >= arrived(0) + ms,
        "a request left {} ms after the 429, inside the pause it asked for: {report}",
        arrived(later) - arrived(0)
    );
}

/// Starts `stephost run` of the chat step on `input` in a process of its
/// own, and returns once the model was asked.
fn run_in_another_process(
    sb: &Sandbox,
    server: &ModelServer,
    input: &str,
    run_id: &str,
) -> std::process::Child {
    let child = sb
        .command(&[
            "run",
            guests::CHAT_STEP,
            "--input",
            input,
            "--run-id",
            run_id,
        ])
        .env("STEPHOST_TEST_MODEL_KEY", KEY)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while model_requests(server) == 0 {
        assert!(std::time::Instant::now() < deadline, "no request came");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    child
}

#[test]
fn a_pause_one_process_is_told_holds_back_another_process_on_the_ledger() {
    // One process's run is told to wait 1.5 s. A run started in another
    // process after that must wait out the same pause: it is kept by the
    // ledger, not by the process that was told.
    let server = told_to_wait(1500);
    let sb = Sandbox::with_config(BIN, &config("openai-chat", &server.url(), ""));
    let input = r#"{"model":"support","message":"hi"}"#;
    let mut first = run_in_another_process(&sb, &server, input, "x1");
    stephost(
        &sb,
        &["run", guests::CHAT_STEP, "--input", input, "--run-id", "x2"],
    )
    .expect_code(0);
    assert!(first.wait().unwrap().success());
    let report = server.report();
    let requests = report["requests"].as_array().unwrap();
    assert_eq!(requests.len(), 3, "{report}");
    assert_eq!(requests[0]["status"], 429, "{report}");
    arrived_after(&report, 1, 1_450);
}

#[test]
fn a_run_that_would_wait_long_for_its_model_leaves_memory_and_a_worker_wakes_it() {
    // One process's run is told to wait 5 s. A run started after that would
    // wait past the 2 s slept in place: it leaves memory, waiting, holding
    // no thread, and a worker wakes it when the pause is over.
    let server = told_to_wait(5000);
    let sb = Sandbox::with_config(BIN, &config("openai-chat", &server.url(), ""));
    let input = r#"{"model":"support","message":"hi"}"#;
    let mut first = run_in_another_process(&sb, &server, input, "w1");
    let held = stephost(
        &sb,
        &["run", guests::CHAT_STEP, "--input", input, "--run-id", "w2"],
    );
    held.expect_code(7);
    let show = sb.show("w2");
    assert_eq!(show["run"]["status"], "waiting", "{show:#}");
    assert!(show["run"]["wake_at_ms"].as_i64().is_some(), "{show:#}");
    assert!(calls(&show).is_empty(), "the call was recorded: {show:#}");
    assert_eq!(model_requests(&server), 1, "the held run asked the model");
    assert!(first.wait().unwrap().success());
    stephost(&sb, &["worker", "--exit-when-idle"]).expect_code(0);
    assert_eq!(sb.show("w2")["run"]["status"], "completed");
    let report = server.report();
    let requests = report["requests"].as_array().unwrap();
    assert_eq!(requests.len(), 3, "{report}");
    arrived_after(&report, 2, 4_950);
}

#[test]
fn answers_are_streamed_so_a_long_one_outlives_the_timeout_and_a_cut_one_is_asked_again() {
    // The first answer trickles in 64-byte pieces 100 ms apart, for about
    // two seconds, past the 500 ms timeout, which bounds each pause, not the
    // whole answer. The second is cut after two events: a failed attempt,
    // asked again.
    let text = "The parcel left the depot this morning and will arrive tomorrow.";
    let server = server_with(
        &format!(
            r#"{{"turns": [
                {{"text": "{text}", "sse_write_bytes": 64, "sse_gap_ms": 100}}
            ]}}"#
        ),
        0,
    );
    let sb = Sandbox::with_config(
        BIN,
        &config("anthropic-messages", &server.url(), "").replace(
            "max_tokens = 1024\n",
            "max_tokens = 1024\ntimeout_ms = 500\n",
        ),
    );
    let input = r#"{"model":"support","message":"Where is my parcel?"}"#;
    let ran = stephost(
        &sb,
        &[
            "run",
            guests::CHAT_STEP,
            "--input",
            input,
            "--run-id",
            "long",
        ],
    );
    ran.expect_code(0);
    assert_eq!(ran.json()["text"], text, "{}", ran.stdout);
    let report = server.report();
    let first = &report["requests"][0];
    assert_eq!(first["stream"], true, "{report}");
    let took = first["finished_ms"].as_u64().unwrap() - first["arrived_ms"].as_u64().unwrap();
    assert!(
        took > 500,
        "the answer took {took} ms, not past the timeout"
    );

    let cut = server_with(
        &format!(
            r#"{{"turns": [{{"text": "{text}", "faults": [{{"kind": "cut", "after_events": 2}}]}}]}}"#
        ),
        0,
    );
    sb.set_config(&config("openai-chat", &cut.url(), ""));
    let ran = stephost(
        &sb,
        &[
            "run",
            guests::CHAT_STEP,
            "--input",
            input,
            "--run-id",
            "cut",
        ],
    );
    ran.expect_code(0);
    assert_eq!(ran.json()["text"], text, "{}", ran.stdout);
    assert_eq!(model_requests(&cut), 2);
    let show = sb.show("cut");
    let attempts: Vec<(&str, &str)> = show["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["result"].as_str().unwrap(),
                a["detail"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(attempts.len(), 2, "{attempts:?}");
    assert_eq!(attempts[0].0, "retryable", "{attempts:?}");
    assert!(attempts[0].1.contains("stream"), "{attempts:?}");
    assert_eq!(attempts[1].0, "ok", "{attempts:?}");
}

#[test]
fn an_alias_switched_to_another_api_keeps_old_runs_replaying() {
    let (server, sb) = keyed_sandbox("openai-chat", "");
    let ran = stephost(
        &sb,
        &["run", guests::CHAT_STEP, "--input", REFUND, "--run-id", "o"],
    );
    ran.expect_code(0);
    assert_eq!(model_requests(&server), 3);
    sb.set_config(&config("anthropic-messages", &server.url(), ""));
    stephost(&sb, &["replay", "o"]).expect_code(0);
    assert_eq!(model_requests(&server), 3, "replay asked the model");
    // New runs of the same step go to the other API.
    let ran = stephost(
        &sb,
        &["run", guests::CHAT_STEP, "--input", REFUND, "--run-id", "n"],
    );
    ran.expect_code(0);
    let report = server.report();
    let paths: Vec<&str> = report["requests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["path"].as_str().unwrap())
        .collect();
    assert_eq!(
        paths,
        [
            "/v1/chat/completions",
            "/v1/chat/completions",
            "/v1/chat/completions",
            "/v1/messages",
            "/v1/messages",
            "/v1/messages"
        ]
    );
    let _: Value = ran.json();
}

#[test]
fn a_redacted_value_is_nowhere_in_the_ledger_and_a_replay_still_checks_it() {
    const CARD: &str = "4111-1111-1111-1111";
    const ANSWER_SECRET: &str = "PIN 8642";
    let server = server_with(
        &format!(
            r#"{{"turns": [{{"text": "Noted, {ANSWER_SECRET}. Anything else?", "sse_gap_ms": 150}}]}}"#
        ),
        0,
    );
    let sb = Sandbox::with_config(
        BIN,
        &config(
            "openai-chat",
            &server.url(),
            &format!(
                r#"
[effects."vault.read"]
kind = "static"
class = "read"
response = '{{"card": "{CARD}", "holder": "C. One"}}'

[redact."vault.read"]
response = ["/card"]

[redact."models.support"]
request = ["/messages/*/content/*/text"]
response = ["/content/0/text"]
"#
            ),
        ),
    );
    let key = sb.path("chain.key");
    std::fs::write(&key, "a test chain key of enough bytes, 0123456789").unwrap();
    std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let with_key = |args: &[&str]| {
        sb.stephost_with_envs(
            &[
                ("STEPHOST_TEST_MODEL_KEY", KEY.as_ref()),
                ("STEPHOST_CHAIN_KEY_FILE", key.as_os_str()),
            ],
            args,
        )
    };
    let input =
        r#"{"model":"support","message":"Please check my card.","with_card":true,"quiet":true}"#;
    let ran = with_key(&["run", guests::CHAT_STEP, "--input", input, "--run-id", "p"]);
    ran.expect_code(0);
    // The model was sent the real request.
    assert_eq!(ran.json()["stop"], "stop", "{}", ran.stdout);
    assert!(
        server.report().to_string().contains(CARD),
        "the model was not sent the card"
    );
    for secret in [CARD, ANSWER_SECRET] {
        assert!(
            !sb.ledger_contains(secret),
            "{secret} is in the ledger's files"
        );
    }
    let show = with_key(&["show", "p", "--json"]);
    show.expect_code(0);
    assert!(show.stdout.contains("stephost_redacted"), "{}", show.stdout);
    let export = with_key(&["export", "p"]);
    export.expect_code(0);
    for secret in [CARD, ANSWER_SECRET] {
        assert!(!show.stdout.contains(secret), "{secret} in show");
        assert!(!export.stdout.contains(secret), "{secret} in the export");
    }
    with_key(&["verify", "p"]).expect_code(0);
    // A replay still checks the redacted request: the same run replays (the
    // card it sends the model now the marker of the card it read); one whose
    // model request would differ is a divergence.
    with_key(&["replay", "p"]).expect_code(0);
    let other = sb.path("other.json");
    let mut fixture: Value = export.json();
    fixture["input"] = Value::String(input.replace("\"quiet\"", "\"max_tokens\":7,\"quiet\""));
    std::fs::write(&other, fixture.to_string()).unwrap();
    let diverged = with_key(&[
        "replay",
        "--fixture",
        other.to_str().unwrap(),
        "--module",
        guests::CHAT_STEP,
    ]);
    assert_eq!(diverged.code, Some(4), "{diverged:?}");
    assert!(
        diverged.stdout.contains("call #2 diverged"),
        "{}",
        diverged.stdout
    );
    assert_eq!(model_requests(&server), 1);

    // Through the API (what the console shows), and the event stream while
    // another such run streams its answer in: neither value, anywhere.
    let key_file = key.to_str().unwrap();
    let served = sb.serve(
        &[],
        &[
            ("STEPHOST_CHAIN_KEY_FILE", key_file),
            ("STEPHOST_TEST_MODEL_KEY", KEY),
        ],
    );
    let digest = served.client().upload(guests::CHAT_STEP);
    let events = served.client().events_until(
        "\"run_id\":\"q\",\"status\":\"completed\"",
        std::time::Duration::from_secs(60),
        || {
            served
                .post(
                    "/api/runs",
                    &serde_json::json!({
                        "module_digest": digest,
                        "run_id": "q",
                        "input": serde_json::from_str::<Value>(input).unwrap(),
                    }),
                )
                .expect(201);
        },
    );
    let mut seen = events;
    for run in ["p", "q"] {
        for path in [
            format!("/api/runs/{run}"),
            format!("/api/runs/{run}/calls"),
            format!("/api/runs/{run}/calls/2"),
            format!("/api/runs/{run}/export"),
        ] {
            seen.push_str(&served.get(&path).body);
        }
    }
    assert!(seen.contains("stephost_redacted"), "{seen}");
    for secret in [CARD, ANSWER_SECRET] {
        assert!(!seen.contains(secret), "{secret} shown by the API: {seen}");
    }
    assert_eq!(served.stop(), Some(0));
}

/// With traces exported, a model call is a GenAI span (the conventions'
/// attributes), its messages on it only when asked.
#[test]
fn a_model_call_carries_the_gen_ai_attributes_and_its_messages_only_when_asked() {
    let (_server, sb) = keyed_sandbox("openai-chat", "");
    let input = r#"{"model":"support","message":"hello there","max_tokens":300}"#;
    for (run_id, content) in [("m1", false), ("m2", true)] {
        let collector = stephost_tests::otlp::Collector::start();
        let mut env = vec![
            ("STEPHOST_TEST_MODEL_KEY", KEY),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", collector.endpoint()),
        ];
        if content {
            env.push(("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true"));
        }
        let env: Vec<(&str, &std::ffi::OsStr)> =
            env.iter().map(|(k, v)| (*k, v.as_ref())).collect();
        let args = [
            "run",
            guests::CHAT_STEP,
            "--input",
            input,
            "--run-id",
            run_id,
        ];
        sb.stephost_with_envs(&env, &args).expect_code(0);
        let spans = collector.spans();
        let chat = spans
            .iter()
            .find(|s| s.attr("gen_ai.operation.name") == "chat")
            .unwrap_or_else(|| panic!("a chat span: {spans:#?}"));
        assert_eq!(chat.name, "chat scripted-1");
        assert_eq!(chat.kind, 3);
        assert_eq!(chat.attr("gen_ai.provider.name"), "openai");
        assert_eq!(chat.attr("gen_ai.request.model"), "scripted-1");
        assert_eq!(chat.attr("gen_ai.request.max_tokens"), 300);
        assert_eq!(chat.attr("server.address"), "127.0.0.1");
        assert!(chat.attr("gen_ai.response.model").is_string(), "{chat:#?}");
        assert!(chat.attr("gen_ai.response.id").is_string(), "{chat:#?}");
        assert!(chat.attr("gen_ai.usage.input_tokens").as_i64().unwrap() > 0);
        assert!(chat.attr("gen_ai.usage.output_tokens").as_i64().unwrap() > 0);
        assert!(chat.attr("gen_ai.response.finish_reasons").is_array());
        let carried = chat.attributes.keys().any(|k| k.ends_with(".messages"));
        assert_eq!(carried, content, "{chat:#?}");
        if content {
            assert!(
                chat.attr("gen_ai.input.messages")
                    .as_str()
                    .unwrap()
                    .contains("hello there")
            );
        }
        let text = format!("{spans:?}");
        assert!(!text.contains(KEY), "the key is on a span");
    }
}
