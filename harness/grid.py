"""Sweep grids: presets and TOML files, expanded into cells.

A grid is a base configuration plus a list of one-axis (or few-axis) slices, as SPEC
recommends: the union of slices around the default config, not a full Cartesian product.

TOML format (every key optional; unknown keys are errors):

    [base]                 # values shared by every cell unless a slice overrides them
    batch = 1
    node_dim = 384
    pair_dim = 128
    heads = 12
    query_points = 4
    value_points = 8
    dtypes = ["fp32", "bf16"]
    modes = ["eager", "graph"]   # graph: CUDA-graph replay, only for length <= graph_max_length
    graph_max_length = 512
    passes = ["forward"]         # and/or "forward+backward": a timed training step (eager)
    seeds = 3                    # correctness seeds per cell
    budget_s = 1.0               # timing budget per cell and mode

    [[slice]]              # each slice: lists of values; cells = product of its lists
    length = [64, 128, 256]

    [[slice]]
    length = [256, 1024]
    heads = [4, 8, 16]

A slice may also set `dtypes` and `passes` for its own cells.
"""

from __future__ import annotations

import itertools
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from harness.runner import PASSES
from variants.problem import PRECISIONS, IPAConfig, IPAInputError

AXES = ("batch", "length", "node_dim", "pair_dim", "heads", "query_points", "value_points")
MODES = ("eager", "graph")
BASE_DEFAULTS = {
    "batch": 1, "node_dim": 384, "pair_dim": 128, "heads": 12, "query_points": 4,
    "value_points": 8, "dtypes": ["fp32", "bf16"], "modes": ["eager", "graph"],
    "graph_max_length": 512, "seeds": 3, "budget_s": 1.0, "passes": ["forward"],
}


@dataclass(frozen=True)
class Cell:
    """One variant-independent point of the grid."""

    batch: int
    length: int
    config: IPAConfig
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

    def modes_for(self, cell: Cell, device: str) -> list[str]:
        """Eager always; CUDA-graph replay of a forward on CUDA up to graph_max_length (a
        training step is timed eagerly)."""
        return [m for m in self.modes if m == "eager" or (
            device == "cuda" and cell.length <= self.graph_max_length
            and cell.pass_name == "forward")]


def _positive_ints(where: str, key: str, values) -> list[int]:
    if not isinstance(values, list) or not values:
        raise IPAInputError(f"{where}.{key}: expected a non-empty list of integers, got {values!r}")
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise IPAInputError(f"{where}.{key}: expected positive integers, got {v!r}")
    return values


def grid_from_dict(data: dict, source: str = "") -> Grid:
    """Validate a grid description (the TOML structure above) and expand it into cells."""
    unknown = set(data) - {"base", "slice"}
    if unknown:
        raise IPAInputError(f"grid: unknown table(s) {sorted(unknown)}; expected [base], [[slice]]")
    base = dict(BASE_DEFAULTS)
    extra = set(data.get("base", {})) - set(BASE_DEFAULTS)
    if extra:
        raise IPAInputError(f"base: unknown key(s) {sorted(extra)}; known: {sorted(BASE_DEFAULTS)}")
    base.update(data.get("base", {}))
    for key in AXES:
        if key in base and key != "length":
            _positive_ints("base", key, [base[key]])
    _positive_ints("base", "seeds", [base["seeds"]])
    budget = base["budget_s"]
    if isinstance(budget, bool) or not isinstance(budget, int | float) or not budget > 0:
        raise IPAInputError(f"base.budget_s: expected a positive number of seconds, got {budget!r}")
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
            config = IPAConfig(**{k: point[k] for k in AXES if k not in ("batch", "length")})
            cell = Cell(point["batch"], point["length"], config, point["precision"],
                        point["pass"])
            if cell not in cells:
                cells.append(cell)
    return Grid(cells, list(base["modes"]), int(base["graph_max_length"]), int(base["seeds"]),
                float(base["budget_s"]), source, slices)


def _check_passes(where: str, passes) -> list[str]:
    if not isinstance(passes, list) or not passes or any(p not in PASSES for p in passes):
        raise IPAInputError(f"{where}.passes: expected a non-empty list of names in "
                            f"{list(PASSES)}, got {passes!r}")
    return passes


def load_grid_file(path: str | Path) -> Grid:
    path = Path(path)
    if not path.exists():
        raise IPAInputError(f"--grid: no such file {str(path)!r}")
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise IPAInputError(f"--grid {path}: invalid TOML: {exc}") from exc
    return grid_from_dict(data, source=str(path))


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
    # Training steps (forward+backward, eager) along N at the default config.
    "training": {
        "base": {"modes": ["eager"], "seeds": 2, "budget_s": 0.5,
                 "passes": ["forward+backward"]},
        "slice": [{"length": [256, 1024, 2048, 4096]}],
    },
    # Memory scaling at long sequences.
    "long": {
        "base": {"modes": ["eager"], "seeds": 1},
        "slice": [{"length": [2048, 4096, 6144, 8192, 12288]}],
    },
}


def preset_grid(name: str) -> Grid:
    if name not in PRESETS:
        raise IPAInputError(f"--preset: expected one of {list(PRESETS)}, got {name!r}")
    return grid_from_dict(PRESETS[name], source=f"preset:{name}")
