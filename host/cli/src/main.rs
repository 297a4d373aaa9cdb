fn main() {
    std::process::exit(stephost::main());
}
