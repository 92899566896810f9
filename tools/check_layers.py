#!/usr/bin/env python3
# check_layers.py - the layering of src/ (docs/architecture.md), checked and counted over the include and call graph.
"""Checks src/ against alloy's layers and prints each offence as file:line.

The layers, low to high: base < ir < kernels (the reference kernels
the CPU backend and constant folding share) < step < passes < codegen < runtime, and
inside runtime/: files and bundles (io/, bundle/, profile) < the backend
interface (backend.h) < the backends (cpu/, cuda/; the registry backend.c
beside them) and the cost model (cost/, which reads the launch plan from
step/, as the CUDA backend does) < the graph object (graph/). A file may
include headers, and
name functions defined in files, of its own layer and below. Besides:

- the backends never include or call each other, and nothing outside a
  backend's folder includes its headers or names its functions but the
  registry (runtime/backend.c), which may include its open header
  (cpu_backend.h, cuda_backend.h) and name its open functions;
- a file of runtime/ includes passes/ or codegen/, or names a function
  defined there, only when it is one of the compiler-side files
  src/runtime/meson.build names (alloy_runtime_compiler_sources), and in
  the backends only the JIT files (*_jit.c);
- nothing below runtime/graph/ includes the builder API (alloy/graph.h,
  alloy/alloy.h);
- base, ir, kernels, step, passes and codegen read no environment;
- each folder's meson.build lists exactly the .c files of its folder
  (runtime/meson.build those of runtime/ and its sub-folders);
- each public header include/alloy/X.h declares only functions defined in
  runtime/graph/X_api.c, or in the files HEADER_HOMES lists for it (the
  core builder API of graph.h, the base's types.h, ...);
- every source path the docs name (docs/*.md and README.md beside SRC_DIR:
  `runtime/cpu/cpu_ops.c`, `src/step/pipeline.def`, `include/alloy/*.h`)
  is there, so a move cannot leave a page (the add-an-op recipe among
  them) pointing at a file that is gone.

"Names a function" is read cheaply: the non-static functions defined at
column 0 of each .c file, and every identifier of every .c and .h file
(comments and strings dropped, members after . or -> skipped). Tables
(.def) are read for includes only.

usage: check_layers.py SRC_DIR              check; exit 1 on any offence
       check_layers.py --count SRC_DIR      the counts (back-arrows, circles, reaches past the backend interface, ...)
       check_layers.py --self-test [SRC_DIR] plants offences in scratch trees and checks each is rejected (then
                                            checks SRC_DIR: the `layers` test)
"""
import glob
import os
import re
import shutil
import sys
import tempfile

# (path prefix, rank, layer name), the first match wins
LAYERS = [
    ("base/", 0, "base"),
    ("ir/", 1, "ir"),
    ("kernels/", 2, "kernels"),
    ("step/", 3, "step"),
    ("passes/", 4, "passes"),
    ("codegen/", 5, "codegen"),
    ("runtime/io/", 6, "runtime files"),
    ("runtime/comm/", 6, "runtime files"),
    ("runtime/bundle/", 6, "runtime files"),
    ("runtime/profile.", 6, "runtime files"),
    ("runtime/backend.h", 7, "the backend interface"),
    ("runtime/backend.c", 7, "the backend registry"),
    ("runtime/cpu/", 8, "the CPU backend"),
    ("runtime/cuda/", 8, "the CUDA backend"),
    ("cost/", 8, "the cost model"),
    ("runtime/graph/", 9, "the graph object"),
]
BACKENDS = ("runtime/cpu/", "runtime/cuda/")
REGISTRY = "runtime/backend.c"
OPEN_HEADERS = {"runtime/cpu/cpu_backend.h", "runtime/cuda/cuda_backend.h"}
OPEN_FUNCTIONS = re.compile(r"^(cpu|cuda)_backend_open\w*$")
BUILDER_HEADERS = {"alloy/graph.h", "alloy/alloy.h"}
NO_ENV = ("base/", "ir/", "kernels/", "step/", "passes/", "codegen/")
COMPILER = ("passes/", "codegen/", "cost/")
# Where the functions a public header declares are defined besides runtime/graph/X_api.c for include/alloy/X.h
# (a path ending in / stands for its folder).
HEADER_HOMES = {
    "graph.h": ("runtime/graph/builder.c", "runtime/graph/graph.c", "runtime/graph/graph_error.c",
                "runtime/graph/state_api.c", "runtime/graph/run.c", "runtime/graph/config.c",
                "runtime/graph/compile_ir.c", "runtime/graph/dump_api.c", "runtime/graph/share.c"),
    "types.h": ("base/",),
    "safetensors.h": ("runtime/io/",),
    "mpi.h": ("runtime/comm/",),
    "distributed.h": ("runtime/comm/",),
    "amp.h": ("runtime/graph/range_stats.c",),
    "bundle.h": ("runtime/graph/bundle_save.c",),
    "train.h": ("runtime/graph/overflow.c", "runtime/graph/optim_api.c"),
}
FOLDER_LISTS = ["base", "ir", "kernels", "step", "passes", "codegen", "cost", "runtime"]
KEYWORDS = {"if", "for", "while", "switch", "return", "sizeof", "do", "else", "case", "defined"}


