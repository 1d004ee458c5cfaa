#!/usr/bin/env python3
"""Oracle for mcpp's parallel_state: Megatron-Core's rank groups, computed two independent ways.

1. megatron_groups(): a transcription of megatron/core/parallel_state.py
   generate_masked_orthogonal_rank_groups + RankGenerator (order normalization, masks, offsets).
2. numpy_groups(): the same groups from numpy axis algebra: arange(world) reshaped with the order's
   dims (first dim fastest), masked axes moved last, reshaped to [num_groups, group_size].
The two must agree (asserted for every query), so a transcription slip shows up here, not in C++.

initialize_model_parallel's grids are restated in layout(): the dense grid RankGenerator(tp, ep=1, dp,
pp, cp, order) and the expert grid RankGenerator(expert_tp, ep, expert_dp, pp, cp=1, order), plus the
embedding (first + last pp stage) and position-embedding (first stage) groups.

Usage: megatron_ranks.py --world N [--tp T --pp P --cp C --ep E --etp X --order O]
prints JSON {"dp": ..., "order": ..., "groups": {kind: [[ranks]...]}} with mcpp's kind names.
"""
import argparse
import json
import sys

import numpy as np

NAMES = ["tp", "pp", "dp", "ep", "cp"]


def normalize_order(order, sizes):
    order = order.lower()
    for name in NAMES:
        if name not in order.split("-"):
            if sizes[name] != 1:
                raise ValueError(f"size of {name} is {sizes[name]} but order {order} omits it")
            order = order + "-" + name
    return order


def megatron_groups(world, ordered_size, mask):
    """Transcription of Megatron-Core's generate_masked_orthogonal_rank_groups."""

    def prefix_product(a, init=1):
        r = [init]
        for v in a:
            init = init * v
            r.append(init)
        return r

    def inner_product(a, b):
        return sum(x * y for x, y in zip(a, b))

    def decompose(index, shape):
        stride = prefix_product(shape)
        idx = [(index // d) % s for s, d in zip(shape, stride)]
        assert sum(x * y for x, y in zip(idx, stride[:-1])) == index
        return idx

    masked_shape = [s for s, m in zip(ordered_size, mask) if m]
    unmasked_shape = [s for s, m in zip(ordered_size, mask) if not m]
    global_stride = prefix_product(ordered_size)
    masked_stride = [d for d, m in zip(global_stride, mask) if m]
    unmasked_stride = [d for d, m in zip(global_stride, mask) if not m]
    group_size = prefix_product(masked_shape)[-1]
    ranks = []
    for group_index in range(world // group_size):
        g = decompose(group_index, unmasked_shape)
        ranks.append([inner_product(decompose(r, masked_shape), masked_stride) + inner_product(g, unmasked_stride)
                      for r in range(group_size)])
    return ranks


def numpy_groups(world, ordered_size, mask):
    """Independent: numpy C-order is last-axis-fastest, so axes are the order's dims reversed."""
    n = len(ordered_size)
    arr = np.arange(world).reshape(list(reversed(ordered_size)))
    axis_of = lambda i: n - 1 - i  # order position i -> numpy axis
    unmasked = [axis_of(i) for i in reversed(range(n)) if not mask[i]]  # slowest first
    masked = [axis_of(i) for i in reversed(range(n)) if mask[i]]
    group_size = int(np.prod([ordered_size[i] for i in range(n) if mask[i]]))
    return arr.transpose(unmasked + masked).reshape(-1, group_size).tolist()


class Generator:
    def __init__(self, tp, ep, dp, pp, cp, order):
        self.sizes = {"tp": tp, "pp": pp, "dp": dp, "ep": ep, "cp": cp}
        self.world = tp * ep * dp * pp * cp
        self.order = normalize_order(order, self.sizes)
        self.ordered_size = [self.sizes[t] for t in self.order.split("-")]

    def get_ranks(self, token):
        tokens = self.order.split("-")
        mask = [False] * len(tokens)
        for t in token.split("-"):
            mask[tokens.index(t)] = True
        a = megatron_groups(self.world, self.ordered_size, mask)
        b = numpy_groups(self.world, self.ordered_size, mask)
        assert a == b, f"transcription and numpy disagree for {token}: {a} vs {b}"
        return a


def layout(world, tp, pp, cp, ep, etp, order):
    assert world % (tp * pp * cp) == 0 and world % (etp * ep * pp) == 0
    dp = world // (tp * pp * cp)
    edp = world // (etp * ep * pp)
    dec = Generator(tp, 1, dp, pp, cp, order)
    exp = Generator(etp, ep, edp, pp, 1, order)
    assert dec.get_ranks("pp") == exp.get_ranks("pp")
    pp_groups = dec.get_ranks("pp")
    groups = {
        "dp_cp": dec.get_ranks("dp-cp"), "dp": dec.get_ranks("dp"), "cp": dec.get_ranks("cp"),
        "mp": dec.get_ranks("tp-pp"), "tp": dec.get_ranks("tp"), "pp": pp_groups,
        "embd": [[g[0]] if len(g) == 1 else [g[0], g[-1]] for g in pp_groups],
        "pos_embd": [[g[0]] for g in pp_groups],
        "tp_cp": dec.get_ranks("tp-cp"), "ep": exp.get_ranks("ep"), "expert_tp": exp.get_ranks("tp"),
        "tp_ep": exp.get_ranks("tp-ep"), "expert_dp": exp.get_ranks("dp"),
        # extra tokens, compared against RankGenerator::get_ranks directly
        "dec:tp-dp-cp": dec.get_ranks("tp-dp-cp"), "dec:tp-dp": dec.get_ranks("tp-dp"),
        "exp:tp-ep-pp": exp.get_ranks("tp-ep-pp"), "exp:dp-pp": exp.get_ranks("dp-pp"),
    }
    return {"dp": dp, "expert_dp": edp, "order": dec.order, "expert_order": exp.order, "groups": groups}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--world", type=int, required=True)
    for f in ("tp", "pp", "cp", "ep"):
        p.add_argument("--" + f, type=int, default=1)
    p.add_argument("--etp", type=int, default=0)
    p.add_argument("--order", default="tp-cp-ep-dp-pp")
    a = p.parse_args()
    json.dump(layout(a.world, a.tp, a.pp, a.cp, a.ep, a.etp or a.tp, a.order), sys.stdout)
    print()


if __name__ == "__main__":
    main()
