//! The wasmtime engine, the linkers with every import (one for runs on a
//! thread of their own, one for runs executed as tasks), and a cache of
//! compiled, pre-instantiated step components keyed by module digest (in
//! memory, and optionally on disk so a new process skips the compile).
//!
//! A step is one of:
//! - a component for the [`WORLD`] (it exports `run`), in any language;
//! - a WASI command component (it exports `wasi:cli/run`): its stdin is the
//!   run's input, its stdout the output and its exit code is kept;
//! - a WASI preview1 core module: with `_start` it is a command, run on
//!   wasmtime's own preview1 implementation (so `proc_exit(n)` keeps `n`);
//!   with the `component-type` metadata of the step world (what
//!   `wit-bindgen c` or similar emit) it is made a step component
//!   in-process with the preview1 reactor adapter.

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use wasmtime::component::{Component, HasSelf, InstancePre as ComponentPre, Linker};
use wasmtime::{
    Config, Enabled, Engine, InstanceAllocationStrategy, InstancePre, Module,
    PoolingAllocationConfig,
};
use wasmtime_wasi::p2::bindings::sync::CommandPre;

use crate::bounded::Bounded;
use crate::command::Preview1State;
use crate::imports::StepState;

pub use crate::bindings::{WORLD, WORLD_0_1, WORLD_0_2, WORLD_0_3};

/// The world recorded for runs of WASI command programs.
pub const COMMAND_WORLD: &str = "wasi:cli/command@0.2";

impl crate::imports::runs::StepModules for StepEngine {
    fn read(&self, bytes: &[u8], what: &str) -> Result<crate::imports::runs::StepModule, String> {
        let loaded = self.load(bytes, what).map_err(|e| e.to_string())?;
        Ok(crate::imports::runs::StepModule {
            digest: loaded.digest.clone(),
            world: loaded.world(),
            step: loaded.step.clone(),
        })
    }
}

/// Whether this build can run (and resume) runs started under `world`.
pub fn provides(world: &str) -> bool {
    world == WORLD_0_1 || world == WORLD_0_2 || world == WORLD_0_3 || world == COMMAND_WORLD
}

pub use crate::error::ModuleError;

/// How a loaded step is entered.
pub enum Entry {
    /// A component of the step world: `run(input) -> result<output, error>`.
    Step {
        pre: ComponentPre<StepState>,
        /// [`WORLD_0_1`], [`WORLD_0_2`] or [`WORLD_0_3`], as its imports say.
        world: &'static str,
    },
    /// A WASI command component: stdin, stdout and an exit code.
    Command(CommandPre<StepState>),
    /// A WASI preview1 command module (`_start`).
    Preview1(InstancePre<Preview1State>),
}

/// A step component ready to instantiate.
pub struct Loaded {
    pub digest: String,
    /// The step's declared `name@version` (the `stephost-step` custom section
    /// the guest SDK writes), when it has one.
    pub step: Option<String>,
    pub entry: Entry,
    /// A step component pre-instantiated with the task linker (see
    /// [`StepEngine::task_pre`]), once a run of it is executed as a task.
    task: OnceLock<Result<ComponentPre<StepState>, String>>,
}

impl Loaded {
    /// The world runs of this step are recorded under.
    pub fn world(&self) -> &'static str {
        match self.entry {
            Entry::Step { world, .. } => world,
            Entry::Command(_) | Entry::Preview1(_) => COMMAND_WORLD,
        }
    }
}

/// Instances kept for reuse (wasmtime's pooling allocator), for a host that
/// lives for many runs: a run starts in a slot of memory mapped before
/// instead of mapping and unmapping its own (about 25 µs less per run on
/// this project's machines). The pool reserves address space for
/// `instances` runs at once and, on Linux 6.7 and later, keeps up to
/// [`Self::KEEP_RESIDENT_BYTES`] of memory per slot a run has used; a
/// one-shot command does without it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InstancePool {
    /// Runs that may be instantiated at the same time.
    pub instances: u32,
    /// The largest linear memory a guest may grow to (the runs' limit).
    pub memory_bytes_max: u64,
}

pub use crate::limiter::{INSTANCES_MAX, MEMORIES_MAX, TABLE_ELEMENTS_MAX, TABLES_MAX};

