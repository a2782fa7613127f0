//! The transaction coordinator's state file (producer ids, epochs, open transactions).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| statestore_native::fuzzing::txn_state(data));