def layer(path):
    for prefix, rank, name in LAYERS:
        if path.startswith(prefix):
            return rank, name
    return None, None


def backend_of(path):
    for b in BACKENDS:
        if path.startswith(b):
            return b
    return None


def strip(text):
    """text without comments and string or character literals, newlines kept (line numbers hold)."""
    def blank(m):
        return re.sub(r"[^\n]", " ", m.group(0))
    return re.sub(r'/\*.*?\*/|//[^\n]*|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', blank, text, flags=re.S)


def line_of(text, pos):
    return text.count("\n", 0, pos) + 1


DEFINITION = re.compile(r"^(?![^\n(]*\b(?:static|typedef|extern)\b|#)[A-Za-z_][\w \t\*]*?[\s\*]([A-Za-z_]\w*)[ \t]*\([^;{}]*\)\s*\{",
                        re.M)
STATIC_DEFINITION = re.compile(r"^[^\n(]*\bstatic\b[\w \t\*]*?[\s\*]([A-Za-z_]\w*)[ \t]*\(", re.M)
INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]+"([^"]+)"', re.M)
IDENT = re.compile(r"(->|\.)?[ \t]*([A-Za-z_]\w*)")


class Tree:
    """The sources of one src/ directory: files, includes, definitions and uses."""

    def __init__(self, src):
        self.src = src
        self.files = {}  # path -> raw text
        for root, _, names in os.walk(src):
            for n in names:
                if n.endswith((".c", ".h", ".def")):
                    full = os.path.join(root, n)
                    rel = os.path.relpath(full, src).replace(os.sep, "/")
                    with open(full, encoding="utf-8", errors="replace") as f:
                        self.files[rel] = f.read()
        self.code = {p: strip(t) for p, t in self.files.items()}
        self.includes = {}  # path -> [(line, target)]
        for p, t in self.files.items():
            self.includes[p] = [(line_of(t, m.start()), m.group(1)) for m in INCLUDE.finditer(t)]
        self.defined = {}  # function name -> defining .c file
        self.statics = {}  # path -> names it defines static
        for p, c in self.code.items():
            if not p.endswith(".c"):
                continue
            self.statics[p] = set(STATIC_DEFINITION.findall(c))
            for m in DEFINITION.finditer(c):
                name = m.group(1)
                if name not in KEYWORDS:
                    self.defined.setdefault(name, p)
        self.uses = {}  # path -> {defining file: (line, name)}, the first use of each
        for p, c in self.code.items():
            if p.endswith(".def"):
                continue
            out = {}
            own = self.statics.get(p, set())
            for m in IDENT.finditer(c):
                if m.group(1):
                    continue  # a member
                name = m.group(2)
                where = self.defined.get(name)
                if not where or where == p or name in own or where in out:
                    continue
                out[where] = (line_of(c, m.start(2)), name)
            self.uses[p] = out

    def compiler_side(self):
        """The compiler-side files of runtime/ as the build names them (runtime/meson.build), else as the
        single src/meson.build of older trees did (the runtime/ files of its second list)."""
        path = os.path.join(self.src, "runtime", "meson.build")
        if os.path.exists(path):
            text = open(path, encoding="utf-8").read()
            files = set()
            for m in re.finditer(r"alloy_runtime_compiler_sources\s*\+?=\s*files\(([^)]*)\)", text):
                files |= {"runtime/" + f for f in re.findall(r"'([^']+)'", m.group(1))}
            return files
        path = os.path.join(self.src, "meson.build")
        if not os.path.exists(path):
            return set()
        text = strip_meson(open(path, encoding="utf-8").read())
        files = set()
        for m in re.finditer(r"alloy_sources\s*(?:=\s*alloy_runtime_shared_sources\s*)?\+=?\s*files\(([^)]*)\)", text):
            files |= {f for f in re.findall(r"'(runtime/[^']+)'", m.group(1))}
        return files


