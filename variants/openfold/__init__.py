"""Problem `openfold`: the full AlphaFold2 / OpenFold IPA (SPEC-openfold.md).

`problem.py` holds the problem as data (config, parameters, inputs, checks, invariance, cost
model), `reference.py` the eager module and the float64 oracle. `PROBLEM` gathers them under
the `Problem` interface that docs/problems.md proposes (`harness/problems.py`).
"""

from __future__ import annotations

from types import SimpleNamespace

from variants.openfold import probes, problem, reference

PROBLEM = SimpleNamespace(
    name=problem.NAME,
    config_class=problem.OpenFoldConfig,
    inputs_class=problem.OpenFoldInputs,
    input_names=problem.INPUT_NAMES,
    grad_inputs=problem.INPUT_NAMES[:4],  # a training step's: s, z, frames; the mask is data
    parameter_spec=problem.parameter_spec,
    init_state_dict=problem.init_state_dict,
    check_state_dict=problem.check_state_dict,
    make_inputs=problem.make_inputs,
    validate_inputs=problem.validate_inputs,
    check_input_values=problem.check_input_values,
    module_class=reference.OpenFoldIPA,
    make_module=reference.make_module,
    reference_forward=reference.chunked_forward,
    oracle=reference.oracle_forward,
    tol_floors=problem.TOL_FLOORS,
    not_supported_reasons=problem.not_supported_reasons,
    min_bytes=problem.min_bytes,
    flops=problem.flops,
    rigid_motion=problem.rigid_motion,
    invariance_rows=problem.invariance_rows,
    output_parts=problem.output_parts,
    # diagnose: keyword dicts of harness.probes.Probe / Rule, and the verdict's fallback;
    # --pass forward+backward: gradient name -> term, keyword dicts of GradientRule
    probes=probes.PROBES,
    rules=probes.RULES,
    probes_everywhere=probes.EVERYWHERE,
    gradient_terms=probes.GRADIENT_TERMS,
    gradient_rules=probes.GRADIENT_RULES,
    gradient_shared_terms=probes.GRADIENT_SHARED_TERMS,
)
