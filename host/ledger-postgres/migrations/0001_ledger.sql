-- stephost ledger on PostgreSQL, schema version 1.
--
-- A run's row is changed only by compare-and-set on `version` (claims,
-- renewals, releases, repins, a person's decision) or by its claim's holder
-- in a transaction that locks the row and checks `fence` first
-- (stephost_commit); every change bumps `version`. `due_at` is when a worker
-- should look at the run next, as stephost-core's lifecycle rules compute
-- it.

CREATE TABLE stephost_meta (
    key    text PRIMARY KEY,
    value  text NOT NULL
);
INSERT INTO stephost_meta (key, value) VALUES ('format', 'stephost-ledger'), ('version', '1');

CREATE TABLE modules (
    digest      text PRIMARY KEY,
    bytes       bytea NOT NULL,
    size        bigint NOT NULL,
    created_at  bigint NOT NULL
);

-- Request and response bodies larger than a call row keeps, by sha256 of
-- their text (model requests message by message): each kept once.
CREATE TABLE payloads (
    digest  text PRIMARY KEY,
    body    text NOT NULL
);

CREATE TABLE runs (
    run_id         text PRIMARY KEY,
    module_digest  text NOT NULL,
    input          text NOT NULL,
    status         text NOT NULL CHECK (status IN ('pending', 'running', 'waiting',
                   'completed', 'failed', 'parked', 'diverged')),
    output         text,
    error          text,
    created_at     bigint NOT NULL,
    updated_at     bigint NOT NULL,
    version        bigint NOT NULL,
    owner          text,
    lease_until    bigint,
    fence          bigint NOT NULL,
    wake_at        bigint,
    due_at         bigint,
    world          text NOT NULL,
    step           text,
    exit_code      integer
);
CREATE INDEX runs_due ON runs (due_at, run_id) WHERE due_at IS NOT NULL;
CREATE INDEX runs_created ON runs (created_at, run_id);
CREATE INDEX runs_status ON runs (status);

-- `request` and `outcome` hold the body, or (when `*_split`) its text with
-- references to `payloads`. `attempts` is a JSON array of the call's
-- attempts, in order.
CREATE TABLE calls (
    run_id         text NOT NULL,
    seq            bigint NOT NULL,
    class          text NOT NULL CHECK (class IN ('observe', 'read', 'write', 'suspend')),
    interface      text NOT NULL,
    function       text NOT NULL,
    operation_id   text NOT NULL,
    request        text NOT NULL,
    request_split  boolean NOT NULL,
    request_hash   text NOT NULL,
    state          text NOT NULL CHECK (state IN ('started', 'succeeded', 'failed', 'unknown')),
    outcome        text,
    outcome_split  boolean NOT NULL,
    started_at     bigint NOT NULL,
    finished_at    bigint,
    fence          bigint NOT NULL,
    resolved_by    text,
    resolved_at    bigint,
    chain          text,
    attempts       jsonb,
    PRIMARY KEY (run_id, seq)
);

CREATE TABLE logs (
    id         bigserial PRIMARY KEY,
    run_id     text NOT NULL,
    after_seq  bigint NOT NULL,
    level      text NOT NULL,
    message    text NOT NULL,
    at         bigint NOT NULL
);
CREATE INDEX logs_by_run ON logs (run_id, id);

CREATE TABLE counters (
    name   text PRIMARY KEY,
    value  bigint NOT NULL
);

