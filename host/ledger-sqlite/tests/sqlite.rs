//! What only the SQLite ledger does: its file, its schema, how it keeps
//! bodies, and how group commit shares transactions and fsyncs.

use std::path::Path;
use std::sync::Arc;

use rusqlite::Connection;
use stephost_core::lifecycle::{self, ClaimMode};
use stephost_core::store::{Pool, PoolOptions, WriteOp};
use stephost_core::{CallClass, CallRecord, CallState, Claim, NewRun, StoreError};
use stephost_ledger_sqlite::SqlitePool;
use stephost_ledger_sqlite::schema::{APPLICATION_ID, OLD_APPLICATION_ID, VERSION};

fn open(path: &Path) -> Result<SqlitePool, StoreError> {
    SqlitePool::open(path, PoolOptions::default())
}

fn claimed_run(pool: &dyn Pool, run_id: &str) -> Claim {
    let store = pool.store().unwrap();
    let run = NewRun {
        run_id,
        module_digest: "m",
        step: None,
        world: "stephost:step/step@0.1.0",
        input: "{}",
        now_ms: 1,
        budget: Default::default(),
    };
    store.insert_run(&run.record(None)).unwrap();
    lifecycle::claim(
        store.as_ref(),
        run_id,
        "w",
        60_000,
        2,
        ClaimMode::Any,
        &|_| true,
    )
    .unwrap()
}

fn read_call(seq: u64, request: &str, outcome: &str) -> CallRecord {
    CallRecord {
        seq,
        class: CallClass::Read,
        interface: "stephost:step/llm".into(),
        function: "complete".into(),
        operation_id: format!("op-{seq}"),
        request: request.into(),
        request_hash: stephost_core::ids::request_hash("stephost:step/llm", "complete", request),
        state: CallState::Succeeded,
        outcome: Some(outcome.into()),
        started_at_ms: 3,
        finished_at_ms: Some(4),
        fence: 1,
        resolved_by: None,
        chain: None,
    }
}

#[test]
fn a_file_that_is_not_sqlite_is_refused_and_left_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notes.txt");
    let text = "these are notes, not a ledger\n".repeat(200);
    std::fs::write(&path, &text).unwrap();
    let err = open(&path).err().expect("refused");
    assert!(matches!(err, StoreError::NotALedger { .. }), "{err:?}");
    assert!(err.to_string().contains("not a stephost ledger"), "{err}");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
}

#[test]
fn another_applications_database_is_refused_and_left_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("other.db");
    let conn = Connection::open(&path).unwrap();
    conn.execute_batch("CREATE TABLE orders (id INTEGER); INSERT INTO orders VALUES (7);")
        .unwrap();
    drop(conn);
    let err = open(&path).err().expect("refused");
    assert!(matches!(err, StoreError::NotALedger { .. }), "{err:?}");
    let conn = Connection::open(&path).unwrap();
    let tables: i64 = conn
        .query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get(0))
        .unwrap();
    assert_eq!(tables, 1, "nothing was created in it");
}

#[test]
fn a_ledger_of_the_earlier_development_format_is_refused_with_a_message_that_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.db");
    let conn = Connection::open(&path).unwrap();
    conn.execute_batch("CREATE TABLE runs (run_id TEXT PRIMARY KEY);")
        .unwrap();
    conn.pragma_update(None, "application_id", OLD_APPLICATION_ID)
        .unwrap();
    conn.pragma_update(None, "user_version", 9).unwrap();
    drop(conn);
    let before = std::fs::read(&path).unwrap();
    let err = open(&path).err().expect("refused");
    assert!(matches!(err, StoreError::OldFormat { .. }), "{err:?}");
    let message = err.to_string();
    assert!(
        message.contains("earlier development format") && message.contains("schema version 9"),
        "{message}"
    );
    assert_eq!(std::fs::read(&path).unwrap(), before, "left as it was");
}

