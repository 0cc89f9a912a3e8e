#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# What a user does after building, checked on a finished build (no second nvcc build):
#   install to a prefix and move it (relocatable), build and run a C consumer through pkg-config
#   and a CMake consumer through find_package, run the installed tools, build the TGZ and DEBs
#   and check each DEB's files and that its Depends cover every library its binaries link against;
#   each DEB's changelog, maintainer, versioned libc6, ldconfig trigger and clean pkg-config output.
# usage: .ci/install_check.sh [BUILD_DIR]   (default: build)
set -euo pipefail
cd "$(dirname "$0")/.."
src=$(pwd)
build=$(cd "${1:-build}" && pwd)
work=$(mktemp -d /tmp/fly_install_check.XXXXXX)
trap 'rm -rf "$work"' EXIT
fail() { echo "install_check: FAIL: $*" >&2; exit 1; }
step() { echo "install_check: $*"; }
# grep that reads all its input: grep -q would exit early and, under pipefail, fail the producer.
has() { grep "$@" > /dev/null; }
[ -f "$build/CMakeCache.txt" ] || fail "$build is not a configured build directory"
ls "$build"/libflykernels.so.* >/dev/null 2>&1 || fail "$build has no libflykernels.so (build it first)"
for tool in pkg-config cc c++ readelf dpkg-deb cpack; do
  command -v "$tool" >/dev/null || fail "$tool is not installed"
done
# Without a GPU every consumer must end on FLY_ERROR_NO_DEVICE; with one, on the device's arch.
if [ -e /dev/nvidia0 ]; then expect="device sm_"; else expect="FLY_ERROR_NO_DEVICE"; fi

# 1. Install, then move the tree: nothing may depend on the path it was installed to.
step "install to a prefix, then move it"
cmake --install "$build" --prefix "$work/staged" > "$work/install.log" || { cat "$work/install.log"; fail "cmake --install"; }
mv "$work/staged" "$work/prefix"
prefix="$work/prefix"
pcs=$(find "$prefix" -name flykernels.pc)
[ "$(echo "$pcs" | grep -c .)" = 1 ] || fail "expected one flykernels.pc under the prefix, found: $pcs"
libdir_expected=$(dirname "$(dirname "$pcs")")
ls "$libdir_expected"/libflykernels.so.* >/dev/null 2>&1 || fail "no libflykernels.so.* beside the pkgconfig directory"
for f in include/flykernels/flykernels.h include/flykernels/flykernels.hpp bin/flyinfo bin/flytune bin/flybench \
         share/flykernels/db/schema.sql share/flykernels/suites/rmsnorm.json share/flykernels/tuning/gemm.json; do
  [ -e "$prefix/$f" ] || fail "$f is not installed"
done
find "$libdir_expected" -path '*cmake/flykernels/flykernelsConfig.cmake' | has . || fail "no flykernelsConfig.cmake"
if grep -rIl -- "$work/staged" "$prefix" > "$work/stale.txt"; then
  fail "files still name the install path after the move: $(tr '\n' ' ' < "$work/stale.txt")"
fi

# 2. C consumer through pkg-config (relocatable .pc: prefix found from the file's own place).
step "C consumer through pkg-config"
PKG_CONFIG_PATH=$(dirname "$pcs")
export PKG_CONFIG_PATH
pkg-config --exists --print-errors flykernels || fail "pkg-config does not find flykernels"
[ "$(pkg-config --variable=prefix flykernels)" -ef "$prefix" ] || fail "pkg-config prefix $(pkg-config --variable=prefix flykernels) is not $prefix"
libdir=$(pkg-config --variable=libdir flykernels)
[ "$libdir" -ef "$libdir_expected" ] || fail "pkg-config libdir $libdir is not $libdir_expected"
# shellcheck disable=SC2046
cc -std=c11 -Wall -Wextra -Werror "$src/examples/pkgconfig_c/consumer.c" $(pkg-config --cflags --libs flykernels) \
   -Wl,-rpath,"$libdir" -o "$work/c_consumer" || fail "building the C consumer through pkg-config"
out=$(cd "$work" && env -u LD_LIBRARY_PATH ./c_consumer) || fail "C consumer exited $?: $out"
echo "$out" | sed 's/^/    /'
echo "$out" | has "$expect" || fail "C consumer did not report $expect"

# 3. C++ consumer through find_package(flykernels) and flykernels::flykernels.
step "C++ consumer through find_package"
cmake -S "$src/examples/cmake_cxx" -B "$work/cmake_consumer" -DCMAKE_PREFIX_PATH="$prefix" \
      -DCMAKE_BUILD_TYPE=Release > "$work/consumer_configure.log" 2>&1 \
  || { cat "$work/consumer_configure.log"; fail "configuring the CMake consumer"; }
