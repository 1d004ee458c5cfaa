#!/usr/bin/env python3
"""Independent oracle for mcpp checkpoints and HF exports: struct + json + numpy (+ python3-xxhash).

Parses safetensors files as huggingface/safetensors validates them (header length, JSON, 8-byte
aligned data start, offsets contiguous from 0 to the end of the file, __metadata__ strings), checks
mcpp's manifest.json against the files and recomputes every tensor's XXH3-64, and redoes the GPT-2 /
Llama layout conversions with numpy reshapes (not the C++ code's row loops).

  read_safetensors.py make-hf gpt2|llama|mixtral|qwen3 OUTDIR  random HF model dir (llama, qwen3: BF16, mixtral: F16,
                                                       2 shards; qwen3: q/k norms, head_dim 8 != hidden / heads)
  read_safetensors.py check-ckpt ITERDIR               manifest vs files, xxh3, manifest checksum, strict parse
  read_safetensors.py check-import gpt2|llama|mixtral|qwen3 HFDIR ITERDIR
  read_safetensors.py check-export gpt2|llama|mixtral|qwen3 ITERDIR OUTDIR [ORIG_HFDIR]
  read_safetensors.py flip ITERDIR KEY                  flip one byte inside KEY's data
Exit code 0 on success; an AssertionError (exit 1) names the file and tensor otherwise.
"""
import json
import os
import struct
import sys

import numpy as np
import xxhash

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import manifest_checksum  # noqa: E402

NP = {"F32": np.float32, "F16": np.float16, "I32": np.int32, "I64": np.int64, "BF16": np.uint16,
      "F64": np.float64, "U8": np.uint8, "BOOL": np.uint8}


def parse(path):
    """Returns (metadata, {name: (dtype, shape, np.ndarray raw)}, data_start) after strict checks."""
    blob = open(path, "rb").read()
    assert len(blob) >= 8, f"{path}: shorter than 8 bytes"
    (n,) = struct.unpack("<Q", blob[:8])
    assert 8 + n <= len(blob), f"{path}: header length {n} past the end"
    assert (8 + n) % 8 == 0, f"{path}: data section not 8-byte aligned (header {n} bytes)"
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    meta = header.pop("__metadata__", {})
    assert all(isinstance(v, str) for v in meta.values()), f"{path}: __metadata__ values must be strings"
    data = blob[8 + n:]
    out, expect = {}, 0
    for name, e in sorted(header.items(), key=lambda kv: tuple(kv[1]["data_offsets"])):
        b, end = e["data_offsets"]
        assert b == expect, f"{path}: tensor {name} starts at {b}, expected {expect} (hole or overlap)"
        dt = np.dtype(NP[e["dtype"]])
        count = int(np.prod(e["shape"], dtype=np.int64))
        assert end - b == count * dt.itemsize, f"{path}: tensor {name} byte span vs shape {e['shape']}"
        arr = np.frombuffer(data, dtype=dt.newbyteorder("<"), count=count, offset=b).reshape(e["shape"])
        out[name] = (e["dtype"], list(e["shape"]), arr)
        expect = end
    assert expect == len(data), f"{path}: data section has {len(data) - expect} trailing bytes"
    return meta, out, 8 + n


def as_f32(dtype, arr):
    if dtype == "BF16":
        return (arr.astype(np.uint32) << 16).view(np.float32)
    return arr.astype(np.float32)