impl InstancePool {
    /// The largest memory a pool slot holds: wasmtime's default address
    /// space reservation per memory. Runs allowed more go without a pool.
    pub const MEMORY_BYTES_MAX: u64 = 4 << 30;

    /// A pool of `instances` slots for runs under `limits`, if any: a limit
    /// on memory above what a slot holds turns the pool off.
    pub fn for_limits(instances: u32, limits: &stephost_core::Limits) -> Option<Self> {
        let fits = limits.memory_bytes_max <= Self::MEMORY_BYTES_MAX;
        (instances > 0 && fits).then_some(InstancePool {
            instances,
            memory_bytes_max: limits.memory_bytes_max,
        })
    }

    /// Most bytes of a slot's linear memory, and of its tables, kept mapped
    /// between runs (those a run touched; the rest is unmapped as before).
    /// A worker keeps up to this much per slot it has used, idle or not.
    pub const KEEP_RESIDENT_BYTES: usize = 1 << 20;

    fn config(&self) -> PoolingAllocationConfig {
        let n = self.instances.max(1);
        let per = |limit: usize| u32::try_from(limit).unwrap_or(u32::MAX);
        let mut pool = PoolingAllocationConfig::new();
        // Each slot can hold a component as large as a run may create
        // (the store limits of `instance::store_limits`), so a component that runs
        // without a pool runs in one: another language's runtime (CPython,
        // QuickJS, their WASI adapters) holds a dozen core instances and
        // tables of tens of thousands of functions.
        pool.total_component_instances(n)
            .total_core_instances(n.saturating_mul(per(INSTANCES_MAX)))
            .total_memories(n.saturating_mul(per(MEMORIES_MAX)))
            .total_tables(n.saturating_mul(per(TABLES_MAX)))
            .max_memories_per_module(per(MEMORIES_MAX))
            .max_tables_per_module(per(TABLES_MAX))
            .table_elements(TABLE_ELEMENTS_MAX)
            .max_core_instance_size(8 << 20)
            .max_component_instance_size(8 << 20)
            // A stack for each run executed as a task (a worker's), instead
            // of wasmtime's default reservation of a thousand.
            .total_stacks(n)
            .max_memory_size(
                usize::try_from(self.memory_bytes_max.min(Self::MEMORY_BYTES_MAX))
                    .unwrap_or(usize::MAX),
            );
        // A slot's memory and tables stay mapped after a run, and the pages
        // the run touched are found with PAGEMAP_SCAN (Linux 6.7 and later)
        // and reset by memset instead of an madvise: the next run in the
        // slot starts without page faults, and a run's start and end cost
        // about 20 µs less on this project's machines. Without the scan,
        // wasmtime would memset the whole kept range after every run,
        // which measured slower than unmapping.
        if PoolingAllocationConfig::is_pagemap_scan_available() {
            pool.pagemap_scan(Enabled::Yes)
                .linear_memory_keep_resident(Self::KEEP_RESIDENT_BYTES)
                .table_keep_resident(Self::KEEP_RESIDENT_BYTES);
        }
        pool
    }
}

/// The linker for runs executed as tasks (see [`StepEngine::task_pre`]):
/// WASI's async bindings, and the step world's imports with `effects.call`
/// async ([`crate::imports::effects::link_call_as_task`]).
fn task_linker(engine: &Engine) -> wasmtime::Result<Linker<StepState>> {
    let mut linker = Linker::new(engine);
    wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
    crate::imports::http::link(&mut linker, false)?;
    link_step_world(&mut linker, EffectsCall::AsTask)?;
    Ok(linker)
}

/// How a linker serves `effects.call`.
#[derive(Clone, Copy)]
enum EffectsCall {
    /// On the calling thread, which waits for a write's durable commit (a
    /// single run: [`crate::imports::effects`]'s `Host::call`).
    OnThread,
    /// Awaiting a write's durable commit, so that the thread goes on with
    /// other runs (a worker's tasks).
    AsTask,
}

