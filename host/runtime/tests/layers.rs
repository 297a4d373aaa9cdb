//! The modules of the runtime and of the effects crate use only the
//! modules of their own layer or of the layers below it, as each crate's
//! opening comment lists them (`//! | layer | modules |`, lowest first): no
//! import runs back up.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Each module's layer, from the crate's `lib.rs`.
fn layers(src: &Path) -> BTreeMap<String, usize> {
    let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
    let mut layer_of = BTreeMap::new();
    let rows = lib
        .lines()
        .filter(|l| l.starts_with("//! |") && !l.contains("---") && !l.contains("| layer |"));
    for (layer, row) in rows.enumerate() {
        let modules = row.split('|').nth(2).unwrap_or_default();
        for (i, part) in modules.split('`').enumerate() {
            let name = part.trim();
            if i % 2 == 1 && !name.is_empty() && !name.contains(' ') {
                layer_of.insert(name.to_string(), layer);
            }
        }
    }
    assert!(
        !layer_of.is_empty(),
        "{} lists no layers",
        src.join("lib.rs").display()
    );
    layer_of
}

/// The `.rs` files under `dir`.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The crate modules `code` names (`crate::NAME`, `use crate::{NAME, ...}`).
fn named(code: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for item in group[..end].split(',') {
                let name = item.trim().split("::").next().unwrap_or_default();
                found.push(name.to_string());
            }
        } else {
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            found.push(rest[..end].to_string());
        }
    }
    found
}

/// Every upward use in the crate at `src`, as `file: module (layer) uses
/// module (layer)`.
fn upward(src: &Path) -> Vec<String> {
    let layer_of = layers(src);
    let mut files = Vec::new();
    sources(src, &mut files);
    let mut found = Vec::new();
    for file in files {
        let relative = file.strip_prefix(src).unwrap();
        let module = relative
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy()
            .trim_end_matches(".rs")
            .to_string();
        if module == "lib" {
            continue;
        }
        let Some(&own) = layer_of.get(&module) else {
            found.push(format!(
                "{}: module `{module}` is in no layer of lib.rs",
                relative.display()
            ));
            continue;
        };
        let text = std::fs::read_to_string(&file).unwrap();
        for (n, line) in text.lines().enumerate() {
            let code = line.trim_start();
            if code.starts_with("//") {
                continue;
            }
            for used in named(code) {
                if let Some(&theirs) = layer_of.get(&used)
                    && theirs > own
                {
                    found.push(format!(
                        "{}:{}: `{module}` (layer {own}) uses `{used}` (layer {theirs})",
                        relative.display(),
                        n + 1
                    ));
                }
            }
        }
    }
    found
}

/// Fails naming every import of the crate at `src` (relative to this
/// crate) that runs back up its layers.
fn assert_layered(src: &str) {
    let found = upward(&Path::new(env!("CARGO_MANIFEST_DIR")).join(src));
    assert!(
        found.is_empty(),
        "imports that run back up:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_runtime_s_modules_use_only_their_layer_and_the_ones_below() {
    assert_layered("src");
}

#[test]
fn the_effects_modules_use_only_their_layer_and_the_ones_below() {
    assert_layered("../effects/src");
}

#[test]
fn an_upward_use_is_found() {
    // Non-vacuity: the check reads what it claims to.
    assert_eq!(
        named("use crate::{engine, imports::lock}; let x = crate::runner::Host::open;"),
        ["engine", "imports", "runner"]
    );
}
