-- Child runs (docs/composition.md). A child's row names the parent's call
-- that started it and the join set it is joined in, and the root of its
-- tree; all set when the child is recorded (in the same transaction as the
-- parent's call that starts it), never changed, and sealed with its input.
-- `arrivals` counts the ends of the run's children: a child's end, in its
-- own commit, adds one and appends the end to `inbox` under that number
-- (gapless, in commit order: the parent's row is locked first), and makes
-- the parent due if it waits. It moves `version`, never `fence`: a running
-- parent goes on.
ALTER TABLE runs ADD COLUMN parent_run_id text;
ALTER TABLE runs ADD COLUMN parent_seq bigint;
ALTER TABLE runs ADD COLUMN join_set text;
ALTER TABLE runs ADD COLUMN root_run_id text;
ALTER TABLE runs ADD COLUMN arrivals bigint NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN detached boolean NOT NULL DEFAULT false;
-- A run cancelled (with the runs below it, in one transaction): a commit
-- of the run that begins something (a write, a wait, a child) is refused
-- from then on (SH005).
ALTER TABLE runs ADD COLUMN cancel_at bigint;
ALTER TABLE runs ADD COLUMN cancel_by text;
ALTER TABLE runs ADD COLUMN cancel_reason text;
ALTER TABLE runs DROP CONSTRAINT runs_status_check;
ALTER TABLE runs ADD CONSTRAINT runs_status_check CHECK (status IN ('pending', 'running',
    'waiting', 'completed', 'failed', 'parked', 'diverged', 'cancelled'));
CREATE INDEX runs_children ON runs (parent_run_id, parent_seq) WHERE parent_run_id IS NOT NULL;

CREATE TABLE inbox (
    run_id        text NOT NULL REFERENCES runs (run_id),
    arrival       bigint NOT NULL,
    child_run_id  text NOT NULL,
    join_set      text NOT NULL,
    status        text NOT NULL,
    at            bigint NOT NULL,
    PRIMARY KEY (run_id, arrival),
    UNIQUE (run_id, child_run_id)
);

-- Marks the runs `p_top` cancelled (each unfinished one not marked yet),
-- then every run below them, level by level; the ids marked. A run nobody
-- holds that is pending or waiting is due at once. Each level's rows are
-- locked (updated) before the next level is read, in its own statement:
-- a child started by a run of that level either committed before the lock
-- (and is read with the next level) or waits for it and finds the mark,
-- so no child escapes.
CREATE FUNCTION stephost_mark_cancelled(p_top text[], p_at bigint, p_by text, p_reason text)
RETURNS SETOF text LANGUAGE plpgsql AS $$
DECLARE
    level text[] := p_top;
    r record;
BEGIN
    WHILE cardinality(level) > 0 LOOP
        PERFORM 1 FROM runs WHERE run_id = ANY(level) ORDER BY run_id FOR UPDATE;
        FOR r IN UPDATE runs SET cancel_at = p_at, cancel_by = p_by, cancel_reason = p_reason,
                version = version + 1, updated_at = p_at,
                wake_at = CASE WHEN status = 'waiting' AND owner IS NULL THEN p_at
                               ELSE wake_at END,
                due_at = CASE WHEN status IN ('pending', 'waiting') AND owner IS NULL THEN p_at
                              ELSE due_at END
                WHERE run_id = ANY(level) AND cancel_at IS NULL
                    AND status NOT IN ('completed', 'failed', 'diverged', 'cancelled')
                RETURNING run_id LOOP
            RETURN NEXT r.run_id;
        END LOOP;
        SELECT coalesce(array_agg(run_id ORDER BY parent_seq), '{}') INTO level
            FROM runs WHERE parent_run_id = ANY(level);
    END LOOP;
END $$;

-- stephost_commit as in 0004, and also:
--   begins          the commit begins something: refused (SH005, DETAIL
--                   who cancelled and why) once the run is cancelled;
--   end.cancel_children  {at, by, reason}: the run's children not detached
--                   are cancelled with its end (stephost_mark_cancelled);
--   end.inbox_seen  for a run that waits for a child: the arrivals it saw;
--                   if more have arrived, the run is due at once;
--   end.arrival     {parent_run_id, child_run_id, join_set, status, at}: a
--                   child's end, appended to its parent's inbox.
DROP FUNCTION stephost_commit;

CREATE FUNCTION stephost_commit(
    p_run_id text, p_fence bigint, p_async boolean, d_digest text[], d_body text[], p jsonb)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    newest bigint;
    last_seq bigint;
    u record;
    a record;
    n bigint;
    c_by text;
    c_reason text;
BEGIN
    IF p_async THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    SELECT fence, cancel_by, cancel_reason INTO newest, c_by, c_reason FROM runs
        WHERE run_id = p_run_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no run %', p_run_id USING ERRCODE = 'SH001';
    END IF;
    IF newest <> p_fence THEN
        RAISE EXCEPTION 'run % is fenced', p_run_id USING ERRCODE = 'SH002', DETAIL = newest::text;
    END IF;
    IF c_by IS NOT NULL AND (p->>'begins')::boolean THEN
        RAISE EXCEPTION 'run % is cancelled', p_run_id USING ERRCODE = 'SH005',
            DETAIL = jsonb_build_object('by', c_by, 'reason', c_reason)::text;
    END IF;
    IF d_digest IS NOT NULL THEN
        INSERT INTO payloads (digest, body)
            SELECT * FROM unnest(d_digest, d_body) ORDER BY 1 ON CONFLICT (digest) DO NOTHING;
    END IF;
    IF p ? 'calls' THEN
        SELECT coalesce(max(seq), 0) INTO last_seq FROM calls WHERE run_id = p_run_id;
        IF last_seq <> (p->'calls'->0->>'seq')::bigint - 1 THEN
            RAISE EXCEPTION 'call % of run % does not follow its last', p->'calls'->0->>'seq',
                p_run_id USING ERRCODE = 'SH003', DETAIL = last_seq::text;
        END IF;
        INSERT INTO calls
            SELECT r.* FROM jsonb_array_elements(p->'calls') AS c,
                LATERAL jsonb_populate_record(NULL::calls,
                    c || jsonb_build_object('run_id', p_run_id, 'fence', p_fence)) AS r;
    END IF;
    IF p ? 'updates' THEN
        FOR u IN SELECT * FROM jsonb_to_recordset(p->'updates') AS x(seq bigint, state text,
                outcome text, outcome_split boolean, finished_at bigint, chain text,
                attempts jsonb) LOOP
            IF u.state IS NULL THEN
                UPDATE calls SET attempts = coalesce(attempts, '[]'::jsonb) || u.attempts
                    WHERE run_id = p_run_id AND seq = u.seq;
            ELSE
                UPDATE calls SET state = u.state, outcome = u.outcome,
                    outcome_split = u.outcome_split, finished_at = u.finished_at,
                    chain = u.chain,
                    attempts = CASE WHEN u.attempts IS NULL THEN attempts
                                    ELSE coalesce(attempts, '[]'::jsonb) || u.attempts END
                    WHERE run_id = p_run_id AND seq = u.seq;
            END IF;
            IF NOT FOUND THEN
                RAISE EXCEPTION 'call % of run % is not recorded', u.seq, p_run_id
                    USING ERRCODE = 'SH004', DETAIL = u.seq::text;
            END IF;
        END LOOP;
    END IF;
    IF p ? 'logs' THEN
        INSERT INTO logs (run_id, after_seq, level, message, at)
            SELECT p_run_id, x.after_seq, x.level, x.message, x.at
            FROM jsonb_to_recordset(p->'logs')
                AS x(after_seq bigint, level text, message text, at bigint);
    END IF;
    IF p ? 'lease' THEN
        UPDATE runs SET lease_until = (p->'lease'->>'lease_until')::bigint,
            due_at = (p->'lease'->>'due_at')::bigint, version = version + 1
            WHERE run_id = p_run_id;
    END IF;
    IF p ? 'end' THEN
        UPDATE runs SET status = e.status, output = e.output, error = e.error,
            exit_code = e.exit_code,
            wake_at = CASE WHEN runs.arrivals > e.inbox_seen THEN e.updated_at ELSE e.wake_at END,
            due_at = CASE WHEN runs.arrivals > e.inbox_seen THEN e.updated_at ELSE e.due_at END,
            updated_at = e.updated_at, owner = NULL, lease_until = NULL,
            version = version + 1, seal = coalesce(e.seal, runs.seal)
            FROM jsonb_to_record(p->'end') AS e(status text, output text, error text,
                exit_code integer, wake_at bigint, due_at bigint, updated_at bigint, seal text,
                inbox_seen bigint)
            WHERE run_id = p_run_id;
        IF p->'end' ? 'arrival' THEN
            SELECT * INTO a FROM jsonb_to_record(p->'end'->'arrival') AS x(parent_run_id text,
                child_run_id text, join_set text, status text, at bigint);
            -- The parent's row is locked first: its arrivals are numbered in
            -- the order the ends commit, and its own end (which compares
            -- `arrivals` with what it saw) is ordered with each.
            PERFORM 1 FROM runs WHERE run_id = a.parent_run_id FOR UPDATE;
            IF NOT FOUND THEN
                RAISE EXCEPTION 'no run %', a.parent_run_id USING ERRCODE = 'SH001';
            END IF;
            IF NOT EXISTS (SELECT 1 FROM inbox
                    WHERE run_id = a.parent_run_id AND child_run_id = a.child_run_id) THEN
                UPDATE runs SET arrivals = arrivals + 1, version = version + 1,
                    wake_at = CASE WHEN status = 'waiting' THEN a.at ELSE wake_at END,
                    due_at = CASE WHEN status = 'waiting' THEN a.at ELSE due_at END
                    WHERE run_id = a.parent_run_id
                    RETURNING arrivals INTO n;
                INSERT INTO inbox (run_id, arrival, child_run_id, join_set, status, at)
                    VALUES (a.parent_run_id, n, a.child_run_id, a.join_set, a.status, a.at);
            END IF;
        END IF;
        IF p->'end' ? 'cancel_children' THEN
            PERFORM stephost_mark_cancelled(
                (SELECT coalesce(array_agg(run_id ORDER BY parent_seq), '{}') FROM runs
                    WHERE parent_run_id = p_run_id AND NOT detached),
                (p->'end'->'cancel_children'->>'at')::bigint,
                p->'end'->'cancel_children'->>'by',
                p->'end'->'cancel_children'->>'reason');
        END IF;
    END IF;
    IF p ? 'counters' THEN
        INSERT INTO counters (name, value)
            SELECT key, value::bigint FROM jsonb_each_text(p->'counters')
            ON CONFLICT (name) DO UPDATE SET value = counters.value + excluded.value;
    END IF;
END $$;