-- One execution's commit, applied in one call (one statement, so one round
-- trip and no transaction statements around it when it is alone): locks
-- the run's row and refuses the commit unless `p_fence` is the run's newest
-- fencing token, then keeps the payloads, appends the calls (the first must
-- follow the run's last recorded call), sets outcomes and appends attempts
-- (`o_state` NULL: attempts only), appends log lines, renews the lease
-- (`p_lease_until` not NULL), ends the execution (`e_status` not NULL) and
-- adds to the counters. With `p_async`, the transaction commits without
-- waiting for its WAL flush (the next durable commit flushes it).
-- Errors: SH001 no such run; SH002 fenced (DETAIL: the newest token);
-- SH003 not appended (DETAIL: the last recorded sequence number); SH004 an
-- outcome for a call not recorded (DETAIL: its sequence number).
CREATE FUNCTION stephost_commit(
    p_run_id text, p_fence bigint, p_async boolean,
    d_digest text[], d_body text[],
    c_seq bigint[], c_class text[], c_interface text[], c_function text[],
    c_operation_id text[], c_request text[], c_request_split boolean[], c_request_hash text[],
    c_state text[], c_outcome text[], c_outcome_split boolean[], c_started_at bigint[],
    c_finished_at bigint[], c_chain text[], c_attempts text[],
    o_seq bigint[], o_state text[], o_outcome text[], o_outcome_split boolean[],
    o_finished_at bigint[], o_chain text[], o_attempts text[],
    l_after_seq bigint[], l_level text[], l_message text[], l_at bigint[],
    p_lease_until bigint, p_lease_due_at bigint,
    e_status text, e_output text, e_error text, e_exit_code integer, e_wake_at bigint,
    e_due_at bigint, e_updated_at bigint,
    n_name text[], n_value bigint[])
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    newest bigint;
    last_seq bigint;
BEGIN
    IF p_async THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    SELECT fence INTO newest FROM runs WHERE run_id = p_run_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no run %', p_run_id USING ERRCODE = 'SH001';
    END IF;
    IF newest <> p_fence THEN
        RAISE EXCEPTION 'run % is fenced', p_run_id USING ERRCODE = 'SH002', DETAIL = newest::text;
    END IF;
    IF d_digest IS NOT NULL THEN
        INSERT INTO payloads (digest, body)
            SELECT * FROM unnest(d_digest, d_body) ORDER BY 1 ON CONFLICT (digest) DO NOTHING;
    END IF;
    IF c_seq IS NOT NULL THEN
        SELECT coalesce(max(seq), 0) INTO last_seq FROM calls WHERE run_id = p_run_id;
        IF last_seq <> c_seq[1] - 1 THEN
            RAISE EXCEPTION 'call % of run % does not follow its last', c_seq[1], p_run_id
                USING ERRCODE = 'SH003', DETAIL = last_seq::text;
        END IF;
        INSERT INTO calls (run_id, seq, class, interface, function, operation_id, request,
            request_split, request_hash, state, outcome, outcome_split, started_at, finished_at,
            fence, chain, attempts)
        SELECT p_run_id, t.seq, t.class, t.interface, t.function, t.operation_id, t.request,
            t.request_split, t.request_hash, t.state, t.outcome, t.outcome_split, t.started_at,
            t.finished_at, p_fence, t.chain, t.attempts::jsonb
        FROM unnest(c_seq, c_class, c_interface, c_function, c_operation_id, c_request,
            c_request_split, c_request_hash, c_state, c_outcome, c_outcome_split, c_started_at,
            c_finished_at, c_chain, c_attempts)
            AS t(seq, class, interface, function, operation_id, request, request_split,
                 request_hash, state, outcome, outcome_split, started_at, finished_at, chain,
                 attempts);
    END IF;
    IF o_seq IS NOT NULL THEN
        FOR i IN 1 .. array_length(o_seq, 1) LOOP
            IF o_state[i] IS NULL THEN
                UPDATE calls SET attempts = coalesce(attempts, '[]'::jsonb) || o_attempts[i]::jsonb
                    WHERE run_id = p_run_id AND seq = o_seq[i];
            ELSE
                UPDATE calls SET state = o_state[i], outcome = o_outcome[i],
                    outcome_split = o_outcome_split[i], finished_at = o_finished_at[i],
                    chain = o_chain[i],
                    attempts = CASE WHEN o_attempts[i] IS NULL THEN attempts
                                    ELSE coalesce(attempts, '[]'::jsonb) || o_attempts[i]::jsonb END
                    WHERE run_id = p_run_id AND seq = o_seq[i];
            END IF;
            IF NOT FOUND THEN
                RAISE EXCEPTION 'call % of run % is not recorded', o_seq[i], p_run_id
                    USING ERRCODE = 'SH004', DETAIL = o_seq[i]::text;
            END IF;
        END LOOP;
    END IF;
    IF l_at IS NOT NULL THEN
        INSERT INTO logs (run_id, after_seq, level, message, at)
            SELECT p_run_id, * FROM unnest(l_after_seq, l_level, l_message, l_at);
    END IF;
    IF p_lease_until IS NOT NULL THEN
        UPDATE runs SET lease_until = p_lease_until, due_at = p_lease_due_at,
            version = version + 1 WHERE run_id = p_run_id;
    END IF;
    IF e_status IS NOT NULL THEN
        UPDATE runs SET status = e_status, output = e_output, error = e_error,
            exit_code = e_exit_code, wake_at = e_wake_at, due_at = e_due_at,
            updated_at = e_updated_at, owner = NULL, lease_until = NULL, version = version + 1
            WHERE run_id = p_run_id;
    END IF;
    IF n_name IS NOT NULL THEN
        INSERT INTO counters (name, value) SELECT * FROM unnest(n_name, n_value)
            ON CONFLICT (name) DO UPDATE SET value = counters.value + excluded.value;
    END IF;
END $$;

-- Workers LISTEN on `stephost_due`: a run that nobody holds and that has a
-- time it is due at (submitted, released, decided, waiting on a timer)
-- wakes them when its transaction commits.
CREATE FUNCTION stephost_notify_due() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('stephost_due', '');
    RETURN NULL;
END $$;
CREATE TRIGGER runs_due_notify AFTER INSERT OR UPDATE ON runs
    FOR EACH ROW WHEN (NEW.due_at IS NOT NULL AND NEW.owner IS NULL)
    EXECUTE FUNCTION stephost_notify_due();
