"""Sweep grids: presets and TOML files, expanded into cells.

A grid is a base configuration plus a list of one-axis (or few-axis) slices, as SPEC
recommends: the union of slices around the default config, not a full Cartesian product.

TOML format (every key optional; unknown keys are errors):

    [base]                 # values shared by every cell unless a slice overrides them
    problem = "simplified"  # or "openfold" (docs/problems.md); one per file. Without it: the
                            # sweep's --problem. The layer sizes default to its config's.
    batch = 1
    node_dim = 384         # simplified: SPEC.md's names; openfold maps them (c_s, c_z,
    pair_dim = 128         # no_heads, c_hidden, no_qk_points, no_v_points)
    heads = 12
    head_dim = 32          # simplified: node_dim / heads, derived (another value is an
                           # error); openfold: c_hidden (default 16)
    query_points = 4
    value_points = 8
    dtypes = ["fp32", "bf16"]
    modes = ["eager", "graph"]   # graph: CUDA-graph replay, only for length <= graph_max_length
    graph_max_length = 512
    passes = ["forward"]         # and/or "forward+backward": a timed training step (eager)
    seeds = 3                    # correctness seeds per cell
    budget_s = 1.0               # timing budget per cell and mode
    host_spin_ms = 0             # CUDA: the host's busy wait before each sample (0: none;
                                 # harness/measure.py)

    [[slice]]              # each slice: lists of values; cells = product of its lists
    length = [64, 128, 256]

    [[slice]]
    length = [256, 1024]
    heads = [4, 8, 16]

A slice may also set `dtypes` and `passes` for its own cells. A grid without `problem` runs
the problem the sweep is given (`--problem`, default simplified), so the presets below that
name none serve every problem.
"""

from __future__ import annotations

import itertools
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from harness.measure import TimingPolicy
from harness.problems import DEFAULT, PROBLEMS
from harness.runner import PASSES
from variants.problem import PRECISIONS, IPAInputError

CONFIG_AXES = ("node_dim", "pair_dim", "heads", "head_dim", "query_points", "value_points")
AXES = ("batch", "length", *CONFIG_AXES)
MODES = ("eager", "graph")
# The layer sizes' defaults are the problem's (its config class's defaults, `columns()`).
BASE_DEFAULTS = {
    "batch": 1, "dtypes": ["fp32", "bf16"], "modes": ["eager", "graph"],
    "graph_max_length": 512, "seeds": 3, "budget_s": 1.0, "passes": ["forward"],
    "host_spin_ms": TimingPolicy.host_spin_ms,
}
BASE_KEYS = ("problem", *BASE_DEFAULTS, *CONFIG_AXES)


def make_config(problem: str, columns: dict[str, int]):
    """The config of `problem` with the sizes `columns` (the CSV's names, `columns()`), each
    defaulting to the problem's own. A size the problem derives (simplified: head_dim =
    node_dim / heads) must agree with its derivation (`IPAInputError`)."""
    return PROBLEMS[problem].config_class.from_columns(**columns)


@dataclass(frozen=True)
class Cell:
    """One variant-independent point of the grid."""

    batch: int
    length: int
    config: object  # the problem's config (IPAConfig, OpenFoldConfig): it names the problem
    precision: str
    pass_name: str = "forward"  # or "forward+backward": a training step


@dataclass
class Grid:
    cells: list[Cell]
    modes: list[str]
    graph_max_length: int
    seeds: int
    budget_s: float
    source: str = ""
    slices: list[dict] = field(default_factory=list)
    problem: str = DEFAULT
    host_spin_ms: float = BASE_DEFAULTS["host_spin_ms"]

    def modes_for(self, cell: Cell, device: str) -> list[str]:
        """Eager always; CUDA-graph replay (of a forward or a whole training step) on CUDA up
        to graph_max_length."""
        return [m for m in self.modes if m == "eager" or (
            device == "cuda" and cell.length <= self.graph_max_length)]


def _positive_ints(where: str, key: str, values) -> list[int]:
    if not isinstance(values, list) or not values:
        raise IPAInputError(f"{where}.{key}: expected a non-empty list of integers, got {values!r}")
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise IPAInputError(f"{where}.{key}: expected positive integers, got {v!r}")
    return values


