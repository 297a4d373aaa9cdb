-- Retention (stephost_core::retention): what deleting a finished run needs
-- to find what it owned, by index.
--
-- `payload_refs`: which runs refer to each payload part (a part is kept
-- once however many calls carry it): a part goes when its last run does.
-- Kept by a trigger on `calls`, so that every writer of calls keeps it,
-- and filled here for the calls already recorded (a reference is `\x01` +
-- 64 hex digits + `\x01` in a split body).
CREATE TABLE payload_refs (
    run_id  text NOT NULL,
    digest  text NOT NULL,
    PRIMARY KEY (run_id, digest)
);
CREATE INDEX payload_refs_digest ON payload_refs (digest);

CREATE FUNCTION stephost_payload_refs() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO payload_refs (run_id, digest)
        SELECT NEW.run_id, m.r[1] FROM regexp_matches(
            CASE WHEN NEW.request_split THEN NEW.request ELSE '' END || ' ' ||
            CASE WHEN NEW.outcome_split THEN coalesce(NEW.outcome, '') ELSE '' END,
            E'\\x01([0-9a-f]{64})\\x01', 'g') AS m(r)
        ON CONFLICT DO NOTHING;
    RETURN NULL;
END $$;
CREATE TRIGGER calls_payload_refs AFTER INSERT OR UPDATE OF outcome ON calls
    FOR EACH ROW WHEN (NEW.request_split OR NEW.outcome_split)
    EXECUTE FUNCTION stephost_payload_refs();

INSERT INTO payload_refs (run_id, digest)
    SELECT c.run_id, m.r[1] FROM calls c, regexp_matches(
        CASE WHEN c.request_split THEN c.request ELSE '' END || ' ' ||
        CASE WHEN c.outcome_split THEN coalesce(c.outcome, '') ELSE '' END,
        E'\\x01([0-9a-f]{64})\\x01', 'g') AS m(r)
    WHERE c.request_split OR c.outcome_split
    ON CONFLICT DO NOTHING;

-- `module_stored`: when each module was last stored (a submit stores its
-- module before recording its run): a module no run pins is kept for an
-- hour after, so a run being submitted never loses its module.
CREATE TABLE module_stored (
    digest  text PRIMARY KEY,
    at      bigint NOT NULL
);
INSERT INTO module_stored (digest, at) SELECT digest, created_at FROM modules;

-- Runs by module, for "does any run still pin it".
CREATE INDEX runs_module ON runs (module_digest);