cmake --build "$work/cmake_consumer" > "$work/consumer_build.log" 2>&1 \
  || { cat "$work/consumer_build.log"; fail "building the CMake consumer"; }
out=$(cd "$work" && env -u LD_LIBRARY_PATH ./cmake_consumer/consumer) || fail "CMake consumer exited $?: $out"
echo "$out" | sed 's/^/    /'
echo "$out" | has "$expect" || fail "CMake consumer did not report $expect"

# 4. Installed tools: they start from any directory (run path), find their data, answer --help.
step "installed tools"
for t in flyinfo flytune flybench; do
  readelf -d "$prefix/bin/$t" | grep -E 'R(UN)?PATH' | has '\$ORIGIN' || fail "$t has no \$ORIGIN run path"
  help=$(cd / && env -u LD_LIBRARY_PATH "$prefix/bin/$t" --help) || fail "$t --help exited $?"
  echo "$help" | has "^usage: $t" || fail "$t --help printed no usage line"
  rc=0; (cd / && env -u LD_LIBRARY_PATH "$prefix/bin/$t" --no-such-option) > /dev/null 2> "$work/err.txt" || rc=$?
  [ "$rc" = 2 ] || fail "$t --no-such-option exited $rc, not 2"
  grep -q "no-such-option" "$work/err.txt" || fail "$t --no-such-option did not name the option: $(cat "$work/err.txt")"
done
for t in flytune flybench; do
  (cd / && "$prefix/bin/$t" --help) | has "^data: $prefix/share/flykernels " \
    || fail "$t does not find its data under $prefix/share/flykernels: $(cd / && "$prefix/bin/$t" --help | grep '^data:')"
  (cd / && "$prefix/bin/$t" --help --data-dir "$src") | has "^data: $src " || fail "$t --data-dir does not override"
done
for t in flyinfo flytune flybench; do
  v=$(cd / && env -u LD_LIBRARY_PATH "$prefix/bin/$t" --version) || fail "$t --version exited $?"
  [ "$v" = "$t $(sed -n 's/^CMAKE_PROJECT_VERSION:STATIC=//p' "$build/CMakeCache.txt")" ] || fail "$t --version printed '$v'"
done
# Usage errors before the device check (exit 2), no GPU 3 (GPUs hidden, whatever this machine has).
rc=0; (cd / && CUDA_VISIBLE_DEVICES="" "$prefix/bin/flytune" rmsnorm --db) > /dev/null 2>&1 || rc=$?
[ "$rc" = 2 ] || fail "flytune rmsnorm --db (no value) exited $rc, not 2"
rc=0; (cd / && CUDA_VISIBLE_DEVICES="" "$prefix/bin/flybench" gemm --suite /nonexistent.json) > /dev/null 2>&1 || rc=$?
[ "$rc" = 2 ] || fail "flybench gemm --suite /nonexistent.json exited $rc, not 2"
for t in flytune flybench; do
  rc=0; (cd / && CUDA_VISIBLE_DEVICES="" "$prefix/bin/$t" rmsnorm) > /dev/null 2>&1 || rc=$?
  [ "$rc" = 3 ] || fail "$t rmsnorm without a GPU exited $rc, not 3"
done
rc=0; (cd / && "$prefix/bin/flytune" rmsnorm --quick --no-such-option) > /dev/null 2>&1 || rc=$?
[ "$rc" = 2 ] || fail "flytune rmsnorm --no-such-option exited $rc, not 2"
info=$(cd / && env -u LD_LIBRARY_PATH "$prefix/bin/flyinfo") || fail "installed flyinfo exited $?"
echo "$info" | sed -n '1,3p' | sed 's/^/    /'
echo "$info" | has "bundled kernel variants: [1-9]" || fail "installed flyinfo lists no variants"

# 5. Packages: TGZ (the whole tree) and the DEBs, inspected with dpkg-deb.
step "cpack TGZ and DEB"
(cd "$work" && cpack -G "TGZ;DEB" --config "$build/CPackConfig.cmake" -B "$work/pkg") > "$work/cpack.log" 2>&1 \
  || { cat "$work/cpack.log"; fail "cpack"; }