#[test]
fn a_ledger_newer_than_this_build_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("new.db");
    drop(open(&path).unwrap());
    // A newer build that does not say which builds may use it.
    let conn = Connection::open(&path).unwrap();
    conn.pragma_update(None, "user_version", VERSION + 1)
        .unwrap();
    conn.execute(
        "DELETE FROM stephost_meta WHERE key = 'compatible_from'",
        [],
    )
    .unwrap();
    drop(conn);
    let err = open(&path).err().expect("refused");
    assert_eq!(
        err,
        StoreError::TooNew {
            location: path.display().to_string(),
            found: VERSION + 1,
            supported: VERSION,
            compatible_from: VERSION + 1,
        }
    );
}

/// Rolling upgrades: a ledger a newer build migrated is used as it is by
/// this build when the newer build says builds of this schema may use it
/// (a migration that only adds), and refused when it says they may not.
#[test]
fn a_newer_ledger_is_used_when_it_says_this_build_may_and_refused_when_not() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("next.db");
    drop(open(&path).unwrap());
    // What the next build's expanding migration would leave: one more
    // table, a higher version, the same compatible_from.
    let conn = Connection::open(&path).unwrap();
    conn.execute_batch("CREATE TABLE next_release_table (x INTEGER) STRICT")
        .unwrap();
    conn.pragma_update(None, "user_version", VERSION + 1)
        .unwrap();
    drop(conn);
    let pool = open(&path).expect("a compatible newer ledger is used");
    claimed_run(&pool, "r");
    assert_eq!(pool.store().unwrap().run("r").unwrap().run_id, "r");
    drop(pool);
    let conn = Connection::open(&path).unwrap();
    let version: i64 = conn
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .unwrap();
    assert_eq!(version, VERSION + 1, "never migrated down");
    // The next build's contracting migration says older builds may not.
    conn.execute(
        "UPDATE stephost_meta SET value = ?1 WHERE key = 'compatible_from'",
        [(VERSION + 1).to_string()],
    )
    .unwrap();
    drop(conn);
    let err = open(&path).err().expect("refused");
    assert!(
        matches!(err, StoreError::TooNew { compatible_from, .. } if compatible_from == VERSION + 1),
        "{err:?}"
    );
    assert!(err.to_string().contains("upgrade stephost"), "{err}");
}

#[test]
fn a_new_ledger_gives_freed_pages_back_after_pruning() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db");
    let pool = open(&path).unwrap();
    let conn = Connection::open(&path).unwrap();
    let mode: i64 = conn
        .pragma_query_value(None, "auto_vacuum", |r| r.get(0))
        .unwrap();
    assert_eq!(mode, 2, "auto_vacuum = INCREMENTAL");
    let (from,): (String,) = conn
        .query_row(
            "SELECT value FROM stephost_meta WHERE key = 'compatible_from'",
            [],
            |r| Ok((r.get(0)?,)),
        )
        .unwrap();
    assert_eq!(
        from,
        stephost_ledger_sqlite::schema::COMPATIBLE_FROM.to_string()
    );
    drop(conn);
    // A finished run with a large body, pruned: the file gives pages back.
    let claim = claimed_run(&pool, "big");
    let mut writer = pool.writer().unwrap();
    let body = format!("{{\"blob\":\"{}\"}}", "x".repeat(400_000));
    let mut call = stephost_core::CallRecord {
        seq: 1,
        class: stephost_core::CallClass::Read,
        interface: "stephost:step/effects".into(),
        function: "orders".into(),
        operation_id: "op".into(),
        request_hash: stephost_core::ids::request_hash("stephost:step/effects", "orders", &body),
        request: body.clone(),
        state: stephost_core::CallState::Succeeded,
        outcome: Some(body),
        started_at_ms: 1,
        finished_at_ms: Some(1),
        fence: claim.fence,
        resolved_by: None,
        chain: None,
    };
    call.fence = claim.fence;
    let end = stephost_core::lifecycle::ended(
        &stephost_core::RunEnd::Completed {
            output: "{}".into(),
            exit_code: None,
        },
        2,
    );
    writer
        .commit(
            &claim,
            vec![
                stephost_core::WriteOp::Call(call),
                stephost_core::WriteOp::End(end),
            ],
        )
        .wait()
        .unwrap();
    writer.landed().unwrap();
    let retention = pool.retention().unwrap();
    let rule = stephost_core::retention::Rule::new(i64::MAX, &[]).unwrap();
    let summary = stephost_core::retention::prune_all(retention.as_ref(), &rule, false).unwrap();
    assert_eq!(summary.pruned.run_ids, ["big"]);
    assert!(
        // The 400 kB part's pages (each page holds a little less).
        summary.reclaimed_bytes >= 350_000,
        "{} bytes given back",
        summary.reclaimed_bytes
    );
}

