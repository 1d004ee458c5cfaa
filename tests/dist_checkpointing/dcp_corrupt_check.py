#!/usr/bin/env python3
"""Corruption of a sharded checkpoint (issue 5): every damage is an error naming file and tensor.

usage: dcp_corrupt_check.py MCPP WORKDIR
A TP2 x DP2 (distributed optimizer) checkpoint is damaged one way at a time — a flipped data byte, a
truncation, a deleted file (model and optimizer files of several ranks), a flipped header byte, and
manifest edits (shifted offset, changed shape, changed global shape, dropped entry, an edited meta field, broken
JSON, deleted manifest; each edit once as is — the manifest checksum names the edited field — and once re-sealed
with a consistent checksum by the independent oracle, as a buggy writer would, for the layout checks). For each: `mcpp ckpt verify` and a loading `mcpp train` (1 rank: the planner reads every
shard) exit with code 2 (an error, never a crash), and the message names the file and, where one
tensor is involved, the tensor key.
"""
import json
import os
import shutil
import subprocess
import sys

MCPP, WORK = sys.argv[1], sys.argv[2]
shutil.rmtree(WORK, ignore_errors=True)
os.makedirs(WORK)
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
failures = []


def run(cmd):
    return subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=300)


corpus = os.path.join(WORK, "corpus.jsonl")
with open(corpus, "w") as f:
    for i in range(200):
        f.write(json.dumps({"text": f"Record {i}: alpha beta gamma {i % 11} delta {i % 5}."}) + "\n")
run([MCPP, "data", "preprocess", "--input", corpus, "--output-prefix", os.path.join(WORK, "c"), "--append-eod"])
M = ["--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
     "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "8", "--lr", "1e-3",
     "--lr-decay-iters", "8", "--log-interval", "1", "--eval-interval", "100", "--eval-iters", "1",
     "--split", "90,10,0", "--hidden-dropout", "0", "--attention-dropout", "0",
     "--data-path", os.path.join(WORK, "c_text_document"), "--seed", "5"]
base = os.path.join(WORK, "base")
p = run(["mpiexec", "--allow-run-as-root", "--oversubscribe", "-np", "4", MCPP, "train", *M, "--train-iters", "2",
         "--tensor-model-parallel-size", "2", "--make-vocab-size-divisible-by", "64", "--use-distributed-optimizer",
         "--save", base])
if p.returncode != 0:
    print("FAIL: base run\n" + p.stderr[-3000:])
    sys.exit(1)
IT = "iter_0000002"
man = json.load(open(os.path.join(base, IT, "manifest.json")))


def entry_in(fname, pick=0):
    es = [e for e in man["tensors"] if e["file"] == fname]
    return es[pick % len(es)]


def flip(path, off):
    with open(path, "r+b") as f:
        f.seek(off)
        b = f.read(1)
        f.seek(off)
        f.write(bytes([b[0] ^ 0x5A]))


def truncate(path, cut):
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size - cut)


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "oracle", "ckpt"))
import manifest_checksum  # noqa: E402


def edit_manifest(fn, reseal=False):
    def go(ck):
        p_ = os.path.join(ck, "manifest.json")
        j = json.load(open(p_))
        fn(j)
        if reseal:
            manifest_checksum.reseal(j)
        open(p_, "w").write(json.dumps(j))
    return go


def entry_index(j, fname, pick=0):
    return [i for i, e in enumerate(j["tensors"]) if e["file"] == fname][pick]


cases = []  # (name, damage(ckdir), words that must appear in both messages)
for fname, pick in (("model.rank_00001.safetensors", 2), ("optimizer.rank_00002.safetensors", 5),
                    ("model.rank_00003.safetensors", 0), ("optimizer.rank_00000.safetensors", 1)):
    e = entry_in(fname, pick)
    cases.append((f"flip data byte in {fname}", lambda ck, e=e, f_=fname: flip(os.path.join(ck, f_), e["byte_offset"] + 1),
                  [f_ for f_ in [fname]] + [e["key"], "checksum mismatch"]))
for fname in ("model.rank_00002.safetensors", "optimizer.rank_00003.safetensors"):
    last = max((e for e in man["tensors"] if e["file"] == fname), key=lambda e: e["byte_offset"])
    cases.append((f"truncate {fname}", lambda ck, f_=fname: truncate(os.path.join(ck, f_), 12),
                  [fname, last["key"], "truncated"]))
    cases.append((f"delete {fname}", lambda ck, f_=fname: os.remove(os.path.join(ck, f_)), [fname, "missing data file"]))
cases.append(("flip header byte of model.rank_00000.safetensors",
              lambda ck: flip(os.path.join(ck, "model.rank_00000.safetensors"), 9), ["model.rank_00000.safetensors"]))
