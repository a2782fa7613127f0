//! A record batch: header, CRC, records of every codec, control markers; decoded records re-encode to the same records.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| statestore_native::fuzzing::batch(data));