def grid_problem(data: dict) -> str | None:
    """The problem a grid description names in `[base]`, or None when it names none."""
    problem = data.get("base", {}).get("problem") if isinstance(data.get("base"), dict) else None
    if problem is not None and problem not in PROBLEMS:
        raise IPAInputError(f"base.problem: expected one of {sorted(PROBLEMS)}, got {problem!r}")
    return problem


def grid_from_dict(data: dict, source: str = "", problem: str | None = None) -> Grid:
    """Validate a grid description (the TOML structure above) and expand it into cells of
    its `problem` (else `problem`, else the default one). A `problem` argument that differs
    from the grid's own is an error."""
    unknown = set(data) - {"base", "slice"}
    if unknown:
        settings = sorted(k for k in unknown if not isinstance(data[k], (dict, list)))
        hint = (f"; settings such as {settings} go under [base]" if settings else "")
        raise IPAInputError(f"grid: unknown top-level entries {sorted(unknown)}; expected the "
                            f"tables [base] and [[slice]]{hint}")
    base = dict(BASE_DEFAULTS)
    extra = set(data.get("base", {})) - set(BASE_KEYS)
    if extra:
        raise IPAInputError(f"base: unknown key(s) {sorted(extra)}; known: {sorted(BASE_KEYS)}")
    own = grid_problem(data)
    if own is not None and problem is not None and own != problem:
        raise IPAInputError(f"--problem {problem}: the grid{f' {source}' if source else ''} is "
                            f"for problem {own!r} (its base.problem); drop --problem or pick "
                            "another grid")
    problem = own or problem or DEFAULT
    base.update({k: v for k, v in data.get("base", {}).items() if k != "problem"})
    for key in AXES:
        if key in base and key != "length":
            _positive_ints("base", key, [base[key]])
    _positive_ints("base", "seeds", [base["seeds"]])
    budget = base["budget_s"]
    if isinstance(budget, bool) or not isinstance(budget, int | float) or not budget > 0:
        raise IPAInputError(f"base.budget_s: expected a positive number of seconds, got {budget!r}")
    spin = base["host_spin_ms"]
    if isinstance(spin, bool) or not isinstance(spin, int | float) or not spin >= 0:
        raise IPAInputError(f"base.host_spin_ms: expected a number of milliseconds >= 0, got "
                            f"{spin!r}")
    graph_max = base["graph_max_length"]
    if isinstance(graph_max, bool) or not isinstance(graph_max, int) or graph_max < 0:
        raise IPAInputError(f"base.graph_max_length: expected an integer >= 0, got {graph_max!r}")
    for key in ("dtypes", "modes", "passes"):
        if not isinstance(base[key], list) or not base[key]:
            raise IPAInputError(f"base.{key}: expected a non-empty list, got {base[key]!r}")
    for dtype in base["dtypes"]:
        if dtype not in PRECISIONS:
            raise IPAInputError(
                f"base.dtypes: expected names in {sorted(PRECISIONS)}, got {dtype!r}")
    for mode in base["modes"]:
        if mode not in MODES:
            raise IPAInputError(f"base.modes: expected names in {list(MODES)}, got {mode!r}")
    _check_passes("base", base["passes"])
    slices = data.get("slice", [])
    if not slices:
        raise IPAInputError("grid: expected at least one [[slice]] with a `length` list")

    cells: list[Cell] = []
    for index, slc in enumerate(slices):
        where = f"slice[{index}]"
        bad = set(slc) - set(AXES) - {"dtypes", "passes"}
        if bad:
            raise IPAInputError(f"{where}: unknown key(s) {sorted(bad)}; known: {list(AXES)}")
        if "length" not in slc and "length" not in base:
            raise IPAInputError(f"{where}: expected a `length` list")
        axes = {k: _positive_ints(where, k, slc[k]) if k in slc else [base[k]] for k in AXES
                if k in slc or k in base}
        dtypes = slc.get("dtypes", base["dtypes"])
        passes = _check_passes(where, slc.get("passes", base["passes"]))
        for values in itertools.product(*axes.values(), dtypes, passes):
            point = dict(zip([*axes, "precision", "pass"], values, strict=True))
            config = make_config(problem, {k: point[k] for k in CONFIG_AXES if k in point})
            cell = Cell(point["batch"], point["length"], config, point["precision"],
                        point["pass"])
            if cell not in cells:
                cells.append(cell)
    return Grid(cells, list(base["modes"]), int(base["graph_max_length"]), int(base["seeds"]),
                float(base["budget_s"]), source, slices, problem, float(spin))


