"""training.forensics_cli: data consistency, flight-recorder payload checksums and SIGUSR1 dumps with host stacks on
CPU ranks (docs/DEBUGGING.md; issue 33). The tiny GPT of cli_harness, each job in its own session.

A. --check-data-consistency N (M121):
   TP2 x DP2 (np 4) with the check every iteration, PP2 x DP2 every 2nd: exit 0, losses equal to the unchecked run.
   TP2 x DP2 with --inject-fault bad-batch@2:1 (rank 1's first token changed): every rank exits (no orphans, within
   seconds), the error names iteration 2, the tp group [0, 1], microbatch 0 and its two ranks (two members: no
   majority to blame; tests/training/data_consistency_test.cpp covers a larger group's minority).
   --check-data-consistency -1: one error line, exit 2.
B. --flight-recorder-checksums: DP4 (np 4) with corrupt-collective@2:1 (the lowest bit of rank 1's next shared result
   flipped) and hang@3:0 (the watchdog then dumps every rank): `mcpp debug hang --json` names the first result mismatch
   at iteration 2 with rank 1 the one member that differs, and rank 0 the hang's culprit.
C. SIGUSR1: np 2 with hang@3:1 (watchdog timeout 60 s, so only the signal dumps) and --flight-recorder-checksums:
   once rank 1 hangs, SIGUSR1 to mpiexec (which forwards it) makes both ranks write rank_<r>.json with reason
   "SIGUSR1" and a main-thread stack; the job is then stopped (no orphans). `mcpp debug hang` names rank 1, shows
   every rank's stack (rank 1's in FaultInjector::begin_step, demangled), and no result mismatch (the healthy
   all_reduce / all_gather / broadcast results agree: the checksums' semantics hold on the MPI backend).
"""
import json
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from cli_harness import (MCPP, WORK, check, debug_hang_json, failures, finish_session_job, losses,  # noqa: E402
                         record_corpus, run, session_job, start_session_job, tiny_train_flags)

DATA = record_corpus()
BASE = tiny_train_flags(DATA)


def job(name, np_, extra, env=None):
    return session_job(name, np_, [*BASE, *extra], env)


TP2 = ["--tensor-model-parallel-size", "2"]
PP2 = ["--pipeline-model-parallel-size", "2"]

# ---------------- A. --check-data-consistency
rc, _, log, plain = job("tp2dp2_plain", 4, TP2)
check(rc == 0, f"TP2xDP2 plain: exit {rc}\n{log[-2000:]}")
rc, _, log, d = job("tp2dp2_checked", 4, TP2 + ["--check-data-consistency", "1"])
check(rc == 0 and "error" not in log, f"TP2xDP2 --check-data-consistency 1: exit {rc}\n{log[-2000:]}")
check(losses(d) and losses(d) == losses(plain), f"the check changed the losses: {losses(d)} vs {losses(plain)}")
rc, _, log, d = job("pp2dp2_checked", 4, PP2 + ["--check-data-consistency", "2"])
check(rc == 0 and "error" not in log and len(losses(d)) == 6,
      f"PP2xDP2 --check-data-consistency 2: exit {rc}\n{log[-2000:]}")

rc, secs, log, d = job("tp2dp2_bad_batch", 4, TP2 + ["--check-data-consistency", "1", "--inject-fault",
                                                    "bad-batch@2:1"])
errs = sorted({l.split("] ", 1)[-1] for l in log.splitlines() if l.startswith("error:")})
check(rc != 0, "bad-batch: the job exited 0")
check(secs < 60, f"bad-batch: the job took {secs:.1f} s to end")
check(len(errs) == 1 and all(w in errs[0] for w in ("--check-data-consistency: iteration 2:", "tp group [0, 1]",
                                                     "microbatch 0", "global ranks [0, 1] hold different batches",
                                                     "rank 1: ")),
      f"bad-batch: expected one named error (iteration 2, tp group [0, 1], microbatch 0, rank 1), got {errs}\n"
      f"{log[-2500:]}")
check(not any(r == 2 for r in losses(d)), "bad-batch: iteration 2 was logged (the step must not complete)")

p = run([MCPP, "train", *BASE, "--check-data-consistency", "-1", "--save", os.path.join(WORK, "bad")], expect=1)
errs = [l for l in p.stderr.splitlines() if l.startswith("error:")]
check(p.returncode == 2 and len(errs) == 1 and "check_data_consistency" in errs[0],
      f"--check-data-consistency -1: exit {p.returncode}, {errs}")

