//! One (key, value) of a store's offsets column family: offsets and the status marker.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| statestore_native::fuzzing::offsets(data));