def _check_passes(where: str, passes) -> list[str]:
    if not isinstance(passes, list) or not passes or any(p not in PASSES for p in passes):
        raise IPAInputError(f"{where}.passes: expected a non-empty list of names in "
                            f"{list(PASSES)}, got {passes!r}")
    return passes


def load_grid_file(path: str | Path, problem: str | None = None) -> Grid:
    path = Path(path)
    if not path.exists():
        raise IPAInputError(f"--grid: no such file {str(path)!r}")
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise IPAInputError(f"--grid {path}: invalid TOML: {exc}") from exc
    return grid_from_dict(data, source=str(path), problem=problem)


_N_SLICE_DEFAULT = [64, 128, 256, 384, 512, 768, 1000, 1024, 1536, 2048, 3000, 4096]
PRESETS: dict[str, dict] = {
    # CPU, seconds: small layer, two ragged lengths. Used by CI.
    "smoke": {
        "base": {"node_dim": 64, "pair_dim": 16, "heads": 4, "dtypes": ["fp32"],
                 "modes": ["eager"], "seeds": 2, "budget_s": 0.1},
        "slice": [{"length": [16, 45]}, {"length": [16], "passes": ["forward+backward"]}],
    },
    # One or two minutes on a GPU: the N axis at the default config.
    "quick": {
        "base": {"seeds": 2, "budget_s": 0.5, "graph_max_length": 256},
        "slice": [{"length": [256, 1024, 4096]}],
    },
    # The published grid: N for every dtype, then B, H, Qp, Vp one at a time.
    "default": {
        "base": {"seeds": 2, "budget_s": 0.5},
        "slice": [
            {"length": _N_SLICE_DEFAULT},
            {"length": [256, 1024], "batch": [4]},
            {"length": [256, 1024], "heads": [4, 8, 16]},
            {"length": [256, 1024], "query_points": [8]},
            {"length": [256, 1024], "value_points": [12]},
        ],
    },
    # Training steps (forward+backward) along N at the default config, eager and, up to
    # graph_max_length, the whole step replayed as one CUDA graph.
    "training": {
        "base": {"modes": ["eager", "graph"], "graph_max_length": 1024, "seeds": 2,
                 "budget_s": 0.5,
                 "passes": ["forward+backward"]},
        "slice": [{"length": [256, 1024, 2048, 4096]}],
    },
    # Memory scaling at long sequences.
    "long": {
        "base": {"modes": ["eager"], "seeds": 1},
        "slice": [{"length": [2048, 4096, 6144, 8192, 12288]}],
    },
    # The OpenFold layer (SPEC-openfold.md) on CPU, seconds: a small layer, padded batches
    # (B = 2: one element shorter, its tail masked), ragged N, and a training step.
    "openfold-smoke": {
        "base": {"problem": "openfold", "batch": 2, "node_dim": 48, "pair_dim": 16, "heads": 4,
                 "head_dim": 8, "dtypes": ["fp32"], "modes": ["eager"], "seeds": 2,
                 "budget_s": 0.1},
        "slice": [{"length": [16, 45]}, {"length": [16], "passes": ["forward+backward"]}],
    },
    # The OpenFold layer on a GPU: issue #18's grid (default config, B = 1, N = 256..4096,
    # fp32 and bf16), CUDA-graph replay up to N = 512.
    "openfold-default": {
        "base": {"problem": "openfold", "seeds": 2, "budget_s": 0.5},
        "slice": [{"length": [256, 512, 1024, 2048, 4096]}],
    },
}


def preset_grid(name: str, problem: str | None = None) -> Grid:
    if name not in PRESETS:
        raise IPAInputError(f"--preset: expected one of {list(PRESETS)}, got {name!r}")
    return grid_from_dict(PRESETS[name], source=f"preset:{name}", problem=problem)
