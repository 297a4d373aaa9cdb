-- Notifications owed to webhooks (stephost_core::notices): recorded before
-- they are sent, marked when a receiver accepts them.
CREATE TABLE notices (
    no            bigserial PRIMARY KEY,
    delivery_id   text NOT NULL UNIQUE,
    webhook       text NOT NULL,
    event         text NOT NULL,
    run_id        text NOT NULL,
    body          text NOT NULL,
    created_at    bigint NOT NULL,
    state         text NOT NULL,
    next_at       bigint NOT NULL,
    attempts      integer NOT NULL,
    delivered_at  bigint,
    last_error    text
);
CREATE INDEX notices_due ON notices (next_at) WHERE state = 'owed';
CREATE INDEX notices_by_run ON notices (run_id, no);
CREATE INDEX runs_updated ON runs (updated_at);
