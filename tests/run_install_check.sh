#!/bin/sh
# run_install_check.sh BUILD: installs BUILD (a configured alloy build) under a fresh prefix, then
# builds examples/mlp_forward.c as an outside program would, with `pkg-config --cflags --libs alloy`
# only (and -lm, which the example itself uses), and runs it without LD_LIBRARY_PATH: the headers, the versioned liballoy.so.0, the
# pkg-config file and its rpath must be enough. Then the same for liballoy-runtime: examples/aot_train.c built with
# `pkg-config --cflags --libs alloy-runtime` alone runs a bundle that BUILD's alloyc compiled, linked to the
# installed liballoy-runtime.so.0 and not to liballoy. Leaves BUILD's prefix as it found it. Exit 0 on
# success; prints what failed otherwise.
set -eu
build=$1
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/alloy-install.XXXXXX")
old_prefix=$(meson introspect "$build" --buildoptions | python3 -c 'import json,sys; print([o["value"] for o in json.load(sys.stdin) if o["name"] == "prefix"][0])')
restore() { meson configure "$build" -Dprefix="$old_prefix" >/dev/null 2>&1 || true; rm -rf "$tmp"; }
trap restore EXIT
fail() { echo "install check: $*"; exit 1; }
meson configure "$build" -Dprefix="$tmp/prefix" >/dev/null || fail "meson configure -Dprefix failed"
meson install -C "$build" --quiet >"$tmp/install.log" 2>&1 || { cat "$tmp/install.log"; fail "meson install failed"; }
pc=$(find "$tmp/prefix" -name alloy.pc | head -1)
[ -n "$pc" ] || fail "no alloy.pc installed under $tmp/prefix"
so=$(find "$tmp/prefix" -name 'liballoy.so.0' | head -1)
[ -n "$so" ] || fail "no versioned liballoy.so.0 installed"
grep -q 'cuda\|nvrtc\|cublas' "$pc" && fail "alloy.pc names CUDA libraries alloy does not link: $(grep Libs "$pc")"
export PKG_CONFIG_PATH="$(dirname "$pc")"
flags=$(pkg-config --cflags --libs alloy) || fail "pkg-config --cflags --libs alloy failed"
${CC:-cc} -std=c11 "$root/examples/mlp_forward.c" $flags -lm -o "$tmp/mlp_forward" || fail "cc with: $flags"
out=$(env -u LD_LIBRARY_PATH ALLOY_DEVICE=cpu "$tmp/mlp_forward" 2>&1) || fail "the program failed: $out"
ldd "$tmp/mlp_forward" | grep -q "liballoy.so.0 => $tmp/prefix" || fail "not linked to the installed liballoy.so.0: $(ldd "$tmp/mlp_forward" | grep alloy)"
echo "install check: built examples/mlp_forward.c against $pc ($flags) and ran it: $(echo "$out" | tail -1)"

pcr=$(find "$tmp/prefix" -name alloy-runtime.pc | head -1)
[ -n "$pcr" ] || fail "no alloy-runtime.pc installed under $tmp/prefix"
[ -n "$(find "$tmp/prefix" -name 'liballoy-runtime.so.0' | head -1)" ] || fail "no versioned liballoy-runtime.so.0 installed"
rflags=$(pkg-config --cflags --libs alloy-runtime) || fail "pkg-config --cflags --libs alloy-runtime failed"
${CC:-cc} -std=c11 -D_POSIX_C_SOURCE=200809L "$root/examples/aot_train.c" "$root/examples/cli.c" \
    "$root/examples/mlp_data.c" $rflags -lm -o "$tmp/aot_train" || fail "cc with: $rflags"
"$build/tools/alloyc" compile "$root/examples/ir/mlp_classifier.ir" --train --amp=f16 --optimizer=adamw \
    -o "$tmp/step.alloy" >/dev/null || fail "alloyc compile -o step.alloy failed"
out=$(env -u LD_LIBRARY_PATH ALLOY_DEVICE=cpu "$tmp/aot_train" "$tmp/step.alloy" --steps 5 2>&1) || fail "aot_train failed: $out"
ldd "$tmp/aot_train" | grep -q "liballoy-runtime.so.0 => $tmp/prefix" ||
    fail "aot_train is not linked to the installed liballoy-runtime.so.0: $(ldd "$tmp/aot_train" | grep alloy)"
ldd "$tmp/aot_train" | grep -q "liballoy.so" && fail "aot_train links liballoy: $(ldd "$tmp/aot_train" | grep alloy)"
echo "install check: built examples/aot_train.c against $pcr ($rflags) and ran a bundle: $(echo "$out" | tail -1)"
