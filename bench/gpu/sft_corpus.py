#!/usr/bin/env python3
"""Builds an SFT JSONL ({"prompt": ..., "response": ...} per line, Megatron's SFTDataset form) from Python's
library reference (Debian's python3.11-doc): every documented function, method, class, attribute, data item and
exception becomes one question ("In Python's `module` module, what does `signature` do?") answered by its
description (the directive's indented body, reST roles reduced to their text, nested directives dropped),
in a fixed shuffled order. For bench/gpu/sft_curve.sh (the SFT loss curve at a real size on the GPU).
usage: sft_corpus.py OUT.jsonl [--seed 1234]      Needs: apt-get install python3.11-doc. Standard library only."""
import argparse, glob, json, os, random, re, sys

SRC = "/usr/share/doc/python3.11/html/_sources/library"
DIRECTIVE = re.compile(r"^(\s*)\.\. (function|method|class|attribute|data|exception|decorator)::\s+(.+)$")
MODULE = re.compile(r"^\.\. (?:module|currentmodule):: ([\w.]+)")
ROLE = re.compile(r":[\w:]+:`~?([^`<]*?)(?:\s*<[^>]*>)?`")


def clean(line):
    line = ROLE.sub(r"`\1`", line)      # :func:`open` -> `open`
    return line.replace("``", "`")


def entries(path):
    lines = open(path, encoding="utf-8", errors="replace").read().splitlines()
    module = os.path.basename(path).split(".rst")[0]
    i = 0
    while i < len(lines):
        m = MODULE.match(lines[i])
        if m:
            module = m.group(1)
        d = DIRECTIVE.match(lines[i])
        if not d:
            i += 1
            continue
        indent, kind, sig = len(d.group(1)), d.group(2), d.group(3).strip()
        i += 1
        while i < len(lines) and lines[i].strip():
            i += 1                       # the signature's continuation lines (alternative forms) and its options
        body, skip = [], None
        while i < len(lines):
            line = lines[i]
            if line.strip() and len(line) - len(line.lstrip()) <= indent:
                break
            depth = len(line) - len(line.lstrip())
            if skip is not None and (not line.strip() or depth > skip):
                i += 1
                continue
            skip = None
            if line.lstrip().startswith(".. ") or line.lstrip().startswith(":"):
                skip = depth             # a nested directive or an option: drop it and its block
            else:
                body.append(clean(line.strip()))
            i += 1
        text = re.sub(r"\n{3,}", "\n\n", "\n".join(body)).strip()
        if len(text) >= 40:
            yield {"prompt": f"In Python's `{module}` module, what does the {kind} `{sig}` do?", "response": text}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=1234)
    a = ap.parse_args()
    files = sorted(glob.glob(SRC + "/*.rst.txt"))
    if not files:
        sys.exit(f"error: no {SRC}/*.rst.txt (apt-get install python3.11-doc)")
    rows = [e for f in files for e in entries(f)]
    random.Random(a.seed).shuffle(rows)
    with open(a.out, "w") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    chars = sum(len(r["prompt"]) + len(r["response"]) for r in rows)
    print(json.dumps({"out": a.out, "conversations": len(rows), "chars": chars}))


if __name__ == "__main__":
    main()
