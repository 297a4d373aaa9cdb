//! Versioned schema of the SQLite ledger.
//!
//! The file is marked with `PRAGMA application_id` so that stephost never
//! writes into a database that is not its own, and `PRAGMA user_version`
//! holds the schema version. Migrations run in order, each in its own
//! transaction; a ledger newer than this build is refused.

/// `STEP` in ASCII.
pub const APPLICATION_ID: i64 = 0x5354_4550;

/// Each entry migrates from version `index` to `index + 1`.
pub const MIGRATIONS: &[&str] = &[
    // v1: modules, runs, calls, attempts, logs.
    r#"
CREATE TABLE modules (
    digest      TEXT PRIMARY KEY,
    bytes       BLOB NOT NULL,
    size        INTEGER NOT NULL,
    created_at  INTEGER NOT NULL
) STRICT;

CREATE TABLE runs (
    run_id        TEXT PRIMARY KEY,
    module_digest TEXT NOT NULL REFERENCES modules(digest),
    input         TEXT NOT NULL,
    status        TEXT NOT NULL CHECK (status IN ('pending','running','waiting','completed','failed','parked','diverged')),
    output        TEXT,
    error         TEXT,
    created_at    INTEGER NOT NULL,
    updated_at    INTEGER NOT NULL,
    version       INTEGER NOT NULL,
    owner         TEXT,
    lease_until   INTEGER,
    fence         INTEGER NOT NULL,
    wake_at       INTEGER,
    world         TEXT NOT NULL,
    step          TEXT
) STRICT;
CREATE INDEX runs_by_status ON runs(status, created_at);

CREATE TABLE calls (
    run_id        TEXT NOT NULL REFERENCES runs(run_id),
    seq           INTEGER NOT NULL,
    class         TEXT NOT NULL CHECK (class IN ('observe','read','write','suspend')),
    interface     TEXT NOT NULL,
    function      TEXT NOT NULL,
    operation_id  TEXT NOT NULL,
    request       TEXT NOT NULL,
    request_hash  TEXT NOT NULL,
    state         TEXT NOT NULL CHECK (state IN ('started','succeeded','failed','unknown')),
    outcome       TEXT,
    started_at    INTEGER NOT NULL,
    finished_at   INTEGER,
    fence         INTEGER NOT NULL,
    resolved_by   TEXT,
    resolved_at   INTEGER,
    chain         TEXT,
    PRIMARY KEY (run_id, seq)
) STRICT, WITHOUT ROWID;
-- Operation ids are looked up for writes (and approvals) only.
CREATE INDEX calls_by_operation ON calls(operation_id) WHERE class IN ('write', 'suspend');

CREATE TABLE attempts (
    run_id      TEXT NOT NULL,
    seq         INTEGER NOT NULL,
    attempt     INTEGER NOT NULL,
    kind        TEXT NOT NULL,
    started_at  INTEGER NOT NULL,
    finished_at INTEGER NOT NULL,
    result      TEXT NOT NULL,
    detail      TEXT,
    fence       INTEGER NOT NULL,
    PRIMARY KEY (run_id, seq, attempt),
    FOREIGN KEY (run_id, seq) REFERENCES calls(run_id, seq)
) STRICT, WITHOUT ROWID;

CREATE TABLE logs (
    run_id     TEXT NOT NULL REFERENCES runs(run_id),
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    after_seq  INTEGER NOT NULL,
    level      TEXT NOT NULL,
    message    TEXT NOT NULL,
    at         INTEGER NOT NULL
) STRICT;
CREATE INDEX logs_by_run ON logs(run_id, id);

CREATE TABLE counters (
    name   TEXT PRIMARY KEY,
    value  INTEGER NOT NULL
) STRICT;
"#,
    // v2: the exit status of a finished WASI command run.
    r#"
ALTER TABLE runs ADD COLUMN exit_code INTEGER;
"#,
];

/// The schema version this build writes.
pub fn current_version() -> i64 {
    MIGRATIONS.len() as i64
}
