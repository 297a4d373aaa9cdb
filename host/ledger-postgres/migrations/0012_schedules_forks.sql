-- Schedules (stephost_core::schedules): one row per schedule, moved by
-- compare-and-set on `version` by the worker that fires its due slots.
-- `next_at` is the first slot not yet handled; `buffered_at` a slot kept
-- (overlap buffer-one) to fire when `last_run_id` finishes.
CREATE TABLE schedules (
    name          text PRIMARY KEY,
    cron          text NOT NULL,
    timezone      text NOT NULL,
    module_digest text NOT NULL,
    world         text NOT NULL,
    step          text,
    input         text NOT NULL,
    overlap       text NOT NULL CHECK (overlap IN ('skip', 'buffer-one', 'allow')),
    catch_up      bigint NOT NULL,
    paused        boolean NOT NULL,
    next_at       bigint NOT NULL,
    last_run_id   text,
    buffered_at   bigint,
    created_at    bigint NOT NULL,
    updated_at    bigint NOT NULL,
    version       bigint NOT NULL
);
CREATE INDEX schedules_due ON schedules (next_at) WHERE NOT paused;

-- Forks (stephost_core::fork): the source run, the call the fork went live
-- from, the source's link before it and whose operation ids the fork's
-- calls carry (`fork`, JSON), set when the fork is recorded and sealed with
-- its input; `fork_of`, the source alone, finds a run's forks. NULL for a
-- run that is no fork.
ALTER TABLE runs ADD COLUMN fork text;
ALTER TABLE runs ADD COLUMN fork_of text;
CREATE INDEX runs_forks ON runs (fork_of) WHERE fork_of IS NOT NULL;