# ---------------- B. --flight-recorder-checksums: a corrupted result
rc, secs, log, d = job("dp4_corrupt", 4, ["--flight-recorder-checksums", "--inject-fault", "corrupt-collective@2:1",
                                          "--inject-fault", "hang@3:0"],
                       env={"MCPP_DISTRIBUTED_TIMEOUT_SECONDS": "3"})
check(rc != 0 and "distributed timeout" in log, f"corrupt + hang: no watchdog timeout (exit {rc})\n{log[-2000:]}")
rep = debug_hang_json("corrupt", d)
mm = rep.get("result_mismatch") or {}
check(mm.get("iteration") == 2 and mm.get("differing_ranks") == [1] and len(mm.get("result_checksums", {})) >= 3,
      f"corrupt-collective@2:1: debug hang's result_mismatch {mm} does not name rank 1 at iteration 2")
check(rep.get("culprit_rank") == 0, f"corrupt + hang@3:0: culprit {rep.get('culprit_rank')} != 0")
text = run([MCPP, "debug", "hang", d]).stdout
check("first result mismatch" in text and "ranks [1] differ" in text, f"corrupt: the text report:\n{text[-2500:]}")

# ---------------- C. SIGUSR1: every rank dumps its recorder and host stack
p, d, logf = start_session_job("sigusr1_hang", 2, [*BASE, "--flight-recorder-checksums", "--inject-fault",
                                                   "hang@3:1"], env={"MCPP_DISTRIBUTED_TIMEOUT_SECONDS": "60"})
deadline = time.monotonic() + 60
while time.monotonic() < deadline and "hang@3:1: this rank stops" not in open(logf).read() and p.poll() is None:
    time.sleep(0.2)
time.sleep(1.0)  # rank 0 reaches its next collective and waits there
fr = os.path.join(d, "flight_recorder")
os.kill(p.pid, signal.SIGUSR1)  # mpiexec forwards SIGUSR1 to every rank
dumps = {}
deadline = time.monotonic() + 15
while time.monotonic() < deadline and len(dumps) < 2:
    for r in (0, 1):
        f = os.path.join(fr, f"rank_{r}.json")
        if r not in dumps and os.path.exists(f):
            dumps[r] = json.load(open(f))
    time.sleep(0.2)
os.killpg(p.pid, signal.SIGTERM)  # the job would hang until the watchdog's 60 s: stop it
finish_session_job("sigusr1", p, timeout=20)
log = open(logf).read()
check(sorted(dumps) == [0, 1] and all(x.get("reason") == "SIGUSR1" for x in dumps.values()),
      f"SIGUSR1: dumps {sorted(dumps)} (reasons {[x.get('reason') for x in dumps.values()]})\n{log[-2000:]}")
check(all((x.get("host_stacks") or [{}])[0].get("captured") for x in dumps.values()),
      f"SIGUSR1: a dump without a captured main-thread stack: {[x.get('host_stacks') for x in dumps.values()]}")
rep = debug_hang_json("sigusr1", d)
stacks = rep.get("host_stacks", {})
check(rep.get("culprit_rank") == 1, f"SIGUSR1: culprit {rep.get('culprit_rank')} != 1: {rep.get('culprit')}")
check(sorted(stacks) == ["0", "1"], f"SIGUSR1: stacks of ranks {sorted(stacks)}")
# the innermost frame of mcpp itself is the injected sleep's caller (not the SIGUSR1 handler that woke the watcher)
own = [f for f in stacks.get("1", []) if f.endswith("(mcpp)")]
check(own and own[0].startswith("mcpp::FaultInjector::begin_step("),
      f"SIGUSR1: rank 1's innermost mcpp frame is not the injected hang (FaultInjector::begin_step): {stacks.get('1')}")
check(any("mcpp::" in f for f in stacks.get("0", [])), f"SIGUSR1: rank 0's stack names no mcpp frame: {stacks.get('0')}")
check(rep.get("result_mismatch", "absent") is None,
      f"SIGUSR1 (healthy results): debug hang reports a result mismatch: {rep.get('result_mismatch', 'absent')}")
text = run([MCPP, "debug", "hang", d]).stdout
check("host stacks" in text and "culprit: rank 1" in text, f"SIGUSR1: the text report:\n{text[-2500:]}")

if failures:
    print("\n\n".join(failures))
    sys.exit(1)
print("forensics checks passed")
