#!/bin/bash
# Packs what a device run of the NCCL tests and the CUDA kernel bench needs into <build>/carry (carry that
# folder): bin/ (nccl_driver, cuda_kernels_bench), lib.tgz (lib/: their non-system shared libraries except
# libcudart / libcublasLt, which are in /usr/local/cuda/lib64 there, and libnccl, which is in Python's
# site-packages there) and ompi_root.tgz (Debian's Open MPI 4.1.4 runtime, used by device_run.sh only
# when the device machine has no mpirun of its own). Usage: tests/nccl/make_carry.sh build-cuda2
set -euo pipefail
build=${1:?usage: make_carry.sh <build dir>}
out=$build/carry
rm -rf "$out" && mkdir -p "$out/bin" "$out/lib"
cp "$build/bin/nccl_driver" "$build/bin/cuda_kernels_bench" "$out/bin/"
skip='linux-vdso|ld-linux|libc\.so|libm\.so|libstdc\+\+|libgcc_s|libpthread|libdl\.so|librt\.so|libcudart|libcublas|libnccl|libcuda\.so'
pkgs="openmpi-bin libopenmpi3 libpmix2 openmpi-common"
files=$(dpkg -L $pkgs | grep -v -E '^/usr/share/(doc|man|lintian)' | while read -r f; do [ -f "$f" ] || [ -L "$f" ] && echo "$f"; done)
tar czf "$out/ompi_root.tgz" -P $files /etc/alternatives/mpirun /etc/alternatives/mpiexec /usr/bin/mpirun /usr/bin/mpiexec 2>/dev/null
# shared libraries of the binaries, of libmpi and of the Open MPI launcher (not its optional plugins)
for f in "$out"/bin/* /usr/bin/orterun /usr/bin/orted $(echo "$files" | grep -E '\.so(\.[0-9]+)*$' | grep -v '/openmpi3/\|/pmix/'); do
  ldd "$f" 2>/dev/null | awk '$3 ~ /^\// {print $3}'
done | sort -u | grep -v -E "$skip" | while read -r lib; do cp -L "$lib" "$out/lib/"; done
tar czf "$out/lib.tgz" -C "$out" lib && rm -rf "$out/lib"
du -sh "$out"