def offences(tree):
    """Every offence as (kind, path, line, message); kinds: back-arrow, reach, compiler, builder, env, meson,
    header, docs, circle."""
    out = []
    compiler_side = tree.compiler_side()

    def compiler_ok(p):
        if p not in compiler_side:
            return False
        return not backend_of(p) or p.endswith("_jit.c")

    for p in sorted(tree.files):
        mine, my_name = layer(p)
        if mine is None:
            continue
        mine_backend = backend_of(p)
        for line, inc in tree.includes[p]:
            if inc in BUILDER_HEADERS and not p.startswith("runtime/graph/"):
                out.append(("builder", p, line, f"includes {inc} (the builder API) below runtime/graph/"))
            theirs, their_name = layer(inc)
            if theirs is None:
                continue
            their_backend = backend_of(inc)
            if their_backend and their_backend != mine_backend:
                if p == REGISTRY and inc in OPEN_HEADERS:
                    continue
                kind = "back-arrow" if mine_backend else "reach"
                out.append((kind, p, line, f"includes {inc} ({their_name}: reached through the backend registry)"))
                continue
            if p.startswith("runtime/") and inc.startswith(COMPILER):
                if not compiler_ok(p):
                    out.append(("compiler", p, line, f"includes {inc}: a runtime file includes passes/ or codegen/ only "
                                "when runtime/meson.build names it compiler-side (in the backends, a *_jit.c file)"))
                continue
            if theirs > mine:
                out.append(("back-arrow", p, line, f"includes {inc} ({their_name}, above {my_name})"))
        for where, (line, name) in sorted(tree.uses.get(p, {}).items()):
            theirs, their_name = layer(where)
            if theirs is None:
                continue
            their_backend = backend_of(where)
            if their_backend and their_backend != mine_backend:
                if p == REGISTRY and OPEN_FUNCTIONS.match(name):
                    continue
                kind = "back-arrow" if mine_backend else "reach"
                out.append((kind, p, line, f"names {name} ({where}, {their_name}: reached through the backend registry)"))
                continue
            if p.startswith("runtime/") and where.startswith(COMPILER):
                if not compiler_ok(p):
                    out.append(("compiler", p, line, f"names {name} ({where}): a runtime file calls into passes/ or "
                                "codegen/ only when runtime/meson.build names it compiler-side"))
                continue
            if theirs > mine:
                out.append(("back-arrow", p, line, f"names {name}, defined in {where} ({their_name}, above {my_name})"))
        if p.startswith(NO_ENV):
            for m in re.finditer(r"\bgetenv\s*\(", tree.code[p]):
                out.append(("env", p, line_of(tree.code[p], m.start()), "reads the environment (below the API the "
                            "configuration is the options struct)"))
    out += meson_offences(tree)
    out += header_offences(tree)
    out += docs_offences(tree)
    out += circle_offences(tree)
    return out