/// The step world's imports, WASI's randomness recorded per call and its
/// waits recorded as durable sleeps, on a linker that has WASI already;
/// `effects.call` linked once, as `call` says.
fn link_step_world(linker: &mut Linker<StepState>, call: EffectsCall) -> wasmtime::Result<()> {
    use crate::bindings::stephost::step as v1;
    use crate::bindings::v0_2::stephost::step as v2;
    use crate::bindings::v0_3::stephost::step as v3;
    crate::imports::wasi::record_random_bytes_per_call(linker)?;
    crate::imports::wasi::record_waits(linker)?;
    fn this(s: &mut StepState) -> &mut StepState {
        s
    }
    type Own = HasSelf<StepState>;
    match call {
        EffectsCall::OnThread => {
            v1::effects::add_to_linker::<_, Own>(linker, this)?;
            v2::effects::add_to_linker::<_, Own>(linker, this)?;
            v3::effects::add_to_linker::<_, Own>(linker, this)?;
        }
        EffectsCall::AsTask => crate::imports::effects::link_call_as_task(linker)?,
    }
    v1::llm::add_to_linker::<_, Own>(linker, this)?;
    v1::clock::add_to_linker::<_, Own>(linker, this)?;
    v1::random::add_to_linker::<_, Own>(linker, this)?;
    v1::log::add_to_linker::<_, Own>(linker, this)?;
    v1::timers::add_to_linker::<_, Own>(linker, this)?;
    v1::approvals::add_to_linker::<_, Own>(linker, this)?;
    v2::models::add_to_linker::<_, Own>(linker, this)?;
    v2::llm::add_to_linker::<_, Own>(linker, this)?;
    v2::clock::add_to_linker::<_, Own>(linker, this)?;
    v2::random::add_to_linker::<_, Own>(linker, this)?;
    v2::log::add_to_linker::<_, Own>(linker, this)?;
    v2::timers::add_to_linker::<_, Own>(linker, this)?;
    v2::approvals::add_to_linker::<_, Own>(linker, this)?;
    v3::models::add_to_linker::<_, Own>(linker, this)?;
    v3::llm::add_to_linker::<_, Own>(linker, this)?;
    v3::clock::add_to_linker::<_, Own>(linker, this)?;
    v3::random::add_to_linker::<_, Own>(linker, this)?;
    v3::log::add_to_linker::<_, Own>(linker, this)?;
    v3::timers::add_to_linker::<_, Own>(linker, this)?;
    v3::approvals::add_to_linker::<_, Own>(linker, this)?;
    v3::promises::add_to_linker::<_, Own>(linker, this)?;
    v3::runs::add_to_linker::<_, Own>(linker, this)
}

pub use crate::limiter::EPOCH_TICK_MS;

/// Advances `engine`'s epoch every [`EPOCH_TICK_MS`] on a thread of its
/// own, which ends with the engine.
fn tick_epochs(engine: &Engine) {
    let weak = engine.weak();
    let _ = std::thread::Builder::new()
        .name("stephost-epoch".into())
        .spawn(move || {
            while let Some(engine) = weak.upgrade() {
                engine.increment_epoch();
                drop(engine);
                std::thread::sleep(std::time::Duration::from_millis(EPOCH_TICK_MS));
            }
        });
}

/// Most compiled modules an engine keeps in memory (a long-lived server may
/// be sent any number); the one used longest ago makes room, and is loaded
/// again (from the disk cache, if any) when next needed.
pub const MODULES_CACHED_MAX: usize = 64;

pub struct StepEngine {
    engine: Engine,
    linker: Linker<StepState>,
    /// The linker for runs executed as tasks, made when first needed.
    task_linker: OnceLock<Result<Linker<StepState>, String>>,
    /// WASI preview1 for core command modules.
    preview1: wasmtime::Linker<Preview1State>,
    /// Loaded modules by digest, at most [`MODULES_CACHED_MAX`].
    cache: Mutex<Bounded<String, Arc<Loaded>>>,
    /// Module bytes already hashed, by length and a sample hash, at most
    /// [`MODULES_CACHED_MAX`].
    digests: Mutex<Bounded<SampleKey, (Vec<u8>, String)>>,
    /// Held while compiling, so that runs of one new module starting at once
    /// compile it once instead of once each.
    compiling: Mutex<()>,
    /// Where compiled components are kept between processes, if anywhere.
    disk_cache: Option<PathBuf>,
    /// That folder opened (with its key), when first used.
    disk: OnceLock<Option<crate::cache::DiskCache>>,
    /// Names this engine's compiled-code format in the disk cache: the
    /// wasmtime version and every setting that changes compiled code.
    engine_key: String,
}

