"""The problems the harness can judge, by name (docs/problems.md): `simplified` (SPEC.md, the
default) and `openfold` (SPEC-openfold.md).

A problem is a namespace of what the harness asks of the function under test: its config and
inputs classes, the seeded input generator, the input checks, the benchmark weights, the
eager reference and the float64 oracle (both chunked over query rows at large N), the rigid
motion of the invariance property and the rows it is judged on, and the row groups judged
apart against the oracle (`output_parts`). The harness finds a problem from the config it is
given (`problem_of`), so a recipe, a check or a cell carries its problem in its config's type.

What is wired, and what is not yet: docs/problems.md, "Status".
"""

from __future__ import annotations

from dataclasses import fields
from types import SimpleNamespace

import torch

from harness import correctness, measure
from harness.runner import rigid_motion
from variants import problem as simplified
from variants import reference
from variants.openfold import PROBLEM as OPENFOLD


def _all_rows(inputs) -> torch.Tensor:
    return torch.ones(inputs.batch, inputs.length, dtype=torch.bool,
                      device=inputs.as_tuple()[0].device)


SIMPLIFIED = SimpleNamespace(
    name="simplified",
    config_class=simplified.IPAConfig,
    inputs_class=simplified.IPAInputs,
    input_names=tuple(f.name for f in fields(simplified.IPAInputs)),
    grad_inputs=tuple(f.name for f in fields(simplified.IPAInputs)),  # a training step's
    init_state_dict=reference.init_state_dict,
    make_inputs=simplified.make_inputs,
    validate_inputs=simplified.validate_inputs,
    make_module=reference.make_module,
    reference_forward=correctness.chunked_forward,
    oracle=correctness.oracle_forward,
    rigid_motion=rigid_motion,
    invariance_rows=_all_rows,
    output_parts=lambda inputs: {"all": _all_rows(inputs)},
    min_bytes=measure.min_bytes,
    flops=measure.flops,
)

PROBLEMS = {p.name: p for p in (SIMPLIFIED, OPENFOLD)}
DEFAULT = SIMPLIFIED.name


def problem_of(config) -> SimpleNamespace:
    """The problem whose config `config` is."""
    for problem in PROBLEMS.values():
        if isinstance(config, problem.config_class):
            return problem
    raise TypeError(f"config: expected one of the problems' configs "
                    f"{[p.config_class.__name__ for p in PROBLEMS.values()]}, "
                    f"got {type(config).__name__}")