ls "$work"/pkg/*.tar.gz >/dev/null 2>&1 || fail "no TGZ"
tar -tzf "$work"/pkg/*.tar.gz | has '/bin/flyinfo$' || fail "the TGZ has no bin/flyinfo"
multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch)
version=$(sed -n 's/^CMAKE_PROJECT_VERSION:STATIC=//p' "$build/CMakeCache.txt")
deb_of() { find "$work/pkg" -maxdepth 1 -name "$1_*.deb" | sed -n 1p; }
lib_deb=$(deb_of libflykernels0); dev_deb=$(deb_of libflykernels-dev); tools_deb=$(deb_of flykernels-tools)
[ -n "$lib_deb" ] && [ -n "$dev_deb" ] && [ -n "$tools_deb" ] || fail "expected three DEBs, got: $(ls "$work/pkg")"
for d in "$lib_deb" "$dev_deb" "$tools_deb"; do
  dpkg-deb -I "$d" > /dev/null || fail "dpkg-deb cannot read $d"
  [ "$(dpkg-deb -f "$d" Version)" = "$version" ] || fail "$(basename "$d"): Version $(dpkg-deb -f "$d" Version), not $version"
  [ -n "$(dpkg-deb -f "$d" Maintainer)" ] || fail "$(basename "$d") has no Maintainer"
  echo "    $(dpkg-deb -f "$d" Package) $(dpkg-deb -f "$d" Version): Depends: $(dpkg-deb -f "$d" Depends)"
done
# Licence: each DEB ships /usr/share/doc/<package>/copyright (Debian copyright format, Apache-2.0).
for d in "$lib_deb" "$dev_deb" "$tools_deb"; do
  p=$(dpkg-deb -f "$d" Package)
  dpkg-deb -c "$d" | has " \./usr/share/doc/$p/copyright$" || fail "$(basename "$d") has no /usr/share/doc/$p/copyright"
  dpkg-deb --fsys-tarfile "$d" | tar -xO "./usr/share/doc/$p/copyright" | has "^License: Apache-2.0$" \
    || fail "$(basename "$d"): /usr/share/doc/$p/copyright does not name Apache-2.0"
done
dpkg-deb -c "$lib_deb" | has "/usr/lib/$multiarch/libflykernels.so.0" || fail "the library is not in /usr/lib/$multiarch"
dpkg-deb -c "$dev_deb" | has "/usr/lib/$multiarch/pkgconfig/flykernels.pc" || fail "the .pc is not in /usr/lib/$multiarch/pkgconfig"
dpkg-deb -c "$dev_deb" | has "/usr/include/flykernels/flykernels.hpp" || fail "the dev DEB has no flykernels.hpp"
dpkg-deb -c "$tools_deb" | has "/usr/share/flykernels/suites/" || fail "the tools DEB has no share/flykernels/suites"
dpkg-deb -f "$dev_deb" Depends | has "libflykernels0 (= $version)" || fail "the dev DEB does not depend on libflykernels0 (= $version)"
dpkg-deb -f "$tools_deb" Depends | has "libflykernels0 (= $version)" || fail "the tools DEB does not depend on libflykernels0 (= $version)"
# The .pc inside the DEB says prefix=/usr (a DEB is never moved): pkg-config prints clean paths,
# no ${pcfiledir}/../../.. segments (the relocatable tree above keeps them: pkg-config does not
# normalize paths). Checked under a sysroot, as if installed there.
dpkg-deb -x "$dev_deb" "$work/dev_root"
grep -qx "prefix=/usr" "$work/dev_root/usr/lib/$multiarch/pkgconfig/flykernels.pc" \
  || fail "the DEB's .pc does not say prefix=/usr: $(grep '^prefix=' "$work/dev_root/usr/lib/$multiarch/pkgconfig/flykernels.pc")"
pcflags=$(PKG_CONFIG_PATH='' PKG_CONFIG_LIBDIR="$work/dev_root/usr/lib/$multiarch/pkgconfig" \
          PKG_CONFIG_SYSROOT_DIR="$work/dev_root" pkg-config --cflags --libs flykernels)
echo "    DEB .pc: pkg-config --cflags --libs flykernels: $pcflags"
case "$pcflags" in *..*) fail "the DEB's pkg-config output has '..' path segments: $pcflags" ;; esac
echo "$pcflags" | has -- "-lflykernels" || fail "the DEB's pkg-config output has no -lflykernels: $pcflags"
[ "$(PKG_CONFIG_PATH='' PKG_CONFIG_LIBDIR="$work/dev_root/usr/lib/$multiarch/pkgconfig" pkg-config --variable=includedir flykernels)" \
  = /usr/include ] || fail "the DEB's .pc includedir is not /usr/include"
# Maintainer: a real address, not the old placeholder.
for d in "$lib_deb" "$dev_deb" "$tools_deb"; do
  m=$(dpkg-deb -f "$d" Maintainer)
  echo "$m" | has -E '^[^<>]+ <[^@<> ]+@[^@<> ]+\.[a-z]+>$' || fail "$(basename "$d"): Maintainer '$m' is not 'Name <address>'"
  case "$m" in *@localhost*) fail "$(basename "$d"): Maintainer '$m' is a placeholder" ;; esac
done
# Debian changelog in each DEB: /usr/share/doc/<package>/changelog.Debian.gz, gzip -9n (no name, no
# time stamp in the header), its first entry this version.
for d in "$lib_deb" "$dev_deb" "$tools_deb"; do
  p=$(dpkg-deb -f "$d" Package)
  dpkg-deb --fsys-tarfile "$d" | tar -xO "./usr/share/doc/$p/changelog.Debian.gz" > "$work/changelog.gz" 2>/dev/null \
    || fail "$(basename "$d") has no /usr/share/doc/$p/changelog.Debian.gz"
  gzip -t "$work/changelog.gz" || fail "$(basename "$d"): changelog.Debian.gz is not valid gzip"
  # header bytes: 3 = flags (FNAME 0x08 must be clear), 4..7 = mtime (0 with -n)
  hdr=$(od -An -tx1 -N8 "$work/changelog.gz" | tr -d ' \n')
  [ "${hdr:6:2}" = "00" ] && [ "${hdr:8:8}" = "00000000" ] || fail "$(basename "$d"): changelog.Debian.gz was not made with gzip -n (header $hdr)"
  gzip -dc "$work/changelog.gz" | sed -n 1p | has -E "^flykernels \($version\) " \
    || fail "$(basename "$d"): changelog's first entry is not version $version: $(gzip -dc "$work/changelog.gz" | sed -n 1p)"
done
# Linker cache: the runtime DEB activates the ldconfig trigger (install and removal).
dpkg-deb --ctrl-tarfile "$lib_deb" | tar -xO ./triggers 2>/dev/null | has -x "activate-noawait ldconfig" \
  || fail "$(basename "$lib_deb") has no 'activate-noawait ldconfig' trigger"
# libc6: a versioned dependency, at least the newest GLIBC_ symbol version the binaries use.
glibc_need=$(for d in "$lib_deb" "$tools_deb"; do
               r="$work/glibc_$(basename "$d" .deb)"; dpkg-deb -x "$d" "$r"
               find "$r" -type f \( -name '*.so*' -o -path '*/bin/*' \) -exec objdump -T {} + 2>/dev/null
             done | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -1)
[ -n "$glibc_need" ] || fail "no GLIBC_ symbol versions found in the packaged binaries"
for d in "$lib_deb" "$tools_deb"; do
  have=$(dpkg-deb -f "$d" Depends | tr ',' '\n' | sed -n 's/^ *libc6 (>= \([0-9.]*\)).*/\1/p')
  [ -n "$have" ] || fail "$(basename "$d"): Depends has no versioned libc6: $(dpkg-deb -f "$d" Depends)"
  [ "$(printf '%s\n%s\n' "$glibc_need" "$have" | sort -V | tail -1)" = "$have" ] \
    || fail "$(basename "$d"): libc6 (>= $have), but its binaries need GLIBC_$glibc_need"
  echo "    $(dpkg-deb -f "$d" Package): libc6 (>= $have) (binaries need GLIBC_$glibc_need)"