e1 = man["tensors"][entry_index(man, "model.rank_00001.safetensors", 1)]


def shift(j):
    e = j["tensors"][entry_index(j, "model.rank_00001.safetensors", 1)]
    d = max(range(len(e["global_shape"])), key=lambda d: e["global_shape"][d] - e["local_shape"][d])
    e["global_offset"][d] = (e["global_offset"][d] + 1) % (e["global_shape"][d] - e["local_shape"][d] + 1)


def reshape(j):
    e = j["tensors"][entry_index(j, "model.rank_00001.safetensors", 1)]
    e["local_shape"] = [1] * (len(e["local_shape"]) - 1) + [e["byte_length"] // 4]
    e["global_offset"] = [0] * len(e["local_shape"])


def gshape(j):
    e = j["tensors"][entry_index(j, "model.rank_00001.safetensors", 1)]
    e["global_shape"][0] += 1


def multi_shard_entry(j, fname):  # an entry of a key saved as several shards (dropping it leaves a hole)
    keys = [e["key"] for e in j["tensors"]]
    return [i for i, e in enumerate(j["tensors"]) if e["file"] == fname and keys.count(e["key"]) > 1][0]


def drop(j):
    del j["tensors"][multi_shard_entry(j, "optimizer.rank_00001.safetensors")]


drop_key = man["tensors"][multi_shard_entry(man, "optimizer.rank_00001.safetensors")]["key"]
for what, fn, words in (("shifted global_offset", shift, [e1["key"]]), ("changed local_shape", reshape, [e1["key"]]),
                        ("changed global_shape", gshape, [e1["key"]]), ("dropped entry", drop, [drop_key])):
    cases.append((f"manifest: {what}", edit_manifest(fn), ["manifest.json", "checksum mismatch"] + words))
    cases.append((f"manifest: {what}, re-sealed", edit_manifest(fn, reseal=True),
                  ["manifest.json"] + words + (["missing shards"] if what == "dropped entry" else [])))


def samples(j):
    j["meta"]["consumed_train_samples"] += 8


def step(j):
    j["meta"]["optimizer"]["step"] += 1


model_key = next(e["key"] for e in man["tensors"] if not e["key"].startswith("optimizer."))


def lose_key(j):  # every shard of one model tensor: the layout of the rest is still valid
    j["tensors"] = [e for e in j["tensors"] if e["key"] != model_key]


def lose_optimizer(j):  # meta.optimizer still claims a step
    j["tensors"] = [e for e in j["tensors"] if not e["key"].startswith("optimizer.")]


def lose_all(j):
    j["tensors"] = []


# Incomplete but consistent manifests: verify checks them against the stored config, load against the model.
cases += [("incomplete: a model tensor lost", edit_manifest(lose_key, reseal=True), ["iter_0000002", model_key]),
          ("incomplete: optimizer state lost", edit_manifest(lose_optimizer, reseal=True),
           ["iter_0000002", "optimizer state"]),
          ("incomplete: no tensors at all", edit_manifest(lose_all, reseal=True), ["iter_0000002"])]

cases += [("manifest: edited meta.consumed_train_samples", edit_manifest(samples),
           ["manifest.json", "checksum mismatch", "meta.consumed_train_samples"]),
          ("manifest: edited meta.optimizer.step", edit_manifest(step),
           ["manifest.json", "checksum mismatch", "meta.optimizer.step"]),
          ("manifest: broken JSON", lambda ck: truncate(os.path.join(ck, "manifest.json"), 20),
           ["manifest.json", "not valid JSON"]),
          ("manifest: deleted", lambda ck: os.remove(os.path.join(ck, "manifest.json")), ["manifest.json", "missing"])]

for name, damage, words in cases:
    d = os.path.join(WORK, "c_" + "".join(ch if ch.isalnum() else "_" for ch in name))
    shutil.copytree(base, d)
    damage(os.path.join(d, IT))
    v = run([MCPP, "ckpt", "verify", "--load", d])
    t = run([MCPP, "train", *M, "--train-iters", "3", "--make-vocab-size-divisible-by", "128", "--load", d,
             "--save", d + "_out"])
    for what, p_ in (("verify", v), ("load", t)):
        msg = p_.stdout + p_.stderr
        if p_.returncode != 2:
            failures.append(f"{name}: {what} exit {p_.returncode} (want 2): {msg[-600:]}")
        missing = [w for w in words if w not in msg]
        if missing:
            failures.append(f"{name}: {what} message lacks {missing}: {msg[-600:]}")
    print(f"{name}: {(t.stderr.strip().splitlines() or [''])[-1][:200]}", flush=True)

if failures:
    print("FAIL\n" + "\n".join(failures))
    sys.exit(1)
print(f"OK: {len(cases)} damages, each refused by verify and load with file and tensor named")
