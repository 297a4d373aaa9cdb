-- The runs of a tree, counted against [limits] runs_per_tree_max.
CREATE INDEX runs_root ON runs (root_run_id) WHERE root_run_id IS NOT NULL;

-- Trees' model spend (stephost_core::tree_spend): what each run of a tree
-- has spent on model calls, or holds for one in flight, written whole; the
-- tree's total counts against its root's budget.
CREATE TABLE tree_spend (
    root_run_id  TEXT NOT NULL,
    run_id       TEXT NOT NULL,
    tokens       INTEGER NOT NULL,
    micro_usd    INTEGER NOT NULL,
    PRIMARY KEY (root_run_id, run_id)
) STRICT, WITHOUT ROWID;
