#!/usr/bin/env python3
"""Builds a real-text JSONL corpus from Debian packages (one {"text": ...} document per line) for accuracy runs
longer than the demo's: the fortunes (one document per fortune), Python's documentation sources (python3.11-doc:
one .rst.txt per document), the Debian Reference (debian-reference-en, HTML stripped to text) and the packages'
changelogs, in that order, deduplicated by content, until --max-mb megabytes of text.
usage: text_corpus.py OUT.jsonl [--max-mb 40]
Needs: apt-get install fortunes fortune-anarchism python3.11-doc debian-reference-en (bench/gpu/fp8_accuracy.sh's
preparation step names them). Standard library only."""
import argparse, glob, gzip, hashlib, html, json, os, re, sys

def fortunes():
    for d in ["/usr/share/games/fortunes"]:
        for f in sorted(glob.glob(d + "/**/*", recursive=True)):
            if os.path.islink(f) or not os.path.isfile(f) or f.endswith((".dat", ".u8")):
                continue
            text = open(f, encoding="utf-8", errors="replace").read()
            for doc in re.split(r"\n%\n", text):
                yield doc

def python_docs():
    for f in sorted(glob.glob("/usr/share/doc/python3.11/html/_sources/**/*.txt", recursive=True)):
        yield open(f, encoding="utf-8", errors="replace").read()

def debian_reference():
    for f in sorted(glob.glob("/usr/share/doc/debian-reference-en/**/*.html", recursive=True)):
        raw = open(f, encoding="utf-8", errors="replace").read()
        raw = re.sub(r"(?is)<(script|style)\b.*?</\1>", " ", raw)
        text = html.unescape(re.sub(r"(?s)<[^>]+>", " ", raw))
        yield re.sub(r"[ \t]+", " ", re.sub(r"\n\s*\n+", "\n\n", text))

def changelogs():
    for f in sorted(glob.glob("/usr/share/doc/*/changelog*.gz")):
        try:
            yield gzip.open(f, "rt", encoding="utf-8", errors="replace").read()
        except (OSError, EOFError):
            continue

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--max-mb", type=float, default=40)
    a = ap.parse_args()
    limit, total, seen = int(a.max_mb * 1e6), 0, set()
    counts = {}
    with open(a.out, "w", encoding="utf-8") as out:
        for name, source in [("fortunes", fortunes), ("python_docs", python_docs),
                             ("debian_reference", debian_reference), ("changelogs", changelogs)]:
            for doc in source():
                doc = doc.strip()
                h = hashlib.sha1(doc.encode()).digest()
                if len(doc) < 20 or h in seen:
                    continue
                seen.add(h)
                out.write(json.dumps({"text": doc}) + "\n")
                total += len(doc.encode())
                counts[name] = counts.get(name, 0) + 1
                if total >= limit:
                    break
            if total >= limit:
                break
    print(json.dumps({"out": a.out, "bytes": total, "documents": counts}))
    if not counts:
        sys.exit("error: no text found (apt-get install fortunes python3.11-doc debian-reference-en)")

if __name__ == "__main__":
    main()
