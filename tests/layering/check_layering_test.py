#!/usr/bin/env python3
"""scripts/check_layering.py rejects what breaks the package order and accepts the tree as it is:

1. the real tree passes (exit 0) and --graph prints every declared package;
2. a copy of the declaration with a deliberately upward include (core -> training) fails with exit 2 and one
   error naming the file, the line and both packages;
3. an include of an undeclared package, a package folder missing from the declaration, a dependency cycle in the
   declaration and a file include cycle are each refused by name;
4. --check-doc: the real docs/ARCHITECTURE.md's package-graph block equals --graph's output (exit 0); a copy with a
   stale graph (one edge changed), one without the markers and a missing file are each refused with exit 2 and one
   error naming the document.
usage: check_layering_test.py SOURCE_DIR WORKDIR
"""
import os
import shutil
import subprocess
import sys

SRC, WORK = sys.argv[1], sys.argv[2]
CHECKER = os.path.join(SRC, "scripts", "check_layering.py")
failures = []


def run(root, *extra):
    return subprocess.run([sys.executable, CHECKER, "--root", root, *extra], capture_output=True, text=True)


def expect(cond, what, p=None):
    if not cond:
        failures.append(what + ("" if p is None else f"\n  exit {p.returncode}\n  stdout: {p.stdout}\n  stderr: {p.stderr}"))


def tree(name, packages, files):
    """A minimal source tree: cmake/packages.cmake with `packages`, and {relative path: text} files."""
    root = os.path.join(WORK, name)
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(os.path.join(root, "cmake"))
    with open(os.path.join(root, "cmake", "packages.cmake"), "w") as f:
        f.write("# test declaration\n" + packages)
    for rel, text in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
    return root


# 1. the real tree
p = run(SRC, "--graph")
expect(p.returncode == 0, "the source tree violates its own layering", p)
for pkg in ("core", "kernels", "transformer", "training", "tools"):
    expect(f"  {pkg} " in p.stdout, f"--graph does not list package {pkg}", p)

PACKAGES = "mcpp_package(core)\nmcpp_package(kernels DEPS core)\nmcpp_package(training DEPS kernels)\n"
GOOD = {
    "src/mcpp/core/tensor.h": "#pragma once\n",
    "src/mcpp/kernels/ops.h": '#pragma once\n#include "mcpp/core/tensor.h"\n',
    "src/mcpp/training/trainer.h": '#pragma once\n#include "mcpp/kernels/ops.h"\n#include "mcpp/core/tensor.h"\n',
    "apps/mcpp/main.cpp": '#include "mcpp/training/trainer.h"\n',
}
p = run(tree("good", PACKAGES, GOOD))
expect(p.returncode == 0, "a clean tree is refused", p)

# 2. a deliberately upward include: core -> training, on line 3
bad = dict(GOOD)
bad["src/mcpp/core/bad.cpp"] = '// a core file\n#include <vector>\n#include "mcpp/training/trainer.h"\n'
p = run(tree("upward", PACKAGES, bad))
lines = [l for l in p.stderr.splitlines() if l.startswith("error:")]
expect(p.returncode == 2, "an upward include is accepted", p)
expect(len(lines) == 1 and "src/mcpp/core/bad.cpp:3:" in lines[0] and "core includes training" in lines[0],
       "the error does not name file:line and both packages", p)

# 3. the other refusals
cases = {
    "undeclared include": (PACKAGES, {**GOOD, "src/mcpp/kernels/x.cpp": '#include "mcpp/nowhere/y.h"\n'},
                           "'nowhere' is no package"),
    "undeclared folder": (PACKAGES, {**GOOD, "src/mcpp/extra/x.cpp": "int x;\n"}, "src/mcpp/extra"),
    "declaration cycle": ("mcpp_package(core DEPS kernels)\nmcpp_package(kernels DEPS core)\n"
                          "mcpp_package(training DEPS kernels)\n", GOOD, "dependency cycle"),
    "file include cycle": (PACKAGES, {**GOOD, "src/mcpp/core/a.h": '#include "mcpp/core/b.h"\n',
                                      "src/mcpp/core/b.h": '#include "mcpp/core/a.h"\n'}, "include cycle"),
    "apps included": (PACKAGES, {**GOOD, "src/mcpp/training/t.cpp": '#include "apps/mcpp/command.h"\n'},
                      "no package may use apps/"),
}
for name, (packages, files, want) in cases.items():
    p = run(tree(name.replace(" ", "_"), packages, files))
    expect(p.returncode == 2 and want in p.stderr, f"{name}: not refused with '{want}'", p)

# 4. the architecture document's package graph
p = run(SRC, "--check-doc", "docs/ARCHITECTURE.md")
expect(p.returncode == 0 and p.stderr == "", "docs/ARCHITECTURE.md's package graph differs from --graph", p)
doc = open(os.path.join(SRC, "docs", "ARCHITECTURE.md"), encoding="utf-8").read()
graph = run(SRC, "--graph").stdout
expect(graph.strip() and graph.strip() in doc, "docs/ARCHITECTURE.md does not hold the --graph output verbatim")
stale_line = "  optimizer           DEPS distributed"
expect(stale_line in doc, f"docs/ARCHITECTURE.md has no line '{stale_line}' to make stale")
os.makedirs(WORK, exist_ok=True)
doc_cases = {
    "stale graph": (doc.replace(stale_line, "  optimizer           DEPS distributed models", 1), "package graph block is stale"),
    "no markers": (doc.replace("<!-- package-graph:begin -->", "", 1), "expected one <!-- package-graph:begin -->"),
}
for name, (text, want) in doc_cases.items():
    path = os.path.join(WORK, name.replace(" ", "_") + ".md")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    p = run(SRC, "--check-doc", path)
    lines = [l for l in p.stderr.splitlines() if l.startswith("error:")]
    expect(p.returncode == 2 and len(lines) == 1 and want in lines[0] and path in lines[0],
           f"--check-doc, {name}: not refused with one error naming the file and '{want}'", p)
p = run(SRC, "--check-doc", os.path.join(WORK, "no_such_doc.md"))
expect(p.returncode == 2 and "cannot read" in p.stderr, "--check-doc of a missing file is not refused", p)

for f in failures:
    print("FAIL:", f)
print("ok" if not failures else f"{len(failures)} failure(s)")
sys.exit(1 if failures else 0)