impl StepEngine {
    /// An engine with an in-memory cache only.
    pub fn new() -> Result<Self, ModuleError> {
        Self::with_disk_cache(None)
    }

    /// An engine that also keeps compiled components in `dir` (created when
    /// first written), so that another process loading the same module
    /// skips the compile. A damaged or foreign cache file is recompiled over.
    pub fn with_disk_cache(dir: Option<&Path>) -> Result<Self, ModuleError> {
        Self::with_options(dir, None)
    }

    /// Like [`StepEngine::with_disk_cache`], with instances allocated from
    /// a pool when `pool` is given.
    pub fn with_options(
        dir: Option<&Path>,
        pool: Option<InstancePool>,
    ) -> Result<Self, ModuleError> {
        let mut config = Config::new();
        config.consume_fuel(true);
        config.epoch_interruption(true);
        config.wasm_component_model(true);
        if let Some(pool) = pool {
            config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool.config()));
        }
        let engine = Engine::new(&config).map_err(|e| ModuleError::Engine(format!("{e:#}")))?;
        tick_epochs(&engine);
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_sync(&mut linker)
            .and_then(|()| crate::imports::http::link(&mut linker, true))
            .and_then(|()| link_step_world(&mut linker, EffectsCall::OnThread))
            .map_err(|e| ModuleError::Engine(format!("{e:#}")))?;
        let mut preview1 = wasmtime::Linker::new(&engine);
        wasmtime_wasi::p1::add_to_linker_sync(&mut preview1, |s: &mut Preview1State| &mut s.wasi)
            .and_then(|()| crate::command::record_preview1_random_per_call(&mut preview1))
            .map_err(|e| ModuleError::Engine(format!("{e:#}")))?;
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut hasher);
        let engine_key = format!("{:016x}", hasher.finish());
        Ok(StepEngine {
            engine,
            linker,
            task_linker: OnceLock::new(),
            preview1,
            cache: Mutex::new(Bounded::new(MODULES_CACHED_MAX)),
            digests: Mutex::new(Bounded::new(MODULES_CACHED_MAX)),
            compiling: Mutex::new(()),
            disk_cache: dir.map(Path::to_path_buf),
            disk: OnceLock::new(),
            engine_key,
        })
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// `loaded` (a step component) pre-instantiated for runs executed as
    /// tasks: the same imports as [`StepEngine::load`] links, but the
    /// step's effect calls are async (a write's durable commit is awaited,
    /// not waited for by a thread) and WASI's bindings are its async ones.
    /// `None` for a command: it runs as on a thread of its own, the runtime
    /// told that it blocks.
    pub fn task_pre<'a>(
        &self,
        loaded: &'a Loaded,
    ) -> Option<Result<&'a ComponentPre<StepState>, String>> {
        let Entry::Step { pre, .. } = &loaded.entry else {
            return None;
        };
        let pre = loaded.task.get_or_init(|| {
            let linker = self
                .task_linker
                .get_or_init(|| task_linker(&self.engine).map_err(|e| format!("{e:#}")))
                .as_ref()
                .map_err(|e| format!("the task linker could not be made: {e}"))?;
            linker
                .instantiate_pre(pre.component())
                .map_err(|e| format!("{e:#}"))
        });
        Some(pre.as_ref().map_err(Clone::clone))
    }

    /// Compiles and checks a step module, or returns it from the cache.
    /// `what` names the module in errors (a path, or a digest).
    pub fn load(&self, bytes: &[u8], what: &str) -> Result<Arc<Loaded>, ModuleError> {
        self.load_digested(bytes, self.digest(bytes), what)
    }

    /// The loaded step of `digest`, if this engine has it.
    pub fn cached(&self, digest: &str) -> Option<Arc<Loaded>> {
        self.cache_lock().get(&digest.to_string()).cloned()
    }

    /// The sha256 digest of `bytes`. Bytes this engine has hashed before
    /// are recognised by comparing them in full with the kept copy, which
    /// is several times cheaper than hashing them again.
    fn digest(&self, bytes: &[u8]) -> String {
        let key = (bytes.len(), sample_hash(bytes));
        let mut known = self.digests.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((kept, digest)) = known.get(&key)
            && kept.as_slice() == bytes
        {
            return digest.clone();
        }
        let digest = stephost_core::ids::module_digest(bytes);
        known.insert(key, (bytes.to_vec(), digest.clone()));
        digest
    }

    /// Like [`StepEngine::load`] for bytes whose digest is known (a module
    /// read back from the ledger by its digest): a cache hit hashes nothing.
    pub fn load_digested(
        &self,
        bytes: &[u8],
        digest: String,
        what: &str,
    ) -> Result<Arc<Loaded>, ModuleError> {
        if let Some(hit) = self.cache_lock().get(&digest).cloned() {
            return Ok(hit);
        }
        let _compiling = self.compiling.lock().unwrap_or_else(|p| p.into_inner());
        // Another thread may have compiled it while this one waited.
        if let Some(hit) = self.cache_lock().get(&digest).cloned() {
            return Ok(hit);
        }
        let what = what.to_string();
        let wrong_world = |e: wasmtime::Error| ModuleError::WrongWorld {
            what: what.clone(),
            detail: format!("{e:#}"),
        };
        let entry = if crate::adapt::is_preview1_command(bytes) {
            let module = self.compile_module(bytes, &digest, &what)?;
            Entry::Preview1(
                self.preview1
                    .instantiate_pre(&module)
                    .map_err(wrong_world)?,
            )
        } else {
            let component = self.compile(bytes, &digest, &what)?;
            let kind = self.check_world(&component, &what)?;
            let instance_pre = self
                .linker
                .instantiate_pre(&component)
                .map_err(wrong_world)?;
            match kind {
                Kind::Step(world) => Entry::Step {
                    pre: instance_pre,
                    world,
                },
                Kind::Command => {
                    Entry::Command(CommandPre::new(instance_pre).map_err(wrong_world)?)
                }
            }
        };
        let loaded = Arc::new(Loaded {
            digest: digest.clone(),
            step: declared_step(bytes),
            entry,
            task: OnceLock::new(),
        });
        self.cache_lock().insert(digest, loaded.clone());
        Ok(loaded)
    }

    /// The compiled core module of a preview1 command.
    fn compile_module(
        &self,
        bytes: &[u8],
        digest: &str,
        what: &str,
    ) -> Result<Module, ModuleError> {
        self.through_disk_cache(
            digest,
            // SAFETY: see `through_disk_cache`.
            #[allow(unsafe_code)]
            |path| unsafe { Module::deserialize_file(&self.engine, path) }.ok(),
            || Module::new(&self.engine, bytes).map_err(|e| malformed(what, &e)),
            |module| module.serialize().ok(),
        )
    }

    /// The compiled component of `bytes`, a core module carrying a world's
    /// component type being adapted first.
    fn compile(&self, bytes: &[u8], digest: &str, what: &str) -> Result<Component, ModuleError> {
        self.through_disk_cache(
            digest,
            // SAFETY: see `through_disk_cache`.
            #[allow(unsafe_code)]
            |path| unsafe { Component::deserialize_file(&self.engine, path) }.ok(),
            || {
                check_header(bytes, what)?;
                if !is_core_module(bytes) {
                    return Component::new(&self.engine, bytes).map_err(|e| malformed(what, &e));
                }
                let adapted = crate::adapt::to_component(bytes).map_err(|e| match e {
                    crate::adapt::AdaptError::NotAStep => ModuleError::CoreModule {
                        what: what.to_string(),
                    },
                    crate::adapt::AdaptError::Failed(detail) => ModuleError::Adapt {
                        what: what.to_string(),
                        detail,
                    },
                })?;
                Component::new(&self.engine, &adapted).map_err(|e| malformed(what, &e))
            },
            |component| component.serialize().ok(),
        )
    }

    /// Compiled code of the module `digest`: loaded from the disk cache, or
    /// compiled and written there.
    ///
    /// Safety of `load`: it is given only a file whose HMAC, under the cache
    /// folder's own key, binds its bytes to this module digest and this
    /// engine's compatibility key ([`crate::cache`]): bytes `serialize`
    /// wrote for this module. A swapped or changed file fails the check and
    /// is compiled over. The folder is its owner's only: whoever can change
    /// a file in it between the check and the load can run code as this
    /// user anyway.
    fn through_disk_cache<T>(
        &self,
        digest: &str,
        load: impl FnOnce(&Path) -> Option<T>,
        compile: impl FnOnce() -> Result<T, ModuleError>,
        serialize: impl FnOnce(&T) -> Option<Vec<u8>>,
    ) -> Result<T, ModuleError> {
        let disk = self
            .disk
            .get_or_init(|| {
                self.disk_cache
                    .as_deref()
                    .and_then(|dir| crate::cache::DiskCache::open(dir, &self.engine_key))
            })
            .as_ref();
        if let Some(path) = disk.and_then(|d| d.get(digest))
            && let Some(loaded) = load(&path)
        {
            return Ok(loaded);
        }
        let compiled = compile()?;
        if let Some(disk) = disk
            && let Some(bytes) = serialize(&compiled)
        {
            disk.put(digest, &bytes);
        }
        Ok(compiled)
    }

    fn cache_lock(&self) -> std::sync::MutexGuard<'_, Bounded<String, Arc<Loaded>>> {
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Names what is missing or foreign, before the linker's own messages,
    /// and tells a step from a command.
    fn check_world(&self, component: &Component, what: &str) -> Result<Kind, ModuleError> {
        let ty = component.component_type();
        // What a step may reach is decided in one place (imports/policy.rs).
        let foreign: Vec<&str> = ty
            .imports(&self.engine)
            .map(|(name, _)| name)
            .filter(|name| {
                !name.starts_with("stephost:step/")
                    && crate::imports::policy::treatment(name).is_none()
            })
            .collect();
        if !foreign.is_empty() {
            return Err(ModuleError::WrongWorld {
                what: what.to_string(),
                detail: format!(
                    "it imports {}, which stephost does not provide",
                    foreign.join(", ")
                ),
            });
        }
        if ty.get_export(&self.engine, "run").is_some() {
            return step_world(&imports(ty.imports(&self.engine).map(|(name, _)| name)))
                .map(Kind::Step)
                .map_err(|detail| ModuleError::WrongWorld {
                    what: what.to_string(),
                    detail,
                });
        }
        let exports: Vec<&str> = ty.exports(&self.engine).map(|(name, _)| name).collect();
        if exports.iter().any(|e| e.starts_with("wasi:cli/run@0.2")) {
            return Ok(Kind::Command);
        }
        let found = if exports.is_empty() {
            "nothing".to_string()
        } else {
            exports.join(", ")
        };
        Err(ModuleError::WrongWorld {
            what: what.to_string(),
            detail: format!("it exports neither `run` nor `wasi:cli/run` (it exports {found})"),
        })
    }
}