def write(path, tensors, meta):
    """Our own writer (name -> (dtype string, ndarray)), padded like safetensors."""
    header, offset, chunks = {"__metadata__": meta}, 0, []
    for name, (dt, arr) in tensors.items():
        raw = np.ascontiguousarray(arr).astype(np.dtype(arr.dtype).newbyteorder("<")).tobytes()
        header[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        chunks.append(raw)
    text = json.dumps(header).encode()
    text += b" " * ((8 - (8 + len(text)) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(chunks))


def read_ckpt(iter_dir):
    """Manifest + every tensor (f32 view where floating), checking xxh3 and header agreement."""
    man = json.load(open(os.path.join(iter_dir, "manifest.json")))
    assert man["format"] == "mcpp-checkpoint" and man["format_version"] == 3, "manifest format"
    manifest_checksum.check(man)
    files, tensors = {}, {}
    for e in man["tensors"]:
        f = os.path.join(iter_dir, e["file"])
        if f not in files:
            files[f] = parse(f)
        meta, ts, start = files[f]
        assert meta.get("format") == "pt", f"{f}: __metadata__.format"
        key = e["key"]
        assert key in ts, f"{f}: tensor {key} of the manifest missing from the header"
        dt, shape, arr = ts[key]
        assert dt == e["dtype"] and shape == e["global_shape"] == e["local_shape"], f"{f}: {key} dtype/shape"
        assert e["global_offset"] == [0] * len(shape), f"{f}: {key} global_offset"
        assert e["byte_length"] == arr.nbytes, f"{f}: {key} byte_length"
        raw = open(f, "rb").read()[e["byte_offset"]:e["byte_offset"] + e["byte_length"]]
        assert raw == arr.tobytes(), f"{f}: {key} byte_offset does not point at the header's data"
        assert xxhash.xxh3_64_hexdigest(raw) == e["xxh3"], f"{f}: {key} xxh3 mismatch"
        tensors[key] = as_f32(dt, arr) if dt in ("F32", "BF16", "F16") else arr
    return man, tensors


def read_hf(d):
    out = {}
    if os.path.exists(os.path.join(d, "model.safetensors")):
        names = ["model.safetensors"]
    else:
        names = sorted(set(json.load(open(os.path.join(d, "model.safetensors.index.json")))["weight_map"].values()))
    for n in names:
        meta, ts, _ = parse(os.path.join(d, n))
        assert meta.get("format") == "pt", f"{n}: __metadata__.format must be 'pt'"
        for k, (dt, _, arr) in ts.items():
            out[k] = as_f32(dt, arr)
    return out, json.load(open(os.path.join(d, "config.json")))


def pad(x, rows):
    return np.concatenate([x, np.zeros((rows - x.shape[0],) + x.shape[1:], np.float32)])


def hf_to_ours(fmt, hf, cfg):
    """Our key -> expected tensor, from HF tensors (numpy reshapes, independent of the C++ code)."""
    o = {}
    if fmt == "gpt2":
        h, nh, L, V = cfg["n_embd"], cfg["n_head"], cfg["n_layer"], cfg["vocab_size"]
        d = h // nh
        t = lambda k: hf["transformer." + k]
        o["embedding.word_embeddings.weight"] = pad(t("wte.weight"), (V + 127) // 128 * 128)
        o["embedding.position_embeddings.weight"] = t("wpe.weight")
        for i in range(L):
            p, q = f"decoder.layers.{i}.", f"h.{i}."
            o[p + "input_layernorm.weight"], o[p + "input_layernorm.bias"] = t(q + "ln_1.weight"), t(q + "ln_1.bias")
            w = t(q + "attn.c_attn.weight").T.reshape(3, nh, d, h)        # [q|k|v, head, d, h]
            o[p + "self_attention.linear_qkv.weight"] = w.transpose(1, 0, 2, 3).reshape(3 * h, h)
            b = t(q + "attn.c_attn.bias").reshape(3, nh, d)
            o[p + "self_attention.linear_qkv.bias"] = b.transpose(1, 0, 2).reshape(3 * h)
            o[p + "self_attention.linear_proj.weight"] = t(q + "attn.c_proj.weight").T
            o[p + "self_attention.linear_proj.bias"] = t(q + "attn.c_proj.bias")
            o[p + "pre_mlp_layernorm.weight"], o[p + "pre_mlp_layernorm.bias"] = t(q + "ln_2.weight"), t(q + "ln_2.bias")
            o[p + "mlp.linear_fc1.weight"], o[p + "mlp.linear_fc1.bias"] = t(q + "mlp.c_fc.weight").T, t(q + "mlp.c_fc.bias")
            o[p + "mlp.linear_fc2.weight"], o[p + "mlp.linear_fc2.bias"] = t(q + "mlp.c_proj.weight").T, t(q + "mlp.c_proj.bias")
        o["decoder.final_layernorm.weight"], o["decoder.final_layernorm.bias"] = t("ln_f.weight"), t("ln_f.bias")
    else:
        h, nq, ng, L, V = (cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"],
                           cfg["num_hidden_layers"], cfg["vocab_size"])
        d = cfg.get("head_dim") or h // nq
        Vp = (V + 127) // 128 * 128
        o["embedding.word_embeddings.weight"] = pad(hf["model.embed_tokens.weight"], Vp)
        for i in range(L):
            p, q = f"decoder.layers.{i}.", f"model.layers.{i}."
            o[p + "input_layernorm.weight"] = hf[q + "input_layernorm.weight"]
            qw = hf[q + "self_attn.q_proj.weight"].reshape(ng, nq // ng, d, h)
            kw = hf[q + "self_attn.k_proj.weight"].reshape(ng, 1, d, h)
            vw = hf[q + "self_attn.v_proj.weight"].reshape(ng, 1, d, h)
            o[p + "self_attention.linear_qkv.weight"] = np.concatenate([qw, kw, vw], axis=1).reshape(-1, h)
            o[p + "self_attention.linear_proj.weight"] = hf[q + "self_attn.o_proj.weight"]
            if fmt == "qwen3":  # Megatron's q_layernorm / k_layernorm
                o[p + "self_attention.q_layernorm.weight"] = hf[q + "self_attn.q_norm.weight"]
                o[p + "self_attention.k_layernorm.weight"] = hf[q + "self_attn.k_norm.weight"]
            o[p + "pre_mlp_layernorm.weight"] = hf[q + "post_attention_layernorm.weight"]
            if fmt == "mixtral":  # router = gate; each expert's fc1 = [w1 (gate); w3 (up)], fc2 = w2
                o[p + "mlp.router.weight"] = hf[q + "block_sparse_moe.gate.weight"]
                for e in range(cfg["num_local_experts"]):
                    x, y = f"{p}mlp.experts.local_experts.{e}.", f"{q}block_sparse_moe.experts.{e}."
                    o[x + "linear_fc1.weight"] = np.concatenate([hf[y + "w1.weight"], hf[y + "w3.weight"]])
                    o[x + "linear_fc2.weight"] = hf[y + "w2.weight"]
                continue
            o[p + "mlp.linear_fc1.weight"] = np.concatenate([hf[q + "mlp.gate_proj.weight"], hf[q + "mlp.up_proj.weight"]])
            o[p + "mlp.linear_fc2.weight"] = hf[q + "mlp.down_proj.weight"]
        o["decoder.final_layernorm.weight"] = hf["model.norm.weight"]
        if not cfg.get("tie_word_embeddings", False):
            o["output_layer.weight"] = pad(hf["lm_head.weight"], Vp)
    return o


def ours_to_hf(fmt, t, m):
    """HF name -> expected tensor, from our checkpoint tensors and meta.config.model."""
    o = {}
    L, h, V = m["num_layers"], m["hidden_size"], m["vocab_size"]
    nq, ng, d = m["num_attention_heads"], m["num_query_groups"], m["kv_channels"]
    if fmt == "gpt2":
        o["transformer.wte.weight"] = t["embedding.word_embeddings.weight"][:V]
        o["transformer.wpe.weight"] = t["embedding.position_embeddings.weight"]
        for i in range(L):
            p, q = f"decoder.layers.{i}.", f"transformer.h.{i}."
            o[q + "ln_1.weight"], o[q + "ln_1.bias"] = t[p + "input_layernorm.weight"], t[p + "input_layernorm.bias"]
            w = t[p + "self_attention.linear_qkv.weight"].reshape(nq, 3, d, h)   # per head [q; k; v]
            o[q + "attn.c_attn.weight"] = w.transpose(1, 0, 2, 3).reshape(3 * h, h).T
            b = t[p + "self_attention.linear_qkv.bias"].reshape(nq, 3, d)
            o[q + "attn.c_attn.bias"] = b.transpose(1, 0, 2).reshape(3 * h)
            o[q + "attn.c_proj.weight"] = t[p + "self_attention.linear_proj.weight"].T
            o[q + "attn.c_proj.bias"] = t[p + "self_attention.linear_proj.bias"]
            o[q + "ln_2.weight"], o[q + "ln_2.bias"] = t[p + "pre_mlp_layernorm.weight"], t[p + "pre_mlp_layernorm.bias"]
            o[q + "mlp.c_fc.weight"], o[q + "mlp.c_fc.bias"] = t[p + "mlp.linear_fc1.weight"].T, t[p + "mlp.linear_fc1.bias"]
            o[q + "mlp.c_proj.weight"], o[q + "mlp.c_proj.bias"] = t[p + "mlp.linear_fc2.weight"].T, t[p + "mlp.linear_fc2.bias"]
        o["transformer.ln_f.weight"], o["transformer.ln_f.bias"] = t["decoder.final_layernorm.weight"], t["decoder.final_layernorm.bias"]
    else:
        f = m["ffn_hidden_size"]
        o["model.embed_tokens.weight"] = t["embedding.word_embeddings.weight"][:V]
        for i in range(L):
            p, q = f"decoder.layers.{i}.", f"model.layers.{i}."
            o[q + "input_layernorm.weight"] = t[p + "input_layernorm.weight"]
            w = t[p + "self_attention.linear_qkv.weight"].reshape(ng, nq // ng + 2, d, h)
            o[q + "self_attn.q_proj.weight"] = w[:, :nq // ng].reshape(nq * d, h)
            o[q + "self_attn.k_proj.weight"] = w[:, nq // ng].reshape(ng * d, h)
            o[q + "self_attn.v_proj.weight"] = w[:, nq // ng + 1].reshape(ng * d, h)
            o[q + "self_attn.o_proj.weight"] = t[p + "self_attention.linear_proj.weight"]
            if fmt == "qwen3":
                o[q + "self_attn.q_norm.weight"] = t[p + "self_attention.q_layernorm.weight"]
                o[q + "self_attn.k_norm.weight"] = t[p + "self_attention.k_layernorm.weight"]
            o[q + "post_attention_layernorm.weight"] = t[p + "pre_mlp_layernorm.weight"]
            if fmt == "mixtral":
                F = m["moe_ffn_hidden_size"]
                o[q + "block_sparse_moe.gate.weight"] = t[p + "mlp.router.weight"]
                for e in range(m["num_moe_experts"]):
                    x, y = f"{p}mlp.experts.local_experts.{e}.", f"{q}block_sparse_moe.experts.{e}."
                    o[y + "w1.weight"] = t[x + "linear_fc1.weight"][:F]
                    o[y + "w3.weight"] = t[x + "linear_fc1.weight"][F:]
                    o[y + "w2.weight"] = t[x + "linear_fc2.weight"]
                continue
            o[q + "mlp.gate_proj.weight"] = t[p + "mlp.linear_fc1.weight"][:f]
            o[q + "mlp.up_proj.weight"] = t[p + "mlp.linear_fc1.weight"][f:]
            o[q + "mlp.down_proj.weight"] = t[p + "mlp.linear_fc2.weight"]
        o["model.norm.weight"] = t["decoder.final_layernorm.weight"]
        if m["untie_embeddings_and_output_weights"]:
            o["lm_head.weight"] = t["output_layer.weight"][:V]
    return o


def compare(got, want, where):
    assert sorted(got) == sorted(want), f"{where}: key sets differ: only got {sorted(set(got) - set(want))}, " \
                                        f"only expected {sorted(set(want) - set(got))}"
    for k in want:
        assert got[k].shape == want[k].shape, f"{where}: {k} shape {got[k].shape} vs {want[k].shape}"
        assert np.array_equal(got[k].view(np.uint32), np.ascontiguousarray(want[k]).view(np.uint32)), \
            f"{where}: {k} values differ"


def make_hf(fmt, out):
    rng = np.random.default_rng({"gpt2": 1, "llama": 2, "mixtral": 3, "qwen3": 4}[fmt])
    r = lambda *s: rng.standard_normal(s).astype(np.float32)
    os.makedirs(out, exist_ok=True)
    if fmt == "gpt2":
        h, L, nh, P, V = 16, 2, 4, 32, 100
        cfg = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": h, "n_layer": L,
               "n_head": nh, "n_positions": P, "n_ctx": P, "n_inner": None, "vocab_size": V,
               "layer_norm_epsilon": 1e-5, "activation_function": "gelu_new", "tie_word_embeddings": True}
        ts = {"transformer.wte.weight": r(V, h), "transformer.wpe.weight": r(P, h)}
        for i in range(L):
            q = f"transformer.h.{i}."
            ts.update({q + "ln_1.weight": r(h), q + "ln_1.bias": r(h), q + "attn.c_attn.weight": r(h, 3 * h),
                       q + "attn.c_attn.bias": r(3 * h), q + "attn.c_proj.weight": r(h, h), q + "attn.c_proj.bias": r(h),
                       q + "ln_2.weight": r(h), q + "ln_2.bias": r(h), q + "mlp.c_fc.weight": r(h, 4 * h),
                       q + "mlp.c_fc.bias": r(4 * h), q + "mlp.c_proj.weight": r(4 * h, h), q + "mlp.c_proj.bias": r(h),
                       q + "attn.bias": np.tril(np.ones((P, P), np.float32)).reshape(1, 1, P, P)})  # mask buffer
        ts.update({"transformer.ln_f.weight": r(h), "transformer.ln_f.bias": r(h)})
        write(os.path.join(out, "model.safetensors"), {k: ("F32", v) for k, v in ts.items()}, {"format": "pt"})
    else:
        h, L, nq, ng, d, f, P, V = 16, 2, 4, 2, 4, 40, 64, 130
        cfg = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": h,
               "intermediate_size": f, "num_attention_heads": nq, "num_key_value_heads": ng,
               "num_hidden_layers": L, "head_dim": d, "rms_norm_eps": 1e-6, "rope_theta": 500000.0,
               "max_position_embeddings": P, "vocab_size": V, "tie_word_embeddings": False,
               "attention_bias": False, "mlp_bias": False, "hidden_act": "silu", "rope_scaling": None}
        ts = {"model.embed_tokens.weight": r(V, h), "model.norm.weight": r(h), "lm_head.weight": r(V, h)}
        E = 4
        if fmt == "mixtral":  # Mixtral: 4 experts of width f = 24, top-2, no sliding window; F16 tensors
            f = 24
            cfg.update({"model_type": "mixtral", "architectures": ["MixtralForCausalLM"], "intermediate_size": f,
                        "num_local_experts": E, "num_experts_per_tok": 2, "sliding_window": None,
                        "router_jitter_noise": 0.0})
            del cfg["mlp_bias"]
        if fmt == "qwen3":  # Qwen3: q/k norms over head_dim 8 (4 heads x 8 = 32 != hidden 16), full attention
            d = 8
            cfg.update({"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "head_dim": d,
                        "use_sliding_window": False, "sliding_window": None, "max_window_layers": L,
                        "layer_types": ["full_attention"] * L})
            del cfg["mlp_bias"]
        for i in range(L):
            q = f"model.layers.{i}."
            ts.update({q + "input_layernorm.weight": r(h), q + "self_attn.q_proj.weight": r(nq * d, h),
                       q + "self_attn.k_proj.weight": r(ng * d, h), q + "self_attn.v_proj.weight": r(ng * d, h),
                       q + "self_attn.o_proj.weight": r(h, nq * d), q + "post_attention_layernorm.weight": r(h)})
            if fmt == "qwen3":
                ts.update({q + "self_attn.q_norm.weight": r(d), q + "self_attn.k_norm.weight": r(d)})
            if fmt == "mixtral":
                ts[q + "block_sparse_moe.gate.weight"] = r(E, h)
                for e in range(E):
                    y = f"{q}block_sparse_moe.experts.{e}."
                    ts.update({y + "w1.weight": r(f, h), y + "w3.weight": r(f, h), y + "w2.weight": r(h, f)})
            else:
                ts.update({q + "mlp.gate_proj.weight": r(f, h), q + "mlp.up_proj.weight": r(f, h),
                           q + "mlp.down_proj.weight": r(h, f)})
        if fmt == "mixtral":
            bf16 = {k: ("F16", v.astype(np.float16).view(np.uint16)) for k, v in ts.items()}
        else:
            bf16 = {k: ("BF16", (v.view(np.uint32) >> 16).astype(np.uint16)) for k, v in ts.items()}  # truncate
        names = sorted(bf16)
        shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
                  "model-00002-of-00002.safetensors": names[len(names) // 2:]}
        for fn, ks in shards.items():
            write(os.path.join(out, fn), {k: bf16[k] for k in ks}, {"format": "pt"})
        index = {"metadata": {}, "weight_map": {k: fn for fn, ks in shards.items() for k in ks}}
        json.dump(index, open(os.path.join(out, "model.safetensors.index.json"), "w"))
    json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=1)


def main(argv):
    cmd = argv[1]
    if cmd == "make-hf":
        make_hf(argv[2], argv[3])
    elif cmd == "check-ckpt":
        man, ts = read_ckpt(argv[2])
        print(f"check-ckpt OK: {len(ts)} tensors, iteration {man['iteration']}, xxh3 recomputed")
    elif cmd == "check-import":
        fmt, hf_dir, iter_dir = argv[2:5]
        hf, cfg = read_hf(hf_dir)
        man, ts = read_ckpt(iter_dir)
        assert man["iteration"] == 0, "import is iteration 0"
        compare(ts, hf_to_ours(fmt, hf, cfg), f"{iter_dir} vs {hf_dir}")
        m = man["meta"]["config"]["model"]
        assert m["padded_vocab_size"] % 128 == 0 and m["vocab_size"] == cfg["vocab_size"], "vocab fields"
        print(f"check-import OK: {len(ts)} tensors match the HF tensors rearranged in numpy")
    elif cmd == "check-export":
        fmt, iter_dir, out_dir = argv[2:5]
        man, ts = read_ckpt(iter_dir)
        got, cfg = read_hf(out_dir)
        m = man["meta"]["config"]["model"]
        compare(got, ours_to_hf(fmt, ts, m), f"{out_dir} vs {iter_dir}")
        for name, (dt, _, _) in parse(os.path.join(out_dir, "model.safetensors"))[1].items():
            assert dt == "F32", f"{out_dir}: {name} is {dt}, export writes F32"
        if fmt == "gpt2":
            want = {"model_type": "gpt2", "n_embd": m["hidden_size"], "n_layer": m["num_layers"],
                    "n_head": m["num_attention_heads"], "n_positions": m["max_position_embeddings"],
                    "vocab_size": m["vocab_size"], "activation_function": "gelu_new", "tie_word_embeddings": True}
        elif fmt == "mixtral":
            want = {"model_type": "mixtral", "hidden_size": m["hidden_size"],
                    "intermediate_size": m["moe_ffn_hidden_size"], "num_local_experts": m["num_moe_experts"],
                    "num_experts_per_tok": m["moe_router_topk"], "num_key_value_heads": m["num_query_groups"],
                    "head_dim": m["kv_channels"], "rope_theta": m["rotary_base"], "rms_norm_eps": m["norm_epsilon"],
                    "hidden_act": "silu", "sliding_window": None,
                    "tie_word_embeddings": not m["untie_embeddings_and_output_weights"]}
        else:
            want = {"model_type": fmt, "hidden_size": m["hidden_size"], "intermediate_size": m["ffn_hidden_size"],
                    "num_key_value_heads": m["num_query_groups"], "head_dim": m["kv_channels"],
                    "rope_theta": m["rotary_base"], "rms_norm_eps": m["norm_epsilon"], "hidden_act": "silu",
                    "tie_word_embeddings": not m["untie_embeddings_and_output_weights"]}
            if fmt == "qwen3":
                assert m.get("qk_layernorm") is True, "qwen3 export of a model without qk_layernorm"
                want.update({"attention_bias": False, "use_sliding_window": False})
        for k, v in want.items():
            assert cfg.get(k) == v, f"{out_dir}/config.json: {k} = {cfg.get(k)!r}, expected {v!r}"
        if len(argv) > 5:  # the original HF dir of an import: the export must give back its tensors
            orig, _ = read_hf(argv[5])
            orig = {k: v for k, v in orig.items() if not k.endswith(".attn.bias")}
            compare(got, orig, f"{out_dir} vs original {argv[5]}")
        print(f"check-export OK: {len(got)} HF tensors match the checkpoint rearranged in numpy")
    elif cmd == "flip":
        iter_dir, key = argv[2:4]
        e = next(e for e in json.load(open(os.path.join(iter_dir, "manifest.json")))["tensors"] if e["key"] == key)
        path = os.path.join(iter_dir, e["file"])
        with open(path, "r+b") as f:
            f.seek(e["byte_offset"] + e["byte_length"] // 2)
            b = f.read(1)
            f.seek(-1, 1)
            f.write(bytes([b[0] ^ 0x10]))
    else:
        sys.exit(f"unknown command {cmd}")


if __name__ == "__main__":
    main(sys.argv)
