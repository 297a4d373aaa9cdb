-- Child runs and cancellation (docs/composition.md).
--
-- The runs table is made again (SQLite cannot change a CHECK constraint):
-- a run may be `cancelled`. A child's row names the parent's call that
-- started it (`parent_run_id`, `parent_seq`), the join set it is joined
-- in, whether it goes on when its parent ends first (`detached`), and the
-- root of its tree; all set when the child is recorded (in the parent's
-- commit of that call), never changed, and sealed with its input.
-- `arrivals` counts the ends of the run's children: a child's end, in its
-- own commit, adds one and appends the end to `inbox` under that number
-- (gapless, in commit order), and makes the parent due if it waits. It
-- moves `version`, never `fence`: a running parent goes on. `cancel_at`,
-- `cancel_by` and `cancel_reason` mark a run cancelled (with the runs
-- below it, in one transaction): a commit of the run that begins
-- something (a write, a wait, a child) is refused from then on.
CREATE TABLE runs_new (
    run_no         INTEGER PRIMARY KEY,
    run_id         TEXT NOT NULL UNIQUE,
    module_digest  TEXT NOT NULL,
    input          TEXT NOT NULL,
    status         TEXT NOT NULL CHECK (status = 'pending' OR status = 'running'
                   OR status = 'waiting' OR status = 'completed' OR status = 'failed'
                   OR status = 'parked' OR status = 'diverged' OR status = 'cancelled'),
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
    exit_code      INTEGER,
    seal           TEXT,
    budget         TEXT,
    trace          TEXT,
    parent_run_id  TEXT,
    parent_seq     INTEGER,
    join_set       TEXT,
    detached       INTEGER NOT NULL DEFAULT 0,
    root_run_id    TEXT,
    arrivals       INTEGER NOT NULL DEFAULT 0,
    cancel_at      INTEGER,
    cancel_by      TEXT,
    cancel_reason  TEXT
) STRICT;
INSERT INTO runs_new (run_no, run_id, module_digest, input, status, output, error, created_at,
        updated_at, version, owner, lease_until, fence, wake_at, due_at, world, step, exit_code,
        seal, budget, trace)
    SELECT run_no, run_id, module_digest, input, status, output, error, created_at, updated_at,
        version, owner, lease_until, fence, wake_at, due_at, world, step, exit_code, seal,
        budget, trace
    FROM runs;
DROP TABLE runs;
ALTER TABLE runs_new RENAME TO runs;
CREATE INDEX runs_due ON runs (due_at, run_id) WHERE due_at IS NOT NULL;
CREATE INDEX runs_created ON runs (created_at, run_id);
CREATE INDEX runs_status ON runs (status);
CREATE INDEX runs_updated ON runs (updated_at);
CREATE INDEX runs_children ON runs (parent_run_id, parent_seq) WHERE parent_run_id IS NOT NULL;

CREATE TABLE inbox (
    run_no        INTEGER NOT NULL,
    arrival       INTEGER NOT NULL,
    child_run_id  TEXT NOT NULL,
    join_set      TEXT NOT NULL,
    status        TEXT NOT NULL,
    at            INTEGER NOT NULL,
    PRIMARY KEY (run_no, arrival),
    UNIQUE (run_no, child_run_id)
) STRICT;