def circle_offences(tree):
    """Files that include each other, or name each other's functions, in a circle: one offence per circle, at its
    first file's first use of the next file in the circle."""
    out = []
    inc_edges = {p: {i for _, i in incs if i in tree.files} for p, incs in tree.includes.items()}
    call_edges = {p: {w for w in uses if w.endswith(".c")} for p, uses in tree.uses.items() if p.endswith(".c")}
    for what, edges in (("include", inc_edges), ("call", call_edges)):
        for comp in circles(edges):
            first = comp[0]
            nxt = sorted(w for w in edges.get(first, ()) if w in comp)[0]
            if what == "include":
                line = min(l for l, i in tree.includes[first] if i == nxt)
            else:
                line = tree.uses[first][nxt][0]
            out.append(("circle", first, line, f"{what} circle {' '.join(comp)}: {first} reaches {nxt}, which reaches "
                        f"back (move the shared part to a file both include)"))
    return out


def header_offences(tree):
    """Each function include/alloy/X.h (beside SRC_DIR) declares is defined in runtime/graph/X_api.c or a file
    HEADER_HOMES lists for X.h (names defined nowhere, as those a macro makes, are not read)."""
    root = os.path.dirname(os.path.abspath(tree.src))
    out = []
    for header in sorted(glob.glob(os.path.join(root, "include", "alloy", "*.h"))):
        name = os.path.basename(header)
        homes = ("runtime/graph/" + name[:-2] + "_api.c",) + HEADER_HOMES.get(name, ())
        code = strip(open(header, encoding="utf-8").read())
        seen = set()
        for m in re.finditer(r"\b(alloy_\w+)[ \t]*\(", code):
            fn = m.group(1)
            where = tree.defined.get(fn)
            if fn in seen or not where or where.startswith(homes):
                continue
            seen.add(fn)
            out.append(("header", "../include/alloy/" + name, line_of(code, m.start()),
                        f"declares {fn}, defined in {where}: a public header's calls live in {homes[0]} "
                        "(or where tools/check_layers.py's HEADER_HOMES says)"))
    return out


DOC_PATH = re.compile(r"(?<![\w/.-])((?:src/|include/|tests/|tools/|bench/|examples/)?"
                      r"(?:base|ir|step|passes|codegen|runtime|alloy|cpu|cuda|io|bundle|graph)/[\w./*{},-]*"
                      r"\.(?:c|h|def|sh|py|build|map))\b")


def docs_offences(tree):
    """Each source path a page of docs/ or the README names exists (under the root, src/, include/ or src/runtime/;
    a * or {a,b} in it matches at least one file each)."""
    root = os.path.dirname(os.path.abspath(tree.src))
    pages = sorted(glob.glob(os.path.join(root, "docs", "*.md"))) + [os.path.join(root, "README.md")]
    bases = [root, tree.src, os.path.join(root, "include"), os.path.join(tree.src, "runtime")]

    def exists(path):
        if "{" in path and "}" in path:
            head, rest = path.split("{", 1)
            alts, tail = rest.split("}", 1)
            return all(exists(head + a + tail) for a in alts.split(","))
        return any(glob.glob(os.path.join(b, path)) for b in bases)

    out = []
    for page in pages:
        if not os.path.exists(page):
            continue
        text = open(page, encoding="utf-8").read()
        name = os.path.relpath(page, root)
        for m in DOC_PATH.finditer(text):
            if not exists(m.group(1)):
                out.append(("docs", "../" + name, line_of(text, m.start()), f"names {m.group(1)}, which is not there"))
    return out


def meson_offences(tree):
    """Each folder's meson.build lists exactly its folder's .c files (runtime/ with its sub-folders)."""
    out = []
    for folder in FOLDER_LISTS:
        path = os.path.join(tree.src, folder, "meson.build")
        have = {p for p in tree.files if p.endswith(".c") and p.startswith(folder + "/")}
        if not have:
            continue
        if not os.path.exists(path):
            out.append(("meson", folder + "/meson.build", 0, f"missing: {folder}/ lists its own files"))
            continue
        text = strip_meson(open(path, encoding="utf-8").read())
        listed = {folder + "/" + f for f in re.findall(r"'([^']+\.c)'", text)}
        for p in sorted(have - listed):
            out.append(("meson", p, 0, f"not in {folder}/meson.build"))
        for p in sorted(listed - have):
            out.append(("meson", folder + "/meson.build", 0, f"lists {p}, which is not there"))
    return out


