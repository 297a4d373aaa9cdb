//! Workers as real processes sharing one ledger: submit, claim, execute many
//! runs at once, shut down gracefully, survive SIGKILL, and a frozen worker
//! that wakes after losing its lease writes and sends nothing.

use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use stephost_ledger_postgres::throwaway::{Cluster, TestCa};
use stephost_tests::{BASE_CONFIG, Sandbox, calls, distinct_operations, guests};
use supplier_receiver::Receiver;

const BIN: &str = env!("CARGO_BIN_EXE_stephost-crash");

fn slow_config(reply_delay_ms: u64) -> String {
    format!(
        r#"
[effects.orders]
kind = "file"
class = "write"
path = "orders.jsonl"
reply_delay_ms = {reply_delay_ms}
"#
    )
}

fn signal(child: &Child, name: &str) {
    let ok = std::process::Command::new("kill")
        .args([&format!("-{name}"), &child.id().to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill -{name} failed");
}

fn worker(sb: &Sandbox, args: &[&str]) -> Child {
    let mut all = vec!["worker"];
    all.extend_from_slice(args);
    sb.command(&all)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Freezes `worker` (SIGSTOP) once the file receiver's lock is free: a
/// write has been appended and fsync'd and its slow reply is pending, so
/// the frozen process holds no lock another worker's write would wait for.
fn stop_between_writes(sb: &Sandbox, worker: &Child) {
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(sb.path("orders.jsonl.lock"))
        .unwrap();
    wait_until(
        "the receiver's lock to be free",
        Duration::from_secs(60),
        || lock.try_lock().is_ok(),
    );
    lock.unlock().unwrap();
    signal(worker, "STOP");
}

/// How many runs have completed.
fn completed(sb: &Sandbox) -> usize {
    statuses(sb)
        .iter()
        .filter(|(_, s, _)| s == "completed")
        .count()
}

/// SIGTERM to every worker, then waits for each.
fn stop_workers(workers: &mut [Child]) {
    for w in workers.iter() {
        signal(w, "TERM");
    }
    for w in workers.iter_mut() {
        w.wait().unwrap();
    }
}

/// Every call of each run succeeded, and every write (at `seqs`) is
/// accounted for by its attempts: sent once, or found at the receiver after
/// a crash; never sent twice.
fn each_write_sent_once(sb: &Sandbox, run_ids: impl Iterator<Item = String>, seqs: &[u64]) {
    for id in run_ids {
        let show = sb.show(&id);
        assert!(calls(&show).iter().all(|c| c["state"] == "succeeded"));
        for &seq in seqs {
            let attempts = stephost_tests::attempts_for(&show, seq);
            let sends = attempts.iter().filter(|a| a["kind"] == "send").count();
            let found = attempts.iter().any(|a| a["result"] == "found");
            assert!(
                sends <= 1 && (sends == 1 || found),
                "{id} #{seq}: {attempts:?}"
            );
        }
    }
}

fn submit(sb: &Sandbox, count: u32, run_id: &str) {
    submit_step(
        sb,
        guests::MULTI_WRITE,
        &format!("{{\"count\":{count}}}"),
        run_id,
    );
}

/// The output of `run_id`, which must have completed.
fn completed_output(sb: &Sandbox, run_id: &str) -> Value {
    let show = sb.show(run_id);
    assert_eq!(show["run"]["status"], "completed", "{show:#}");
    serde_json::from_str(show["run"]["output"].as_str().unwrap()).unwrap()
}

/// Submits a run of `guest` on `input` as `run_id`.
fn submit_step(sb: &Sandbox, guest: &str, input: &str, run_id: &str) {
    let out = sb.stephost(&["submit", guest, "--input", input, "--run-id", run_id]);
    out.expect_code(0);
    assert_eq!(out.stdout.trim(), run_id);
}

fn statuses(sb: &Sandbox) -> Vec<(String, String, Value)> {
    sb.stephost(&["runs", "--json"])
        .json()
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["run_id"].as_str().unwrap().to_string(),
                r["status"].as_str().unwrap().to_string(),
                r["owner"].clone(),
            )
        })
        .collect()
}

#[test]
fn a_worker_executes_submitted_runs_several_at_once() {
    let sb = Sandbox::new(BIN);
    for i in 0..8 {
        submit(&sb, 3, &format!("r{i}"));
    }
    // Submitting the same run again returns it; with another input it is refused.
    submit(&sb, 3, "r0");
    sb.stephost(&[
        "submit",
        guests::MULTI_WRITE,
        "--input",
        r#"{"count":9}"#,
        "--run-id",
        "r0",
    ])
    .expect_code(2);
    assert!(statuses(&sb).iter().all(|(_, s, _)| s == "pending"));
    let worker = sb.stephost(&["worker", "--concurrency", "4", "--exit-when-idle"]);
    worker.expect_code(0);
    let runs = statuses(&sb);
    assert_eq!(runs.len(), 8);
    assert!(
        runs.iter().all(|(_, s, o)| s == "completed" && o.is_null()),
        "{runs:?}"
    );
    let lines = sb.received("orders.jsonl");
    assert_eq!(lines.len(), 24);
    distinct_operations(&lines);
    // The runs' commits went through the group committer: at least one
    // per write (its `started` row) and one per run's end, each fsync'd
    // before it was answered; the counts are kept as metrics and reported.
    let commits = sb.metric("group_commit_commit_total");
    let transactions = sb.metric("group_commit_transaction_total");
    let fsyncs = sb.metric("group_commit_fsync_total");
    assert!(commits >= 24 + 8, "{commits} commits");
    assert!(
        (1..=transactions).contains(&fsyncs) && transactions <= commits,
        "{commits} commits, {transactions} transactions, {fsyncs} fsyncs"
    );
    assert!(
        worker.stderr.contains(&format!(
            "{commits} commits in {transactions} transactions and {fsyncs} fsyncs"
        )),
        "{}",
        worker.stderr
    );
}

