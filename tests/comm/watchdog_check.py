#!/usr/bin/python3
"""Watchdog end-to-end check (ctest comm.watchdog_skip_np4).

Runs `mpiexec -np N comm_mpi_driver --scenario=watchdog_skip` as a child in its own session with
MCPP_DISTRIBUTED_TIMEOUT_SECONDS=3: the last rank skips world all_reduce seq 5 and sleeps. Checks:
  - the job exits non-zero within timeout + 10 s, and no process of its session is left behind;
  - every rank wrote <dump>/flight_recorder/rank_<r>.json in the documented schema;
  - the dumps show ranks 0..N-2 pending in all_reduce seq 5 and rank N-1 never past seq 4;
  - stderr has ONE "error: distributed timeout:" line naming the op, group, seq and the missing rank.
usage: watchdog_check.py <comm_mpi_driver> <work dir> <np>
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

TIMEOUT_S = 3
STUCK_SEQ = 5  # world seq 1 = watchdog run-id broadcast, 2..4 = completed warm-up collectives


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def main():
    driver, work, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    skipper = n - 1
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    env = dict(os.environ, MCPP_DISTRIBUTED_TIMEOUT_SECONDS=str(TIMEOUT_S), OMP_NUM_THREADS="1",
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    cmd = ["mpiexec", "--allow-run-as-root", "--oversubscribe", "-np", str(n), driver,
           "--scenario=watchdog_skip", "--dump-dir=" + work]
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=TIMEOUT_S + 30)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        fail("the job hung: still running %d s after start" % (TIMEOUT_S + 30))
    elapsed = time.monotonic() - t0
    print("rc=%d elapsed=%.2f s\n--- stderr ---\n%s" % (p.returncode, elapsed, err))
    if p.returncode == 0:
        fail("the job exited 0; the watchdog must end it non-zero")
    if elapsed > TIMEOUT_S + 10:
        fail("the job took %.1f s > timeout %d s + 10 s" % (elapsed, TIMEOUT_S))
    try:
        os.killpg(p.pid, 0)
        fail("processes of the job's session are still alive after mpiexec returned (zombie ranks)")
    except ProcessLookupError:
        pass

    lines = [l for l in err.splitlines() if l.startswith("error: distributed timeout:")]
    if len(lines) != 1:
        fail("expected exactly one 'error: distributed timeout:' line, got %d" % len(lines))
    line = lines[0]
    for want in ["all_reduce(sum) (group 'world' ranks [%s], seq %d, float32, 8 elements)"
                 % (",".join(str(r) for r in range(n)), STUCK_SEQ),
                 "ranks that never entered it: [%d]" % skipper,
                 "dumps (%d of %d ranks)" % (n, n)]:
        if want not in line:
            fail("error line lacks %r: %s" % (want, line))

    keys = {"id", "group", "group_ranks", "seq", "p2p_seq", "op", "reduce_op", "dtype", "count", "peers", "state",
            "start_steady_ns", "end_steady_ns", "start_wall_us", "end_wall_us",
            "iteration", "microbatch", "pp_stage", "vp_chunk",  # the training coordinates (-1 outside training)
            "payload_checksum", "result_checksum"}  # --flight-recorder-checksums (0 when off)
    for r in range(n):
        path = os.path.join(work, "flight_recorder", "rank_%d.json" % r)
        if not os.path.exists(path):
            fail("rank %d wrote no dump %s" % (r, path))
        d = json.load(open(path))
        if d["rank"] != r or d["world_size"] != n or d["version"] != 1 or d["capacity"] != 2048:
            fail("rank %d dump header wrong: %s" % (r, {k: d[k] for k in d if k != "entries"}))
        for e in d["entries"]:
            if set(e) != keys:
                fail("rank %d entry keys %s != schema %s" % (r, sorted(e), sorted(keys)))
        world = [e for e in d["entries"] if e["group"] == "world"]
        seqs = [e["seq"] for e in world]
        if seqs != list(range(1, len(seqs) + 1)):
            fail("rank %d world seqs not 1..k: %s" % (r, seqs))
        pending = [e for e in world if e["state"] in ("queued", "started")]
        if r == skipper:
            if max(seqs) != STUCK_SEQ - 1 or pending:
                fail("skipping rank %d: expected last seq %d and nothing pending, got %s / %s"
                     % (r, STUCK_SEQ - 1, max(seqs), pending))
        else:
            if len(pending) != 1 or pending[0]["seq"] != STUCK_SEQ or pending[0]["op"] != "all_reduce" \
                    or pending[0]["count"] != 8 or pending[0]["state"] != "started":
                fail("rank %d: expected all_reduce seq %d started and pending, got %s" % (r, STUCK_SEQ, pending))
            if any(e["state"] != "done" for e in world if e["seq"] < STUCK_SEQ):
                fail("rank %d: earlier collectives not all done" % r)
    print("OK: watchdog named the stuck collective and the missing rank; %d dumps; %.2f s" % (n, elapsed))


if __name__ == "__main__":
    main()
