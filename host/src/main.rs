fn main() {
    std::process::exit(stephost::cli::main());
}
