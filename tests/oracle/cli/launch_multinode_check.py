#!/usr/bin/env python3
"""Two "nodes" on loopback: `mcpp launch --nnodes 2 --node-rank R --master-addr 127.0.0.1 --master-port P
--nproc-per-node 2 -- train ...` twice (two launcher processes, a TCP rendezvous, no shared directory).

1. TP2 x DP2 over the two nodes: per-iteration lm loss equal to one process within 1e-5 relative (fp32). And the
   srun form (no launcher): two `mcpp train` with SLURM_PROCID / SLURM_NTASKS and MASTER_ADDR / MASTER_PORT, TP2.
2. A rank on node 1 SIGKILLed mid-save: node 1's launcher names it, the master stops node 0's ranks; both launchers
   exit non-zero within the timeout and no rank survives.
3. Bad input, one error line and exit 2: node rank out of range, --nnodes 2 without --master-addr, an unreachable
   master (nothing listens; --rdzv-timeout 1), an unresolvable master, a port already in use on node 0, a node
   started with another --nproc-per-node.
usage: launch_multinode_check.py MCPP_BIN WORKDIR
"""
import json
import os
import socket
import subprocess
import time

from cli_harness import MCPP as mcpp, WORK as work, launcher_model, random_tokens

env = dict(os.environ, OMP_NUM_THREADS="1")
model = launcher_model(random_tokens(), layers=2)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launcher(node, port, cmd, extra_env=None, nproc=2):
    args = [mcpp, "launch", "--nnodes", "2", "--node-rank", str(node), "--master-addr", "127.0.0.1", "--master-port",
            str(port), "--nproc-per-node", str(nproc), "--rdzv-timeout", "60", "--", *cmd]
    return subprocess.Popen(args, env=dict(env, **(extra_env or {})), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def two_nodes(cmd, extra_env=None, timeout=300):
    port = free_port()
    procs = [launcher(0, port, cmd, extra_env), launcher(1, port, cmd, extra_env)]
    outs = [p.communicate(timeout=timeout) for p in procs]
    return [(p.returncode, o, e) for p, (o, e) in zip(procs, outs)]


def losses(path):
    return [json.loads(l)["lm_loss"] for l in open(path) if '"event":"train"' in l]


ref_path = os.path.join(work, "single.jsonl")
subprocess.run([mcpp, "train", *model, "--metrics-path", ref_path], env=env, check=True, capture_output=True,
               timeout=300)
ref = losses(ref_path)
got_path = os.path.join(work, "tp2dp2.jsonl")
res = two_nodes(["train", *model, "--tensor-model-parallel-size", "2", "--metrics-path", got_path])
for node, (rc, out, err) in enumerate(res):
    assert rc == 0, f"node {node}: exit {rc}\n{out[-2000:]}\n{err[-2000:]}"
got = losses(got_path)
rel = max(abs(a - b) / abs(a) for a, b in zip(ref, got))
assert len(got) == len(ref) == 4 and rel < 1e-5, (ref, got, rel)  # fp32: TP splits change summation order only
print(f"two nodes TP2 x DP2: max rel loss diff vs 1 process {rel:.2e}")

# Under srun without MPI: each rank from SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID, rank 0 serving the rendezvous
# at MASTER_ADDR:MASTER_PORT (here two processes started by hand, as srun would).
port = free_port()
srun_path = os.path.join(work, "srun.jsonl")
procs = [subprocess.Popen([mcpp, "train", *model, "--tensor-model-parallel-size", "2", "--metrics-path", srun_path],
                          env=dict(env, SLURM_PROCID=str(r), SLURM_NTASKS="2", SLURM_LOCALID=str(r),
                                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (1, 0)]
for p in procs:
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, f"srun-style rank: exit {p.returncode}\n{out[-2000:]}\n{err[-2000:]}"
got = losses(srun_path)
rel = max(abs(a - b) / abs(a) for a, b in zip(ref, got))
assert len(got) == 4 and rel < 1e-5, (ref, got, rel)
print(f"srun-style TP2 (SLURM_PROCID, MASTER_ADDR): max rel loss diff vs 1 process {rel:.2e}")

# A rank of node 1 (global rank 3) killed during a checkpoint save: both nodes stop.
t0 = time.time()
res = two_nodes(["train", *model, "--tensor-model-parallel-size", "2", "--save", os.path.join(work, "ckpt"),
                 "--distributed-timeout-minutes", "1"],
                {"MCPP_FAULT_KILL_AT": "after_fsync_model", "MCPP_FAULT_KILL_RANK": "3"}, timeout=200)
(rc0, _, err0), (rc1, _, err1) = res
assert rc1 != 0 and "rank 3 was killed by signal 9" in err1, (rc1, err1[-2000:])
assert rc0 != 0 and "node 1 failed" in err0, (rc0, err0[-2000:])
print(f"rank 3 killed on node 1: node 0 exit {rc0}, node 1 exit {rc1} after {time.time() - t0:.1f} s")

# Bad input.
port = free_port()
busy = socket.socket()
busy.bind(("0.0.0.0", port))
busy.listen(1)
cases = [
    (["--nnodes", "2", "--node-rank", "2", "--master-addr", "127.0.0.1"], "node_rank 2 is out of range"),
    (["--nnodes", "2", "--node-rank", "1"], "needs --master-addr"),
    (["--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
      "--rdzv-timeout", "1"], "cannot reach the master at 127.0.0.1:"),
    (["--nnodes", "2", "--node-rank", "1", "--master-addr", "no-such-host.invalid", "--rdzv-timeout", "1"],
     "cannot resolve the master address 'no-such-host.invalid'"),
    (["--nnodes", "2", "--node-rank", "0", "--master-addr", "127.0.0.1", "--master-port", str(port)],
     f"cannot listen on port {port}"),
]
for args, needle in cases:
    q = subprocess.run([mcpp, "launch", *args, "--nproc-per-node", "2", "--", "train", *model], env=env,
                       capture_output=True, text=True, timeout=60)
    assert q.returncode == 2 and needle in q.stderr and q.stderr.count("\n") == 1, (args, q.returncode, q.stderr)
busy.close()
# A node with another layout: refused by the master with one line (exit 2); the master then ends its ranks.
port = free_port()
master = launcher(0, port, ["train", *model, "--tensor-model-parallel-size", "2"])
q = subprocess.run([mcpp, "launch", "--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1",
                    "--master-port", str(port), "--nproc-per-node", "3", "--rdzv-timeout", "30", "--", "train",
                    *model], env=env, capture_output=True, text=True, timeout=60)
master.kill()
master.communicate()
assert q.returncode == 2 and "--nproc-per-node 3" in q.stderr and q.stderr.count("\n") == 1, (q.returncode, q.stderr)
print("launch multinode OK")