#[derive(Clone, Copy)]
enum Kind {
    Step(&'static str),
    Command,
}

fn imports<'a>(names: impl Iterator<Item = &'a str>) -> Vec<&'a str> {
    names.collect()
}

/// The step world a component's `stephost:step` imports are of: all of one
/// version, 0.1.0 when it imports none.
fn step_world(imports: &[&str]) -> Result<&'static str, String> {
    let versions: std::collections::BTreeSet<&str> = imports
        .iter()
        .filter(|name| name.starts_with("stephost:step/"))
        .filter_map(|name| name.rsplit_once('@').map(|(_, version)| version))
        .collect();
    match versions.into_iter().collect::<Vec<_>>().as_slice() {
        [] | ["0.1.0"] => Ok(WORLD_0_1),
        ["0.2.0"] => Ok(WORLD_0_2),
        ["0.3.0"] => Ok(WORLD_0_3),
        [one] => Err(format!(
            "it imports stephost:step@{one}, which this build does not provide (it provides \
             0.1.0, 0.2.0 and 0.3.0)"
        )),
        many => Err(format!(
            "it imports stephost:step at several versions ({}); build it against one",
            many.join(", ")
        )),
    }
}

/// Writes `bytes` to `path` through a temporary file and a rename, so a
/// reader never sees half a file.
fn malformed(what: &str, e: &wasmtime::Error) -> ModuleError {
    ModuleError::Malformed {
        what: what.to_string(),
        detail: format!("{e:#}"),
    }
}

