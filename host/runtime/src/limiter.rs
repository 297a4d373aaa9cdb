//! What one execution may hold: its memories and tables together within
//! `memory_bytes_max`, and at most so many instances, memories and tables.
//! wasmtime's own `StoreLimits` bounds each memory alone, so a module with
//! several memories (or large tables) could hold several times the limit.

use wasmtime::ResourceLimiter;

/// Most linear memories one run's component may create.
pub const MEMORIES_MAX: usize = 8;
/// Most tables one run's component may create.
pub const TABLES_MAX: usize = 64;
/// Most core instances one run's component may create.
pub const INSTANCES_MAX: usize = 64;
/// Most elements a table may grow to.
pub const TABLE_ELEMENTS_MAX: usize = 1_000_000;

/// How often a running step is interrupted to ask whether it must stop
/// (see `instance::interrupt_on_tick`), in milliseconds.
pub const EPOCH_TICK_MS: u64 = 10;

/// Bytes a table element is counted as (a reference).
pub const TABLE_ELEMENT_BYTES: usize = 8;

/// A run's limiter: every memory and table it grows is charged to one
/// budget.
#[derive(Debug)]
pub struct RunLimiter {
    bytes_max: usize,
    /// Bytes held now: memories' sizes plus tables' elements.
    bytes: usize,
}

impl RunLimiter {
    pub fn new(memory_bytes_max: u64) -> Self {
        RunLimiter {
            bytes_max: usize::try_from(memory_bytes_max).unwrap_or(usize::MAX),
            bytes: 0,
        }
    }

    /// Charges a growth from `current` to `desired` bytes of one memory or
    /// table, or refuses it with a trap `classify_trap` names.
    fn grow(&mut self, current: usize, desired: usize, what: &str) -> wasmtime::Result<bool> {
        let total = self.bytes.saturating_sub(current).saturating_add(desired);
        if total > self.bytes_max {
            return Err(wasmtime::format_err!(
                "forcing trap when growing {what} to {desired} bytes: the run's memories and \
                 tables would hold {total} bytes"
            ));
        }
        self.bytes = total;
        Ok(true)
    }
}

impl ResourceLimiter for RunLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        self.grow(current, desired, "memory")
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > TABLE_ELEMENTS_MAX {
            return Err(wasmtime::format_err!(
                "forcing trap when growing a table to {desired} elements (at most \
                 {TABLE_ELEMENTS_MAX})"
            ));
        }
        self.grow(
            current.saturating_mul(TABLE_ELEMENT_BYTES),
            desired.saturating_mul(TABLE_ELEMENT_BYTES),
            "a table",
        )
    }

    fn instances(&self) -> usize {
        INSTANCES_MAX
    }

    fn tables(&self) -> usize {
        TABLES_MAX
    }

    fn memories(&self) -> usize {
        MEMORIES_MAX
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasmtime::{Config, Engine, Instance, Module, Store};

    /// A core module with two memories of `pages` 64 KiB pages each,
    /// exported as `a` and `b`.
    fn two_memories(pages: u64) -> Vec<u8> {
        use wasm_encoder::{ExportKind, ExportSection, MemorySection, MemoryType};
        let mut memories = MemorySection::new();
        for _ in 0..2 {
            memories.memory(MemoryType {
                minimum: pages,
                maximum: None,
                memory64: false,
                shared: false,
                page_size_log2: None,
            });
        }
        let mut exports = ExportSection::new();
        exports.export("a", ExportKind::Memory, 0);
        exports.export("b", ExportKind::Memory, 1);
        let mut module = wasm_encoder::Module::new();
        module.section(&memories).section(&exports);
        module.finish()
    }

    #[test]
    fn memories_share_one_budget() {
        let mut config = Config::new();
        config.wasm_multi_memory(true);
        let engine = Engine::new(&config).unwrap();
        let limit = 10 * 65536;
        // Two memories of 6 pages each: each within the limit, not both.
        let module = Module::new(&engine, two_memories(6)).unwrap();
        let mut store = Store::new(&engine, RunLimiter::new(limit));
        store.limiter(|l| l);
        let err = Instance::new(&mut store, &module, &[]).unwrap_err();
        assert!(
            format!("{err:#}").contains("forcing trap when growing memory"),
            "{err:#}"
        );
        // Two of 4 pages fit, and growing one past the rest is refused.
        let module = Module::new(&engine, two_memories(4)).unwrap();
        let mut store = Store::new(&engine, RunLimiter::new(limit));
        store.limiter(|l| l);
        let instance = Instance::new(&mut store, &module, &[]).unwrap();
        let a = instance.get_memory(&mut store, "a").unwrap();
        assert!(a.grow(&mut store, 2).is_ok());
        assert!(a.grow(&mut store, 1).is_err());
    }

    #[test]
    fn tables_count_against_the_same_budget() {
        let mut limiter = RunLimiter::new(1024);
        assert!(limiter.memory_growing(0, 512, None).unwrap());
        // 64 elements of 8 bytes: the other 512.
        assert!(limiter.table_growing(0, 64, None).unwrap());
        assert!(limiter.table_growing(64, 65, None).is_err());
        assert!(
            limiter
                .table_growing(0, TABLE_ELEMENTS_MAX + 1, None)
                .is_err()
        );
    }
}
