-- The slots of models' calls in flight (stephost_core::flow::Slot), as JSON:
-- each call's holder and when its slot frees itself unless renewed (ms, by
-- the server's clock).
ALTER TABLE flows ADD COLUMN slots text NOT NULL DEFAULT '[]';
