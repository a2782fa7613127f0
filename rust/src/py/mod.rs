//! PyO3 bindings, one file per domain. Each `register` adds that domain's
//! functions and classes to `statestore._native`. Bindings convert arguments,
//! release the GIL around the work, and map errors to the classes of
//! `statestore.errors` through [`errors`]; they hold no logic of their own.
//! [`testing`] builds the submodule `_native._testing` (tests and benchmarks
//! only); the only logic here, the ceilings benchmarks measure against --
//! replay's raw writes (`testing/ceiling.rs`) and RocksDB building tables on
//! every core (`testing/sst_ceiling.rs`) -- lives beside it so production
//! modules hold no benchmark-only code.

pub mod errors;
pub mod feed;
pub mod fileio;
pub mod kafka;
pub mod log;
pub mod restore;
pub mod store;
pub mod testing;
