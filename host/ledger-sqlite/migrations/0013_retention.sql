-- Retention (stephost_core::retention): what deleting a finished run needs
-- to find what it owned, by index.
--
-- `payload_refs`: which runs refer to each payload part (a part is kept
-- once however many calls carry it): a part goes when its last run does.
-- Filled for the parts already kept from the calls that refer to them
-- (`\x01` + 64 hex digits + `\x01` in a split body).
CREATE TABLE payload_refs (
    run_no  INTEGER NOT NULL,
    digest  TEXT NOT NULL,
    PRIMARY KEY (run_no, digest)
) STRICT, WITHOUT ROWID;
CREATE INDEX payload_refs_digest ON payload_refs (digest);

WITH RECURSIVE bodies (run_no, rest) AS (
    SELECT run_no, request FROM calls WHERE request_split
    UNION ALL
    SELECT run_no, outcome FROM calls WHERE outcome_split AND outcome IS NOT NULL
    UNION ALL
    SELECT run_no, substr(rest, instr(rest, char(1)) + 66) FROM bodies
        WHERE instr(rest, char(1)) > 0
)
INSERT OR IGNORE INTO payload_refs (run_no, digest)
    SELECT run_no, substr(rest, instr(rest, char(1)) + 1, 64) FROM bodies
        WHERE instr(rest, char(1)) > 0;

-- `module_stored`: when each module was last stored (a submit stores its
-- module before recording its run): a module no run pins is kept for an
-- hour after, so a run being submitted never loses its module.
CREATE TABLE module_stored (
    digest  TEXT PRIMARY KEY,
    at      INTEGER NOT NULL
) STRICT, WITHOUT ROWID;
INSERT INTO module_stored (digest, at) SELECT digest, created_at FROM modules;

-- Runs by module, for "does any run still pin it".
CREATE INDEX runs_module ON runs (module_digest);
