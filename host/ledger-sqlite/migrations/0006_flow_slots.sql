-- The slots of models' calls in flight (stephost_core::flow::Slot), as JSON:
-- each call's holder and when its slot frees itself unless renewed.
ALTER TABLE flows ADD COLUMN slots TEXT NOT NULL DEFAULT '[]';
