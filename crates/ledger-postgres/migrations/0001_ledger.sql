-- stephost ledger on PostgreSQL, schema version 1.
--
-- A run's row is changed only by compare-and-set on `version` (claims,
-- renewals, releases, repins, a person's decision) or by its claim's holder
-- in a transaction that locks the row and checks `fence` first
-- (stephost_fenced); every change bumps `version`. `due_at` is when a worker
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

-- Locks run `p_run_id`'s row for the rest of the transaction and refuses
-- the transaction unless `p_fence` is the run's newest fencing token and,
-- if `p_first_seq` is given, unless it follows the run's last recorded
-- call. Errors: SH001 no such run; SH002 fenced (DETAIL: the newest token);
-- SH003 not appended (DETAIL: the last recorded sequence number).
CREATE FUNCTION stephost_fenced(p_run_id text, p_fence bigint, p_first_seq bigint)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    newest bigint;
    last_seq bigint;
BEGIN
    SELECT fence INTO newest FROM runs WHERE run_id = p_run_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no run %', p_run_id USING ERRCODE = 'SH001';
    END IF;
    IF newest <> p_fence THEN
        RAISE EXCEPTION 'run % is fenced', p_run_id USING ERRCODE = 'SH002', DETAIL = newest::text;
    END IF;
    IF p_first_seq IS NOT NULL THEN
        SELECT coalesce(max(seq), 0) INTO last_seq FROM calls WHERE run_id = p_run_id;
        IF last_seq <> p_first_seq - 1 THEN
            RAISE EXCEPTION 'call % of run % does not follow its last', p_first_seq, p_run_id
                USING ERRCODE = 'SH003', DETAIL = last_seq::text;
        END IF;
    END IF;
END $$;

-- Sets a recorded call's outcome (unless `p_state` is NULL) and appends
-- `p_attempts` (a JSON array, or NULL) to its attempts. SH004: the call is
-- not recorded.
CREATE FUNCTION stephost_outcome(p_run_id text, p_seq bigint, p_state text, p_outcome text,
    p_outcome_split boolean, p_finished_at bigint, p_chain text, p_attempts jsonb)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF p_state IS NULL THEN
        UPDATE calls SET attempts = coalesce(attempts, '[]'::jsonb) || p_attempts
            WHERE run_id = p_run_id AND seq = p_seq;
    ELSE
        UPDATE calls SET state = p_state, outcome = p_outcome, outcome_split = p_outcome_split,
            finished_at = p_finished_at, chain = p_chain,
            attempts = CASE WHEN p_attempts IS NULL THEN attempts
                            ELSE coalesce(attempts, '[]'::jsonb) || p_attempts END
            WHERE run_id = p_run_id AND seq = p_seq;
    END IF;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'call % of run % is not recorded', p_seq, p_run_id USING ERRCODE = 'SH004';
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
