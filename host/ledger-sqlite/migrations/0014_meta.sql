-- What the ledger says of itself besides its schema version (PRAGMA
-- user_version): `compatible_from`, the oldest schema version whose builds
-- may use it (rolling upgrades, stephost_core::store::may_use), written by
-- the build that migrated it last.
CREATE TABLE stephost_meta (
    key    TEXT PRIMARY KEY,
    value  TEXT NOT NULL
) STRICT;
