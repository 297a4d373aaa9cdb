//! `stephost` with crash points compiled in, for the end-to-end tests.
fn main() {
    std::process::exit(stephost::main());
}