/// A module's length and [`sample_hash`].
type SampleKey = (usize, u64);

/// A cheap hash of `bytes`' first and last 4 KiB: a key to find the kept
/// copy by, never trusted alone.
fn sample_hash(bytes: &[u8]) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    let n = bytes.len().min(4096);
    bytes[..n].hash(&mut hasher);
    bytes[bytes.len() - n..].hash(&mut hasher);
    hasher.finish()
}

/// A core module is version 1 with layer 0; a component has layer 1.
fn is_core_module(bytes: &[u8]) -> bool {
    bytes.len() >= 8 && bytes[4..8] == [1, 0, 0, 0]
}

fn check_header(bytes: &[u8], what: &str) -> Result<(), ModuleError> {
    if bytes.len() < 8 || &bytes[..4] != b"\0asm" {
        let detail = if bytes.is_empty() {
            "the file is empty".to_string()
        } else {
            "it does not start with the \\0asm magic number".to_string()
        };
        return Err(ModuleError::NotWasm {
            what: what.to_string(),
            detail,
        });
    }
    Ok(())
}

/// The step's declared `name@version`: the content of a `stephost-step`
/// custom section, in the component or in one of its core modules.
pub fn declared_step(bytes: &[u8]) -> Option<String> {
    find_section(bytes, b"stephost-step", 0).and_then(|content| {
        let text = std::str::from_utf8(content)
            .ok()?
            .trim_end_matches('\0')
            .trim();
        (!text.is_empty() && text.len() <= 256).then(|| text.to_string())
    })
}

