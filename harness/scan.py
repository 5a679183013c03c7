"""A static scan of untrusted variant code: `--model-new` files and entry-point modules.

Not a gate: the measurements decide (correctness on fresh seeds, the memory floor). The scan
names what a reviewer should read first, as `scan:<rule>` in a row's `flags` and as warnings
under `check`'s table. Each rule is a pattern that honest IPA code rarely needs and that the
known ways of faking a benchmark do (issue #14): work on other streams or threads, looking up
the caller's frames (for the oracle or a timing loop), patching torch, time or the harness,
state keyed by a tensor's address, ending the process, and low-precision shortcuts in a
full-precision row. The scan reads the syntax tree, so comments and strings never match.
"""

from __future__ import annotations

import ast
import inspect
from dataclasses import dataclass
from pathlib import Path

RULES = {
    "streams": "work on another CUDA stream, which a timer on the current stream cannot see",
    "concurrency": "threads, processes or async work outside the timed call",
    "introspection": "reads the call stack or the interpreter's objects (the oracle, a timing "
                     "loop)",
    "patching": "assigns attributes of torch, time, sys or the harness (other variants' "
                "numbers, the verdict)",
    "address-keyed": "state keyed by a tensor's address (memoising outputs across calls)",
    "process-exit": "ends or signals the process",
    "low-precision": "casts to half precision or enables TF32 (flagged on fp32/fp64 rows only)",
}
# Modules whose import alone is a finding, by rule.
IMPORTS = {
    "threading": "concurrency", "multiprocessing": "concurrency", "concurrent": "concurrency",
    "asyncio": "concurrency", "subprocess": "concurrency",
    "inspect": "introspection", "gc": "introspection", "traceback": "introspection",
    "signal": "process-exit",
}
# Attribute names whose use is a finding, by rule.
ATTRIBUTES = {
    "Stream": "streams", "ExternalStream": "streams", "stream": "streams",
    "set_stream": "streams", "_getframe": "introspection", "settrace": "introspection",
    "setprofile": "introspection", "f_back": "introspection", "f_locals": "introspection",
    "f_globals": "introspection", "data_ptr": "address-keyed",
    "untyped_storage": "address-keyed", "_exit": "process-exit", "exit": "process-exit",
    "kill": "process-exit", "abort": "process-exit", "fork": "concurrency",
    "half": "low-precision", "float16": "low-precision", "bfloat16": "low-precision",
    "allow_tf32": "low-precision", "set_float32_matmul_precision": "low-precision",
}
PATCHED_ROOTS = {"torch", "time", "sys", "builtins", "harness", "variants", "F", "nn", "os"}
CALLS = {"exit": "process-exit", "quit": "process-exit", "setattr": "patching"}
FULL_PRECISION_ONLY = {"low-precision"}


@dataclass(frozen=True)
class Finding:
    rule: str
    path: str
    line: int
    code: str  # the source line, stripped

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.rule}: {self.code} ({RULES[self.rule]})"


def _root_name(node: ast.AST) -> str | None:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _rules_of(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Import | ast.ImportFrom):
        if isinstance(node, ast.Import):
            roots = [a.name.split(".")[0] for a in node.names]
        else:
            roots = [(node.module or "").split(".")[0]]
        return [IMPORTS[root] for root in roots if root in IMPORTS]
    if isinstance(node, ast.Attribute) and node.attr in ATTRIBUTES:
        return [ATTRIBUTES[node.attr]]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in CALLS:
        return [CALLS[node.func.id]]
    if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        if any(isinstance(t, ast.Attribute) and _root_name(t) in PATCHED_ROOTS for t in targets):
            return ["patching"]
    return []


def scan_source(text: str, path: str = "<source>") -> list[Finding]:
    """Every finding in Python source `text`, in line order, one per (rule, line)."""
    try:
        tree = ast.parse(text, filename=path)
    except SyntaxError:
        return []  # importing the file reports it, with the compiler's message
    lines = text.splitlines()
    found = {}
    for node in ast.walk(tree):
        for rule in _rules_of(node):
            line = getattr(node, "lineno", 0)
            code = lines[line - 1].strip() if 0 < line <= len(lines) else ""
            found.setdefault((line, rule), Finding(rule, path, line, code))
    return [found[k] for k in sorted(found)]


def scan_file(path: str | Path) -> list[Finding]:
    path = Path(path)
    return scan_source(path.read_text(errors="replace"), str(path))


def row_flags(findings: list[Finding], dtype: str) -> list[str]:
    """The `scan:<rule>` flags a results row in `dtype` carries."""
    full = dtype in ("fp32", "fp64")
    rules = dict.fromkeys(f.rule for f in findings
                          if full or f.rule not in FULL_PRECISION_ONLY)
    return [f"scan:{rule}" for rule in rules]


def scan_variant(variant) -> list[Finding]:
    """Findings in the code of a variant that is not built in: a `--model-new` file, or the
    module of a variant registered through an entry point. Built-in variants are reviewed
    code and are not scanned."""
    from harness.model_new import ModelNewVariant
    from variants.registry import BUILTIN

    if isinstance(variant, ModelNewVariant):
        return scan_file(variant.path)
    if type(variant) in BUILTIN:
        return []
    try:
        source = inspect.getsourcefile(type(variant))
    except TypeError:  # defined interactively
        return []
    return scan_file(source) if source else []
