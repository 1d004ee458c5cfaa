#!/usr/bin/env python3
"""Oracle for src/mcpp/pipeline_parallel/schedules.cpp: a transcription of Megatron-Core's
forward_backward_pipelining_without_interleaving / _with_interleaving loops
(megatron/core/pipeline_parallel/schedules.py, overlap_p2p_comm=False) with a fake P2P communicator
and fake forward/backward steps that record what runs.

Written independently of the C++: the identity (microbatch, chunk) of every received tensor is not
computed by counting; each recv returns a placeholder that gets bound to the (microbatch, chunk) of the
forward / backward step that consumes it, through Megatron's own list bookkeeping
(input_tensors[chunk][microbatch_id - offset], output_tensor_grads[chunk].pop(0)). An unbound
placeholder (received but never consumed) fails the run.

Usage: megatron_schedule.py PP M V GROUP FORWARD_ONLY  (GROUP 0 = PP; V 1 = non-interleaved)
Prints one line per rank: "<rank>\t<actions>" in the C++ to_string format; invalid sizes exit 3 with
Megatron's message.
       megatron_schedule.py --parse LAYOUT
Megatron's PipelineParallelLayerLayout.parse_str_to_list (regex unrolling, as in
megatron/core/transformer/pipeline_parallel_layer_layout.py): prints the stages joined by '|', each
stage's layer characters in order (the oracle for the C++ layout-string parser).
"""
import re
import sys


def parse_layout(layout_str):
    layout_str = layout_str.replace(",", "")
    for pattern in (r"\(([^)]+)\)\*(\d+)", r"(.)\*(\d+)"):
        layout_str = re.sub(pattern, lambda x: x.group(1) * int(x.group(2)), layout_str)
    stages = []
    for stage in layout_str.split("|"):
        for ch in stage:
            assert ch in "ELtm", f"Invalid layer character: {ch}"
        stages.append(stage)
    return "|".join(stages)


class Slot:
    """A received tensor, bound to (mb, chunk) when a step consumes it."""

    def __init__(self):
        self.label = None

    def bind(self, label):
        assert self.label is None or self.label == label, (self.label, label)
        self.label = label


class Out:
    """A computed tensor: activation of F(mb, c) or input grad of B(mb, c)."""

    def __init__(self, label):
        self.label = label


class Recorder:
    def __init__(self, pp, rank):
        self.pp, self.rank = pp, rank
        self.actions = []  # ("F", mb, c) | ("B", mb, c) | ("C", sn, sp, rp_slot, rn_slot)

    @property
    def first(self):
        return self.rank == 0

    @property
    def last(self):
        return self.rank == self.pp - 1

    def communicate(self, send_next, send_prev, recv_prev, recv_next):
        rp = Slot() if recv_prev else None
        rn = Slot() if recv_next else None
        if send_next is not None or send_prev is not None or rp is not None or rn is not None:
            self.actions.append(("C", send_next, send_prev, rp, rn))
        return rp, rn

    # p2p_communication.py API (first/last-stage no-ops as Megatron's helpers do)
    def recv_forward(self, is_first_stage):
        return None if is_first_stage else self.communicate(None, None, True, False)[0]

    def send_forward(self, out, is_last_stage):
        if not is_last_stage:
            self.communicate(out, None, False, False)

    def recv_backward(self, is_last_stage):
        return None if is_last_stage else self.communicate(None, None, False, True)[1]

    def send_backward(self, grad, is_first_stage):
        if not is_first_stage:
            self.communicate(None, grad, False, False)

    def send_forward_recv_backward(self, out, is_last_stage):
        return None if is_last_stage else self.communicate(out, None, False, True)[1]

    def send_backward_recv_forward(self, grad, is_first_stage):
        return None if is_first_stage else self.communicate(None, grad, True, False)[0]

    def send_forward_recv_forward(self, out, recv_prev):
        return self.communicate(out, None, recv_prev, False)[0]

    def send_backward_recv_backward(self, grad, recv_next):
        return self.communicate(None, grad, False, recv_next)[1]

    def send_forward_backward_recv_forward_backward(self, out, grad, recv_prev, recv_next):
        return self.communicate(out, grad, recv_prev, recv_next)

    # compute
    def forward_step(self, input_tensor, mb, chunk):
        if isinstance(input_tensor, Slot):
            input_tensor.bind((mb, chunk))
        else:
            assert input_tensor is None and self.first and chunk == 0, (self.rank, mb, chunk)
        self.actions.append(("F", mb, chunk))
        return Out((mb, chunk))

    def backward_step(self, output_tensor, output_tensor_grad, chunk, num_chunks):
        mb, c = output_tensor.label
        assert c == chunk
        if isinstance(output_tensor_grad, Slot):
            output_tensor_grad.bind((mb, c))
        else:
            assert output_tensor_grad is None and self.last and chunk == num_chunks - 1
        self.actions.append(("B", mb, c))
        return Out((mb, c))

    def render(self):
        parts = []
        for a in self.actions:
            if a[0] in "FB":
                parts.append(f"{a[0]}{a[1]}.{a[2]}")
                continue
            _, sn, sp, rp, rn = a
            send = "_".join(n for n, t in (("forward", sn), ("backward", sp)) if t is not None)
            recv = "_".join(n for n, t in (("forward", rp), ("backward", rn)) if t is not None)
            name = "_".join(x for x in (("send_" + send) if send else "", ("recv_" + recv) if recv else "") if x)
            ops = []
            for tag, t in (("sn", sn), ("sp", sp), ("rp", rp), ("rn", rn)):
                if t is None:
                    continue
                assert t.label is not None, f"rank {self.rank}: a received tensor was never consumed"
                ops.append(f"{tag}={t.label[0]}.{t.label[1]}")
            parts.append(f"{name}({','.join(ops)})")
        return " ".join(parts)


