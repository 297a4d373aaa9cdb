//! Child runs: a step starts steps as runs of their own and joins them; a
//! start is one commit with the child's row, a child's end reaches its
//! waiting parent, and the order children are joined in is recorded.

use std::collections::BTreeSet;

use serde_json::{Value, json};
use stephost_tests::{Sandbox, calls, guests};

const BIN: &str = env!("CARGO_BIN_EXE_stephost-crash");

/// `orders` and `echo`, the `square` step, and `extra` more `[limits]`.
fn config(extra: &str) -> String {
    format!(
        "{}\n[steps.square]\nmodule = {:?}\n\n[limits]\n{extra}\n",
        stephost_tests::BASE_CONFIG,
        guests::SQUARE
    )
}

fn runs(sb: &Sandbox) -> Vec<Value> {
    sb.stephost(&["runs", "--json"])
        .expect_code(0)
        .json()
        .as_array()
        .unwrap()
        .clone()
}

/// The runs whose parent is `parent`, in the order it started them.
fn children_of(sb: &Sandbox, parent: &str) -> Vec<Value> {
    let mut children: Vec<Value> = runs(sb)
        .into_iter()
        .filter(|r| r["parent"]["run_id"] == parent)
        .collect();
    children.sort_by_key(|c| c["parent"]["seq"].as_u64());
    children
}

