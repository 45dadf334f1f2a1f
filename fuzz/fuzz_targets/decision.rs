//! cargo-fuzz target `decision`: raw bytes into the shared harness `decisions_from_bytes`
//! (tests/it/helpers/fuzz_harness.rs), the same one `tests/it/fuzz.rs` runs on stable in CI.
#![no_main]

#[path = "../../tests/it/helpers/fuzz_harness.rs"]
mod fuzz_harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    fuzz_harness::decisions_from_bytes(data);
});