#[test]
fn retention_deletes_finished_runs_in_the_background_and_prune_does_by_hand() {
    let config = format!("{BASE_CONFIG}\n[retention]\nfinished_before_ms = 1\nevery_ms = 1000\n");
    let sb = Sandbox::with_config(BIN, &config);
    for i in 0..3 {
        submit(&sb, 2, &format!("r{i}"));
    }
    // A run waiting on a timer is never deleted.
    submit_step(&sb, guests::SLEEPER, r#"{"ms": 3600000}"#, "later");
    let first = sb.stephost(&["worker", "--concurrency", "2", "--exit-when-idle"]);
    first.expect_code(0);
    // The runs finished: the next worker's first look deletes them (the
    // first worker's may have deleted some already).
    std::thread::sleep(Duration::from_millis(20));
    let second = sb.stephost(&["worker", "--exit-when-idle"]);
    second.expect_code(0);
    let runs = statuses(&sb);
    assert_eq!(
        runs.iter()
            .map(|(id, s, _)| (id.as_str(), s.as_str()))
            .collect::<Vec<_>>(),
        [("later", "waiting")],
        "{}{}",
        first.stderr,
        second.stderr
    );
    assert_eq!(sb.metric("runs_pruned_total"), 3);
    assert!(sb.metric("pruned_bytes_total") > 0);
    assert!(
        format!("{}{}", first.stderr, second.stderr).contains("finished runs ("),
        "{}{}",
        first.stderr,
        second.stderr
    );
    sb.stephost(&["show", "r0"]).expect_code(2);
    // What the deleted runs wrote stays where the receiver keeps it (two
    // orders each, and the sleeper's first).
    assert_eq!(sb.received("orders.jsonl").len(), 7);

    // By hand: what is not a finished status, or not a duration, is refused.
    let refused = sb.stephost(&["prune", "--finished-before", "0s", "--status", "pending"]);
    refused.expect_code(2);
    assert!(
        refused.stderr.contains("never pruned"),
        "{}",
        refused.stderr
    );
    let refused = sb.stephost(&["prune", "--finished-before", "3 weeks"]);
    refused.expect_code(2);
    assert!(
        refused.stderr.contains("not a duration"),
        "{}",
        refused.stderr
    );
    let none = sb.stephost(&["prune", "--finished-before", "0s", "--json"]);
    none.expect_code(0);
    assert_eq!(none.json()["runs"], 0);
}

/// The configuration the image's services load (deploy/stephost.toml),
/// its data folder made the sandbox's: the supplier step runs to its end
/// with two workers on one ledger, as deploy/compose.yaml runs them.
#[test]
fn the_deploy_configuration_runs_the_supplier_step_on_two_workers() {
    let deploy = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/stephost.toml"),
    )
    .unwrap();
    assert!(deploy.contains("/var/lib/stephost/"), "{deploy}");
    let sb = Sandbox::with_config(BIN, &deploy.replace("/var/lib/stephost/", ""));
    for i in 0..4 {
        sb.stephost(&[
            "submit",
            guests::SUPPLIER_ORDER,
            "--input",
            r#"{"sku":"WIDGET-7","quantity":10}"#,
            "--run-id",
            &format!("order-{i}"),
        ])
        .expect_code(0);
    }
    let workers: Vec<Child> = (0..2).map(|_| worker(&sb, &["--exit-when-idle"])).collect();
    for mut w in workers {
        assert!(w.wait().unwrap().success());
    }
    for i in 0..4 {
        let show = sb.show(&format!("order-{i}"));
        assert_eq!(show["run"]["status"], "completed", "{show:#}");
        assert_eq!(
            serde_json::from_str::<Value>(show["run"]["output"].as_str().unwrap()).unwrap()["ordered"],
            true
        );
    }
    let orders = sb.received("supplier-orders.jsonl");
    assert_eq!(orders.len(), 4);
    distinct_operations(&orders);
}