fn read_leb(bytes: &[u8], pos: &mut usize) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *bytes.get(*pos)?;
        *pos += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

/// Walks a module or component's sections (and, in a component, its nested
/// core modules and components) for a custom section named `name`.
fn find_section<'a>(bin: &'a [u8], name: &[u8], depth: u32) -> Option<&'a [u8]> {
    if bin.len() < 8 || &bin[..4] != b"\0asm" || depth > 4 {
        return None;
    }
    let component = bin[4..8] != [1, 0, 0, 0];
    let mut pos = 8;
    while pos < bin.len() {
        let id = bin[pos];
        pos += 1;
        let size = usize::try_from(read_leb(bin, &mut pos)?).ok()?;
        let end = pos.checked_add(size).filter(|&e| e <= bin.len())?;
        let payload = &bin[pos..end];
        if id == 0 {
            let mut p = 0;
            let len = usize::try_from(read_leb(payload, &mut p)?).ok()?;
            if payload.get(p..p.checked_add(len)?) == Some(name) {
                return Some(&payload[p + len..]);
            }
        } else if component
            && (id == 1 || id == 4)
            && let Some(found) = find_section(payload, name, depth + 1)
        {
            return Some(found);
        }
        pos = end;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pool_is_built_for_the_run_limits_and_left_out_above_what_a_slot_holds() {
        let mut limits = stephost_core::Limits::default();
        let pool = InstancePool::for_limits(3, &limits).expect("a pool");
        assert_eq!(pool.instances, 3);
        assert!(StepEngine::with_options(None, Some(pool)).is_ok());
        // More memory than a slot holds: no pool, rather than no engine.
        limits.memory_bytes_max = 8 << 30;
        assert_eq!(InstancePool::for_limits(3, &limits), None);
        limits.memory_bytes_max = 256 << 20;
        assert_eq!(InstancePool::for_limits(0, &limits), None);
    }

    #[test]
    fn the_declared_step_is_found_in_a_nested_core_module() {
        // A core module with one custom section, nested in a component.
        let mut module = b"\0asm\x01\0\0\0".to_vec();
        let mut custom = vec![13u8];
        custom.extend_from_slice(b"stephost-step");
        custom.extend_from_slice(b"orders@1.2.3");
        module.push(0);
        module.push(custom.len() as u8);
        module.extend_from_slice(&custom);
        let mut component = b"\0asm\x0d\0\x01\0".to_vec();
        component.push(1);
        component.push(module.len() as u8);
        component.extend_from_slice(&module);
        assert_eq!(declared_step(&component).as_deref(), Some("orders@1.2.3"));
        assert_eq!(declared_step(b"\0asm\x0d\0\x01\0"), None);
        assert_eq!(declared_step(b"garbage"), None);
    }
}
