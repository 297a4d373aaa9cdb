//! WASI preview1 core modules made into components, in-process, with the
//! preview1 adapter that matches this build's WASI (the same one
//! `wasm-tools component new --adapt` takes).
//!
//! - A module carrying the `component-type` metadata of a world (what
//!   `wit-bindgen` links into a C or other non-Rust guest) becomes a
//!   component of that world, with the *reactor* adapter.
//! - A module exporting `_start` (a WASI program with a `main`) becomes a
//!   `wasi:cli/run` command, with the *command* adapter. (The engine runs
//!   such modules on wasmtime's preview1 instead, see
//!   [`is_preview1_command`], because the adapter reduces `proc_exit(n)` to
//!   success or failure.)

use wasi_preview1_component_adapter_provider::{
    WASI_SNAPSHOT_PREVIEW1_ADAPTER_NAME, WASI_SNAPSHOT_PREVIEW1_COMMAND_ADAPTER,
    WASI_SNAPSHOT_PREVIEW1_REACTOR_ADAPTER,
};
use wasmparser::{Parser, Payload};

#[derive(Debug, thiserror::Error)]
pub enum AdaptError {
    /// Neither `_start` nor component-type metadata: nothing to run.
    #[error("the module neither exports `_start` nor carries component-type metadata")]
    NotAStep,
    #[error("{0}")]
    Failed(String),
}

/// What a core module offers.
#[derive(Debug, Default, PartialEq, Eq)]
struct Shape {
    start: bool,
    component_type: bool,
}

fn shape(core: &[u8]) -> Result<Shape, AdaptError> {
    let mut shape = Shape::default();
    for payload in Parser::new(0).parse_all(core) {
        match payload.map_err(|e| AdaptError::Failed(format!("not a valid core module: {e}")))? {
            Payload::ExportSection(exports) => {
                for export in exports {
                    let export = export.map_err(|e| AdaptError::Failed(e.to_string()))?;
                    shape.start |= export.name == "_start";
                }
            }
            Payload::CustomSection(section) => {
                shape.component_type |= section.name().starts_with("component-type");
            }
            _ => {}
        }
    }
    Ok(shape)
}

/// Whether `bytes` is a core module that is a WASI command (`_start`, no
/// component-type metadata): run on preview1 directly, not adapted.
pub fn is_preview1_command(bytes: &[u8]) -> bool {
    bytes.len() >= 8
        && bytes[..4] == *b"\0asm"
        && bytes[4..8] == [1, 0, 0, 0]
        && shape(bytes).is_ok_and(|s| s.start && !s.component_type)
}

/// The component for the core module `core`.
pub fn to_component(core: &[u8]) -> Result<Vec<u8>, AdaptError> {
    let shape = shape(core)?;
    let adapter = if shape.component_type {
        WASI_SNAPSHOT_PREVIEW1_REACTOR_ADAPTER
    } else if shape.start {
        WASI_SNAPSHOT_PREVIEW1_COMMAND_ADAPTER
    } else {
        return Err(AdaptError::NotAStep);
    };
    let failed = |e: anyhow::Error| AdaptError::Failed(format!("{e:#}"));
    wit_component::ComponentEncoder::default()
        .validate(true)
        .module(core)
        .map_err(failed)?
        .adapter(WASI_SNAPSHOT_PREVIEW1_ADAPTER_NAME, adapter)
        .map_err(failed)?
        .encode()
        .map_err(failed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_module_without_start_or_metadata_is_not_a_step() {
        // An empty core module.
        let empty = b"\0asm\x01\0\0\0";
        assert_eq!(shape(empty).unwrap(), Shape::default());
        assert!(matches!(to_component(empty), Err(AdaptError::NotAStep)));
        assert!(matches!(
            to_component(b"\0asm\x01\0\0\0\x07\x05"),
            Err(AdaptError::Failed(_))
        ));
    }
}
