"""A variant's code digest (`Variant.code_paths`, the `code_digest` column) decides when a sweep
measures a cell again; a module its numbers depend on but its digest leaves out lets a resumed
sweep keep rows of code that has changed. Here every variant that runs on the CPU is built and
called in a fresh process (a forward, and a training step where it has a backward), and each
module of `variants/` that the build and the calls import must lie in its code paths. Modules
already imported with the registry are not seen; the kernels, imported when a variant is built
or first called, are. CPU (Triton under the interpreter); the variants that compile per call
(torch.compile, FlexAttention) are left out for time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from variants.registry import all_variants

REPO = Path(__file__).resolve().parents[1]
COMPILING = {"torch-compile", "flex-attention"}
PROBE = r"""
import json, sys
import torch
from harness.problems import PROBLEMS
from harness.runner import (InputRecipe, input_names, leaf_inputs, trainable_parameters,
                            training_step)
from variants.registry import get_variant

problem_name, name = sys.argv[1:3]
problem = PROBLEMS[problem_name]
variant = get_variant(name, problem_name)
before = set(sys.modules)
config = problem.config_class()
fn = variant.build(problem.init_state_dict(config), config, "cpu", "fp32")
recipe = InputRecipe(config, 1, 5, "fp32", "cpu", 0)
inputs = recipe.presented(recipe.values())
with torch.no_grad():
    fn(*inputs.as_tuple())
if variant.supports_backward:
    params = {k: p.requires_grad_(True) for k, p in trainable_parameters(fn).items()}
    training_step(fn, leaf_inputs(inputs), params, recipe.grad_output(), input_names(inputs))
files = [getattr(sys.modules[m], "__file__", None) for m in set(sys.modules) - before]
print(json.dumps({"imported": sorted(f for f in files if f),
                  "code_paths": [str(p) for p in variant.code_paths()]}))
"""


def _cpu_variants() -> list[tuple[str, str]]:
    from harness.problems import PROBLEMS

    cases = []
    for problem_name, problem in PROBLEMS.items():
        config = problem.config_class()
        for name, variant in all_variants(problem_name).items():
            if name not in COMPILING and not variant.not_supported_reasons(config, "cpu", "fp32"):
                cases.append((problem_name, name))
    return cases


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                    reason="the Triton variants run on the CPU only under TRITON_INTERPRET=1")
@pytest.mark.parametrize("problem_name, name", _cpu_variants())
def test_code_digest_covers_every_module_the_variant_imports(problem_name, name):
    proc = subprocess.run([sys.executable, "-c", PROBE, problem_name, name], cwd=REPO,
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.splitlines()[-1])
    roots = [Path(p).resolve() for p in found["code_paths"]]
    ours = [Path(f).resolve() for f in found["imported"]
            if Path(f).resolve().is_relative_to(REPO / "variants")]
    missing = [str(f.relative_to(REPO)) for f in ours
               if not any(f == root or f.is_relative_to(root) for root in roots)]
    assert not missing, f"{problem_name} {name}: code_paths leave out {missing}"
