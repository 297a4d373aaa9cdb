-- Promises (stephost_core::promises): each promise's first completion,
-- kept in the transaction that appends it to its run's inbox.
CREATE TABLE promises (
    run_id  text NOT NULL REFERENCES runs (run_id),
    id      bigint NOT NULL,
    state   text NOT NULL CHECK (state IN ('resolved', 'rejected')),
    value   text NOT NULL,
    by      text NOT NULL,
    at      bigint NOT NULL,
    PRIMARY KEY (run_id, id)
);
