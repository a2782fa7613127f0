#!/usr/bin/env bash
# Write the C/C++ toolchain every build of the crate uses: zig (the ziglang package in the venv) behind
# maturin's `zig cc` wrapper, targeting an old glibc so that what is built is a manylinux wheel.
#
#   scripts/zig-toolchain.sh DIR VENV ZIG_TARGET      e.g. ~/.cache/statestore/zig-x86_64-2.28 .venv x86_64-linux-gnu.2.28
#
# DIR gets cc, c++, ar and ranlib. Its path must not depend on the clone: cargo runs a build script
# again (here: compiles RocksDB again) when CC_<target> names another file. What the scripts contain
# may change freely (they name this clone's venv); a file is rewritten only when it differs.
set -euo pipefail
dir=$1
venv=$(cd "$2" && pwd)
zig_target=$3
mkdir -p "$dir"

write() {  # name, then the command line after `maturin zig`
    local f=$dir/$1 body
    shift
    body=$(printf '#!/bin/sh\n# written by statestore'"'"'s scripts/zig-toolchain.sh\nexport CARGO_ZIGBUILD_PYTHON_PATH="%s/bin/python"\nexec "%s/bin/maturin" zig %s "$@"\n' \
        "$venv" "$venv" "$*")
    if [ "$(cat "$f" 2>/dev/null)" != "$body" ]; then
        printf '%s\n' "$body" >"$f.tmp" && chmod +x "$f.tmp" && mv "$f.tmp" "$f"
    fi
}
# The same flags maturin --zig gives zig: keep debug info to strip later, no sanitizers, the glibc version.
write cc cc -- -g -fno-sanitize=all -target "$zig_target"
write c++ c++ -- -g -fno-sanitize=all -target "$zig_target"
write ar ar --
write ranlib ranlib --
