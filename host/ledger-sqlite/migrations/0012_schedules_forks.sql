-- Schedules (stephost_core::schedules): one row per schedule, moved by
-- compare-and-set on `version` by the worker that fires its due slots.
-- `next_at` is the first slot not yet handled; `buffered_at` a slot kept
-- (overlap buffer-one) to fire when `last_run_id` finishes.
CREATE TABLE schedules (
    name          TEXT PRIMARY KEY,
    cron          TEXT NOT NULL,
    timezone      TEXT NOT NULL,
    module_digest TEXT NOT NULL,
    world         TEXT NOT NULL,
    step          TEXT,
    input         TEXT NOT NULL,
    overlap       TEXT NOT NULL CHECK (overlap IN ('skip', 'buffer-one', 'allow')),
    catch_up      INTEGER NOT NULL,
    paused        INTEGER NOT NULL,
    next_at       INTEGER NOT NULL,
    last_run_id   TEXT,
    buffered_at   INTEGER,
    created_at    INTEGER NOT NULL,
    updated_at    INTEGER NOT NULL,
    version       INTEGER NOT NULL
) STRICT;
CREATE INDEX schedules_due ON schedules (next_at) WHERE paused = 0;

-- Forks (stephost_core::fork): the source run, the call the fork went live
-- from, the source's link before it and whose operation ids the fork's
-- calls carry (`fork`, JSON), set when the fork is recorded and sealed with
-- its input; `fork_of`, the source alone, finds a run's forks. NULL for a
-- run that is no fork.
ALTER TABLE runs ADD COLUMN fork TEXT;
ALTER TABLE runs ADD COLUMN fork_of TEXT;
CREATE INDEX runs_forks ON runs (fork_of) WHERE fork_of IS NOT NULL;
