-- Models' flow state (stephost_core::flow), shared by every process on the
-- ledger: what each model's request and token buckets hold, when they were
-- last filled, and until when its calls are paused (ms).
CREATE TABLE flows (
    key              TEXT PRIMARY KEY,
    requests         REAL NOT NULL,
    tokens           REAL NOT NULL,
    at_ms            INTEGER NOT NULL,
    paused_until_ms  INTEGER NOT NULL
) STRICT;