done
# Every library a packaged binary links against must come from a package its Depends names.
checked=0
for d in "$lib_deb" "$tools_deb"; do
  root="$work/root_$(basename "$d" .deb)"
  dpkg-deb -x "$d" "$root"
  deps=$(dpkg-deb -f "$d" Depends | tr ',' '\n' | sed 's/(.*)//; s/ //g; s/:.*//')
  while read -r f; do
    for needed in $(readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
      case "$needed" in libflykernels.so.*) pkg=libflykernels0 ;;
        *) path=$(ldconfig -p | awk -v n="$needed" '$1 == n && !p && /x86-64|AArch64|64bit/ {p = $NF} END {print p}')
           [ -n "$path" ] || fail "$(basename "$f") needs $needed, which this machine does not have"
           pkg=$( { dpkg -S "$path" || dpkg -S "$(readlink -f "$path")" || dpkg -S "/usr$path"; } 2>/dev/null | sed -n 1p || true)
           pkg=${pkg%%:*}
           [ -n "$pkg" ] || fail "$(basename "$f") needs $needed ($path), which no Debian package provides" ;;
      esac
      echo "$deps" | has -x "$pkg" || fail "$(basename "$d"): $(basename "$f") needs $needed from $pkg, not in Depends"
      checked=$((checked + 1))
    done
  done < <(find "$root" -type f \( -name '*.so*' -o -path '*/bin/*' \))
done
[ "$checked" -ge 10 ] || fail "only $checked linked libraries checked against Depends (expected the library's and 3 tools')"
echo "    $checked linked libraries (NEEDED) of the packaged binaries come from packages in their Depends"
step "OK (installed, moved, consumed through pkg-config and find_package, tools run, DEBs checked)"
