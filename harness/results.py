"""The results row: its schema, statuses, the resumable writer, the one reader.

Every command that reads or writes sweep results goes through this module: `sweep` writes
with `ResultsFile`; `report`, `compare`, `plot`, the notebook and the pytest-benchmark suite
read with `read_results` and name columns from `COLUMNS`. `results/README.md` documents
every column; this module is the code it describes.

A row is one variant x cell (batch, length, layer config, dtype) x timing mode x device.
`KEY_COLUMNS` identify it: resumption and `compare` match rows on them.
"""

from __future__ import annotations

import csv
import io
import os
from pathlib import Path

import pandas as pd

from variants.problem import IPAInputError

RESULTS_CSV = "results.csv"
METADATA_JSON = "metadata.json"

COLUMNS = [
    "run_id", "started_at", "variant", "is_baseline", "batch", "length", "heads", "node_dim",
    "pair_dim", "query_points", "value_points", "dtype", "math_mode", "mode", "device",
    "device_name", "status", "reason", "build_s", "median_ms", "p20_ms", "p80_ms", "n_samples",
    "rel_noise", "peak_mem_mib", "rel_l2", "max_abs", "reference_rel_l2", "tol", "err_ratio",
    "invariance_err", "invariance_tol", "correctness_seeds", "speedup_vs_baseline", "floor_ms",
    "pct_of_floor", "tflops", "notes",
]
KEY_COLUMNS = ["variant", "batch", "length", "heads", "node_dim", "pair_dim", "query_points",
               "value_points", "dtype", "mode", "device"]
SHAPE_COLUMNS = ["batch", "heads", "node_dim", "pair_dim", "query_points", "value_points"]

# What a row's `status` may be (results/README.md, "Outcome").
STATUSES = {
    "ok": "timed and within tolerance",
    "mismatch": "timed, but outside tolerance (or NaN/Inf, wrong shape or dtype, a modified "
                "input, invariance failed)",
    "error": "the variant raised",
    "oom": "out of memory",
    "unsupported": "the variant declares it cannot run the cell here",
}
NO_NUMBER = ("oom", "error", "unsupported")  # statuses that carry no timing

# The error figure every table shows: the variant's rel_l2 over the reference's own rel_l2
# in the same precision (1.0 = as accurate as the eager reference). Column `err_ratio`.
ERR_RATIO_LABEL = "err/ref"


def format_err_ratio(value: float) -> str:
    """`err_ratio` as every table prints it: 0.04, 1.00, 2.37e+05; '-' when undefined."""
    if value != value:  # nan
        return "-"
    return f"{value:.2f}" if value < 1e4 else f"{value:.2e}"


def row_key(row: dict) -> tuple[str, ...]:
    """The key of a row (a dict with at least KEY_COLUMNS), as the strings the CSV holds."""
    return tuple(str(row[k]) for k in KEY_COLUMNS)


def _refuse_symlink(path: Path, what: str) -> None:
    if path.is_symlink():
        raise IPAInputError(f"{what}: expected a regular file, got a symbolic link {str(path)!r} "
                            f"(-> {os.readlink(path)!r}); pass the real path")


class ResultsFile:
    """Append-only CSV that survives SIGKILL: each cell's rows go out in one write + fsync.

    Opening an existing file checks that this tool wrote it (the header is `COLUMNS`) before
    anything is changed; a torn last line (no newline, from a killed write) is then cut off,
    so the file always parses. `done` holds the keys of every row on disk.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.done: set[tuple[str, ...]] = set()
        self.baseline_ms: dict[tuple[str, ...], float] = {}
        _refuse_symlink(self.path, "results file")
        if self.path.exists():
            self._check_header()
            self._repair()
            with self.path.open(newline="") as f:
                for row in csv.DictReader(f):
                    self._remember(row)
        else:
            with self.path.open("x", newline="") as f:
                csv.writer(f, lineterminator="\n").writerow(COLUMNS)
                f.flush()
                os.fsync(f.fileno())

    def _check_header(self) -> None:
        with self.path.open(newline="") as f:
            header = f.readline().rstrip("\r\n").split(",")
        if header != COLUMNS:
            missing = [c for c in COLUMNS if c not in header]
            raise IPAInputError(
                f"results file {self.path}: not written by this version of ipa-bench (its header "
                f"differs: {len(header)} columns, missing {missing[:5]}); nothing was changed. "
                "Use a new -o DIR")

    def _repair(self) -> None:
        data = self.path.read_bytes()
        if data and not data.endswith(b"\n"):
            with self.path.open("r+b") as f:
                f.truncate(data.rfind(b"\n") + 1)
                os.fsync(f.fileno())

    def _remember(self, row: dict) -> None:
        key = row_key(row)
        self.done.add(key)
        if row["is_baseline"] == "True" and row["median_ms"]:
            self.baseline_ms[key[1:]] = float(row["median_ms"])

    def append(self, rows: list[dict]) -> None:
        """Write one cell's rows in a single write, then fsync."""
        unknown = {k for row in rows for k in row} - set(COLUMNS)
        if unknown:
            raise ValueError(f"rows: unknown columns {sorted(unknown)}")
        for row in rows:
            if row.get("status") not in STATUSES:
                raise ValueError(f"row status: expected one of {list(STATUSES)}, "
                                 f"got {row.get('status')!r}")
        rows = [{c: row.get(c, "") for c in COLUMNS} for row in rows]
        buffer = io.StringIO()
        csv.DictWriter(buffer, COLUMNS, lineterminator="\n").writerows(rows)
        with self.path.open("a", newline="") as f:
            f.write(buffer.getvalue())
            f.flush()
            os.fsync(f.fileno())
        for row in rows:
            self._remember({k: str(v) for k, v in row.items()})


def read_results(path: str | Path, what: str = "RESULTS.csv", *,
                 allow_empty: bool = False) -> pd.DataFrame:
    """A results CSV as a DataFrame, checked: the file exists, parses, has every column of
    `COLUMNS`, holds rows (unless `allow_empty`) and only known statuses. Every failure is an
    `IPAInputError` naming `what` and the path."""
    path = Path(path)
    if not path.is_file():
        raise IPAInputError(f"{what}: no such file {str(path)!r}")
    try:
        df = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise IPAInputError(f"{what} {path}: not a readable CSV ({exc})") from None
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise IPAInputError(f"{what} {path}: not an ipa-bench results CSV; missing columns "
                            f"{missing}")
    if df.empty and not allow_empty:
        raise IPAInputError(f"{what} {path}: no rows (only a header); nothing to read")
    unknown = sorted(set(df["status"].dropna().astype(str)) - set(STATUSES))
    if unknown or df["status"].isna().any():
        raise IPAInputError(f"{what} {path}: unknown status values {unknown or ['(empty)']}; "
                            f"expected {list(STATUSES)} (a truncated or edited file?)")
    for column in ["length", *SHAPE_COLUMNS]:
        if not df.empty and not pd.api.types.is_integer_dtype(df[column]):
            raise IPAInputError(f"{what} {path}: column {column!r} holds values that are not "
                                "integers (a truncated or edited file?)")
    return df


def latest_per_key(df: pd.DataFrame) -> pd.DataFrame:
    """One row per key: the last one (a file that holds concatenated runs)."""
    return df.drop_duplicates(subset=KEY_COLUMNS, keep="last")
