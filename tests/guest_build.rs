// Builds guests from source for wasm32-wasip2, in a target directory of
// their own (a nested cargo must not wait on the lock of the build that runs
// the build script): shared by the build scripts of the tests and the bench
// (`include!`d, as build scripts share no crate).

/// Builds `packages` of the workspace at `root` for wasm32-wasip2 and
/// returns the path of each one's component, in order.
fn build_guests(root: &std::path::Path, packages: &[&str]) -> Vec<std::path::PathBuf> {
    let target_dir = root.join("target").join("guest-wasm");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = std::process::Command::new(cargo);
    cmd.current_dir(root)
        .args([
            "build",
            "--release",
            "--target",
            "wasm32-wasip2",
            "--target-dir",
        ])
        .arg(&target_dir);
    for package in packages {
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
    let status = cmd.status().expect("cannot start cargo to build the guests");
    if !status.success() {
        panic!(
            "building the guests failed ({status}); is the wasm32-wasip2 target installed? \
             run `rustup target add wasm32-wasip2`"
        );
    }
    let out = target_dir.join("wasm32-wasip2").join("release");
    packages
        .iter()
        .map(|package| {
            // Libraries and the `guest_command` binary are named with underscores.
            let file = out.join(format!("{}.wasm", package.replace('-', "_")));
            assert!(file.exists(), "{} was not built", file.display());
            file
        })
        .collect()
}
