# The peer side of `nccl_driver --scenario=bandwidth`: the same collectives, sizes, bf16 messages and
# nccl-tests bandwidth definitions through torch.distributed (NCCL), 2 processes on 2 GPUs, to run in the
# same device call. Time: the slowest rank's wall time of `iters` back-to-back calls after 3 warm-up
# calls, ended by torch.cuda.synchronize().
# usage (device machine, 2 GPUs): python3 bench/gpu/torch_nccl_bw.py
import os, time
import torch, torch.distributed as dist, torch.multiprocessing as mp


def worker(rank, n):
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method="tcp://127.0.0.1:29533", rank=rank, world_size=n)
    if rank == 0:
        print(f"torch {torch.__version__}, NCCL {torch.cuda.nccl.version()}, {n} ranks, "
              f"NCCL_NVLS_ENABLE={os.environ.get('NCCL_NVLS_ENABLE')}")
        print("| op | size | time (us) | algbw (GB/s) | busbw (GB/s) |\n| --- | --- | --- | --- | --- |")
    for op in ("all_reduce", "all_gather", "reduce_scatter"):
        size = 1 << 20
        while size <= 1 << 30:
            elems = size // 2 // n * n
            full = torch.zeros(elems, dtype=torch.bfloat16, device="cuda")
            part = torch.zeros(elems // n, dtype=torch.bfloat16, device="cuda")
            call = {"all_reduce": lambda: dist.all_reduce(full),
                    "all_gather": lambda: dist.all_gather_into_tensor(full, part),
                    "reduce_scatter": lambda: dist.reduce_scatter_tensor(part, full)}[op]
            iters = 10 if size >= 256 << 20 else 30
            for _ in range(3):
                call()
            torch.cuda.synchronize()
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                call()
            torch.cuda.synchronize()
            t = torch.tensor([(time.perf_counter() - t0) / iters], device="cuda")
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            t = t.item()
            nbytes = elems * 2
            factor = 2 * (n - 1) / n if op == "all_reduce" else (n - 1) / n
            if rank == 0:
                print(f"| {op} | {nbytes / 2**20:g} MiB | {t * 1e6:.1f} | {nbytes / t / 1e9:.1f} | "
                      f"{nbytes / t / 1e9 * factor:.1f} |", flush=True)
            size <<= 2
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, args=(2,), nprocs=2)
