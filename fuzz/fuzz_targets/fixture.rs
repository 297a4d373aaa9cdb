#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| stephost_host::fuzzing::fixture(data));