#[test]
fn a_new_ledger_is_marked_as_stephosts_and_reopened_with_its_rows() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db");
    let pool = open(&path).unwrap();
    let claim = claimed_run(&pool, "r");
    let mut writer = pool.writer().unwrap();
    writer
        .commit(
            &claim,
            vec![WriteOp::Call(read_call(1, "{}", "{\"ok\":1}"))],
        )
        .wait()
        .unwrap();
    drop((writer, pool));
    let conn = Connection::open(&path).unwrap();
    let id: i64 = conn
        .pragma_query_value(None, "application_id", |r| r.get(0))
        .unwrap();
    let version: i64 = conn
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .unwrap();
    assert_eq!((id, version), (APPLICATION_ID, VERSION));
    drop(conn);
    let reopened = open(&path).unwrap();
    let calls = reopened.store().unwrap().calls("r", 1, 10).unwrap();
    assert_eq!(calls, [read_call(1, "{}", "{\"ok\":1}")]);
}

#[test]
fn identical_bodies_and_the_messages_of_a_conversation_are_kept_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db");
    let pool = open(&path).unwrap();
    let claim = claimed_run(&pool, "chat");
    let answer = format!("{{\"ok\":\"{}\"}}", "the same long answer ".repeat(100));
    let mut messages = Vec::new();
    let mut ops = Vec::new();
    for seq in 1..=10u64 {
        messages.push(format!(
            "{{\"role\":\"user\",\"content\":\"question {seq}: {}\"}}",
            "and more words ".repeat(20)
        ));
        let request = format!("{{\"messages\":[{}]}}", messages.join(","));
        ops.push(WriteOp::Call(read_call(seq, &request, &answer)));
    }
    let expected: Vec<CallRecord> = ops
        .iter()
        .map(|op| match op {
            WriteOp::Call(call) => call.clone(),
            _ => unreachable!(),
        })
        .collect();
    let mut writer = pool.writer().unwrap();
    writer.commit(&claim, ops).wait().unwrap();
    writer.landed().unwrap();
    let conn = Connection::open(&path).unwrap();
    let parts: i64 = conn
        .query_row("SELECT count(*) FROM payloads", [], |r| r.get(0))
        .unwrap();
    // Ten messages (those of requests past the inline size) and one answer.
    assert!((10..=11).contains(&parts), "{parts} parts kept");
    let stored: i64 = conn
        .query_row(
            "SELECT (SELECT sum(length(body)) FROM payloads) + \
             (SELECT sum(length(request) + length(outcome)) FROM calls)",
            [],
            |r| r.get(0),
        )
        .unwrap();
    let whole: usize = expected
        .iter()
        .map(|c| c.request.len() + c.outcome.as_ref().map_or(0, String::len))
        .sum();
    assert!(
        (stored as usize) * 3 < whole,
        "{stored} bytes stored for {whole} bytes of bodies"
    );
    assert_eq!(
        pool.store().unwrap().calls("chat", 1, 100).unwrap(),
        expected
    );
}

