//! Builds every test guest and the example steps from source for
//! wasm32-wasip2 (see `guest_build.rs`), and tells the tests where the
//! components are.

use std::path::PathBuf;

include!("guest_build.rs");

/// (package, environment variable with the component's path)
const GUESTS: &[(&str, &str)] = &[
    ("supplier-order", "SUPPLIER_ORDER"),
    ("mcp-supplier-order", "MCP_SUPPLIER_ORDER"),
    ("http-supplier-order", "HTTP_SUPPLIER_ORDER"),
    ("guest-http-step", "GUEST_HTTP_STEP"),
    ("guest-multi-write", "GUEST_MULTI_WRITE"),
    ("guest-divergent", "GUEST_DIVERGENT"),
    ("guest-looper", "GUEST_LOOPER"),
    ("guest-memory-bomb", "GUEST_MEMORY_BOMB"),
    ("guest-panicker", "GUEST_PANICKER"),
    ("guest-huge-payload", "GUEST_HUGE_PAYLOAD"),
    ("guest-wrong-world", "GUEST_WRONG_WORLD"),
    ("guest-wasi-only", "GUEST_WASI_ONLY"),
    ("guest-llm-step", "GUEST_LLM_STEP"),
    ("guest-chat-step", "GUEST_CHAT_STEP"),
    ("guest-approval-step", "GUEST_APPROVAL_STEP"),
    ("guest-sleeper", "GUEST_SLEEPER"),
    ("guest-command", "GUEST_COMMAND"),
    ("guest-fanout", "GUEST_FANOUT"),
    ("guest-fanout-v2", "GUEST_FANOUT_V2"),
    ("guest-fork-step", "GUEST_FORK_STEP"),
    ("guest-fork-step-fixed", "GUEST_FORK_STEP_FIXED"),
    ("guest-square", "GUEST_SQUARE"),
    ("guest-promise-step", "GUEST_PROMISE_STEP"),
    ("agent-refund", "AGENT_REFUND"),
];

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let root = manifest.parent().unwrap().to_path_buf();
    for dir in [
        "tests/guest_build.rs",
        "wit",
        "guest-sdk",
        "examples",
        "tests/guests",
    ] {
        println!("cargo:rerun-if-changed={}", root.join(dir).display());
    }
    let packages: Vec<&str> = GUESTS.iter().map(|(package, _)| *package).collect();
    for ((_, var), file) in GUESTS.iter().zip(build_guests(&root, &packages)) {
        println!("cargo:rustc-env={var}={}", file.display());
    }
}
