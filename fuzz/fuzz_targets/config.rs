#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| stephost_runtime::fuzzing::config(data));