#[test]
fn writers_committing_at_once_share_the_group_committers_transactions_and_fsyncs() {
    const RUNS: usize = 16;
    const WRITES: u64 = 20;
    let dir = tempfile::tempdir().unwrap();
    let pool = Arc::new(
        SqlitePool::open(
            &dir.path().join("ledger.db"),
            PoolOptions { group_commit: true },
        )
        .unwrap(),
    );
    let claims: Vec<Claim> = (0..RUNS)
        .map(|i| claimed_run(pool.as_ref(), &format!("r{i}")))
        .collect();
    let barrier = std::sync::Barrier::new(RUNS);
    std::thread::scope(|scope| {
        for claim in &claims {
            let pool = pool.clone();
            let barrier = &barrier;
            scope.spawn(move || {
                let mut writer = pool.writer().unwrap();
                barrier.wait();
                for seq in 1..=WRITES {
                    let mut call = read_call(seq, "{}", "{\"ok\":1}");
                    call.class = CallClass::Write;
                    call.state = CallState::Started;
                    call.outcome = None;
                    call.finished_at_ms = None;
                    writer
                        .commit(claim, vec![WriteOp::Started(call)])
                        .wait()
                        .unwrap();
                }
            });
        }
    });
    let counts = pool.commit_counts();
    assert_eq!(counts.commits, RUNS as u64 * WRITES);
    assert!(counts.fsyncs <= counts.transactions, "{counts:?}");
    assert!(
        counts.transactions < counts.commits,
        "no commits shared a transaction: {counts:?}"
    );
    let store = pool.store().unwrap();
    for claim in &claims {
        assert_eq!(
            store.calls(&claim.run_id, 1, 100).unwrap().len() as u64,
            WRITES
        );
    }
}

#[test]
fn a_buffered_commit_that_fails_fails_the_writers_next_commit_and_nothing_after_it_lands() {
    let dir = tempfile::tempdir().unwrap();
    let pool = open(&dir.path().join("ledger.db")).unwrap();
    let claim = claimed_run(&pool, "r");
    let mut writer = pool.writer().unwrap();
    // Handed to the writer's thread: call #2 before call #1 is refused.
    let early = writer.commit(
        &claim,
        vec![WriteOp::Call(read_call(2, "{}", "{\"ok\":2}"))],
    );
    assert_eq!(early.wait(), Ok(()), "answered later");
    let later = writer.commit(
        &claim,
        vec![WriteOp::Call(read_call(1, "{}", "{\"ok\":1}"))],
    );
    let mut started = read_call(3, "{}", "{}");
    started.class = CallClass::Write;
    started.state = CallState::Started;
    started.outcome = None;
    let durable = writer
        .commit(&claim, vec![WriteOp::Started(started)])
        .wait();
    assert!(
        matches!(durable, Err(StoreError::NotAppended { seq: 2, .. })),
        "{durable:?}"
    );
    // The commit after the failure was refused too, though it would apply.
    let _ = later.wait();
    assert!(matches!(
        writer.landed(),
        Err(StoreError::NotAppended { .. })
    ));
    assert!(pool.store().unwrap().calls("r", 1, 10).unwrap().is_empty());
}

/// A small deterministic generator, so that the interleaving is the same
/// at every run of the test.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