def strip_meson(text):
    return re.sub(r"#[^\n]*", "", text)


def circles(edges):
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]
    nodes = set(edges) | {t for ts in edges.values() for t in ts}

    def visit(v):
        work = [(v, iter(sorted(edges.get(v, ()))))]
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        while work:
            node, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                    advanced = True
                    break
                if w in on:
                    low[node] = min(low[node], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == node:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return sorted(out)


def counts(tree):
    found = offences(tree)
    inc_edges = {p: {i for _, i in incs if i in tree.files} for p, incs in tree.includes.items()}
    call_edges = {p: {w for w in uses if w.endswith(".c")} for p, uses in tree.uses.items() if p.endswith(".c")}
    compiler_side = tree.compiler_side()
    reaching = sorted({p for p, incs in tree.includes.items() if p.startswith("runtime/")
                       for _, i in incs if i.startswith(COMPILER)})
    in_runtime_lib = [p for p in reaching if p not in compiler_side]
    include_back = sum(1 for k, _, _, m in found if k == "back-arrow" and m.startswith("includes"))
    call_back = sum(1 for k, _, _, m in found if k == "back-arrow" and m.startswith("names"))
    return [
        ("back-arrows (includes against the layer order)", include_back, []),
        ("back-arrows (functions named against the layer order)", call_back, []),
        ("include circles", len(circles(inc_edges)), [" ".join(c) for c in circles(inc_edges)]),
        ("call circles (files naming each other's functions)", len(circles(call_edges)),
         [" ".join(c) for c in circles(call_edges)]),
        ("reaches past the backend interface", sum(1 for k, *_ in found if k == "reach"),
         [f"{p}:{l}: {m}" for k, p, l, m in found if k == "reach"]),
        ("files of runtime/ that include passes/ or codegen/", len(reaching), reaching),
        ("  of them in liballoy-runtime (not compiler-side)", len(in_runtime_lib), in_runtime_lib),
        ("offences in all", len(found), []),
    ]


def check(src, quiet=False):
    found = offences(Tree(src))
    if not quiet:
        for kind, p, line, msg in found:
            print(f"src/{p}:{line}: layering ({kind}): {msg}" if line else f"src/{p}: layering ({kind}): {msg}")
        if not found:
            print("layers: ok (base < ir < kernels < step < passes < codegen < runtime; backends behind the registry)")
    return found


def self_test():
    """Plants one offence of each kind in scratch trees, and the real tree's copy with a bad include; each must be
    rejected naming its file and line, and the clean scratch tree accepted."""
    failures = 0
    here = os.path.dirname(os.path.abspath(__file__))
    real = os.path.join(os.path.dirname(here), "src")
    scratch = {
        "base/base.h": "#include <stdio.h>\n",
        "base/mem.c": '#include "base/base.h"\nvoid *al_mem(void) { return 0; }\n',
        "ir/ir.h": '#include "base/base.h"\nvoid ir_new(void);\n',
        "ir/graph.c": '#include "ir/ir.h"\nvoid ir_new(void)\n{\n    al_mem();\n}\n',
        "kernels/ref.h": '#include "ir/ir.h"\nvoid ref_copy(void);\n',
        "kernels/ref.c": '#include "kernels/ref.h"\nvoid ref_copy(void) { ir_new(); }\n',
        "step/plan.h": '#include "ir/ir.h"\n',
        "step/plan.c": '#include "step/plan.h"\nint plan_build(void) { ir_new(); return 0; }\n',
        "passes/pass.h": '#include "step/plan.h"\nint pass_run(void);\n',
        "passes/pass.c": '#include "passes/pass.h"\nint pass_run(void) { return plan_build(); }\n',
        "codegen/emit.h": '#include "step/plan.h"\n',
        "codegen/emit.c": '#include "codegen/emit.h"\nint cg_emit(void) { return 0; }\n',
        "runtime/backend.h": '#include "step/plan.h"\n',
        "runtime/backend.c": '#include "runtime/backend.h"\n#include "runtime/cpu/cpu_backend.h"\n'
                             'int rt_backend_open(void) { return cpu_backend_open(); }\n',
        "runtime/cpu/cpu_backend.h": '#include "runtime/backend.h"\nint cpu_backend_open(void);\n',
        "runtime/cpu/cpu_backend.c": '#include "runtime/cpu/cpu_backend.h"\nint cpu_util(void);\n'
                                     'int cpu_backend_open(void) { return cpu_util(); }\n',
        "runtime/cpu/cpu_util.c": "int cpu_util(void) { return 0; }\n",
        "runtime/cuda/cuda_backend.h": '#include "runtime/backend.h"\n',
        "runtime/cuda/cuda_jit.c": '#include "codegen/emit.h"\nint cuda_jit(void) { return cg_emit(); }\n',
        "runtime/graph/graph.c": '#include "alloy/graph.h"\n#include "runtime/backend.h"\n'
                                 'int graph_open(void) { return rt_backend_open(); }\n',
        "runtime/graph/compile_ir.c": '#include "passes/pass.h"\nint graph_compile(void) { return pass_run(); }\n',
        "runtime/graph/norm_api.c": "int alloy_norm(void) { return 0; }\n",
    }
    # beside src/: the pages and public headers, each with its text
    outside = {
        "docs/layers.md": "The passes are `passes/pass.c`; the registry is src/runtime/backend.c.\n",
        "include/alloy/norm.h": "int alloy_norm(void);\n",
    }
    lists = {
        "base": ["mem.c"], "ir": ["graph.c"], "kernels": ["ref.c"], "step": ["plan.c"], "passes": ["pass.c"], "codegen": ["emit.c"],
        "runtime": ["backend.c", "cpu/cpu_backend.c", "cpu/cpu_util.c", "graph/graph.c"],
    }
    runtime_compiler = ["cuda/cuda_jit.c", "graph/compile_ir.c", "graph/norm_api.c"]
    # each plant: (file, text appended, the kind, the line it must name[, the file it must name when another])
    plants = [
        ("base/mem.c", '#include "ir/ir.h"\n', "back-arrow", 3),
        ("ir/ir.h", '#include "passes/pass.h"\n', "back-arrow", 3),
        ("step/plan.c", "int plan_more(void) { return pass_run(); }\n", "back-arrow", 3),
        ("kernels/ref.c", '#include "step/plan.h"\n', "back-arrow", 3),
        ("runtime/cuda/cuda_backend.h", '#include "runtime/cpu/cpu_backend.h"\n', "back-arrow", 2),
        ("runtime/graph/graph.c", "int graph_cpu(void) { return cpu_backend_open(); }\n", "reach", 4),
        ("runtime/graph/graph.c", '#include "runtime/cpu/cpu_backend.h"\n', "reach", 4),
        ("cost/cost.h", '#include "runtime/cuda/cuda_backend.h"\n', "reach", 1),
        ("runtime/backend.h", '#include "codegen/emit.h"\n', "compiler", 2),
        ("runtime/cpu/cpu_backend.c", "int cpu_emit(void) { return cg_emit(); }\n", "compiler", 4),
        ("runtime/backend.h", '#include "runtime/graph/graph_impl.h"\n', "back-arrow", 2),
        ("runtime/cpu/cpu_backend.h", '#include "alloy/graph.h"\n', "builder", 3),
        ("passes/pass.c", 'int pass_env(void) { return getenv("X") != 0; }\n', "env", 3),
        ("ir/extra.c", "int ir_extra(void) { return 0; }\n", "meson", 0),
        ("docs/layers.md", "The schedule is `passes/schedule.h`.\n", "docs", 2),
        ("include/alloy/random.h", "int alloy_norm(void);\n", "header", 1),
        # the circle is named at its first file (cpu_backend.c, naming cpu_util at line 2)
        ("runtime/cpu/cpu_util.c", "int cpu_util_open(void) { return cpu_backend_open(); }\n", "circle", 2,
         "runtime/cpu/cpu_backend.c"),
    ]

    def build(top, plant=None):
        root = os.path.join(top, "src")
        for p, text in list(outside.items()) + ([plant[:2]] if plant and plant[0] not in outside else []):
            if not p.startswith(("docs/", "include/")):
                continue
            os.makedirs(os.path.dirname(os.path.join(top, p)), exist_ok=True)
            with open(os.path.join(top, p), "w") as f:
                f.write(text + (plant[1] if plant and plant[0] == p and p in outside else ""))
        for p, text in scratch.items():
            os.makedirs(os.path.dirname(os.path.join(root, p)), exist_ok=True)
            with open(os.path.join(root, p), "w") as f:
                f.write(text + (plant[1] if plant and plant[0] == p else ""))
        if plant and plant[0] not in scratch and not plant[0].startswith(("docs/", "include/")):
            os.makedirs(os.path.dirname(os.path.join(root, plant[0])), exist_ok=True)
            with open(os.path.join(root, plant[0]), "w") as f:
                f.write(plant[1])
        for folder, names in lists.items():
            with open(os.path.join(root, folder, "meson.build"), "w") as f:
                f.write(f"{folder}_sources = files(" + ", ".join(f"'{n}'" for n in names) + ")\n")
                if folder == "runtime":
                    f.write("alloy_runtime_compiler_sources = files(" +
                            ", ".join(f"'{n}'" for n in runtime_compiler) + ")\n")
        return root

    def expect(name, ok):
        nonlocal failures
        print(("ok:   " if ok else "FAIL: ") + name)
        failures += 0 if ok else 1

    with tempfile.TemporaryDirectory() as tmp:
        clean = build(os.path.join(tmp, "clean"))
        found = check(clean, quiet=True)
        expect(f"the clean scratch tree passes ({len(found)} offences: {found})", not found)
        for i, plant in enumerate(plants):
            root = build(os.path.join(tmp, f"plant{i}"), plant)
            found = check(root, quiet=True)
            where = "../" + plant[0] if plant[0].startswith(("docs/", "include/")) else plant[0]
            where = plant[4] if len(plant) > 4 else where
            hit = [f for f in found if f[0] == plant[2] and f[1] == where and f[2] == plant[3]]
            # a back-arrow or reach that closes a loop is a circle too
            others = [f for f in found if f not in hit and f[0] != "circle"]
            expect(f"{plant[0]} + {plant[1].strip()!r}: rejected as {plant[2]} at line {plant[3]} "
                   f"({len(found)} offences)", len(hit) == 1 and not others)
        if os.path.isdir(real):
            copy = os.path.join(tmp, "real", "src")
            shutil.copytree(real, copy)
            target = os.path.join(copy, "base", "mem.c")
            lines = open(target).read().count("\n")
            with open(target, "a") as f:
                f.write('#include "runtime/graph/graph_impl.h"\n')
            found = check(copy, quiet=True)
            expect(f"the real tree with base/mem.c including runtime/graph/graph_impl.h is rejected at line {lines + 1}",
                   any(k == "back-arrow" and p == "base/mem.c" and l == lines + 1 for k, p, l, _ in found))
    print("self-test: ok" if not failures else f"self-test: {failures} failed")
    return failures == 0


def main(argv):
    if len(argv) in (2, 3) and argv[1] == "--self-test":
        ok = self_test()
        if len(argv) == 3 and check(argv[2]):
            ok = False
        return 0 if ok else 1
    if len(argv) == 3 and argv[1] == "--count":
        for name, n, items in counts(Tree(argv[2])):
            print(f"{n:5d}  {name}")
            for it in items:
                print(f"         {it}")
        return 0
    if len(argv) == 2 and not argv[1].startswith("-"):
        return 1 if check(argv[1]) else 0
    print(__doc__.strip().split("\n\n")[-1], file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
