-- One execution's commit, as stephost-core's CommitPlan lays it out (what a
-- commit means is checked there, once): this function only locks the run's
-- row, refuses the commit unless `p_fence` is the run's newest fencing
-- token and the first call it appends follows the run's last recorded
-- call, and writes. `p` is the plan as one JSON object:
--   calls    new call rows, keys named as the `calls` columns (run_id and
--            fence are this function's), so a column added to `calls`
--            needs no new signature;
--   updates  [{seq, state, outcome, outcome_split, finished_at, chain,
--            attempts}]: an earlier call's outcome (state not null) and/or
--            attempts to append;
--   logs     [{after_seq, level, message, at}];
--   lease    {lease_until, due_at};
--   end      {status, output, error, exit_code, wake_at, due_at,
--            updated_at, seal}: the run's final columns (seal null keeps it);
--   counters {name: amount}.
-- Payload bodies come as two arrays. With `p_async`, the transaction
-- commits without waiting for its WAL flush (the next durable commit
-- flushes it).
-- Errors: SH001 no such run; SH002 fenced (DETAIL: the newest token);
-- SH003 not appended (DETAIL: the last recorded sequence number); SH004 an
-- outcome for a call not recorded (DETAIL: its sequence number).
DROP FUNCTION stephost_commit;

CREATE FUNCTION stephost_commit(
    p_run_id text, p_fence bigint, p_async boolean, d_digest text[], d_body text[], p jsonb)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    newest bigint;
    last_seq bigint;
    u record;
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
            exit_code = e.exit_code, wake_at = e.wake_at, due_at = e.due_at,
            updated_at = e.updated_at, owner = NULL, lease_until = NULL,
            version = version + 1, seal = coalesce(e.seal, runs.seal)
            FROM jsonb_to_record(p->'end') AS e(status text, output text, error text,
                exit_code integer, wake_at bigint, due_at bigint, updated_at bigint, seal text)
            WHERE run_id = p_run_id;
    END IF;
    IF p ? 'counters' THEN
        INSERT INTO counters (name, value)
            SELECT key, value::bigint FROM jsonb_each_text(p->'counters')
            ON CONFLICT (name) DO UPDATE SET value = counters.value + excluded.value;
    END IF;
END $$;
