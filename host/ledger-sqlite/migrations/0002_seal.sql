-- The run's seal: keyed digests of its input, module, end and chain head
-- (see stephost_core::chain), rewritten when they change at rest.
ALTER TABLE runs ADD COLUMN seal TEXT;