#[test]
fn a_worker_killed_around_a_batched_write_is_reconciled_by_the_next() {
    // Concurrency 2 puts the worker's writes through group commit.
    for (point, expected) in [
        (
            "after-started@6",
            vec!["interrupted:unrecorded", "lookup:not_found", "send:ok"],
        ),
        (
            "after-send@6",
            vec!["interrupted:unrecorded", "lookup:found"],
        ),
    ] {
        let sb = Sandbox::new(BIN);
        submit(&sb, 3, "w");
        let crashed = sb
            .command(&["worker", "--concurrency", "2", "--exit-when-idle"])
            .env("STEPHOST_CRASH_AT", point)
            .output()
            .unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(crashed.status.signal(), Some(libc::SIGABRT), "{point}");
        assert!(
            String::from_utf8_lossy(&crashed.stderr)
                .contains(&format!("crash point {point} fired"))
        );
        // Everything before the write was made durable with its `started`.
        let at_crash = sb.show("w");
        assert_eq!(calls(&at_crash).len(), 6, "{point}: {at_crash:#}");
        assert_eq!(calls(&at_crash)[5]["state"], "started");
        sb.stephost(&["worker", "--exit-when-idle"]).expect_code(0);
        let show = sb.show("w");
        assert_eq!(show["run"]["status"], "completed");
        assert_eq!(show["run"]["fence"], 2);
        let lines = sb.received("orders.jsonl");
        assert_eq!(lines.len(), 3, "{point}");
        distinct_operations(&lines);
        let kinds: Vec<String> = stephost_tests::attempts_for(&show, 6)
            .iter()
            .map(|a| {
                format!(
                    "{}:{}",
                    a["kind"].as_str().unwrap(),
                    a["result"].as_str().unwrap()
                )
            })
            .collect();
        assert_eq!(kinds, expected, "{point}");
    }
}

