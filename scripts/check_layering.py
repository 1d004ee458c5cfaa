#!/usr/bin/env python3
"""The package layering of src/mcpp (DESIGN.md: a package includes only packages below it), enforced.

The allowed dependencies are declared once, in cmake/packages.cmake, as the CMake calls that build the package
libraries:  mcpp_package(<name> [DEPS <package>...]).  A package may include its own headers, those of the
packages in its DEPS, and (transitively) whatever those may include. apps/ may include every package; no package
may include apps/.

Checks, over every source and header under src/mcpp and apps/ (comments are not stripped: an #include is an
#include wherever it sits):
  1. each  #include "mcpp/<pkg>/..."  is allowed for the including file's package — else
     "error: src/mcpp/core/x.h:3: core includes training (mcpp/training/trainer.h); core may use: (nothing)";
  2. every folder src/mcpp/<pkg> is a declared package, and every declared package exists;
  3. the declared graph is acyclic and names only declared packages;
  4. no include cycle between files (a header including itself through others).
Exit 0 when clean, 2 with one "error:" line per problem otherwise.

  --graph        print the package graph (declared edges, and the packages each one includes today) and check.
  --check-doc D  also require that the fenced block between the markers <!-- package-graph:begin --> and
                 <!-- package-graph:end --> of the Markdown file D (relative to --root unless absolute; CI passes
                 docs/ARCHITECTURE.md) is exactly what --graph prints — one error naming D and the first differing
                 line otherwise, so the architecture document cannot drift from cmake/packages.cmake and the code.
  --stamp F      touch F after a clean check (the build's custom command; the libraries depend on it).
usage: check_layering.py [--root DIR] [--graph] [--check-doc FILE] [--stamp FILE]
"""
import argparse
import os
import re
import sys

PACKAGE_CALL = re.compile(r"^\s*mcpp_package\(\s*([A-Za-z_]\w*)((?:\s+[^)#]*)?)\)", re.M)
INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')
SOURCE_EXT = (".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh", ".inc")
DOC_BEGIN, DOC_END = "<!-- package-graph:begin -->", "<!-- package-graph:end -->"


def read_packages(root):
    """{package: [direct deps]} in declaration order, from cmake/packages.cmake."""
    path = os.path.join(root, "cmake", "packages.cmake")
    text = open(path, encoding="utf-8").read()
    text = "\n".join(line.split("#", 1)[0] for line in text.splitlines())  # CMake comments
    packages = {}
    for m in PACKAGE_CALL.finditer(text):
        words = m.group(2).split()
        deps = []
        if words:
            if words[0] != "DEPS":
                raise SystemExit(f"error: {path}: mcpp_package({m.group(1)} ...): expected DEPS, got '{words[0]}'")
            deps = words[1:]
        if m.group(1) in packages:
            raise SystemExit(f"error: {path}: package '{m.group(1)}' declared twice")
        packages[m.group(1)] = deps
    if not packages:
        raise SystemExit(f"error: {path}: no mcpp_package(...) declarations")
    return packages


def closure(packages):
    """{package: set of packages it may include (itself excluded)}; errors for unknown names and cycles."""
    errors, allowed, state = [], {}, {}

    def visit(p, stack):
        if state.get(p) == "done":
            return allowed[p]
        if state.get(p) == "active":
            errors.append("error: cmake/packages.cmake: dependency cycle " + " -> ".join(stack + [p]))
            return set()
        state[p] = "active"
        out = set()
        for d in packages[p]:
            if d not in packages:
                errors.append(f"error: cmake/packages.cmake: package '{p}' depends on undeclared '{d}'")
                continue
            out |= {d} | visit(d, stack + [p])
        state[p], allowed[p] = "done", out
        return out

    for p in packages:
        visit(p, [])
    return allowed, errors


def source_files(root):
    for top in ("src/mcpp", "apps"):
        base = os.path.join(root, top)
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames.sort()
            for f in sorted(filenames):
                if f.endswith(SOURCE_EXT):
                    yield os.path.relpath(os.path.join(dirpath, f), root)


def package_of(rel):
    """'src/mcpp/<pkg>/...' -> pkg; 'apps/...' -> 'apps'; a file directly in src/mcpp -> ''."""
    parts = rel.split(os.sep)
    if parts[0] == "apps":
        return "apps"
    return parts[2] if len(parts) > 3 else ""


def graph_lines(packages, used):
    """What --graph prints: the declared edges, then the packages each package's files include today."""
    width = max(len(p) for p in packages)
    lines = ["package graph (cmake/packages.cmake; a package may use its DEPS and what they may use):"]
    for p, deps in packages.items():
        lines.append(f"  {p:<{width}}  DEPS {' '.join(deps) if deps else '-'}")
    lines.append("includes today (package -> packages its files include):")
    for p in packages:
        lines.append(f"  {p:<{width}}  -> {' '.join(sorted(used[p])) if used[p] else '-'}")
    return lines


