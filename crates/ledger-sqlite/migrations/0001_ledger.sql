-- stephost ledger, schema version 1.
--
-- A run's row is changed only by compare-and-set on `version` (claims,
-- renewals, releases, repins, a person's decision) or by its claim's holder
-- in a transaction that checks `fence` (an execution's end, its lease);
-- every change bumps `version`. `due_at` is when a worker should look at the
-- run next, as stephost-core's lifecycle rules compute it.

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
    run_id         TEXT PRIMARY KEY,
    module_digest  TEXT NOT NULL,
    input          TEXT NOT NULL,
    status         TEXT NOT NULL CHECK (status IN
                   ('pending', 'running', 'waiting', 'completed', 'failed', 'parked', 'diverged')),
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

-- A run's calls, clustered by run and sequence number. `request` and
-- `outcome` hold the body, or (when `*_split` is 1) its text with
-- references to `payloads`. `attempts` is a JSON array of the call's
-- attempts, in order.
CREATE TABLE calls (
    run_id         TEXT NOT NULL,
    seq            INTEGER NOT NULL,
    class          TEXT NOT NULL CHECK (class IN ('observe', 'read', 'write', 'suspend')),
    interface      TEXT NOT NULL,
    function       TEXT NOT NULL,
    operation_id   TEXT NOT NULL,
    request        TEXT NOT NULL,
    request_split  INTEGER NOT NULL,
    request_hash   TEXT NOT NULL,
    state          TEXT NOT NULL CHECK (state IN ('started', 'succeeded', 'failed', 'unknown')),
    outcome        TEXT,
    outcome_split  INTEGER NOT NULL,
    started_at     INTEGER NOT NULL,
    finished_at    INTEGER,
    fence          INTEGER NOT NULL,
    resolved_by    TEXT,
    resolved_at    INTEGER,
    chain          TEXT,
    attempts       TEXT,
    PRIMARY KEY (run_id, seq)
) STRICT, WITHOUT ROWID;
-- Calls waiting for a person or for reconciliation: the approvals inbox and
-- the queue of unknown outcomes.
CREATE INDEX calls_open ON calls (state, started_at) WHERE state IN ('started', 'unknown');

CREATE TABLE logs (
    id         INTEGER PRIMARY KEY,
    run_id     TEXT NOT NULL,
    after_seq  INTEGER NOT NULL,
    level      TEXT NOT NULL,
    message    TEXT NOT NULL,
    at         INTEGER NOT NULL
) STRICT;
CREATE INDEX logs_by_run ON logs (run_id, id);

CREATE TABLE counters (
    name   TEXT PRIMARY KEY,
    value  INTEGER NOT NULL
) STRICT;
