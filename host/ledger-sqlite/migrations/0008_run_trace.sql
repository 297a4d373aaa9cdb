-- The trace a run reports into (stephost_core::RunTrace), as JSON; NULL for
-- a run recorded before traces were kept (its trace is derived from its id).
-- Set when the run is recorded and never changed; not sealed.
ALTER TABLE runs ADD COLUMN trace TEXT;
