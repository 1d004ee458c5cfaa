# PyTorch's scaled_dot_product_attention at our benchmark shapes, per backend (the peer's attention, for
# the kernel table next to ours in docs/PERF.md): causal, bf16, [b, h, s, d]; fwd and bwd ms with CUDA
# events (median of 20 after 5 warm-ups) and TFLOP/s counting useful causal work (fwd 4*b*h*s^2*d/2,
# bwd 2.5x fwd — the same convention as bench/cuda_kernels_bench.cpp).
# usage (device): python3 bench/gpu/torch_sdpa_bench.py
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

SHAPES = [("124M", 32, 12, 1024, 64), ("1.3B", 8, 16, 2048, 128)]
BACKENDS = [("default", None), ("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
            ("efficient", SDPBackend.EFFICIENT_ATTENTION)]


def timed(fn, reps=20):
    for _ in range(5):
        fn()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    return sorted(ts)[len(ts) // 2]


for name, b, h, s, d in SHAPES:
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    fwd_flop = 4 * b * h * s * s * d / 2
    for bname, be in BACKENDS:
        ctx = sdpa_kernel([be]) if be is not None else torch.autograd.graph.saved_tensors_hooks(lambda x: x, lambda x: x)
        try:
            with ctx:
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                g = torch.randn_like(o)
                tf = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
                tfb = timed(lambda: torch.autograd.grad(F.scaled_dot_product_attention(q, k, v, is_causal=True), (q, k, v), g))
            tb = tfb - tf
            print(f"| torch sdpa {bname} | {name} s{s} b{b} h{h} d{d} causal | fwd {tf:.3f} ms {fwd_flop / tf / 1e9:.1f} TFLOP/s "
                  f"| bwd {tb:.3f} ms {2.5 * fwd_flop / tb / 1e9:.1f} TFLOP/s |", flush=True)
        except Exception as e:  # a backend that does not take these inputs
            print(f"| torch sdpa {bname} | {name} | not available: {type(e).__name__}: {str(e)[:120]} |", flush=True)
