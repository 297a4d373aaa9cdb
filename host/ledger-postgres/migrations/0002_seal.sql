-- The run's seal: keyed digests of its input, module, end and chain head
-- (see stephost_core::chain), rewritten when they change at rest; an
-- execution's end writes it through stephost_commit's new e_seal.
ALTER TABLE runs ADD COLUMN seal text;

-- The function gains a parameter: the old one goes first (its name is
-- unique in the schema, so no argument list is needed).
DROP FUNCTION stephost_commit;

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
    e_due_at bigint, e_updated_at bigint, e_seal text,
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
            updated_at = e_updated_at, owner = NULL, lease_until = NULL, version = version + 1,
            seal = coalesce(e_seal, seal)
            WHERE run_id = p_run_id;
    END IF;
    IF n_name IS NOT NULL THEN
        INSERT INTO counters (name, value) SELECT * FROM unnest(n_name, n_value)
            ON CONFLICT (name) DO UPDATE SET value = counters.value + excluded.value;
    END IF;
END $$;
