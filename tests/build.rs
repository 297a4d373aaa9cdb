//! Builds every test guest and the example steps from source for
//! wasm32-wasip2, in a target directory of their own (a nested cargo must not
//! wait on the lock of the build that runs this script), and tells the tests
//! where the components are.

use std::path::PathBuf;
use std::process::Command;

/// (package, environment variable with the component's path)
const GUESTS: &[(&str, &str)] = &[
    ("supplier-order", "SUPPLIER_ORDER"),
    ("guest-multi-write", "GUEST_MULTI_WRITE"),
    ("guest-divergent", "GUEST_DIVERGENT"),
    ("guest-looper", "GUEST_LOOPER"),
    ("guest-memory-bomb", "GUEST_MEMORY_BOMB"),
    ("guest-panicker", "GUEST_PANICKER"),
    ("guest-huge-payload", "GUEST_HUGE_PAYLOAD"),
    ("guest-wrong-world", "GUEST_WRONG_WORLD"),
    ("guest-wasi-only", "GUEST_WASI_ONLY"),
    ("guest-llm-step", "GUEST_LLM_STEP"),
    ("guest-approval-step", "GUEST_APPROVAL_STEP"),
    ("guest-sleeper", "GUEST_SLEEPER"),
    ("guest-command", "GUEST_COMMAND"),
];

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let root = manifest.parent().unwrap().to_path_buf();
    let target_dir = root.join("target").join("guest-wasm");
    for dir in ["wit", "guest-sdk", "examples", "tests/guests"] {
        println!("cargo:rerun-if-changed={}", root.join(dir).display());
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(&root)
        .args([
            "build",
            "--release",
            "--target",
            "wasm32-wasip2",
            "--target-dir",
        ])
        .arg(&target_dir);
    for (package, _) in GUESTS {
        cmd.args(["-p", package]);
    }
    for var in [
        "CARGO_ENCODED_RUSTFLAGS",
        "RUSTFLAGS",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET",
        "CARGO_MAKEFLAGS",
        "MAKEFLAGS",
        "MFLAGS",
        "RUSTC_WORKSPACE_WRAPPER",
        "CARGO_PRIMARY_PACKAGE",
        "CARGO_FEATURE_CRASH_POINTS",
    ] {
        cmd.env_remove(var);
    }
    let status = cmd
        .status()
        .expect("cannot start cargo to build the test guests");
    if !status.success() {
        panic!(
            "building the test guests failed ({status}); is the wasm32-wasip2 target installed? \
             run `rustup target add wasm32-wasip2`"
        );
    }
    let out = target_dir.join("wasm32-wasip2").join("release");
    for (package, var) in GUESTS {
        // Libraries and the `guest_command` binary are named with underscores.
        let file = out.join(format!("{}.wasm", package.replace('-', "_")));
        assert!(file.exists(), "{} was not built", file.display());
        println!("cargo:rustc-env={var}={}", file.display());
    }
}
