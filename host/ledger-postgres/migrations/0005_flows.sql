-- Models' flow state (stephost_core::flow), shared by every worker on the
-- ledger: what each model's request and token buckets hold, when they were
-- last filled, and until when its calls are paused (ms, by the server's
-- clock).
CREATE TABLE flows (
    key              text PRIMARY KEY,
    requests         double precision NOT NULL,
    tokens           double precision NOT NULL,
    at_ms            bigint NOT NULL,
    paused_until_ms  bigint NOT NULL
);
