-- A run's own model budget (stephost_core::RunBudget), as JSON; NULL when
-- it has none and [limits]'s hold. Sealed with the run's input.
ALTER TABLE runs ADD COLUMN budget TEXT;
