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
    // v3: the same tables, with CHECKs spelled as OR chains. SQLite builds
    // a temporary b-tree for every `x IN (a, b, c, ...)` of more than two
    // values, each time a row is written: about 3 µs per recorded call.
    // The tables are rebuilt (SQLite cannot change a CHECK in place), with
    // foreign keys off for the rebuild (see `SqliteLedger::migrate`).
    // The index of calls by operation id is gone with the old table: no
    // query used it, and it cost every write one more page in the WAL.
    r#"
CREATE TABLE runs_v3 (
    run_id        TEXT PRIMARY KEY,
    module_digest TEXT NOT NULL REFERENCES modules(digest),
    input         TEXT NOT NULL,
    status        TEXT NOT NULL CHECK (status = 'pending' OR status = 'running'
                      OR status = 'waiting' OR status = 'completed' OR status = 'failed'
                      OR status = 'parked' OR status = 'diverged'),
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
    step          TEXT,
    exit_code     INTEGER
) STRICT;
INSERT INTO runs_v3 (run_id, module_digest, input, status, output, error, created_at,
    updated_at, version, owner, lease_until, fence, wake_at, world, step, exit_code)
SELECT run_id, module_digest, input, status, output, error, created_at,
    updated_at, version, owner, lease_until, fence, wake_at, world, step, exit_code
FROM runs;
DROP TABLE runs;
ALTER TABLE runs_v3 RENAME TO runs;
CREATE INDEX runs_by_status ON runs(status, created_at);

CREATE TABLE calls_v3 (
    run_id        TEXT NOT NULL REFERENCES runs(run_id),
    seq           INTEGER NOT NULL,
    class         TEXT NOT NULL CHECK (class = 'observe' OR class = 'read'
                      OR class = 'write' OR class = 'suspend'),
    interface     TEXT NOT NULL,
    function      TEXT NOT NULL,
    operation_id  TEXT NOT NULL,
    request       TEXT NOT NULL,
    request_hash  TEXT NOT NULL,
    state         TEXT NOT NULL CHECK (state = 'started' OR state = 'succeeded'
                      OR state = 'failed' OR state = 'unknown'),
    outcome       TEXT,
    started_at    INTEGER NOT NULL,
    finished_at   INTEGER,
    fence         INTEGER NOT NULL,
    resolved_by   TEXT,
    resolved_at   INTEGER,
    chain         TEXT,
    PRIMARY KEY (run_id, seq)
) STRICT, WITHOUT ROWID;
INSERT INTO calls_v3 (run_id, seq, class, interface, function, operation_id, request,
    request_hash, state, outcome, started_at, finished_at, fence, resolved_by, resolved_at, chain)
SELECT run_id, seq, class, interface, function, operation_id, request,
    request_hash, state, outcome, started_at, finished_at, fence, resolved_by, resolved_at, chain
FROM calls;
DROP TABLE calls;
ALTER TABLE calls_v3 RENAME TO calls;
"#,
    // v4: a call's attempts are kept in its own row, as a JSON array, not
    // in a table of their own. Attempts are written with their call's
    // outcome, so a write's commit now changes one page (the call's) where
    // it changed two; with many runs in one commit, each run's calls and
    // attempts sat on pages of their own, so this halves the pages a group
    // commit writes.
    r#"
ALTER TABLE calls ADD COLUMN attempts TEXT;
UPDATE calls SET attempts = (
    SELECT json_group_array(json_object('attempt', a.attempt, 'kind', a.kind,
        'started_at', a.started_at, 'finished_at', a.finished_at, 'result', a.result,
        'detail', a.detail, 'fence', a.fence) ORDER BY a.attempt)
    FROM attempts a WHERE a.run_id = calls.run_id AND a.seq = calls.seq)
WHERE EXISTS (SELECT 1 FROM attempts a WHERE a.run_id = calls.run_id AND a.seq = calls.seq);
DROP TABLE attempts;
"#,
    // v5: calls are keyed by one integer, their run's number in the high 32
    // bits and their sequence number in the low 32 (`run_no` and `seq` are
    // computed from it, not stored). Keyed by (run_id, seq), the calls
    // table was a b-tree of its own kind (WITHOUT ROWID), where SQLite
    // splits a full page by spreading its rows over three: a run's next
    // call then split a page every third commit or so, and a write's commit
    // carried 2.7 pages on average. An integer key appends a run's calls at
    // the end of the table, where a full page is simply followed by a new
    // one: about one page per commit, rows packed, no run id in every row.
    // A run's number is given when the run is recorded and never changes.
    r#"