#[test]
fn a_worker_killed_after_the_outcome_of_a_write_that_cannot_be_resent_finds_it_recorded() {
    // A receiver that does not deduplicate, behind group commit: the
    // outcome reaches the ledger before the guest sees it, so the crash
    // cannot lose it; the next worker neither asks the receiver nor parks.
    let sb = Sandbox::with_config(BIN, &(slow_config(0) + "deduplicate = false\n"));
    submit(&sb, 3, "w");
    let crashed = sb
        .command(&["worker", "--concurrency", "2", "--exit-when-idle"])
        .env("STEPHOST_CRASH_AT", "after-outcome@6")
        .output()
        .unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(crashed.status.signal(), Some(libc::SIGABRT));
    let at_crash = sb.show("w");
    assert_eq!(calls(&at_crash)[5]["state"], "succeeded", "{at_crash:#}");
    sb.stephost(&["worker", "--exit-when-idle"]).expect_code(0);
    let show = sb.show("w");
    assert_eq!(show["run"]["status"], "completed", "{show:#}");
    assert_eq!(sb.received("orders.jsonl").len(), 3);
    let kinds: Vec<&str> = stephost_tests::attempts_for(&show, 6)
        .iter()
        .map(|a| a["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["send"]);
}

#[test]
fn resume_refuses_a_run_another_live_worker_holds() {
    let sb = Sandbox::with_config(BIN, &slow_config(400));
    submit(&sb, 5, "held");
    let mut w = worker(&sb, &["--concurrency", "1"]);
    wait_until("the worker's first write", Duration::from_secs(60), || {
        !sb.received("orders.jsonl").is_empty()
    });
    let resumed = sb.stephost(&["resume", "held"]);
    resumed.expect_code(6);
    assert!(resumed.stderr.contains("claimed by"), "{}", resumed.stderr);
    signal(&w, "TERM");
    w.wait().unwrap();
}

#[test]
fn graceful_shutdown_releases_claims_and_another_worker_finishes() {
    let sb = Sandbox::with_config(BIN, &slow_config(300));
    for i in 0..3 {
        submit(&sb, 4, &format!("g{i}"));
    }
    let mut w = worker(&sb, &["--concurrency", "2"]);
    wait_until("a first write", Duration::from_secs(60), || {
        !sb.received("orders.jsonl").is_empty()
    });
    signal(&w, "TERM");
    let status = w.wait().unwrap();
    assert_eq!(status.code(), Some(0), "the worker did not exit cleanly");
    let runs = statuses(&sb);
    assert!(
        runs.iter().any(|(_, s, _)| s != "completed"),
        "the shutdown came too late to test anything: {runs:?}"
    );
    // No claim is left behind.
    assert!(runs.iter().all(|(_, _, owner)| owner.is_null()), "{runs:?}");
    sb.stephost(&["worker", "--exit-when-idle"]).expect_code(0);
    assert!(statuses(&sb).iter().all(|(_, s, _)| s == "completed"));
    let lines = sb.received("orders.jsonl");
    assert_eq!(lines.len(), 12);
    distinct_operations(&lines);
}

#[test]
fn a_frozen_worker_that_wakes_after_losing_its_lease_writes_and_sends_nothing() {
    let sb = Sandbox::with_config(BIN, &slow_config(400));
    submit(&sb, 6, "z");
    let zombie = sb
        .command(&[
            "worker",
            "--concurrency",
            "1",
            "--lease-ms",
            "1000",
            "--exit-when-idle",
            "--log-format",
            "json",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_until("the zombie's first write", Duration::from_secs(60), || {
        !sb.received("orders.jsonl").is_empty()
    });
    stop_between_writes(&sb, &zombie);
    std::thread::sleep(Duration::from_millis(1500));
    // The successor claims once the lease has run out and finishes the run.
    sb.stephost(&["worker", "--lease-ms", "1000", "--exit-when-idle"])
        .expect_code(0);
    let done = sb.show("z");
    assert_eq!(done["run"]["status"], "completed");
    assert_eq!(done["run"]["fence"], 2);
    let lines = sb.received("orders.jsonl");
    assert_eq!(lines.len(), 6);
    distinct_operations(&lines);

    signal(&zombie, "CONT");
    let woke = zombie.wait_with_output().unwrap();
    assert_eq!(woke.status.code(), Some(0));
    // The zombie wrote no ledger row and sent no request once it woke.
    assert_eq!(sb.show("z"), done);
    // What it said of the run (the claim it lost, how the run ended for it)
    // names the trace the run reports into.
    let stderr = String::from_utf8_lossy(&woke.stderr);
    let said: Vec<Value> = stderr
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|l| l["source"] == "worker" && l["run_id"] == "z")
        .collect();
    assert!(!said.is_empty(), "{stderr}");
    assert!(
        said.iter()
            .all(|l| l["trace_id"] == done["run"]["trace"]["trace_id"]),
        "{stderr}"
    );
    assert_eq!(sb.received("orders.jsonl"), lines);
    assert!(
        lines
            .iter()
            .all(|l| l["fence"].as_i64() == Some(1) || l["fence"].as_i64() == Some(2))
    );
}

#[test]
fn an_upgrade_while_the_old_worker_is_frozen_fences_the_old_build_out() {
    let sb = Sandbox::with_config(BIN, &slow_config(400));
    submit(&sb, 3, "u");
    let mut old = worker(
        &sb,
        &[
            "--concurrency",
            "1",
            "--lease-ms",
            "1000",
            "--exit-when-idle",
        ],
    );
    wait_until(
        "the old build's first write",
        Duration::from_secs(60),
        || !sb.received("orders.jsonl").is_empty(),
    );
    stop_between_writes(&sb, &old);
    std::thread::sleep(Duration::from_millis(1500));
    // The divergent build differs from the second write on: the history so
    // far (one write) replays, so the run is repinned.
    let upgraded = sb.stephost(&["upgrade", "u", "--module", guests::DIVERGENT, "--json"]);
    upgraded.expect_code(0);
    assert_eq!(upgraded.json()[0]["moved"], true, "{}", upgraded.stdout);
    let repinned = sb.show("u")["run"].clone();
    assert_eq!(repinned["fence"], 2, "the repin did not move the fence");

    // The old execution wakes to a moved fence and writes nothing more; its
    // worker may then claim the run afresh, under the new pin.
    signal(&old, "CONT");
    old.wait().unwrap();
    sb.stephost(&["worker", "--exit-when-idle"]).expect_code(0);
    let done = sb.show("u");
    assert_eq!(done["run"]["status"], "completed");
    sb.stephost(&["verify", "u"]).expect_code(0);
    let lines = sb.received("orders.jsonl");
    assert_eq!(lines.len(), 3);
    distinct_operations(&lines);
    // After the first write, only a claim made after the repin wrote.
    assert_eq!(lines[0]["fence"], 1);
    assert!(lines[1..].iter().all(|l| l["fence"] == 3), "{lines:?}");
    assert_eq!(
        lines
            .iter()
            .filter(|l| l["request"]["divergent"] == true)
            .count(),
        1,
        "{lines:?}"
    );
}

#[test]
fn sigterm_drains_a_worker_whose_run_computes_without_calls() {
    // Fuel for many minutes: only the drain can stop the loop in time.
    let sb = Sandbox::with_config(BIN, "[limits]\nfuel_max = 1000000000000000\n");
    submit_step(&sb, guests::LOOPER, "{}", "spin");
    let mut w = worker(&sb, &["--concurrency", "1"]);
    wait_until("the run to be claimed", Duration::from_secs(60), || {
        !sb.show("spin")["run"]["owner"].is_null()
    });
    signal(&w, "TERM");
    // A worker that does not drain fails the test rather than hanging it.
    wait_until("the worker to drain", Duration::from_secs(60), || {
        w.try_wait().unwrap().is_some()
    });
    let status = w.wait().unwrap();
    assert_eq!(status.code(), Some(0), "the worker did not drain cleanly");
    let run = sb.show("spin")["run"].clone();
    assert!(
        run["owner"].is_null(),
        "the claim was not released: {run:#}"
    );
    assert_ne!(run["status"], "failed", "{run:#}");
    // Released where it was: left to another worker, which replays it.
    assert_eq!(run["status"], "running", "{run:#}");
}

/// The peak resident memory of process `pid` (VmHWM), in bytes.
fn peak_rss(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

#[test]
fn a_worker_running_memory_bombs_stays_within_their_limits() {
    const LIMIT: u64 = 64 << 20;
    let sb = Sandbox::with_config(BIN, &format!("[limits]\nmemory_bytes_max = {LIMIT}\n"));
    for i in 0..3 {
        submit_step(&sb, guests::MEMORY_BOMB, "{}", &format!("bomb-{i}"));
    }
    let mut w = worker(&sb, &["--concurrency", "3", "--exit-when-idle"]);
    let mut peak = 0;
    while w.try_wait().unwrap().is_none() {
        peak = peak_rss(w.id()).unwrap_or(peak).max(peak);
        std::thread::sleep(Duration::from_millis(20));
    }
    for i in 0..3 {
        let run = sb.show(&format!("bomb-{i}"))["run"].clone();
        assert_eq!(run["status"], "failed", "{run:#}");
        assert!(
            run["error"].as_str().unwrap().starts_with("memory_limit"),
            "{run:#}"
        );
    }
    // Three runs at their limit, and the worker's own bounded overhead.
    let bound = 3 * LIMIT + (160 << 20);
    assert!(peak > 0, "the worker's memory was never read");
    assert!(peak < bound, "peak RSS {peak} bytes, bound {bound}");
}

#[test]
fn a_worker_with_runs_that_sleep_for_an_hour_through_wasi_is_not_held() {
    let sb = Sandbox::new(BIN);
    for i in 0..3 {
        submit_step(
            &sb,
            guests::WASI_ONLY,
            r#"{"sleep_ms": 3600000}"#,
            &format!("nap-{i}"),
        );
    }
    // Runs as tasks, three at once: each sleep leaves memory as a timer.
    sb.stephost(&["worker", "--concurrency", "3", "--exit-when-idle"])
        .expect_code(0);
    for i in 0..3 {
        let run = sb.show(&format!("nap-{i}"))["run"].clone();
        assert_eq!(run["status"], "waiting", "{run:#}");
        assert!(run["owner"].is_null(), "{run:#}");
    }
}

#[test]
fn runs_survive_workers_killed_at_random_with_one_effect_per_write() {
    // Each write's receiver takes 60 ms: 200 runs of 3 writes keep 12
    // slots busy for about 3 s, time for eight kills, one every 300 ms (and
    // a kill often lands between a request and its outcome).
    let sb = Sandbox::with_config(BIN, &slow_config(60));
    let runs = 200;
    for i in 0..runs {
        submit(&sb, 3, &format!("s{i:02}"));
    }
    let args = ["--concurrency", "4", "--lease-ms", "2000"];
    let mut workers: Vec<Child> = (0..3).map(|_| worker(&sb, &args)).collect();
    let kills = kill_workers_until_done(
        &sb,
        &mut workers,
        &args,
        runs,
        Duration::from_millis(300),
        8,
    );
    stop_workers(&mut workers);
    assert!(kills >= 3, "too few kills to mean anything: {kills}");
    let lines = sb.received("orders.jsonl");
    assert_eq!(lines.len(), runs * 3, "one business effect per write");
    distinct_operations(&lines);
    each_write_sent_once(&sb, (0..runs).map(|i| format!("s{i:02}")), &[3, 6, 9]);
}

/// Starts `workers` fresh and kills one at random every `every` until every
/// run of `runs` has completed (at most `kills_max` kills, each victim
/// replaced at once); returns how many were killed.
fn kill_workers_until_done(
    sb: &Sandbox,
    workers: &mut [Child],
    args: &[&str],
    runs: usize,
    every: Duration,
    kills_max: usize,
) -> usize {
    let deadline = Instant::now() + Duration::from_secs(180);
    let mut kills = 0;
    let mut next_kill = Instant::now() + every;
    let mut pick = 7usize;
    loop {
        let done = completed(sb);
        if done == runs {
            return kills;
        }
        assert!(
            Instant::now() < deadline,
            "only {done} of {runs} runs completed"
        );
        std::thread::sleep(Duration::from_millis(100));
        if Instant::now() >= next_kill && kills < kills_max {
            // A fixed pseudo-random pick.
            pick = (pick * 31 + 17) % 101;
            let victim = pick % workers.len();
            workers[victim].kill().unwrap();
            workers[victim].wait().unwrap();
            workers[victim] = worker(sb, args);
            kills += 1;
            next_kill = Instant::now() + every;
        }
    }
}

fn supplier_config(receiver: &Receiver) -> String {
    stephost_tests::supplier_http_config(&receiver.url(), true)
}

#[test]
fn two_workers_killed_at_random_order_each_of_200_runs_exactly_once() {
    // The supplier step against the supplier's HTTP API on 127.0.0.1, which
    // holds each order 100 ms before it answers (200 orders keep 8 slots
    // busy for 2.5 s), so that kills land between a request and its
    // outcome.
    let receiver = Receiver::start().unwrap();
    let sb = Sandbox::with_config(BIN, &supplier_config(&receiver));
    let runs = 200;
    for i in 0..runs {
        let input = format!(r#"{{"sku":"SKU-{i}","quantity":10}}"#);
        submit_step(&sb, guests::SUPPLIER_ORDER, &input, &format!("o{i:03}"));
    }
    for _ in 0..runs {
        receiver.push_fault(supplier_receiver::Fault::Delay(Duration::from_millis(100)));
    }
    let args = ["--concurrency", "4", "--lease-ms", "2000"];
    let mut workers: Vec<Child> = (0..2).map(|_| worker(&sb, &args)).collect();
    let kills = kill_workers_until_done(
        &sb,
        &mut workers,
        &args,
        runs,
        Duration::from_millis(250),
        6,
    );
    stop_workers(&mut workers);
    assert!(kills >= 3, "too few kills to mean anything: {kills}");
    assert_eq!(receiver.business_effects(), runs, "one order per run");
    let mut keys: Vec<String> = receiver
        .orders()
        .iter()
        .map(|o| o.operation_id.clone())
        .collect();
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), runs);
    for i in 0..runs {
        let output = completed_output(&sb, &format!("o{i:03}"));
        assert_eq!(output["ordered"], true, "o{i:03}: {output}");
    }
}

#[test]
fn a_postgresql_restart_under_load_loses_nothing_and_sends_nothing_twice() {
    // A cluster of this test's own: restarting the shared one would cut
    // the other tests off.
    let cluster = Cluster::start().expect("start a throwaway PostgreSQL");
    // 60 runs of 6 writes, each answered after 50 ms, on 16 slots: about
    // 1.2 s of work, which the restarts cut into.
    let sb = Sandbox::with_ledger(BIN, &slow_config(50), Some(cluster.url()));
    let runs = 60;
    for i in 0..runs {
        submit(&sb, 6, &format!("p{i:02}"));
    }
    let args = ["--concurrency", "8", "--lease-ms", "2000"];
    let mut workers: Vec<Child> = (0..2).map(|_| worker(&sb, &args)).collect();
    // Restart the server twice while the runs write (`-m fast`: every
    // session is cut off, in-flight transactions roll back).
    for _ in 0..2 {
        std::thread::sleep(Duration::from_millis(400));
        let done = completed(&sb);
        assert!(done < runs, "the runs finished before the restart");
        cluster.restart().expect("restart PostgreSQL");
    }
    wait_until(
        "every run to complete after the restarts",
        Duration::from_secs(120),
        || completed(&sb) == runs,
    );
    stop_workers(&mut workers);
    let lines = sb.received("orders.jsonl");
    assert_eq!(lines.len(), runs * 6, "one business effect per write");
    distinct_operations(&lines);
    each_write_sent_once(
        &sb,
        (0..runs).map(|i| format!("p{i:02}")),
        &[3, 6, 9, 12, 15, 18],
    );
}

#[test]
fn the_cli_and_a_worker_reach_postgresql_over_tls_checking_its_certificate() {
    // A server that takes TCP connections over TLS alone, with a
    // certificate for 127.0.0.1 that a CA of this test's signed.
    let ca = TestCa::new("e2e CA");
    let cluster = Cluster::start_tls(&ca, "hostssl all stephost 127.0.0.1/32 trust")
        .expect("start a throwaway PostgreSQL serving TLS");
    let write = |name: &str, pem: String| {
        let path = cluster.path(name);
        std::fs::write(&path, pem).unwrap();
        path.display().to_string()
    };
    let ca_file = write("ca.pem", ca.pem());
    let url = |ca_file: &str| {
        format!(
            "postgres://stephost@127.0.0.1:{}/postgres?sslmode=verify-full&sslrootcert={ca_file}",
            cluster.port()
        )
    };
    let sb = Sandbox::with_ledger(BIN, BASE_CONFIG, Some(url(&ca_file)));
    let ran = sb.stephost(&[
        "--ledger",
        &url(&ca_file),
        "run",
        guests::MULTI_WRITE,
        "--input",
        r#"{"count":2}"#,
        "--run-id",
        "t1",
    ]);
    ran.expect_code(0);
    // A worker's connections (group commit, the listener's) too.
    submit(&sb, 2, "t2");
    submit(&sb, 2, "t3");
    sb.stephost(&["worker", "--concurrency", "2", "--exit-when-idle"])
        .expect_code(0);
    let runs = statuses(&sb);
    assert_eq!(runs.len(), 3);
    assert!(runs.iter().all(|(_, s, _)| s == "completed"), "{runs:?}");
    assert_eq!(sb.received("orders.jsonl").len(), 6);
    // A CA that did not sign the server's certificate: refused, saying so.
    let other = write("other-ca.pem", TestCa::new("another CA").pem());
    let refused = sb.stephost(&["--ledger", &url(&other), "runs"]);
    assert_ne!(refused.code, Some(0));
    assert!(
        refused.stderr.contains("not signed by a CA in sslrootcert"),
        "{}",
        refused.stderr
    );
}

/// An HTTP receiver on 127.0.0.1 that holds each request until `parties`
/// are held at once (or 20 s have passed), then answers them all `{}`;
/// it keeps the most it held at once.
struct Rendezvous {
    url: String,
    state: std::sync::Arc<(std::sync::Mutex<Held>, std::sync::Condvar)>,
}

#[derive(Default)]
struct Held {
    now: usize,
    most: usize,
    met: bool,
}

impl Rendezvous {
    fn start(parties: usize) -> Rendezvous {
        use std::io::{BufRead, BufReader, Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let state = std::sync::Arc::new((
            std::sync::Mutex::new(Held::default()),
            std::sync::Condvar::new(),
        ));
        let shared = state.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { return };
                let shared = shared.clone();
                std::thread::spawn(move || {
                    let mut reader = BufReader::new(stream.try_clone().unwrap());
                    let mut length = 0;
                    loop {
                        let mut line = String::new();
                        if reader.read_line(&mut line).unwrap_or(0) == 0 {
                            return;
                        }
                        let lower = line.to_ascii_lowercase();
                        if let Some(value) = lower.strip_prefix("content-length:") {
                            length = value.trim().parse().unwrap_or(0);
                        }
                        if line == "\r\n" {
                            break;
                        }
                    }
                    let mut body = vec![0; length];
                    let _ = reader.read_exact(&mut body);
                    let (lock, wake) = &*shared;
                    let mut held = lock.lock().unwrap();
                    held.now += 1;
                    held.most = held.most.max(held.now);
                    if held.now >= parties {
                        held.met = true;
                        wake.notify_all();
                    }
                    let deadline = Instant::now() + Duration::from_secs(20);
                    while !held.met && Instant::now() < deadline {
                        held = wake
                            .wait_timeout(held, Duration::from_millis(100))
                            .unwrap()
                            .0;
                    }
                    held.now -= 1;
                    drop(held);
                    let _ = stream.write_all(
                        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\
                          Connection: close\r\n\r\n{}",
                    );
                });
            }
        });
        Rendezvous { url, state }
    }

    fn most_at_once(&self) -> usize {
        self.state.0.lock().unwrap().most
    }
}

#[test]
fn a_worker_keeps_its_runs_blocking_writes_in_flight_at_once() {
    // Runs are tasks on a thread per core: a write that blocks (HTTP here)
    // must not hold a thread the other runs need, or fewer than all of
    // them could be waiting at the receiver at once on a machine with
    // fewer cores than runs.
    const RUNS: usize = 6;
    let receiver = Rendezvous::start(RUNS);
    let sb = Sandbox::with_config(
        BIN,
        &format!(
            "[effects.orders]\nkind = \"http\"\nclass = \"write\"\nmethod = \"POST\"\n\
             url = \"{}/orders\"\n",
            receiver.url
        ),
    );
    for i in 0..RUNS {
        submit(&sb, 1, &format!("r{i}"));
    }
    let worker = sb.stephost(&["worker", "--concurrency", "6", "--exit-when-idle"]);
    worker.expect_code(0);
    let runs = statuses(&sb);
    assert!(runs.iter().all(|(_, s, _)| s == "completed"), "{runs:?}");
    assert_eq!(receiver.most_at_once(), RUNS, "{}", worker.stderr);
}

#[test]
fn a_worker_running_many_runs_at_once_executes_command_programs_too() {
    let sb = Sandbox::new(BIN);
    for i in 0..3 {
        submit_step(&sb, guests::COMMAND, r#""text""#, &format!("cmd-{i}"));
        submit(&sb, 2, &format!("step-{i}"));
    }
    sb.stephost(&["worker", "--concurrency", "4", "--exit-when-idle"])
        .expect_code(0);
    for i in 0..3 {
        let output = completed_output(&sb, &format!("cmd-{i}"));
        assert!(
            output
                .as_str()
                .is_some_and(|s| s.starts_with("plain text at ")),
            "{output}"
        );
        assert_eq!(sb.show(&format!("step-{i}"))["run"]["status"], "completed");
    }
    assert_eq!(sb.received("orders.jsonl").len(), 6);
}

#[test]
fn a_step_that_computes_for_long_does_not_hold_back_the_workers_other_runs() {
    // Runs are tasks on a thread per core: four steps spinning until their
    // fuel runs out, claimed first, must yield their threads to the runs
    // behind them now and then, or those would wait for the spinners to end.
    let sb = Sandbox::with_config(
        BIN,
        &format!(
            "{}\n[limits]\nfuel_max = 30_000_000_000\n",
            stephost_tests::BASE_CONFIG
        ),
    );
    for i in 0..4 {
        submit_step(&sb, guests::LOOPER, "{}", &format!("spin-{i}"));
    }
    for i in 0..2 {
        submit(&sb, 3, &format!("r{i}"));
    }
    sb.stephost(&["worker", "--concurrency", "6", "--exit-when-idle"])
        .expect_code(0);
    let ended = |run_id: &str| {
        let show = sb.show(run_id);
        (
            show["run"]["status"].as_str().unwrap().to_string(),
            show["run"]["updated_at_ms"].as_i64().unwrap(),
        )
    };
    let spinners: Vec<_> = (0..4).map(|i| ended(&format!("spin-{i}"))).collect();
    let others: Vec<_> = (0..2).map(|i| ended(&format!("r{i}"))).collect();
    assert!(spinners.iter().all(|(s, _)| s == "failed"), "{spinners:?}");
    assert!(others.iter().all(|(s, _)| s == "completed"), "{others:?}");
    let first_spinner_end = spinners.iter().map(|(_, at)| *at).min().unwrap();
    assert!(
        others.iter().all(|(_, at)| *at < first_spinner_end),
        "the runs behind the spinners ended after one of them: {others:?} {spinners:?}"
    );
}

#[test]
fn a_worker_running_many_runs_at_once_runs_steps_that_sleep() {
    // A WASI sleep waits on the runtime's timers; a short durable sleep
    // sleeps in place.
    let sb = Sandbox::new(BIN);
    for i in 0..3 {
        submit_step(
            &sb,
            guests::SLEEPER,
            r#"{"ms": 30, "wasi_sleep_ms": 20}"#,
            &format!("sleep-{i}"),
        );
    }
    sb.stephost(&["worker", "--concurrency", "3", "--exit-when-idle"])
        .expect_code(0);
    for i in 0..3 {
        let output = completed_output(&sb, &format!("sleep-{i}"));
        let slept = output["after"].as_u64().unwrap() - output["before"].as_u64().unwrap();
        // Due times are kept in ms: the wake-up may come up to 1 ms before
        // 30 ms past the clock read just before the sleep.
        assert!(slept >= 29_000_000, "{output}");
    }
    assert_eq!(sb.received("orders.jsonl").len(), 6);
}

#[test]
fn runs_waiting_for_their_writes_fsync_hold_no_thread_so_many_share_each_fsync() {
    // Sixteen runs at once on a thread per core, writing to an in-process
    // effect: a run that waited for its write's fsync on its thread would
    // let no more runs than threads share an fsync.
    const RUNS: usize = 16;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let sb = Sandbox::with_config(BIN, "[effects.fast]\nkind = \"echo\"\nclass = \"write\"\n");
    for i in 0..RUNS {
        submit_step(
            &sb,
            guests::MULTI_WRITE,
            r#"{"count": 40, "effect": "fast"}"#,
            &format!("r{i}"),
        );
    }
    sb.stephost(&["worker", "--concurrency", "16", "--exit-when-idle"])
        .expect_code(0);
    assert!(statuses(&sb).iter().all(|(_, s, _)| s == "completed"));
    let commits = sb.metric("group_commit_commit_total");
    let fsyncs = sb.metric("group_commit_fsync_total");
    assert!(commits >= (RUNS * 41) as i64, "{commits} commits");
    if threads < RUNS {
        assert!(
            commits as f64 / fsyncs as f64 > threads as f64,
            "{commits} commits in {fsyncs} fsyncs on {threads} threads"
        );
    }
}

#[test]
fn a_worker_polling_once_an_hour_takes_a_run_submitted_by_another_process_at_once() {
    let sb = Sandbox::with_config(BIN, stephost_tests::SUPPLIER_CONFIG);
    // The ledger exists before the worker starts; the worker is killed if
    // an assertion fails before it is told to stop.
    sb.stephost(&["runs"]).expect_code(0);
    let mut worker = KilledOnDrop(Some(worker(&sb, &["--poll-ms", "3600000"])));
    // Two in turn, each by `submit --wait` (a process of its own): the
    // second surely after the worker's first look for runs.
    for run_id in ["a", "b"] {
        let done = sb.stephost(&[
            "submit",
            guests::SUPPLIER_ORDER,
            "--input",
            r#"{"sku":"WIDGET-7","quantity":10}"#,
            "--run-id",
            run_id,
            "--wait",
            "60000",
            "--json",
        ]);
        done.expect_code(0);
        assert_eq!(done.json()["status"], "completed", "{}", done.stdout);
    }
    assert_eq!(sb.received("supplier-orders.jsonl").len(), 2);
    // A run that waits for a person answers the wait at once, waiting.
    let quick = sb.stephost(&[
        "submit",
        guests::SUPPLIER_ORDER,
        "--input",
        r#"{"sku":"WIDGET-7","quantity":10,"approval_ttl_seconds":3600}"#,
        "--run-id",
        "c",
        "--wait",
        "60000",
    ]);
    quick.expect_code(7);
    assert!(
        quick.stderr.contains("run c is waiting"),
        "{}",
        quick.stderr
    );
    let mut worker = worker.0.take().expect("the worker");
    signal(&worker, "TERM");
    assert!(worker.wait().expect("the worker ends").success());
}

/// A child process killed when dropped, unless taken first.
struct KilledOnDrop(Option<Child>);

impl Drop for KilledOnDrop {
    fn drop(&mut self) {
        if let Some(child) = self.0.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[test]
fn a_worker_writes_one_json_object_a_line_when_asked() {
    let sb = Sandbox::new(BIN);
    sb.stephost(&[
        "submit",
        guests::MULTI_WRITE,
        "--input",
        r#"{"count":1}"#,
        "--run-id",
        "logged",
    ])
    .expect_code(0);
    let ran = sb.stephost_with_env(
        "STEPHOST_LOG_FORMAT",
        "json",
        &["worker", "--exit-when-idle"],
    );
    ran.expect_code(0);
    let lines: Vec<Value> = ran
        .stderr
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: not JSON: {l}")))
        .collect();
    for line in &lines {
        for field in ["time", "level", "source", "message"] {
            assert!(line[field].is_string(), "no {field}: {line}");
        }
    }
    // The step's own line, with its run and the calls it had made.
    let step = lines
        .iter()
        .find(|l| l["source"] == "step" && l["message"] == "write 0 to orders done")
        .unwrap_or_else(|| panic!("{lines:#?}"));
    assert_eq!(step["run_id"], "logged");
    assert_eq!(step["level"], "info");
    assert_eq!(step["seq"], 3);
    // The worker's, naming the run.
    assert!(
        lines.iter().any(|l| l["source"] == "worker"
            && l["run_id"] == "logged"
            && l["message"] == "run logged completed"),
        "{lines:#?}"
    );
    // Text stays the default, for people.
    let text = sb.stephost(&["worker", "--exit-when-idle"]);
    assert!(
        text.stderr.starts_with("stephost worker: 0 completed"),
        "{}",
        text.stderr
    );
    let bad = sb.stephost(&["worker", "--exit-when-idle", "--log-format", "xml"]);
    bad.expect_code(2);
}
