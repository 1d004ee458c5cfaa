#!/bin/bash
# Packs a CUDA build's binaries for a device run into device_carry/ (git-ignored; pass it as `carry`):
#   device_carry/bin.tar.xz  the binaries named (default: mcpp mcpp_tests cuda_kernels_bench), stripped and
#                          xz-compressed
#                          (their sm_90 + sm_80 fatbins compress ~6x; bench/gpu/env.sh unpacks them to bin/)
#   device_carry/lib.tar.xz  their non-system shared libraries (not libcudart / libcublas* / libnccl /
#                          libcuda: the device machine has those in /usr/local/cuda and Python's site-packages)
#   device_carry/anchors/  a copy of ../shared/anchors (the PyTorch peer benchmark, run in the same call)
#   device_carry/ompi_root.tgz  Debian's Open MPI 4.1.4 runtime (the binaries link its libmpi; relocated
#                          under /tmp/dompi by bench/gpu/env.sh on the device)
# usage: bench/gpu/make_carry.sh <cuda build dir> [binary ...]
set -euo pipefail
build=${1:?usage: make_carry.sh <cuda build dir> [binary ...]}
shift
bins=${*:-mcpp mcpp_tests cuda_kernels_bench}
root=$(cd "$(dirname "$0")/../.." && pwd)
out=$root/device_carry
# not helpers' subfolders
rm -rf "$out/bin" "$out/bin.tar.xz" "$out/lib" "$out/lib.tgz" "$out/lib.tar.xz" "$out/ompi_root.tgz" "$out/anchors"
mkdir -p "$out/bin" "$out/lib"
for b in $bins; do strip -o "$out/bin/$b" "$build/bin/$b"; done  # no symbols: half the size
skip='linux-vdso|ld-linux|libc\.so|libm\.so|libstdc\+\+|libgcc_s|libpthread|libdl\.so|librt\.so|libcudart|libcublas|libnccl|libcuda\.so|libcudnn'
for f in "$out"/bin/*; do ldd "$f" | awk '$3 ~ /^\// {print $3}'; done | sort -u | grep -v -E "$skip" |
  while read -r lib; do cp -L "$lib" "$out/lib/"; done
pkgs="openmpi-bin libopenmpi3 libpmix2 openmpi-common"
files=$(dpkg -L $pkgs | grep -v -E '^/usr/share/(doc|man|lintian)' | while read -r f; do [ -f "$f" ] || [ -L "$f" ] && echo "$f"; done)
tar czf "$out/ompi_root.tgz" -P $files /etc/alternatives/mpirun /etc/alternatives/mpiexec /usr/bin/mpirun /usr/bin/mpiexec 2>/dev/null
for f in /usr/bin/orterun /usr/bin/orted $(echo "$files" | grep -E '\.so(\.[0-9]+)*$' | grep -v '/openmpi3/\|/pmix/'); do
  ldd "$f" 2>/dev/null | awk '$3 ~ /^\// {print $3}'
done | sort -u | grep -v -E "$skip" | while read -r lib; do cp -L "$lib" "$out/lib/"; done
tar cf - -C "$out" lib | xz -9e -T2 > "$out/lib.tar.xz" && rm -rf "$out/lib"
cp -r "$root/../shared/anchors" "$out/anchors"
# xz -9e (a 64 MiB dictionary): the stripped mcpp + mcpp_tests 32 MB at -6, 17.6 MB at -9e
tar cf - -C "$out/bin" . | xz -9e -T2 > "$out/bin.tar.xz" && rm -rf "$out/bin"
du -sh "$out"
