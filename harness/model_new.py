"""Bring your own kernel: a KernelBench-style Python file that defines `ModelNew`, as a variant.

The file is what a KernelBench submission is: a module defining `class ModelNew(nn.Module)`
with the reference's constructor and forward, which may compile CUDA with
`torch.utils.cpp_extension.load_inline` or define Triton kernels at import time. The
interchange is the problem's (docs/problems.md), and the file is judged as the problem the
command selects (`--problem`; the config's type says which):

- simplified: `ModelNew(node_dim, pair_dim, num_heads, num_query_points, num_value_points)`,
  `forward(node_repr, pair_repr, translations, rotations)`, SPEC.md's parameter names;
- openfold: `ModelNew(c_s, c_z, c_hidden, no_heads, no_qk_points, no_v_points)` (inf and eps
  keep their defaults), `forward(s, z, translations, rotations, mask)`, OpenFold v2's
  parameter names, or all of v1's.

`model_new_variant(path)` wraps it as a `Variant` named `model-new:<file name>`; its build
imports the file (once per variant, lazily), instantiates `ModelNew(*config.module_args())`,
loads the reference's weights, and moves it to the device and dtype. An openfold ModelNew
whose parameters carry OpenFold v1's names (`linear_q_points.weight`: the published
checkpoints' layer) gets the same weights renamed (`convert_v2_state_dict`); its gradients
are reported under the v2 names.

Everything that can go wrong inside the user's file (import, compilation, construction,
state_dict names or shapes, moving to the device, forward) raises `ModelNewError` with the
underlying message, e.g. the compiler output `load_inline` reports. Callers record it as an
error / FAIL row instead of crashing: `check` does, the sweep should (`except ModelNewError`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import itertools
import re
import sys
from pathlib import Path
from types import ModuleType

import torch

from variants.base import IPAFunction, Variant
from variants.openfold.problem import V1_KEYS, convert_v1_state_dict, convert_v2_state_dict
from variants.problem import IPAConfig, IPAInputError, Precision, get_precision

_counter = itertools.count()


class ModelNewError(RuntimeError):
    """A ModelNew file failed to import or compile, construct, take the weights, or run."""


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


_ERROR_LINE = re.compile(r"\berror\b", re.IGNORECASE)
_LEADING_PATH = re.compile(r"^\S*/(?=[^/\s]+[:(])")


def _compiler_errors_first(exc: BaseException, most: int = 5) -> str:
    """`_describe(exc)`, led by the compiler's error lines when it holds a build log.

    `load_inline` failures carry the whole ninja log (long command lines first), and rows
    are often cut to a few hundred characters: the error lines go up front, paths trimmed.
    """
    text = _describe(exc)
    lines = text.splitlines()
    errors = [_LEADING_PATH.sub("", line.strip()) for line in lines[1:]
              if _ERROR_LINE.search(line)]
    if not errors:
        return text
    return f"{lines[0]}; first errors: {' | '.join(errors[:most])}\nfull message:\n{text}"


# Where each problem's SPEC names its parameters (for the key-mismatch message).
_PARAMETERS_SECTION = {"simplified": "SPEC 'Parameters'",
                       "openfold": "SPEC-openfold 'Constructor and parameters'"}
# Other complete sets of parameter names a problem's ModelNew may use: problem -> (the names,
# the converters from the harness's names to them and back, what they are).
_OTHER_NAMES = {"openfold": (frozenset(V1_KEYS), convert_v2_state_dict, convert_v1_state_dict,
                             "OpenFold v1")}


class ModelNewVariant(Variant):
    """A variant built from a user's ModelNew file; capabilities are unknown until it runs.
    It implements every problem: the command's `--problem` (the config) says which one the
    file is judged as."""

    description = "external KernelBench-style ModelNew file"
    supports_backward = True  # autograd through its forward

    def __init__(self, path: str | Path):
        from harness.problems import PROBLEMS

        self.path = Path(path).resolve()
        self.name = f"model-new:{self.path.name}"
        self.problems = tuple(PROBLEMS)
        self._module: ModuleType | None = None
        self._import_error: ModelNewError | None = None

    def not_supported_reasons(self, config, device, precision) -> list[str]:
        """The base class's reasons, the problem's own (openfold: fp16 cannot hold inf), and
        a config the constructor cannot express (openfold's inf and eps keep their
        defaults in `ModelNew(*config.module_args())`)."""
        from harness.problems import problem_of

        reasons = super().not_supported_reasons(config, device, precision)
        problem = problem_of(config)
        own = getattr(problem, "not_supported_reasons", None)
        reasons += own(config, precision) if own else []
        built = problem.config_class(*config.module_args())
        if built != config:
            reasons.append(f"ModelNew{config.module_args()} builds {built}, not {config}: the "
                           "constructor takes the sizes only")
        return reasons

    def code_paths(self) -> list[Path]:
        return [self.path]

    def load_module(self) -> ModuleType:
        """Import the file once (a failure is remembered, so a broken kernel is compiled
        once per run, not once per cell) and return the module."""
        if self._module is not None:
            return self._module
        if self._import_error is not None:
            raise self._import_error
        digest = hashlib.sha1(str(self.path).encode()).hexdigest()[:8]
        module_name = f"ipa_bench_model_new_{self.path.stem}_{digest}_{next(_counter)}"
        spec = importlib.util.spec_from_file_location(module_name, self.path)
        if spec is None or spec.loader is None:
            self._import_error = ModelNewError(f"{self.name}: not an importable Python file")
            raise self._import_error
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        # The file may import helpers that sit beside it.
        sys.path.insert(0, str(self.path.parent))
        try:
            spec.loader.exec_module(module)
        except BaseException as exc:
            sys.modules.pop(module_name, None)
            if not isinstance(exc, Exception):  # KeyboardInterrupt, SystemExit
                raise
            self._import_error = ModelNewError(
                f"{self.name}: import failed (a compile error from load_inline shows up "
                f"here): {_compiler_errors_first(exc)}")
            raise self._import_error from exc
        finally:
            if str(self.path.parent) in sys.path:
                sys.path.remove(str(self.path.parent))
        if not isinstance(getattr(module, "ModelNew", None), type):
            self._import_error = ModelNewError(f"{self.name}: the file defines no class ModelNew")
            raise self._import_error
        self._module = module
        return module

    def build(
        self,
        state_dict: dict[str, torch.Tensor],
        config: IPAConfig,
        device: str,
        precision: str | Precision,
    ) -> IPAFunction:
        """`ModelNew(*config.module_args())` holding `state_dict` (renamed where the file
        uses another complete set of the problem's names), on `device` in `precision`; the
        returned `forward(*inputs)` takes the problem's forward arguments in order."""
        from harness.problems import problem_of

        problem = problem_of(config).name
        dtype = get_precision(precision).dtype
        cls = self.load_module().ModelNew
        try:
            model = cls(*config.module_args())
        except Exception as exc:
            raise ModelNewError(
                f"{self.name}: ModelNew{config.module_args()} raised {_describe(exc)}") from exc
        weights, renamed = model_state_dict(self.name, model, state_dict, problem)
        try:
            model.load_state_dict(weights, strict=True)
            model = model.to(device=device, dtype=dtype).eval().requires_grad_(False)
        except Exception as exc:  # shape mismatches, a device the file cannot use
            raise ModelNewError(f"{self.name}: loading the weights failed: {_describe(exc)}") \
                from exc

        name = self.name

        def forward(*inputs):
            try:
                return model(*inputs)
            except torch.cuda.OutOfMemoryError:
                raise  # out of memory is a figure of the cell, not a bug in the file
            except Exception as exc:
                raise ModelNewError(f"{name}: forward raised {_describe(exc)}") from exc

        forward.module = model
        if renamed:  # gradients under the harness's names (runner.trainable_parameters)
            forward.parameters = lambda: [(renamed.get(key, key), p)
                                          for key, p in model.named_parameters()]
        return forward


def model_state_dict(name: str, model: torch.nn.Module, state_dict: dict,
                     problem: str = "simplified") -> tuple[dict, dict[str, str]]:
    """The weights for `model`: `state_dict` itself when `model` takes its names, else
    renamed when `model` takes another complete set of `problem`'s names (openfold: v1's),
    with the renaming (model's name -> the harness's); otherwise ModelNewError listing the
    missing and unexpected keys (`check_state_dict_keys`)."""
    own = frozenset(model.state_dict())
    if problem in _OTHER_NAMES and own != set(state_dict):
        names, to_model, to_harness, _ = _OTHER_NAMES[problem]
        if own == names:
            harness_names = to_harness({key: key for key in own})  # harness's -> model's
            return to_model(state_dict), {m: h for h, m in harness_names.items()}
    check_state_dict_keys(name, model, state_dict, problem)
    return state_dict, {}


def check_state_dict_keys(name: str, model: torch.nn.Module, state_dict: dict,
                          problem: str = "simplified") -> None:
    """Raise ModelNewError listing missing and unexpected keys unless `model` takes exactly
    the reference's state_dict names."""
    own = set(model.state_dict())
    missing = sorted(own - set(state_dict))  # torch's meaning: the model has them, we don't
    unexpected = sorted(set(state_dict) - own)
    if missing or unexpected:
        hint = ""
        if problem in _OTHER_NAMES:
            names, _, _, what = _OTHER_NAMES[problem]
            if set(missing) & names:
                hint = (f" ({', '.join(sorted(set(missing) & names))}: {what} names; ModelNew "
                        f"takes the reference's names or all of {what}'s, not a mix)")
        raise ModelNewError(
            f"{name}: state_dict keys differ from the reference's "
            f"({_PARAMETERS_SECTION.get(problem, 'SPEC')}): "
            f"missing keys (in ModelNew, not in the reference): {', '.join(missing) or 'none'}; "
            f"unexpected keys (in the reference, not in ModelNew): "
            f"{', '.join(unexpected) or 'none'}{hint}")


def model_new_variant(path: str | Path) -> Variant:
    """The variant `model-new:<file name>` built from the ModelNew file at `path`.

    A missing file is an IPAInputError now (a usage error); anything wrong inside the file
    is a ModelNewError when the variant is built.
    """
    path = Path(path)
    if not path.is_file():
        raise IPAInputError(f"--model-new: no such file {str(path)!r}")
    return ModelNewVariant(path)
