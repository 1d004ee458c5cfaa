#!/bin/bash
# Runs the NCCL tests (2 GPUs) and the CUDA kernel bench (1 GPU) on a device machine from the bundle of
# tests/nccl/make_carry.sh. Open MPI is Debian's 4.1.4 from the bundle, relocated under /tmp/dompi
# (OPAL_PREFIX), so the launcher matches the libmpi the binaries were linked with, whatever the machine
# has; libnccl.so.2 comes from Python's site-packages (nvidia/nccl/lib), libcudart / libcublasLt from
# /usr/local/cuda/lib64. NVLink multicast stays off (NCCL_NVLS_ENABLE=0 and friends).
# usage: tests/nccl/device_run.sh <carry dir> <log dir> [ops] [watchdog] [bench]   (default: all three)
set -u
C=$(cd "$1" && pwd)
LOG=$2
shift 2
what=${*:-ops watchdog bench}
mkdir -p "$LOG"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
D=/tmp/dompi
mkdir -p $D && tar xzf "$C/ompi_root.tgz" -C $D --transform 's,^/,,' && tar xzf "$C/lib.tgz" -C $D || exit 1
NCCL_LIB=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
[ -n "$NCCL_LIB" ] || NCCL_LIB=$(dirname "$(find / -name libnccl.so.2 -path '*nvidia/nccl*' 2>/dev/null | head -1)")
export OPAL_PREFIX=$D/usr PMIX_INSTALL_PREFIX=$D/usr/lib/x86_64-linux-gnu/pmix2
ML=$D/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH=$NCCL_LIB:/usr/local/cuda/lib64:$D/lib:$ML/openmpi/lib:$ML/pmix2/lib:$ML
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=4
export OMPI_MCA_mca_base_component_show_load_errors=0 OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader
export OMPI_MCA_btl_vader_single_copy_mechanism=none
MPIRUN="$D/usr/bin/orterun --allow-run-as-root --oversubscribe -np 2"
export NCCL_DEBUG=${NCCL_DEBUG:-INFO} NCCL_DEBUG_SUBSYS=${NCCL_DEBUG_SUBSYS:-INIT}
echo "== machine"; nvidia-smi -L; nvidia-smi topo -m 2>/dev/null | head -4; echo "NCCL_LIB=$NCCL_LIB"
ldd "$C/bin/nccl_driver" | grep -E "nccl|mpi|not found"
rc=0
for w in $what; do
  case $w in
    ops) echo "== nccl ops (np 2)"; $MPIRUN "$C/bin/nccl_driver" 2>&1 | tee "$LOG/nccl_ops.log"; r=${PIPESTATUS[0]} ;;
    watchdog) echo "== nccl watchdog (np 2)"; timeout 120 $MPIRUN "$C/bin/nccl_driver" --scenario=watchdog 2>&1 | tee "$LOG/nccl_watchdog.log"
      r=${PIPESTATUS[0]}; grep -q "WATCHDOG OK" "$LOG/nccl_watchdog.log" || r=1 ;;
    bench) echo "== cuda kernels bench (1 GPU)"; CUDA_VISIBLE_DEVICES=0 "$C/bin/cuda_kernels_bench" 2>&1 | tee "$LOG/cuda_kernels_bench.md"; r=${PIPESTATUS[0]} ;;
    *) echo "unknown step $w"; r=2 ;;
  esac
  echo "== $w: exit $r"
  [ $r -eq 0 ] || rc=1
done
exit $rc