#[test]
fn calls_of_runs_committed_in_any_interleaving_read_back_whole_in_order_and_are_found() {
    const RUNS: usize = 3;
    const CALLS: u64 = 1500;
    let dir = tempfile::tempdir().unwrap();
    let pool = open(&dir.path().join("ledger.db")).unwrap();
    let claims: Vec<Claim> = (0..RUNS)
        .map(|i| claimed_run(&pool, &format!("r{i}")))
        .collect();
    let mut writer = pool.writer().unwrap();
    let mut next = [1u64; RUNS];
    let mut random = Lcg(7);
    // Commits of one to fifty calls of a run at a time, the runs taken in
    // random turns: segments of every length, across several epochs.
    while next.iter().any(|&n| n <= CALLS) {
        let run = random.below(RUNS as u64) as usize;
        if next[run] > CALLS {
            continue;
        }
        let count = (1 + random.below(50)).min(CALLS + 1 - next[run]);
        let ops = (next[run]..next[run] + count)
            .map(|seq| WriteOp::Call(read_call(seq, &format!("{{\"run\":{run}}}"), "{\"ok\":1}")))
            .collect();
        writer.commit(&claims[run], ops).wait().unwrap();
        next[run] += count;
    }
    writer.landed().unwrap();
    let store = pool.store().unwrap();
    for (run, claim) in claims.iter().enumerate() {
        let calls = store.calls(&claim.run_id, 1, usize::MAX).unwrap();
        assert_eq!(calls.len() as u64, CALLS, "run {run}");
        for (i, call) in calls.iter().enumerate() {
            assert_eq!(call.seq, i as u64 + 1);
            assert_eq!(call.request, format!("{{\"run\":{run}}}"));
        }
        for seq in [1, 2, 700, 1024, 1025, CALLS] {
            let one = store.calls(&claim.run_id, seq, 1).unwrap();
            assert_eq!(one.len(), 1);
            assert_eq!(one[0].seq, seq, "run {run}");
        }
        assert!(store.calls(&claim.run_id, CALLS + 1, 5).unwrap().is_empty());
        let history = store.history(&claim.run_id).unwrap();
        assert_eq!(history.len() as u64, CALLS);
        assert_eq!(history.into_calls().unwrap(), calls);
        // Appending goes on after the run's last call only.
        let again = writer.commit(claim, vec![WriteOp::Call(read_call(CALLS, "{}", "{}"))]);
        assert!(matches!(
            again.wait(),
            Ok(()) | Err(StoreError::NotAppended { .. })
        ));
        assert!(matches!(
            writer.landed(),
            Err(StoreError::NotAppended { .. })
        ));
        writer = pool.writer().unwrap();
    }
}

#[test]
fn a_call_missing_from_the_middle_of_a_long_history_is_corrupt_not_the_end() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db");
    let pool = open(&path).unwrap();
    let claim = claimed_run(&pool, "gap");
    let mut writer = pool.writer().unwrap();
    let ops = (1..=5000)
        .map(|seq| WriteOp::Call(read_call(seq, "{}", "{\"ok\":1}")))
        .collect();
    writer.commit(&claim, ops).wait().unwrap();
    writer.landed().unwrap();
    let conn = Connection::open(&path).unwrap();
    conn.execute("DELETE FROM calls WHERE seq = 3000", [])
        .unwrap();
    drop(conn);
    let read = pool
        .store()
        .unwrap()
        .history("gap")
        .and_then(|h| h.into_calls());
    assert!(
        matches!(&read, Err(StoreError::Corrupt(m)) if m.contains("call #")),
        "{read:?}"
    );
}

#[test]
fn processes_opening_a_new_ledger_at_once_all_open_it() {
    // Each opener has its own connections, as processes do: the one that
    // turns the new file's journal to WAL holds a lock the others' busy
    // handler does not wait for, so they wait for it themselves.
    let dir = tempfile::tempdir().unwrap();
    for round in 0..20 {
        let path = dir.path().join(format!("ledger-{round}.db"));
        let opened: Vec<_> = std::thread::scope(|scope| {
            let openers: Vec<_> = (0..4)
                .map(|_| scope.spawn(|| open(&path).map(|_| ())))
                .collect();
            openers.into_iter().map(|o| o.join().unwrap()).collect()
        });
        for result in opened {
            result.unwrap_or_else(|e| panic!("round {round}: {e}"));
        }
    }
}