def without_interleaving(pp, rank, M, forward_only):
    p = Recorder(pp, rank)
    num_warmup = min(pp - rank - 1, M)
    remaining = M - num_warmup
    input_tensors, output_tensors = [], []
    mb = 0
    for i in range(num_warmup):
        input_tensor = p.recv_forward(p.first)
        output_tensor = p.forward_step(input_tensor, mb, 0)
        mb += 1
        p.send_forward(output_tensor, p.last)
        if not forward_only:
            input_tensors.append(input_tensor)
            output_tensors.append(output_tensor)
    if remaining > 0:
        input_tensor = p.recv_forward(p.first)
    for i in range(remaining):
        last_iteration = i == remaining - 1
        output_tensor = p.forward_step(input_tensor, mb, 0)
        mb += 1
        if forward_only:
            p.send_forward(output_tensor, p.last)
            if not last_iteration:
                input_tensor = p.recv_forward(p.first)
        else:
            output_tensor_grad = p.send_forward_recv_backward(output_tensor, p.last)
            input_tensors.append(input_tensor)
            output_tensors.append(output_tensor)
            input_tensor = input_tensors.pop(0)
            output_tensor = output_tensors.pop(0)
            input_tensor_grad = p.backward_step(output_tensor, output_tensor_grad, 0, 1)
            if last_iteration:
                input_tensor = None
                p.send_backward(input_tensor_grad, p.first)
            else:
                input_tensor = p.send_backward_recv_forward(input_tensor_grad, p.first)
    if not forward_only:
        for i in range(num_warmup):
            input_tensor = input_tensors.pop(0)
            output_tensor = output_tensors.pop(0)
            output_tensor_grad = p.recv_backward(p.last)
            input_tensor_grad = p.backward_step(output_tensor, output_tensor_grad, 0, 1)
            p.send_backward(input_tensor_grad, p.first)
    return p.render()


def get_schedule_table(num_microbatches, num_model_chunks, group):
    table = []
    for lo in range(0, num_microbatches, group):
        hi = num_microbatches if lo + group >= num_microbatches else lo + group
        table.extend([(m, c) for c in range(num_model_chunks) for m in range(lo, hi)])
    return table


