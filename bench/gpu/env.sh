# Sourced on a device machine from the repo root: unpacks device_carry/ (bench/gpu/make_carry.sh) and
# sets the loader path (our non-system libs, CUDA's, NCCL's and cuDNN's from Python's site-packages) and $MPIRUN
# (Debian's Open MPI 4.1.4 from the bundle, relocated with OPAL_PREFIX, so the launcher matches the
# libmpi our binaries link). NVLink multicast stays off (NCCL_NVLS_ENABLE=0). Also the helpers the device
# scripts share: run_train (one `mcpp train` run, one GPU or under mpirun) and the 124M model flags.
C=$PWD/device_carry
D=/tmp/dompi
mkdir -p $D/lib && if [ -f "$C/lib.tar.xz" ]; then tar xJf "$C/lib.tar.xz" -C $D; else tar xzf "$C/lib.tgz" -C $D; fi &&
  tar xzf "$C/ompi_root.tgz" -C $D --transform 's,^/,,'
if [ -f "$C/bin.tar.xz" ]; then mkdir -p "$C/bin" && tar xJf "$C/bin.tar.xz" -C "$C/bin"; fi
NCCL_LIB=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
CUDNN_LIB=$(python3 -c 'import nvidia.cudnn, os; print(os.path.join(list(nvidia.cudnn.__path__)[0], "lib"))' 2>/dev/null)
export OPAL_PREFIX=$D/usr PMIX_INSTALL_PREFIX=$D/usr/lib/x86_64-linux-gnu/pmix2
ML=$D/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH=$D/lib:$NCCL_LIB:$CUDNN_LIB:/usr/local/cuda/lib64:$ML/openmpi/lib:$ML/pmix2/lib:$ML
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=4
export OMPI_MCA_mca_base_component_show_load_errors=0 OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader
export OMPI_MCA_btl_vader_single_copy_mechanism=none
MPIRUN="$D/usr/bin/orterun --allow-run-as-root --oversubscribe"
MCPP=$C/bin/mcpp

# GPT-2 124M shapes (T 1024, bf16, random tokens from /tmp/rnd: make_rnd_124m), 20 iterations logged every 10;
# the callers add the batch and the layout.
M124="--num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length 1024 --max-position-embeddings 1024
  --tokenizer-type NullTokenizer --vocab-size 50304 --hidden-dropout 0 --attention-dropout 0 --bf16 --device cuda
  --lr 1e-4 --lr-decay-style constant --train-iters 20 --log-interval 10 --eval-iters 0 --data-path /tmp/rnd
  --split 100,0,0"
# The equivalence checks' small model (d256, 4 heads, T 256, vocab 512, fp32 unless --bf16, 6 steps logged
# each, 8 microbatches of 2) on /tmp/rnd_small (make_rnd_small); the callers add --num-layers and the layout.
SMALL_MODEL="--hidden-size 256 --num-attention-heads 4 --kv-channels 64 --seq-length 256
  --max-position-embeddings 256 --tokenizer-type NullTokenizer --vocab-size 512 --hidden-dropout 0
  --attention-dropout 0 --lr 1e-3 --train-iters 6 --log-interval 1 --eval-iters 0 --data-path /tmp/rnd_small
  --split 100,0,0 --device cuda --micro-batch-size 2 --global-batch-size 16"
make_rnd_small() {
  python3 bench/gpu/random_tokens.py /tmp/rnd_small --tokens 400000 --vocab 512 --doc-len 1024 >/dev/null
}
make_rnd_124m() {
  [ -f /tmp/rnd.bin ] || python3 bench/gpu/random_tokens.py /tmp/rnd --tokens 4000000 --vocab 50304 >/dev/null
}
# run_train NAME NP [flags...]: `mcpp train $RUN_FLAGS --metrics-path $OUT/NAME.jsonl flags...` on GPU 0 (NP 1)
# or under mpirun -np NP, output in $OUT/NAME.log; prints "NAME: exit RC, N iterations" (and the log's tail
# on a failure).
run_train() {
  local name=$1 np=$2
  shift 2
  if [ "$np" = 1 ]; then
    CUDA_VISIBLE_DEVICES=0 "$MCPP" train $RUN_FLAGS --metrics-path "$OUT/$name.jsonl" "$@" > "$OUT/$name.log" 2>&1
  else
    $MPIRUN -np "$np" "$MCPP" train $RUN_FLAGS --metrics-path "$OUT/$name.jsonl" "$@" > "$OUT/$name.log" 2>&1
  fi
  local rc=$?
  echo "$name: exit $rc, $(grep -c '"event":"train"' "$OUT/$name.jsonl" 2>/dev/null) iterations"
  [ $rc -eq 0 ] || tail -5 "$OUT/$name.log"
}
