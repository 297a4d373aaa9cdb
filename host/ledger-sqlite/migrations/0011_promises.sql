-- Promises (stephost_core::promises): each promise's first completion,
-- kept in the transaction that appends it to its run's inbox.
CREATE TABLE promises (
    run_no  INTEGER NOT NULL,
    id      INTEGER NOT NULL,
    state   TEXT NOT NULL CHECK (state IN ('resolved', 'rejected')),
    value   TEXT NOT NULL,
    by      TEXT NOT NULL,
    at      INTEGER NOT NULL,
    PRIMARY KEY (run_no, id)
) STRICT, WITHOUT ROWID;