ALTER TABLE runs ADD COLUMN run_no INTEGER;
UPDATE runs SET run_no = rowid;
CREATE UNIQUE INDEX runs_by_no ON runs(run_no);

CREATE TABLE calls_v5 (
    key           INTEGER PRIMARY KEY,
    run_no        INTEGER GENERATED ALWAYS AS (key >> 32) VIRTUAL,
    seq           INTEGER GENERATED ALWAYS AS (key & 4294967295) VIRTUAL,
    class         TEXT NOT NULL CHECK (class = 'observe' OR class = 'read'
                      OR class = 'write' OR class = 'suspend'),
    interface     TEXT NOT NULL,
    function      TEXT NOT NULL,
    operation_id  TEXT NOT NULL,
    request       TEXT NOT NULL,
    request_hash  TEXT NOT NULL,
    state         TEXT NOT NULL CHECK (state = 'started' OR state = 'succeeded'
                      OR state = 'failed' OR state = 'unknown'),
    outcome       TEXT,
    started_at    INTEGER NOT NULL,
    finished_at   INTEGER,
    fence         INTEGER NOT NULL,
    resolved_by   TEXT,
    resolved_at   INTEGER,
    chain         TEXT,
    attempts      TEXT
) STRICT;
INSERT INTO calls_v5 (key, class, interface, function, operation_id, request, request_hash,
    state, outcome, started_at, finished_at, fence, resolved_by, resolved_at, chain, attempts)
SELECT (r.run_no << 32) + c.seq, c.class, c.interface, c.function, c.operation_id, c.request,
    c.request_hash, c.state, c.outcome, c.started_at, c.finished_at, c.fence, c.resolved_by,
    c.resolved_at, c.chain, c.attempts
FROM calls c JOIN runs r ON r.run_id = c.run_id
ORDER BY r.run_no, c.seq;
-- A call whose run is missing (only a damaged ledger has one) would be
-- left behind by the join: the migration fails instead.
CREATE TEMP TABLE v5_check (ok INTEGER CONSTRAINT every_call_has_its_run CHECK (ok));
INSERT INTO v5_check SELECT (SELECT count(*) FROM calls) = (SELECT count(*) FROM calls_v5);
DROP TABLE v5_check;
DROP TABLE calls;
ALTER TABLE calls_v5 RENAME TO calls;
"#,
    // v6: runs by status and when they are due, so that a worker's look
    // for runnable runs reads the due waiting runs only, not every waiting
    // run.
    r#"
CREATE INDEX runs_waking ON runs(status, wake_at);
"#,
    // v7: calls are stored in the order they were recorded (by rowid) and
    // found by their key through a unique index. Stored by key, a worker
    // running many runs at once wrote each run's call onto that run's own
    // page of the table, and split full pages in the middle of the table,
    // where SQLite spreads a page's rows over three: a transaction of 20
    // runs' commits wrote 2.3 pages per commit. Stored in order, every
    // commit's row goes onto the table's last page, shared by the whole
    // transaction; only the index's small entries land in a page per run.
    // SQLite alone writes 0.9 pages per commit so, and 1.6 times as many
    // commits a second (`stephost-bench`'s figure 5 ceiling). A run's calls
    // recorded together still sit together, so reading a history in order
    // reads the same pages, through the index.
    r#"
CREATE TABLE calls_v7 (
    id            INTEGER PRIMARY KEY,
    key           INTEGER NOT NULL,
    run_no        INTEGER GENERATED ALWAYS AS (key >> 32) VIRTUAL,
    seq           INTEGER GENERATED ALWAYS AS (key & 4294967295) VIRTUAL,
    class         TEXT NOT NULL CHECK (class = 'observe' OR class = 'read'
                      OR class = 'write' OR class = 'suspend'),
    interface     TEXT NOT NULL,
    function      TEXT NOT NULL,
    operation_id  TEXT NOT NULL,
    request       TEXT NOT NULL,
    request_hash  TEXT NOT NULL,
    state         TEXT NOT NULL CHECK (state = 'started' OR state = 'succeeded'
                      OR state = 'failed' OR state = 'unknown'),
    outcome       TEXT,
    started_at    INTEGER NOT NULL,
    finished_at   INTEGER,
    fence         INTEGER NOT NULL,
    resolved_by   TEXT,
    resolved_at   INTEGER,
    chain         TEXT,
    attempts      TEXT
) STRICT;
INSERT INTO calls_v7 (key, class, interface, function, operation_id, request, request_hash,
    state, outcome, started_at, finished_at, fence, resolved_by, resolved_at, chain, attempts)
