-- stephost ledger, schema version 1.
--
-- CHECK constraints list their values with OR, not IN (...): SQLite builds
-- the IN list's table again at every statement, which made each insert of
-- a call more than twice as slow.
--
-- A run's row is changed only by compare-and-set on `version` (claims,
-- renewals, releases, repins, a person's decision) or by its claim's holder
-- in a transaction that checks `fence` (an execution's end, its lease);
-- every change bumps `version`. `due_at` is when a worker should look at the
-- run next, as stephost-core's lifecycle rules compute it. `run_no` numbers
-- runs in the order they were recorded; calls and log lines name their run
-- by it.

CREATE TABLE modules (
    digest      TEXT PRIMARY KEY,
    bytes       BLOB NOT NULL,
    size        INTEGER NOT NULL,
    created_at  INTEGER NOT NULL
) STRICT;

-- Request and response bodies larger than a call row keeps, by sha256 of
-- their text (model requests message by message): each kept once.
CREATE TABLE payloads (
    digest  TEXT PRIMARY KEY,
    body    TEXT NOT NULL
) STRICT, WITHOUT ROWID;

CREATE TABLE runs (
    run_no         INTEGER PRIMARY KEY,
    run_id         TEXT NOT NULL UNIQUE,
    module_digest  TEXT NOT NULL,
    input          TEXT NOT NULL,
    status         TEXT NOT NULL CHECK (status = 'pending' OR status = 'running'
                   OR status = 'waiting' OR status = 'completed' OR status = 'failed'
                   OR status = 'parked' OR status = 'diverged'),
    output         TEXT,
    error          TEXT,
    created_at     INTEGER NOT NULL,
    updated_at     INTEGER NOT NULL,
    version        INTEGER NOT NULL,
    owner          TEXT,
    lease_until    INTEGER,
    fence          INTEGER NOT NULL,
    wake_at        INTEGER,
    due_at         INTEGER,
    world          TEXT NOT NULL,
    step           TEXT,
    exit_code      INTEGER
) STRICT;
CREATE INDEX runs_due ON runs (due_at, run_id) WHERE due_at IS NOT NULL;
CREATE INDEX runs_created ON runs (created_at, run_id);
CREATE INDEX runs_status ON runs (status);

-- Calls, in the order they were recorded (`id`): the rows a commit writes
-- for many runs at once share the table's last pages. `segments` and
-- `run_epochs` say where each run's calls are (see src/segments.rs).
-- `request` and `outcome` hold the body, or (when `*_split` is 1) its text
-- with references to `payloads`. `attempts` is a JSON array of the call's
-- attempts, in order. The calls a person waits on (a started approval, an
-- unknown outcome) are each the last call of an unfinished run, found
-- through `runs_status`.
CREATE TABLE calls (
    id             INTEGER PRIMARY KEY,
    run_no         INTEGER NOT NULL,
    seq            INTEGER NOT NULL,
    class          TEXT NOT NULL CHECK (class = 'observe' OR class = 'read'
                   OR class = 'write' OR class = 'suspend'),
    interface      TEXT NOT NULL,
    function       TEXT NOT NULL,
    operation_id   TEXT NOT NULL,
    request        TEXT NOT NULL,
    request_split  INTEGER NOT NULL,
    request_hash   TEXT NOT NULL,
    state          TEXT NOT NULL CHECK (state = 'started' OR state = 'succeeded'
                   OR state = 'failed' OR state = 'unknown'),
    outcome        TEXT,
    outcome_split  INTEGER NOT NULL,
    started_at     INTEGER NOT NULL,
    finished_at    INTEGER,
    fence          INTEGER NOT NULL,
    resolved_by    TEXT,
    resolved_at    INTEGER,
    chain          TEXT,
    attempts       TEXT
) STRICT;

-- A segment: a run's calls with consecutive sequence numbers at consecutive
-- ids, from `first_id`. Keyed by epoch (`first_id >> 10`) first, so that
-- the segments one commit begins for many runs share a page.
CREATE TABLE segments (
    epoch      INTEGER NOT NULL,
    run_no     INTEGER NOT NULL,
    first_seq  INTEGER NOT NULL,
    first_id   INTEGER NOT NULL,
    PRIMARY KEY (epoch, run_no, first_seq)
) STRICT, WITHOUT ROWID;

-- The epochs each run has segments in, by the first sequence number of the
-- run's first segment there.
CREATE TABLE run_epochs (
    run_no     INTEGER NOT NULL,
    first_seq  INTEGER NOT NULL,
    epoch      INTEGER NOT NULL,
    PRIMARY KEY (run_no, first_seq)
) STRICT, WITHOUT ROWID;

CREATE TABLE logs (
    id         INTEGER PRIMARY KEY,
    run_no     INTEGER NOT NULL,
    after_seq  INTEGER NOT NULL,
    level      TEXT NOT NULL,
    message    TEXT NOT NULL,
    at         INTEGER NOT NULL
) STRICT;
CREATE INDEX logs_by_run ON logs (run_no, id);

CREATE TABLE counters (
    name   TEXT PRIMARY KEY,
    value  INTEGER NOT NULL
) STRICT;
