//! Link every `fsync` and `fdatasync` of the extension (RocksDB's, the
//! standard library's) through `fileio::deferred`'s wrappers, which skip the
//! syncs of stores a restore job makes durable at its end, and otherwise call
//! the C library's (`__real_fsync`). Only with the `store` feature (the
//! wrappers are part of it), and only this package's own links (the
//! extension, its tests): the fuzz targets build without it.
fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let linux = std::env::var_os("CARGO_CFG_TARGET_OS").is_some_and(|os| os == "linux");
    if linux && std::env::var_os("CARGO_FEATURE_STORE").is_some() {
        for f in ["fsync", "fdatasync"] {
            println!("cargo:rustc-link-arg=-Wl,--wrap={f}");
        }
    }
}
