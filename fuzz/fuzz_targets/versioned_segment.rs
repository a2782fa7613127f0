//! One row of a versioned store's segment: the segment value format and the put logic over it.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| statestore_native::fuzzing::versioned_segment(data));