SELECT key, class, interface, function, operation_id, request, request_hash,
    state, outcome, started_at, finished_at, fence, resolved_by, resolved_at, chain, attempts
FROM calls ORDER BY key;
DROP TABLE calls;
ALTER TABLE calls_v7 RENAME TO calls;
CREATE UNIQUE INDEX calls_by_key ON calls(key);
"#,
    // v8: calls are found through spans, not an index of every key (see
    // `ledger/spans.rs`): a span is a run's calls with consecutive
    // sequence numbers stored at consecutive rowids, recorded where it
    // begins. The index cost a run that writes alone a second WAL page in
    // every commit; a span is written only by a run's first call and where
    // another run's call came between two of a run's. The spans of the
    // rows already stored are where a run's rowid and sequence number stop
    // moving together. A call row's fencing token is renamed
    // `writer_fence`, so that an older stephost still running when the
    // ledger is migrated cannot write a call row at all (each of its
    // writes of calls names `fence`): a row it wrote without a span would
    // be lost to every reader.
    r#"
CREATE TABLE call_spans (
    run_no     INTEGER NOT NULL,
    first_seq  INTEGER NOT NULL,
    first_id   INTEGER NOT NULL,
    PRIMARY KEY (run_no, first_seq)
) STRICT, WITHOUT ROWID;
INSERT INTO call_spans (run_no, first_seq, first_id)
SELECT run_no, seq, id FROM (
    SELECT run_no, seq, id, lag(id) OVER w AS before_id, lag(seq) OVER w AS before_seq
    FROM calls WINDOW w AS (PARTITION BY run_no ORDER BY seq))
WHERE before_id IS NULL OR id - before_id <> seq - before_seq;
DROP INDEX calls_by_key;
ALTER TABLE calls RENAME COLUMN fence TO writer_fence;
"#,
    // v9: spans are kept by epoch first (a range of 1,024 rowids, where the
    // span's first call is), then run: a worker's group commit begins a
    // span for nearly every call of its runs, and keyed by run first, a
    // transaction's spans landed on a page per run; by epoch first, they
    // share a page or two. `run_epochs` records, for each run, the first
    // sequence number it has in each epoch, which is how a run's spans are
    // found. An older stephost still running cannot write a span (its
    // insert names no epoch), so it fails at the first call that would
    // begin one; a call that extends a span needs none and is found.
    r#"
-- Epochs are found in the order of a run's calls, so a run's spans must
-- take rowids in that order. Every build since v8 stores them so; v7's
-- (never released) could store a commit's buffered calls before its
-- started one. Such a ledger is refused, not migrated into lookups that
-- would miss calls.
CREATE TEMP TABLE v9_check (ok INTEGER CONSTRAINT spans_in_rowid_order CHECK (ok));
INSERT INTO v9_check SELECT NOT EXISTS (SELECT 1 FROM (SELECT first_id,
    lag(first_id) OVER (PARTITION BY run_no ORDER BY first_seq) AS before_id FROM call_spans)
    WHERE first_id < before_id);
DROP TABLE v9_check;
CREATE TABLE call_spans_v9 (
    epoch      INTEGER NOT NULL,
    run_no     INTEGER NOT NULL,
    first_seq  INTEGER NOT NULL,
    first_id   INTEGER NOT NULL,
    PRIMARY KEY (epoch, run_no, first_seq)
) STRICT, WITHOUT ROWID;
INSERT INTO call_spans_v9 (epoch, run_no, first_seq, first_id)
SELECT first_id >> 10, run_no, first_seq, first_id FROM call_spans;
CREATE TABLE run_epochs (
    run_no     INTEGER NOT NULL,
    first_seq  INTEGER NOT NULL,
    epoch      INTEGER NOT NULL,
    PRIMARY KEY (run_no, first_seq)
) STRICT, WITHOUT ROWID;
INSERT INTO run_epochs (run_no, first_seq, epoch)
SELECT run_no, min(first_seq), epoch FROM call_spans_v9 GROUP BY run_no, epoch;
DROP TABLE call_spans;
ALTER TABLE call_spans_v9 RENAME TO call_spans;
"#,
];

/// The schema version this build writes.
pub fn current_version() -> i64 {
    MIGRATIONS.len() as i64
}