def check_doc(root, doc, lines):
    """[] when doc's package-graph block equals `lines`, else one "error:" line naming doc and the difference."""
    path = doc if os.path.isabs(doc) else os.path.join(root, doc)
    try:
        text = open(path, encoding="utf-8").read()
    except OSError as e:
        return [f"error: {doc}: cannot read the document to check ({e.strerror})"]
    if text.count(DOC_BEGIN) != 1 or text.count(DOC_END) != 1 or text.index(DOC_BEGIN) > text.index(DOC_END):
        return [f"error: {doc}: expected one {DOC_BEGIN} ... {DOC_END} pair around the package graph"]
    block = text[text.index(DOC_BEGIN) + len(DOC_BEGIN):text.index(DOC_END)].strip("\n").splitlines()
    if len(block) < 2 or not block[0].startswith("```") or block[-1].strip() != "```":
        return [f"error: {doc}: the package graph between {DOC_BEGIN} and {DOC_END} must be one fenced block "
                "(``` ... ```)"]
    got = [l.rstrip() for l in block[1:-1]]
    if got == lines:
        return []
    n = next((i for i, (a, b) in enumerate(zip(got, lines)) if a != b), min(len(got), len(lines)))
    have = got[n].strip() if n < len(got) else "(end of block)"
    want = lines[n].strip() if n < len(lines) else "(end of graph)"
    return [f"error: {doc}: the package graph block is stale (graph line {n + 1}: the document has '{have}', "
            f"`scripts/check_layering.py --graph` prints '{want}'); paste the --graph output between the markers"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    ap.add_argument("--graph", action="store_true")
    ap.add_argument("--check-doc", metavar="FILE")
    ap.add_argument("--stamp")
    args = ap.parse_args()
    root = os.path.abspath(args.root)

    packages = read_packages(root)
    allowed, errors = closure(packages)
    present = sorted(d for d in os.listdir(os.path.join(root, "src", "mcpp"))
                     if os.path.isdir(os.path.join(root, "src", "mcpp", d)))
    for d in present:
        if d not in packages:
            errors.append(f"error: src/mcpp/{d}: a folder that is no package of cmake/packages.cmake (declare it there)")
    for p in packages:
        if p not in present:
            errors.append(f"error: cmake/packages.cmake: package '{p}' has no folder src/mcpp/{p}")

    used = {p: set() for p in packages}  # package -> packages it includes today
    file_includes = {}                   # file -> files it includes (resolved to existing files under src/ or apps/)
    for rel in source_files(root):
        pkg = package_of(rel)
        if pkg == "":
            errors.append(f"error: {rel}: a file directly in src/mcpp belongs to no package")
            continue
        targets = []
        with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
            for lineno, line in enumerate(f, 1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                inc = m.group(1)
                parts = inc.split("/")
                if parts[0] == "apps":
                    if pkg != "apps":
                        errors.append(f"error: {rel}:{lineno}: {pkg} includes apps ({inc}); no package may use apps/")
                    targets.append(inc)
                    continue
                if parts[0] != "mcpp" or len(parts) < 3:
                    # a sibling include ("cross_entropy_rows.cuh"): same folder, same package
                    targets.append(os.path.normpath(os.path.join(os.path.dirname(rel), inc)))
                    continue
                dep = parts[1]
                targets.append(os.path.join("src", inc))
                if pkg == "apps" or dep == pkg:
                    continue
                if dep not in packages:
                    errors.append(f"error: {rel}:{lineno}: includes {inc}: '{dep}' is no package of "
                                  "cmake/packages.cmake")
                    continue
                used[pkg].add(dep)
                if dep not in allowed.get(pkg, set()):
                    may = ", ".join(sorted(allowed.get(pkg, set()))) or "(nothing)"
                    errors.append(f"error: {rel}:{lineno}: {pkg} includes {dep} ({inc}), against the package order "
                                  f"of cmake/packages.cmake; {pkg} may use: {may}")
        file_includes[rel] = [t for t in targets if os.path.isfile(os.path.join(root, t))]

    # File-level include cycles (iterative DFS; one report per cycle found).
    state, reported = {}, set()
    for start in sorted(file_includes):
        if state.get(start):
            continue
        stack = [(start, iter(file_includes.get(start, [])))]
        path, state[start] = [start], "active"
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                state[node] = "done"
                stack.pop()
                path.pop()
                continue
            if state.get(nxt) == "active":
                cyc = path[path.index(nxt):] + [nxt]
                key = frozenset(cyc)
                if key not in reported:
                    reported.add(key)
                    errors.append("error: include cycle " + " -> ".join(cyc))
            elif not state.get(nxt):
                state[nxt] = "active"
                path.append(nxt)
                stack.append((nxt, iter(file_includes.get(nxt, []))))

    lines = graph_lines(packages, used)
    if args.graph:
        print("\n".join(lines))
    if args.check_doc:
        errors += check_doc(root, args.check_doc, lines)
    for e in errors:
        print(e, file=sys.stderr)
    if errors:
        return 2
    if args.stamp:
        with open(args.stamp, "w") as f:
            f.write("ok\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
