//! The wasmtime engine, the linker with every import, and a cache of
//! compiled, pre-instantiated step components keyed by module digest.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use wasmtime::component::{Component, HasSelf, Linker};
use wasmtime::{Config, Engine};

use crate::bindings::{Step, StepPre};
use crate::imports::StepState;

/// What `stephost` says a step must look like.
pub const WORLD: &str = "stephost:step/step@0.1.0";

#[derive(Debug, thiserror::Error)]
pub enum ModuleError {
    #[error(
        "{what} is not a WebAssembly module ({detail}); pass a .wasm component built for {WORLD}"
    )]
    NotWasm { what: String, detail: String },
    #[error(
        "{what} is a core WebAssembly module, not a component; build it for wasm32-wasip2 or \
         turn it into a component with `wasm-tools component new`"
    )]
    CoreModule { what: String },
    #[error("{what} is not a valid component: {detail}")]
    Malformed { what: String, detail: String },
    #[error(
        "{what} is a component for another world: {detail}. A step must target {WORLD}: \
         export `run: func(input: string) -> result<string, string>` and import only \
         stephost:step and WASI interfaces"
    )]
    WrongWorld { what: String, detail: String },
    #[error("engine setup failed: {0}")]
    Engine(String),
}

/// A step component ready to instantiate.
pub struct Loaded {
    pub digest: String,
    /// The step's declared `name@version` (the `stephost-step` custom section
    /// the guest SDK writes), when it has one.
    pub step: Option<String>,
    pub pre: StepPre<StepState>,
}

pub struct StepEngine {
    engine: Engine,
    linker: Linker<StepState>,
    cache: Mutex<HashMap<String, Arc<Loaded>>>,
    /// Held while compiling, so that runs of one new module starting at once
    /// compile it once instead of once each.
    compiling: Mutex<()>,
}

impl StepEngine {
    pub fn new() -> Result<Self, ModuleError> {
        let mut config = Config::new();
        config.consume_fuel(true);
        config.wasm_component_model(true);
        let engine = Engine::new(&config).map_err(|e| ModuleError::Engine(format!("{e:#}")))?;
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_sync(&mut linker)
            .map_err(|e| ModuleError::Engine(format!("{e:#}")))?;
        Step::add_to_linker::<StepState, HasSelf<StepState>>(&mut linker, |s| s)
            .map_err(|e| ModuleError::Engine(format!("{e:#}")))?;
        Ok(StepEngine {
            engine,
            linker,
            cache: Mutex::new(HashMap::new()),
            compiling: Mutex::new(()),
        })
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Compiles and checks a step module, or returns it from the cache.
    /// `what` names the module in errors (a path, or a digest).
    pub fn load(&self, bytes: &[u8], what: &str) -> Result<Arc<Loaded>, ModuleError> {
        self.load_digested(bytes, crate::ids::module_digest(bytes), what)
    }

    /// Like [`StepEngine::load`] for bytes whose digest is known (a module
    /// read back from the ledger by its digest): a cache hit hashes nothing.
    pub fn load_digested(
        &self,
        bytes: &[u8],
        digest: String,
        what: &str,
    ) -> Result<Arc<Loaded>, ModuleError> {
        if let Some(hit) = self.cache_lock().get(&digest) {
            return Ok(hit.clone());
        }
        let _compiling = self.compiling.lock().unwrap_or_else(|p| p.into_inner());
        // Another thread may have compiled it while this one waited.
        if let Some(hit) = self.cache_lock().get(&digest) {
            return Ok(hit.clone());
        }
        let what = what.to_string();
        check_header(bytes, &what)?;
        let component =
            Component::new(&self.engine, bytes).map_err(|e| ModuleError::Malformed {
                what: what.clone(),
                detail: format!("{e:#}"),
            })?;
        self.check_world(&component, &what)?;
        let instance_pre =
            self.linker
                .instantiate_pre(&component)
                .map_err(|e| ModuleError::WrongWorld {
                    what: what.clone(),
                    detail: format!("{e:#}"),
                })?;
        let pre = StepPre::new(instance_pre).map_err(|e| ModuleError::WrongWorld {
            what: what.clone(),
            detail: format!("{e:#}"),
        })?;
        let loaded = Arc::new(Loaded {
            digest: digest.clone(),
            step: declared_step(bytes),
            pre,
        });
        self.cache_lock().insert(digest, loaded.clone());
        Ok(loaded)
    }

    fn cache_lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Loaded>>> {
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Names what is missing or foreign, before the linker's own messages.
    fn check_world(&self, component: &Component, what: &str) -> Result<(), ModuleError> {
        let ty = component.component_type();
        let foreign: Vec<&str> = ty
            .imports(&self.engine)
            .map(|(name, _)| name)
            .filter(|name| !name.starts_with("wasi:") && !name.starts_with("stephost:step/"))
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
        if ty.get_export(&self.engine, "run").is_none() {
            let exports: Vec<&str> = ty.exports(&self.engine).map(|(name, _)| name).collect();
            let found = if exports.is_empty() {
                "nothing".to_string()
            } else {
                exports.join(", ")
            };
            return Err(ModuleError::WrongWorld {
                what: what.to_string(),
                detail: format!("it does not export `run` (it exports {found})"),
            });
        }
        Ok(())
    }
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
    // A core module is version 1 with layer 0; a component has layer 1.
    if bytes[4..8] == [1, 0, 0, 0] {
        return Err(ModuleError::CoreModule {
            what: what.to_string(),
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
