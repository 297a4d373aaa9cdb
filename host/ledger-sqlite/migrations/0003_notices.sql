-- Notifications owed to webhooks (stephost_core::notices): recorded before
-- they are sent, marked when a receiver accepts them.
CREATE TABLE notices (
    no            INTEGER PRIMARY KEY,
    delivery_id   TEXT NOT NULL UNIQUE,
    webhook       TEXT NOT NULL,
    event         TEXT NOT NULL,
    run_id        TEXT NOT NULL,
    body          TEXT NOT NULL,
    created_at    INTEGER NOT NULL,
    state         TEXT NOT NULL,
    next_at       INTEGER NOT NULL,
    attempts      INTEGER NOT NULL,
    delivered_at  INTEGER,
    last_error    TEXT
);
CREATE INDEX notices_due ON notices (next_at) WHERE state = 'owed';
CREATE INDEX notices_by_run ON notices (run_id, no);
CREATE INDEX runs_updated ON runs (updated_at);
