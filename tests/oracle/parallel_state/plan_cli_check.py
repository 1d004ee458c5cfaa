#!/usr/bin/env python3
"""`mcpp plan ranks` vs megatron_ranks.py: the printed group lists equal Megatron's for several layouts
(non-default orders, cp > 1, ep > 1), every table row's coordinates and group indices agree with those
lists (and, for the default order, with rank = tp_r + tp*(cp_r + cp*(dp_r + dp*pp_r))); bad layouts exit 2
with exactly one "error: ..." line naming the field.

Usage: plan_cli_check.py <mcpp binary>
"""
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import megatron_ranks  # noqa: E402

KINDS = ["dp_cp", "dp", "cp", "mp", "tp", "pp", "embd", "pos_embd", "tp_cp", "ep", "expert_tp", "tp_ep", "expert_dp"]


def run(mcpp, args):
    return subprocess.run([mcpp, "plan", "ranks"] + args, capture_output=True, text=True)


def parse(out):
    lines = out.splitlines()
    assert lines[0].startswith("layout: "), lines[0]
    head = lines[1].replace("|", " ").split()
    assert head == ["rank", "tp", "cp", "dp", "pp", "etp", "ep", "edp"] + KINDS, head
    rows, i = [], 2
    while lines[i] != "groups:":
        rows.append(lines[i].replace("|", " ").split())
        i += 1
    groups = {}
    for line in lines[i + 1:]:
        kind, rest = line.split(" (", 1)
        lists = rest.split(":", 1)[1].split()
        groups[kind] = [[int(x) for x in g.strip("[]").split(",")] for g in lists]
    return head, rows, groups


def check_case(mcpp, world, tp=1, pp=1, cp=1, ep=1, etp=0, order="tp-cp-ep-dp-pp"):
    args = ["--world", str(world), "--tp", str(tp), "--pp", str(pp), "--cp", str(cp), "--ep", str(ep),
            "--order", order] + (["--expert-tp", str(etp)] if etp else [])
    r = run(mcpp, args)
    assert r.returncode == 0, (args, r.stderr)
    head, rows, groups = parse(r.stdout)
    want = megatron_ranks.layout(world, tp, pp, cp, ep, etp or tp, order)
    for k in KINDS:
        assert groups[k] == want["groups"][k], (args, k, groups[k], want["groups"][k])
    assert len(rows) == world
    dp = want["dp"]
    for rank, row in enumerate(rows):
        # the header repeats names (tp coordinate, tp group), so split the row by position
        assert int(row[0]) == rank
        coords = dict(zip(head[1:8], (int(x) for x in row[1:8])))
        index = dict(zip(KINDS, row[8:]))
        for kind in KINDS:
            member = [i for i, g in enumerate(want["groups"][kind]) if rank in g]
            assert index[kind] == (str(member[0]) if member else "-"), (args, rank, kind, index[kind], member)
        for coord, kind in (("tp", "tp"), ("cp", "cp"), ("dp", "dp"), ("pp", "pp"), ("etp", "expert_tp"),
                            ("ep", "ep"), ("edp", "expert_dp")):
            g = want["groups"][kind][int(index[kind])]
            assert coords[coord] == g.index(rank), (args, rank, coord)
        if order == "tp-cp-ep-dp-pp":
            t, c, d, p = (coords[x] for x in ("tp", "cp", "dp", "pp"))
            assert rank == t + tp * (c + cp * (d + dp * p)), (args, rank)


def check_error(mcpp, args, needle):
    r = run(mcpp, args)
    assert r.returncode == 2, (args, r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], (args, r.stderr)


def main():
    mcpp = sys.argv[1]
    check_case(mcpp, 8, tp=2, pp=2)
    check_case(mcpp, 16, tp=2, pp=2, cp=2)
    check_case(mcpp, 16, tp=2, pp=2, ep=4)
    check_case(mcpp, 32, tp=2, pp=2, cp=2, ep=4, etp=1)
    check_case(mcpp, 8, tp=2, pp=2, order="tp-pp-dp")
    check_case(mcpp, 16, tp=2, pp=2, cp=2, ep=2, order="tp-cp-ep-pp-dp")
    check_case(mcpp, 8, pp=8)
    check_case(mcpp, 1)
    # A known table row: world 8, tp 2, pp 2 -> rank 5 is tp 1, dp 0, pp 1, in tp group [4,5] (#2).
    r = run(mcpp, ["--world", "8", "--tp", "2", "--pp", "2"])
    row5 = [l for l in r.stdout.splitlines() if l.split()[:1] == ["5"]][0].replace("|", " ").split()
    assert row5[:5] == ["5", "1", "0", "0", "1"], row5
    assert "tp (4 x 2): [0,1] [2,3] [4,5] [6,7]" in r.stdout and "pp (4 x 2): [0,4] [1,5] [2,6] [3,7]" in r.stdout
    check_error(mcpp, ["--world", "6", "--tp", "4"], "tensor_model_parallel_size")
    check_error(mcpp, ["--world", "8", "--tp", "2", "--ep", "3"], "expert_model_parallel_size")
    check_error(mcpp, ["--world", "8", "--tp", "0"], "tensor_model_parallel_size must be >= 1")
    check_error(mcpp, ["--world", "8", "--order", "tp-xx-pp"], "unknown dimension 'xx'")
    check_error(mcpp, ["--world", "8", "--ep", "2", "--order", "tp-dp-pp"], "does not name ep")
    check_error(mcpp, ["--tp", "2"], "--world")
    print("plan ranks: OK")


if __name__ == "__main__":
    main()
