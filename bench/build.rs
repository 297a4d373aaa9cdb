//! Builds the bench guest from source for wasm32-wasip2 (see
//! `tests/guest_build.rs`), for the bench's tests (`BENCH_GUEST`).

use std::path::PathBuf;

include!("../tests/guest_build.rs");

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let root = manifest.parent().unwrap().to_path_buf();
    for dir in ["tests/guest_build.rs", "wit", "guest-sdk", "bench/guest"] {
        println!("cargo:rerun-if-changed={}", root.join(dir).display());
    }
    for file in build_guests(&root, &["bench-guest"]) {
        println!("cargo:rustc-env=BENCH_GUEST={}", file.display());
    }
}
