-- Payload parts in a table of rows, looked up by a unique index on their
-- digest. A table WITHOUT ROWID keeps a row in its key's b-tree, where a
-- row of over about 1 KB spills into an overflow page of its own: a part of
-- 1.2 KB took 4 KB. A rowid table keeps rows of up to about 4 KB in place.
CREATE TABLE payload_rows (
    id      INTEGER PRIMARY KEY,
    digest  TEXT NOT NULL UNIQUE,
    body    TEXT NOT NULL
) STRICT;
INSERT INTO payload_rows (digest, body) SELECT digest, body FROM payloads;
DROP TABLE payloads;
ALTER TABLE payload_rows RENAME TO payloads;