/// Runs workers until run `run_id` has finished (a worker that finds
/// nothing due, a child asleep until later, exits; the next one takes what
/// became due).
fn finish(sb: &Sandbox, run_id: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
    loop {
        sb.stephost(&["worker", "--exit-when-idle", "--concurrency", "4"])
            .expect_code(0);
        let status = sb.show(run_id)["run"]["status"].clone();
        if status != "waiting" && status != "pending" && status != "running" {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "run {run_id} is still {status}"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

fn output(sb: &Sandbox, run_id: &str) -> Value {
    let show = sb.show(run_id);
    assert_eq!(show["run"]["status"], "completed", "{show:#}");
    serde_json::from_str(show["run"]["output"].as_str().unwrap()).unwrap()
}

#[test]
fn a_parent_joins_each_child_once_in_the_order_they_ended_and_replays_it() {
    let sb = Sandbox::with_config(BIN, &config(""));
    // The first child sleeps: it is likely to end after the others.
    let input = json!({"n": 3, "fail": [1], "sleep_ms": [1500, 0, 0]}).to_string();
    let ran = sb.run(guests::FANOUT, &input, "p");
    ran.expect_code(7);
    let show = sb.show("p");
    assert_eq!(show["run"]["status"], "waiting");
    let recorded = calls(&show);
    for (seq, call) in recorded.iter().take(3).enumerate() {
        assert_eq!(call["function"], "start", "{call:#}");
        assert_eq!(call["class"], "write");
        assert_eq!(
            call["state"], "succeeded",
            "started with its child, in one commit"
        );
        let child = &children_of(&sb, "p")[seq];
        assert_eq!(child["parent"]["seq"], seq as u64 + 1);
        assert_eq!(child["parent"]["join_set"], "squares");
        assert_eq!(child["root_run_id"], "p");
        assert_eq!(child["world"], "stephost:step/step@0.3.0");
    }
    assert_eq!(recorded[3]["function"], "join-next");
    assert_eq!(recorded[3]["class"], "suspend");
    let tree = sb.stephost(&["tree", "p", "--json"]).expect_code(0).json();
    assert_eq!(tree["status"], "waiting");
    let waits = tree["waits_for"].as_str().unwrap();
    assert!(
        waits.contains("runs.join-next") && waits.contains("squares"),
        "{waits}"
    );
    assert_eq!(tree["children"].as_array().unwrap().len(), 3);

    finish(&sb, "p");
    let out = output(&sb, "p");
    let started: Vec<&str> = out["started"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    let children = children_of(&sb, "p");
    assert_eq!(children.len(), 4, "three in the set and one called");
    let ids: Vec<&str> = children
        .iter()
        .map(|c| c["run_id"].as_str().unwrap())
        .collect();
    assert_eq!(&ids[..3], &started[..]);
    let joined = out["joined"].as_array().unwrap();
    let joined_ids: BTreeSet<&str> = joined
        .iter()
        .map(|j| j["run_id"].as_str().unwrap())
        .collect();
    assert_eq!(
        joined_ids,
        started.iter().copied().collect(),
        "each joined once"
    );
    // Joined in the order they ended (the order their ends committed, the
    // parent's inbox), whatever the order they were started in.
    let tree = sb.stephost(&["tree", "p", "--json"]).expect_code(0).json();
    let mut by_arrival: Vec<(u64, String)> = tree["children"].as_array().unwrap()[..3]
        .iter()
        .map(|c| {
            (
                c["arrival"].as_u64().unwrap(),
                c["run_id"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    by_arrival.sort();
    let joined_order: Vec<&str> = joined
        .iter()
        .map(|j| j["run_id"].as_str().unwrap())
        .collect();
    assert_eq!(
        joined_order,
        by_arrival
            .iter()
            .map(|(_, id)| id.as_str())
            .collect::<Vec<_>>(),
        "{out:#}"
    );
    let failed = joined.iter().find(|j| j["run_id"] == started[1]).unwrap();
    assert_eq!(failed["ok"], false);
    assert!(
        failed["value"]
            .as_str()
            .unwrap()
            .contains("square 1 failed"),
        "{failed}"
    );
    let ok = joined.iter().find(|j| j["run_id"] == started[2]).unwrap();
    assert_eq!(ok["value"], json!({"n": 2, "square": 4}));
    assert_eq!(out["called"], json!({"n": 100, "square": 10000}));
    assert_eq!(out["left"], Value::Null);
    let nodes = tree["children"].as_array().unwrap();
    assert_eq!(nodes.len(), 4);
    assert_eq!(nodes[1]["status"], "failed");
    assert!(nodes.iter().all(|n| n["waits_for"].is_null()));
    let text = sb.stephost(&["tree", "p"]);
    text.expect_code(0);
    assert!(
        text.stdout
            .lines()
            .next()
            .unwrap()
            .starts_with("p completed"),
        "{}",
        text.stdout
    );
    assert!(
        text.stdout.contains(&format!("  {} failed", started[1])),
        "{}",
        text.stdout
    );
    // Children 0, 2 and the called one wrote once each.
    let orders: BTreeSet<u64> = sb
        .received("orders.jsonl")
        .iter()
        .map(|o| o["request"]["n"].as_u64().unwrap())
        .collect();
    assert_eq!(orders, BTreeSet::from([0, 2, 100]));

    // The parent replays from its own record: the same joins in the same
    // order, no child started or read.
    sb.set_config("");
    let replay = sb.stephost(&["replay", "p", "--json"]);
    replay.expect_code(0);
    let report = replay.json();
    assert_eq!(report["result"], "consistent", "{report:#}");
    assert_eq!(
        serde_json::from_str::<Value>(report["output"].as_str().unwrap()).unwrap(),
        out
    );
    sb.stephost(&["verify", "p"]).expect_code(0);
    sb.stephost(&["verify", started[0]]).expect_code(0);
}

#[test]
fn a_parent_killed_right_after_a_start_resumes_without_a_second_child() {
    let input = json!({"n": 3}).to_string();
    // The children a parent that never crashed starts.
    let calm = Sandbox::with_config(BIN, &config(""));
    calm.run(guests::FANOUT, &input, "p").expect_code(7);
    let expected: Vec<Value> = children_of(&calm, "p")
        .iter()
        .map(|c| c["run_id"].clone())
        .collect();
    assert_eq!(expected.len(), 3);

    let sb = Sandbox::with_config(BIN, &config(""));
    let ran = sb.run_crashing_at("after-started@2", guests::FANOUT, &input, "p");
    assert_ne!(ran.code, Some(0), "{}", ran.stderr);
    // A start needs no fsync of its own: the crash kept both starts with
    // their children, or lost them with the parent's record. Run again, the
    // parent starts what it had not recorded, under the same ids.
    let kept = children_of(&sb, "p").len();
    assert!(kept == 2 || kept == 0, "{kept} children after the crash");
    sb.run(guests::FANOUT, &input, "p").expect_code(7);
    finish(&sb, "p");
    let out = output(&sb, "p");
    let children: Vec<Value> = children_of(&sb, "p")
        .iter()
        .map(|c| c["run_id"].clone())
        .collect();
    assert_eq!(children.len(), 4, "no child started twice: {children:#?}");
    assert_eq!(&children[..3], &expected[..], "the same ids, crash or not");
    assert_eq!(out["joined"].as_array().unwrap().len(), 3);
    assert_eq!(sb.received("orders.jsonl").len(), 4);
}

#[test]
fn a_child_with_a_business_key_has_an_id_from_its_key() {
    let sb = Sandbox::with_config(BIN, &config(""));
    let input = json!({"n": 2, "keyed": true}).to_string();
    sb.run(guests::FANOUT, &input, "p").expect_code(7);
    let again = sb.run(guests::FANOUT, &input, "q");
    again.expect_code(7);
    let p: Vec<Value> = children_of(&sb, "p")
        .iter()
        .map(|c| c["run_id"].clone())
        .collect();
    let q: Vec<Value> = children_of(&sb, "q")
        .iter()
        .map(|c| c["run_id"].clone())
        .collect();
    assert_eq!(p.len(), 2);
    assert!(
        p.iter().all(|id| !q.contains(id)),
        "another parent, other children"
    );
    finish(&sb, "p");
    assert_eq!(output(&sb, "p")["joined"].as_array().unwrap().len(), 2);
}

#[test]
fn starts_past_a_limit_or_of_an_unknown_step_are_refused_and_start_nothing() {
    let sb = Sandbox::with_config(BIN, &config("children_per_run_max = 2"));
    let ran = sb.run(guests::FANOUT, &json!({"n": 3}).to_string(), "p");
    ran.expect_code(3);
    let show = sb.show("p");
    let error = show["run"]["error"].as_str().unwrap();
    assert!(error.contains("children_per_run_max = 2"), "{error}");
    assert_eq!(children_of(&sb, "p").len(), 2);
    let third = &calls(&show)[2];
    assert_eq!(third["state"], "failed");
    let outcome: Value = serde_json::from_str(third["outcome"].as_str().unwrap()).unwrap();
    assert_eq!(outcome["err"]["kind"], "budget", "{third:#}");

    sb.set_config(&config("children_pending_max = 2"));
    let ran = sb.run(guests::FANOUT, &json!({"n": 3}).to_string(), "pending");
    ran.expect_code(3);
    let error = sb.show("pending")["run"]["error"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(error.contains("children_pending_max = 2"), "{error}");
    assert_eq!(children_of(&sb, "pending").len(), 2);
    sb.set_config(&config("runs_per_tree_max = 3"));
    let ran = sb.run(guests::FANOUT, &json!({"n": 3}).to_string(), "tree");
    ran.expect_code(3);
    let error = sb.show("tree")["run"]["error"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(error.contains("runs_per_tree_max = 3"), "{error}");
    assert_eq!(
        children_of(&sb, "tree").len(),
        2,
        "the root and two children"
    );

    let ran = sb.run(
        guests::FANOUT,
        &json!({"n": 1, "step": "nope"}).to_string(),
        "u",
    );
    ran.expect_code(3);
    let error = sb.show("u")["run"]["error"].as_str().unwrap().to_string();
    assert!(error.contains("no step named \"nope\""), "{error}");
    assert!(
        error.contains("square"),
        "names the steps it knows: {error}"
    );
    assert!(children_of(&sb, "u").is_empty());
}

/// A root's model budget is its tree's: four children of a parent with a
/// budget for one answer each ask the scripted model; whatever their
/// timing, one is answered and the others are refused `budget` before
/// anything is sent, naming the tree. Without the tree's budget each
/// child's own (the configuration's) would let all four through.
#[test]
fn a_trees_runs_share_their_roots_model_budget() {
    let server = model_server::ModelServer::start_with(model_server::Config {
        script: model_server::Script::from_json(
            r#"{"turns": [{"text": "done", "usage": {"input_tokens": 100, "output_tokens": 300}}]}"#,
        )
        .unwrap(),
        ..model_server::Config::default()
    })
    .unwrap();
    let sb = Sandbox::with_config(
        BIN,
        &format!(
            "{}
[steps.chat]
module = {:?}

[models.support]
api = \"openai-chat\"
\
             url = \"{}\"
model = \"scripted-1\"
",
            stephost_tests::BASE_CONFIG,
            guests::CHAT_STEP,
            server.url()
        ),
    );
    // One call holds its input (about 50 tokens) and max_tokens (300) and
    // spends 400: room for one in 600, never two.
    let input = json!({
        "n": 3,
        "step": "chat",
        "child_input": {"model": "support", "message": "hello", "max_tokens": 300},
    });
    sb.stephost(&[
        "run",
        guests::FANOUT,
        "--input",
        &input.to_string(),
        "--run-id",
        "p",
        "--model-tokens-max",
        "600",
    ])
    .expect_code(7);
    finish(&sb, "p");
    let out = output(&sb, "p");
    let mut answers: Vec<Value> = out["joined"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["value"].clone())
        .collect();
    answers.push(out["called"].clone());
    let answered = answers.iter().filter(|a| a["text"] == "done").count();
    let refused: Vec<&Value> = answers.iter().filter(|a| a["error"] == "budget").collect();
    assert_eq!((answered, refused.len()), (1, 3), "{out:#}");
    for refusal in refused {
        let message = refusal["message"].as_str().unwrap();
        assert!(
            message.contains("tree (root p)") && message.contains("model_tokens_max = 600"),
            "{message}"
        );
    }
    assert_eq!(server.report()["requests_total"], 1, "one call was sent");
    // The refusals are recorded: the tree replays as it ran.
    for child in children_of(&sb, "p") {
        let id = child["run_id"].as_str().unwrap();
        sb.stephost(&["replay", id]).expect_code(0);
    }
}

#[test]
fn a_step_cancels_a_child_it_started_and_joins_it_as_cancelled() {
    let sb = Sandbox::with_config(BIN, &config(""));
    // Both children are pending when the parent (run in-process, alone)
    // cancels the first.
    let input = json!({"n": 2, "cancel": [0]}).to_string();
    sb.run(guests::FANOUT, &input, "p").expect_code(7);
    let show = sb.show("p");
    let cancel = &calls(&show)[2];
    assert_eq!(
        (&cancel["function"], &cancel["class"]),
        (&json!("cancel"), &json!("observe"))
    );
    let first = children_of(&sb, "p")[0]["run_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(sb.show(&first)["run"]["cancel"]["by"], "run p");
    finish(&sb, "p");
    let out = output(&sb, "p");
    let cancelled = out["joined"]
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["run_id"] == first.as_str())
        .unwrap()
        .clone();
    assert_eq!(cancelled["cancelled"], true, "{out:#}");
    assert_eq!(
        cancelled["value"],
        "cancelled by run p: its parent cancelled it (call #3)"
    );
    assert_eq!(
        sb.received("orders.jsonl").len(),
        2,
        "the second child and the called one wrote"
    );
    sb.stephost(&["replay", "p"]).expect_code(0);
}

/// Runs workers until nothing is due now (a child asleep until later waits).
fn drain(sb: &Sandbox) {
    sb.stephost(&["worker", "--exit-when-idle", "--concurrency", "4"])
        .expect_code(0);
}

fn status(sb: &Sandbox, run_id: &str) -> Value {
    sb.show(run_id)["run"]["status"].clone()
}

#[test]
fn a_cancelled_tree_ends_cancelled_top_to_bottom_and_begins_nothing_more() {
    let sb = Sandbox::with_config(BIN, &config(""));
    let input = json!({"n": 2, "sleep_ms": [600000, 600000]}).to_string();
    sb.run(guests::FANOUT, &input, "p").expect_code(7);
    drain(&sb);
    let children = children_of(&sb, "p");
    for child in &children {
        assert_eq!(status(&sb, child["run_id"].as_str().unwrap()), "waiting");
    }
    let cancelled = sb.stephost(&[
        "cancel",
        "p",
        "--by",
        "ops",
        "--reason",
        "wrong customer",
        "--json",
    ]);
    cancelled.expect_code(0);
    let listed = cancelled.json()["cancelled"].as_array().unwrap().clone();
    assert_eq!(listed.len(), 3, "the run and both children: {listed:#?}");
    assert_eq!(listed[0]["run_id"], "p", "top down");
    for run in listed {
        assert_eq!(run["status"], "cancelled", "{run}");
        let show = sb.show(run["run_id"].as_str().unwrap());
        assert_eq!(
            show["run"]["error"], "cancelled by ops: wrong customer",
            "{show:#}"
        );
        assert_eq!(show["run"]["cancel"]["by"], "ops");
    }
    // Nothing more was begun: no child wrote, and a worker finds nothing.
    assert!(sb.received("orders.jsonl").is_empty());
    drain(&sb);
    let tree = sb.stephost(&["tree", "p", "--json"]).expect_code(0).json();
    assert_eq!(tree["status"], "cancelled");
    assert!(
        tree["children"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["status"] == "cancelled")
    );
    // A finished run is not cancelled again.
    let again = sb.stephost(&["cancel", "p", "--by", "ops"]);
    again.expect_code(2);
    assert!(again.stderr.contains("cancelled"), "{}", again.stderr);
    sb.stephost(&["verify", "p"]).expect_code(0);
}

#[test]
fn a_parent_joins_a_cancelled_child_as_cancelled_and_goes_on() {
    let sb = Sandbox::with_config(BIN, &config(""));
    let input = json!({"n": 2, "sleep_ms": [600000, 0]}).to_string();
    sb.run(guests::FANOUT, &input, "p").expect_code(7);
    drain(&sb);
    let sleeper = children_of(&sb, "p")[0]["run_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(status(&sb, &sleeper), "waiting");
    assert_eq!(status(&sb, "p"), "waiting");
    let cancelled = sb.stephost(&["cancel", &sleeper, "--by", "ops", "--json"]);
    cancelled.expect_code(0);
    assert_eq!(cancelled.json()["cancelled"].as_array().unwrap().len(), 1);
    finish(&sb, "p");
    let out = output(&sb, "p");
    let joined = out["joined"].as_array().unwrap();
    let cancelled = joined
        .iter()
        .find(|j| j["run_id"] == sleeper.as_str())
        .unwrap();
    assert_eq!(cancelled["ok"], false);
    assert_eq!(cancelled["cancelled"], true);
    assert_eq!(cancelled["value"], "cancelled by ops");
    assert_eq!(out["called"], json!({"n": 100, "square": 10000}));
}

#[test]
fn children_end_with_their_parent_unless_detached() {
    let sb = Sandbox::with_config(BIN, &config(""));
    let attached = json!({"n": 2, "sleep_ms": [600000, 600000], "join": false}).to_string();
    let ran = sb.run(guests::FANOUT, &attached, "p");
    ran.expect_code(0);
    let detached = json!({"n": 1, "sleep_ms": [1500], "join": false, "detach": true}).to_string();
    sb.run(guests::FANOUT, &detached, "d").expect_code(0);
    // The children of p were marked with p's end; the detached one runs.
    for child in children_of(&sb, "p") {
        let show = sb.show(child["run_id"].as_str().unwrap());
        assert_eq!(show["run"]["cancel"]["by"], "run p", "{show:#}");
    }
    let orphan = children_of(&sb, "d")[0]["run_id"]
        .as_str()
        .unwrap()
        .to_string();
    finish(&sb, &orphan);
    for child in children_of(&sb, "p") {
        let show = sb.show(child["run_id"].as_str().unwrap());
        assert_eq!(show["run"]["status"], "cancelled", "{show:#}");
        assert!(
            show["run"]["error"]
                .as_str()
                .unwrap()
                .contains("its parent ended (completed)"),
            "{show:#}"
        );
    }
    let out = output(&sb, &orphan);
    assert_eq!(
        out,
        json!({"n": 0, "square": 0}),
        "the detached child outlived its parent"
    );
    assert_eq!(
        sb.received("orders.jsonl").len(),
        1,
        "only the detached child wrote"
    );
}

#[test]
fn a_cancelled_child_with_a_write_in_flight_settles_it_and_guesses_nothing() {
    let sb = Sandbox::with_config(BIN, &config(""));
    sb.run(guests::FANOUT, &json!({"n": 2}).to_string(), "p")
        .expect_code(7);
    // The worker dies right after the first child's write is recorded
    // `started`, before it is sent.
    let died = sb.stephost_crashing_at(
        "after-started@1",
        &["worker", "--exit-when-idle", "--concurrency", "1"],
    );
    assert_ne!(died.code, Some(0), "{}", died.stderr);
    let children = children_of(&sb, "p");
    let (first, second): (Vec<&Value>, Vec<&Value>) = children.iter().partition(|c| {
        sb.show(c["run_id"].as_str().unwrap())["calls"]
            .as_array()
            .unwrap()
            .len()
            == 1
    });
    assert_eq!((first.len(), second.len()), (1, 1), "{children:#?}");
    let in_flight = first[0]["run_id"].as_str().unwrap().to_string();
    let unstarted = second[0]["run_id"].as_str().unwrap().to_string();
    assert_eq!(calls(&sb.show(&in_flight))[0]["state"], "started");

    let cancelled = sb.stephost(&["cancel", "p", "--by", "ops", "--json"]);
    cancelled.expect_code(0);
    assert_eq!(status(&sb, "p"), "cancelled");
    assert_eq!(status(&sb, &unstarted), "cancelled");
    // The child whose write was in flight is settled with the receiver
    // (its file receiver deduplicates by operation id): the write lands
    // once, and with no further call to refuse, the child completes.
    let resumed = sb.stephost(&["resume", &in_flight]);
    resumed.expect_code(0);
    assert_eq!(status(&sb, &in_flight), "completed");
    assert_eq!(calls(&sb.show(&in_flight))[0]["state"], "succeeded");
    assert_eq!(sb.received("orders.jsonl").len(), 1);
}

/// A server on `sb`'s ledger whose run `p` waits for two children asleep
/// for ten minutes; the tree as the API shows it then.
fn serve_a_waiting_tree(sb: &Sandbox) -> (stephost_tests::server::Served, Value) {
    let served = sb.serve(&[], &[]);
    let client = served.client();
    let digest = client.upload(guests::FANOUT);
    client
        .post(
            "/api/runs",
            &json!({"module_digest": digest, "run_id": "p",
                    "input": {"n": 2, "sleep_ms": [600000, 600000]}}),
        )
        .expect(201);
    let tree = client.wait_for("both children asleep", "/api/runs/p/tree", |t| {
        t["status"] == "waiting"
            && t["children"]
                .as_array()
                .is_some_and(|c| c.len() == 2 && c.iter().all(|c| c["status"] == "waiting"))
    });
    (served, tree)
}

#[test]
fn the_api_shows_a_tree_and_cancels_it_for_the_servers_worker_to_end() {
    let sb = Sandbox::with_config(BIN, &config(""));
    let (served, tree) = serve_a_waiting_tree(&sb);
    let client = served.client();
    assert!(
        tree["waits_for"]
            .as_str()
            .unwrap()
            .contains("runs.join-next"),
        "{tree:#}"
    );
    let cancelled = client
        .post(
            "/api/runs/p/cancel",
            &json!({"by": "ops", "reason": "test"}),
        )
        .expect(200);
    assert_eq!(cancelled["by"], "ops");
    assert_eq!(
        cancelled["cancelled"].as_array().unwrap().len(),
        3,
        "{cancelled:#}"
    );
    let tree = client.wait_for("the tree cancelled", "/api/runs/p/tree", |t| {
        t["status"] == "cancelled"
            && t["children"]
                .as_array()
                .is_some_and(|c| c.iter().all(|c| c["status"] == "cancelled"))
    });
    assert_eq!(tree["error"], "cancelled by ops: test");
    // A server without tokens records the name given, and wants one.
    client
        .post("/api/runs/p/cancel", &json!({}))
        .expect_error(400, "bad_input");
    client
        .post("/api/runs/p/cancel", &json!({"by": "ops"}))
        .expect_error(409, "run_ended");
    client
        .post("/api/runs/nobody/cancel", &json!({"by": "ops"}))
        .expect_error(404, "unknown_run");
    client
        .get("/api/runs/nobody/tree")
        .expect_error(404, "unknown_run");
}

#[test]
fn an_agent_runs_a_turns_tool_calls_at_once_as_children_and_fans_their_results_in() {
    use model_server::{Config, ModelServer, Script};
    const KEY: &str = "sk-test-parallel-agent";
    let server = ModelServer::start_with(Config {
        script: Script::from_json(include_str!(
            "../../../examples/agent-refund/parallel-script.json"
        ))
        .unwrap(),
        key: Some(KEY.into()),
        ..Config::default()
    })
    .unwrap();
    let config = format!(
        r#"
[models.support]
api = "openai-chat"
url = "{}"
model = "scripted-1"
key_env = "STEPHOST_TEST_MODEL_KEY"
max_tokens = 1024

[effects."orders.lookup"]
kind = "static"
class = "read"
response = '{{"order_id": "A-1001", "amount_cents": 30000}}'

[effects."payments.refund"]
kind = "file"
class = "write"
path = "refunds.jsonl"

[steps.agent-refund]
module = {:?}
"#,
        server.url(),
        guests::AGENT_REFUND
    );
    let sb = Sandbox::with_config(BIN, &config);
    let env = [("STEPHOST_TEST_MODEL_KEY", KEY.as_ref())];
    let input = json!({"message": "Refund A-1001 and A-1002, please.", "parallel": true});
    sb.stephost_with_envs(
        &env,
        &[
            "run",
            guests::AGENT_REFUND,
            "--input",
            &input.to_string(),
            "--run-id",
            "agent",
        ],
    )
    .expect_code(7);
    // Workers run the children; the largest refund waits for a person.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
    loop {
        sb.stephost_with_envs(&env, &["worker", "--exit-when-idle", "--concurrency", "4"])
            .expect_code(0);
        if status(&sb, "agent") == "completed" {
            break;
        }
        let waiting = sb.stephost(&["approvals", "--json"]).expect_code(0).json();
        if let Some(approval) = waiting.as_array().unwrap().first() {
            // The root shows what waits for a person below it.
            let tree = sb
                .stephost(&["tree", "agent", "--json"])
                .expect_code(0)
                .json();
            let needs = tree["needs_a_person"].to_string();
            assert!(
                needs.contains(approval["run_id"].as_str().unwrap())
                    && needs.contains("an approval to decide"),
                "{tree:#}"
            );
        }
        for approval in waiting.as_array().unwrap() {
            let run_id = approval["run_id"].as_str().unwrap();
            let seq = approval["seq"].to_string();
            let sha = approval["details_sha256"].as_str().unwrap();
            assert!(
                approval["subject"].as_str().unwrap().contains("$250.00"),
                "{approval}"
            );
            sb.stephost(&["approve", run_id, &seq, "--details", sha, "--by", "ana"])
                .expect_code(0);
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{:#}",
            sb.show("agent")
        );
    }
    let out = output(&sb, "agent");
    assert_eq!(out["refunded_cents"], 29999, "{out:#}");
    assert_eq!(out["refunds"].as_array().unwrap().len(), 2, "{out:#}");
    assert_eq!(out["turns"], 3);
    assert!(
        out["summary"].as_str().unwrap().contains("Both orders"),
        "{out:#}"
    );
    assert_eq!(server.report()["requests_total"], 3, "each turn asked once");
    // Two lookups at once, then two refunds at once: four children, in two
    // join sets, and each refund sent once.
    let tree = sb
        .stephost(&["tree", "agent", "--json"])
        .expect_code(0)
        .json();
    let sets: Vec<&str> = tree["children"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["join_set"].as_str().unwrap())
        .collect();
    assert_eq!(
        sets,
        [
            "agent-turn-1",
            "agent-turn-1",
            "agent-turn-2",
            "agent-turn-2"
        ]
    );
    let refunds: BTreeSet<u64> = sb
        .received("refunds.jsonl")
        .iter()
        .map(|r| r["request"]["amount_cents"].as_u64().unwrap())
        .collect();
    assert_eq!(refunds, BTreeSet::from([4999, 25000]));
    assert_eq!(sb.received("refunds.jsonl").len(), 2);
    // The model got the tool results in the order it made the calls.
    let third = server.report()["requests"][2].to_string();
    let first = third.find("A-1001").unwrap();
    assert!(third[first..].contains("A-1002"), "{third}");
    // The parent replays from its own record: no model, no child.
    sb.set_config("");
    sb.stephost(&["replay", "agent"]).expect_code(0);
    assert_eq!(server.report()["requests_total"], 3);
}

#[test]
fn verify_checks_that_a_childs_parent_call_started_it() {
    let sb = Sandbox::with_config(BIN, &config(""));
    sb.run(guests::FANOUT, &json!({"n": 1}).to_string(), "p")
        .expect_code(7);
    let child = children_of(&sb, "p")[0]["run_id"]
        .as_str()
        .unwrap()
        .to_string();
    let verified = sb.stephost(&["verify", &child]);
    verified.expect_code(0);
    assert!(verified.stdout.starts_with("intact"), "{}", verified.stdout);
    // A row claiming to be started by p's call #1, sealed as a plain record
    // anyone can seal: its seal holds, its link does not.
    let mut forged: stephost_core::RunRecord =
        serde_json::from_value(sb.show(&child)["run"].clone()).unwrap();
    forged.run_id = "c-forged".into();
    forged.seal = Some(
        stephost_core::chain::Signer::plain().seal(&forged, &stephost_core::chain::Head::default()),
    );
    sb.tamper().insert_runs(&[forged]).unwrap();
    let refused = sb.stephost(&["verify", "c-forged"]);
    refused.expect_code(4);
    assert!(
        refused.stdout.contains("call #1 of run p") && refused.stdout.contains("did not start it"),
        "{}",
        refused.stdout
    );
}

#[test]
fn the_console_shows_a_runs_tree_and_cancels_it_in_a_browser() {
    let sb = Sandbox::with_config(BIN, &config(""));
    let (served, _) = serve_a_waiting_tree(&sb);
    let client = served.client();
    served.browse("tree.mjs", &[]);
    let tree = client.get("/api/runs/p/tree").expect(200);
    assert_eq!(tree["status"], "cancelled", "{tree:#}");
    assert_eq!(tree["error"], "cancelled by browser-ana: wrong customer");
}

#[test]
fn a_python_step_starts_and_joins_children_as_the_rust_one_does() {
    let module =
        crate::languages::build("tests/guests/python-fanout/build.sh", "python_fanout.wasm");
    let sb = Sandbox::with_config(BIN, &config(""));
    let input = json!({"n": 3, "fail": [1]}).to_string();
    sb.run(&module, &input, "p").expect_code(7);
    assert_eq!(sb.show("p")["run"]["world"], "stephost:step/step@0.3.0");
    finish(&sb, "p");
    let out = output(&sb, "p");
    let started: BTreeSet<&str> = out["started"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    let joined = out["joined"].as_array().unwrap();
    let joined_ids: BTreeSet<&str> = joined
        .iter()
        .map(|j| j["run_id"].as_str().unwrap())
        .collect();
    assert_eq!(started.len(), 3);
    assert_eq!(joined_ids, started, "{out:#}");
    let failed: Vec<&Value> = joined.iter().filter(|j| j["ok"] == false).collect();
    assert_eq!(failed.len(), 1, "{out:#}");
    assert!(
        failed[0]["value"]
            .as_str()
            .unwrap()
            .contains("square 1 failed")
    );
    assert_eq!(out["called"], json!({"n": 100, "square": 10000}));
    assert_eq!(out["left"], Value::Null);
    assert_eq!(children_of(&sb, "p").len(), 4);
    // A child cancelled by its parent, as the Rust step does it.
    sb.run(&module, &json!({"n": 2, "cancel": [0]}).to_string(), "pc")
        .expect_code(7);
    finish(&sb, "pc");
    let out = output(&sb, "pc");
    let first = &out["started"][0];
    let cancelled = out["joined"]
        .as_array()
        .unwrap()
        .iter()
        .find(|j| &j["run_id"] == first)
        .unwrap();
    assert_eq!(cancelled["ok"], false, "{out:#}");
    assert!(
        cancelled["value"]
            .as_str()
            .unwrap()
            .starts_with("cancelled by run pc"),
        "{out:#}"
    );
    sb.set_config("");
    sb.stephost(&["replay", "p"]).expect_code(0);
}

#[test]
fn a_parent_waiting_for_its_children_is_upgraded_without_starting_them_again() {
    let sb = Sandbox::with_config(BIN, &config(""));
    let input = json!({"n": 2}).to_string();
    sb.run(guests::FANOUT, &input, "p").expect_code(7);
    let before: Vec<Value> = children_of(&sb, "p")
        .iter()
        .map(|c| c["run_id"].clone())
        .collect();
    let upgraded = sb.stephost(&["upgrade", "p", "--module", guests::FANOUT_V2, "--json"]);
    upgraded.expect_code(0);
    let show = sb.show("p");
    assert_eq!(show["run"]["step"], "guest-fanout-v2@0.1.0", "{show:#}");
    let after: Vec<Value> = children_of(&sb, "p")
        .iter()
        .map(|c| c["run_id"].clone())
        .collect();
    assert_eq!(
        before, after,
        "the upgrade replayed the starts: no child started again"
    );
    finish(&sb, "p");
    let out = output(&sb, "p");
    assert_eq!(out["joined"].as_array().unwrap().len(), 2);
    assert_eq!(
        children_of(&sb, "p").len(),
        3,
        "the two, and the one called after"
    );
    sb.set_config("");
    sb.stephost(&["replay", "p"]).expect_code(0);
}

/// Runs three writes, each answered after 2 s, and cancels the run while
/// the first is in flight (with `STEPHOST_BREAK=breaks` if given); the
/// sandbox and the run.
fn cancelled_between_writes(breaks: Option<&str>) -> (Sandbox, Value) {
    // Each write's receiver answers after 2 s: the cancel lands while the
    // first write is in flight, and the commit after it (the write's
    // outcome, the calls made since, the next write's start) is refused.
    let sb = Sandbox::with_config(
        BIN,
        "[effects.orders]\nkind = \"file\"\nclass = \"write\"\npath = \"orders.jsonl\"\n\
         reply_delay_ms = 2000\n",
    );
    let input = json!({"count": 3}).to_string();
    let run = sb
        .command(&[
            "run",
            guests::MULTI_WRITE,
            "--input",
            &input,
            "--run-id",
            "m",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .envs(breaks.map(|b| ("STEPHOST_BREAK", b)))
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while sb.received("orders.jsonl").is_empty() {
        assert!(std::time::Instant::now() < deadline, "no write arrived");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    sb.stephost(&["cancel", "m", "--by", "ops"]).expect_code(0);
    let ran = run.wait_with_output().unwrap();
    assert_eq!(
        ran.status.code(),
        Some(8),
        "exit 8: cancelled; {}",
        String::from_utf8_lossy(&ran.stderr)
    );
    let show = sb.show("m");
    assert_eq!(show["run"]["status"], "cancelled", "{show:#}");
    (sb, show)
}

#[test]
fn a_run_cancelled_between_its_writes_keeps_what_it_recorded_and_verifies() {
    let (sb, show) = cancelled_between_writes(None);
    // Every write that reached the receiver has its outcome recorded: the
    // refused commit's record of what already happened landed.
    let lines = sb.received("orders.jsonl");
    assert!(lines.len() < 3, "the cancel stopped the run: {lines:#?}");
    let writes: Vec<&Value> = calls(&show)
        .iter()
        .filter(|c| c["class"] == "write")
        .collect();
    assert_eq!(writes.len(), lines.len(), "{show:#}");
    for (write, line) in writes.iter().zip(&lines) {
        assert_eq!(write["state"], "succeeded", "{write:#}");
        assert_eq!(write["operation_id"], line["operation_id"]);
    }
    // The seal covers exactly the calls the ledger holds.
    sb.stephost(&["verify", "m"]).expect_code(0);
}

#[test]
fn a_host_dropping_what_a_refused_commit_recorded_fails_verify() {
    // The check above can fail: with the refused commit's record dropped
    // (a test-only switch), the seal names calls the ledger lacks.
    let (sb, _) = cancelled_between_writes(Some("drop-refused-record"));
    let verified = sb.stephost(&["verify", "m"]);
    verified.expect_code(4);
    assert!(
        verified.stdout.contains("calls were dropped"),
        "{}",
        verified.stdout
    );
}
