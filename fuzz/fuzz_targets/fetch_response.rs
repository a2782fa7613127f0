//! A Fetch response from a broker: decoded by the kafka-protocol crate, its records walked as a restore does (CRC, aborted list, cut batches).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| statestore_native::fuzzing::fetch_response(data));
