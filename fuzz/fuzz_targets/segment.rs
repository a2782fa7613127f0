//! A partition directory built from the bytes: readers (both isolation levels), the index as a hint, offsets, and a writer's recovery (torn-tail cut, index rebuild) losing nothing.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| statestore_native::fuzzing::segment(data));