def with_interleaving(pp, rank, M, V, group, forward_only):
    p = Recorder(pp, rank)
    total = M * V
    if forward_only:
        num_warmup = total
    else:
        num_warmup = (pp - rank - 1) * 2 + (V - 1) * group
    all_warmup = False
    if num_warmup >= total:
        num_warmup, all_warmup = total, True
    remaining = total - num_warmup
    table = get_schedule_table(M, V, group)
    mb_table, chunk_table = zip(*table)

    def get_model_chunk_id(k, forward):
        c = chunk_table[k % total]
        return c if forward else V - c - 1

    def num_released(k, c):
        if forward_only:
            return chunk_table[:k].count(c)
        if k < num_warmup:
            return 0
        return chunk_table[:k - num_warmup].count(V - c - 1)

    def recv_tensor_from_previous_stage(k, forward):
        recv = True
        leading = p.first if forward else p.last
        last_chunk = (V - 1) if forward else 0
        if leading:
            if k < pp - 1:
                recv = False
                nxt = get_model_chunk_id(k + 1, forward)
            else:
                nxt = get_model_chunk_id(k - (pp - 1), forward)
            if nxt == last_chunk:
                recv = False
            nxt += 1 if forward else -1
        else:
            nxt = get_model_chunk_id(k + 1, forward)
        return recv, nxt

    input_tensors = [[] for _ in range(V)]
    output_tensors = [[] for _ in range(V)]
    output_tensor_grads = [[] for _ in range(V)]

    def forward_helper(k):
        c = get_model_chunk_id(k, True)
        mb = mb_table[k]
        if c == 0 and p.first and len(input_tensors[c]) == len(output_tensors[c]):
            input_tensors[c].append(None)
        input_tensor = input_tensors[c][mb - num_released(k, c)]
        out = p.forward_step(input_tensor, mb, c)
        output_tensors[c].append(out)
        if forward_only:
            input_tensors[c].pop(0)
            output_tensors[c].pop()
        return out

    def backward_helper(k):
        c = get_model_chunk_id(k, False)
        if c == V - 1 and p.last and len(output_tensor_grads[c]) == 0:
            output_tensor_grads[c].append(None)
        input_tensors[c].pop(0)
        out = output_tensors[c].pop(0)
        grad = output_tensor_grads[c].pop(0)
        return p.backward_step(out, grad, c, V)

    input_tensors[0].append(p.recv_forward(p.first))
    for k in range(num_warmup):
        cur = get_model_chunk_id(k, True)
        recv_prev, nxt = recv_tensor_from_previous_stage(k, True)
        if k == total - 1:
            recv_prev = False
        output_tensor = forward_helper(k)
        if cur == V - 1 and p.last:
            output_tensor = None
        if k == num_warmup - 1 and not forward_only and not all_warmup:
            recv_next = not p.last
            input_tensor, output_tensor_grad = p.send_forward_backward_recv_forward_backward(
                output_tensor, None, recv_prev, recv_next)
            output_tensor_grads[V - 1].append(output_tensor_grad)
        else:
            input_tensor = p.send_forward_recv_forward(output_tensor, recv_prev)
        if recv_prev:
            input_tensors[nxt].append(input_tensor)
    for k in range(remaining):
        fk = k + num_warmup
        output_tensor = forward_helper(fk)
        input_tensor_grad = backward_helper(k)
        if get_model_chunk_id(fk, True) == V - 1 and p.last:
            output_tensor = None
        if get_model_chunk_id(k, False) == 0 and p.first:
            input_tensor_grad = None
        recv_prev, nf = recv_tensor_from_previous_stage(fk, True)
        recv_next, nb = recv_tensor_from_previous_stage(k, False)
        if k == remaining - 1:
            recv_prev = False
        input_tensor, output_tensor_grad = p.send_forward_backward_recv_forward_backward(
            output_tensor, input_tensor_grad, recv_prev, recv_next)
        if recv_prev:
            input_tensors[nf].append(input_tensor)
        if recv_next:
            output_tensor_grads[nb].append(output_tensor_grad)
    if not forward_only:
        if all_warmup:
            output_tensor_grads[V - 1].append(p.recv_backward(p.last))
        for k in range(remaining, total):
            cur = get_model_chunk_id(k, False)
            recv_next, nb = recv_tensor_from_previous_stage(k, False)
            if k == total - 1:
                recv_next = False
            input_tensor_grad = backward_helper(k)
            if cur == 0 and p.first:
                input_tensor_grad = None
            output_tensor_grad = p.send_backward_recv_backward(input_tensor_grad, recv_next)
            if recv_next:
                output_tensor_grads[nb].append(output_tensor_grad)
    return p.render()


def main():
    if sys.argv[1] == "--parse":
        print(parse_layout(sys.argv[2]))
        return
    pp, M, V, group, forward_only = (int(x) for x in sys.argv[1:6])
    group = group or pp
    if V > 1 and (group > M or group < pp):
        print(f"The number of contiguous micro-batches in a virtual pipeline stage should range in [PP={pp}, M={M}]")
        sys.exit(3)
    if V > 1 and 0 < M % group < pp:
        print(f"The remainder of M divided by N should be 0, or larger than or equal to PP, but it is {M % group}")
        sys.exit(3)
    for rank in range(pp):
        if V == 1:
            s = without_interleaving(pp, rank, M, bool(forward_only))
        else:
            s = with_interleaving(pp, rank, M, V, group, bool(forward_only))
        print(f"{rank}\t{s}")


if __name__ == "__main__":
    main()
