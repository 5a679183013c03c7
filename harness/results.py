"""The results row: its schema, statuses, the resumable writer, the one reader.

Every command that reads or writes sweep results goes through this module: `sweep` writes
with `ResultsFile`; `report`, `compare`, `plot`, the notebook and the pytest-benchmark suite
read with `read_results` and name columns from `COLUMNS`. `results/README.md` documents
every column; this module is the code it describes.

A row is one problem x variant x cell (batch, length, layer config, dtype) x timing mode x
device. `KEY_COLUMNS` identify it: resumption and `compare` match rows on them, so a row of
one problem (`simplified`, `openfold`: docs/problems.md) never meets a row of another.
"""

from __future__ import annotations

import csv
import errno
import fcntl
import io
import json
import math
import os
from pathlib import Path

import pandas as pd

from harness.errors import RunFailure
from variants.problem import IPAInputError

RESULTS_CSV = "results.csv"
METADATA_JSON = "metadata.json"

COLUMNS = [
    "run_id", "started_at", "problem", "variant", "is_baseline", "batch", "length", "heads",
    "head_dim", "node_dim", "pair_dim", "query_points", "value_points", "dtype", "math_mode",
    "mode", "pass", "device", "device_name", "status", "reason", "build_s", "median_ms",
    "p20_ms", "p80_ms", "n_samples", "rel_noise", "host_ms", "host_op_us",
    "peak_mem_mib", "rel_l2", "max_abs", "reference_rel_l2", "tol", "err_ratio",
    "invariance_err", "invariance_tol", "correctness_seeds", "grad_rel_l2", "grad_tol",
    "grad_worst", "grad_err_ratio", "speedup_vs_baseline", "floor_ms", "pct_of_floor", "tflops",
    "notes", "flags", "code_digest", "kernel", "node", "gpu",
]


def _derived_head_dim(df: pd.DataFrame) -> pd.Series:
    """`head_dim` of rows written before the column: all of the simplified problem, where it
    is node_dim // heads."""
    return df["node_dim"] // df["heads"]


# Columns added after the first published runs, with the value older files are read with (a
# callable: computed from the other columns). A file without them still reads; a sweep does
# not resume into it (its header differs).
ADDED_COLUMNS = {"flags": "", "code_digest": "", "kernel": "", "pass": "forward",
                 "grad_rel_l2": math.nan, "grad_tol": math.nan, "grad_worst": "",
                 "grad_err_ratio": math.nan, "node": "", "gpu": "", "problem": "simplified",
                 "head_dim": _derived_head_dim, "host_ms": math.nan, "host_op_us": math.nan}
KEY_COLUMNS = ["problem", "variant", "batch", "length", "heads", "head_dim", "node_dim",
               "pair_dim", "query_points", "value_points", "dtype", "mode", "pass", "device"]
_VARIANT_AT = KEY_COLUMNS.index("variant")
# Per-gradient figures of the forward+backward rows, one JSON object per line.
GRADIENTS_JSONL = "gradients.jsonl"
SHAPE_COLUMNS = ["batch", "heads", "head_dim", "node_dim", "pair_dim", "query_points",
                 "value_points"]

# What a row's `status` may be (results/README.md, "Outcome").
STATUSES = {
    "ok": "timed and within tolerance",
    "mismatch": "timed, but outside tolerance (or NaN/Inf, wrong shape or dtype, a modified "
                "input, invariance failed)",
    "error": "the variant raised",
    "oom": "out of memory",
    "unsupported": "the variant declares it cannot run the cell here",
    "interpreted": "checked for correctness under an interpreter (Triton on CPU); not timed, "
                   "since an interpreted latency means nothing",
    "suspect": "correct outputs, but a latency no honest run can have (below the memory "
               "floor: the bytes that must be read over the measured copy bandwidth); never "
               "ranked",
}
# Statuses whose latency is not drawn or ranked as a result (`suspect` keeps its number).
NO_NUMBER = ("oom", "error", "unsupported", "interpreted", "suspect")
TIMED = ("ok", "mismatch")  # statuses that carry a latency (a mismatch may lack one)

# `flags`: `;`-joined marks on a row whose status stands but whose numbers need care.
NOISY_REL_NOISE = 0.03  # the sampler aims at 0.01; above this the median is not to be trusted
# A row this many times faster than the best built-in variant at its cell is flagged `review`.
REVIEW_SPEEDUP = 10.0
# A host-bound row whose host issued ops this many times slower than the fastest its run had
# seen (from the run's start) is flagged `slow-host`.
SLOW_HOST = 1.3
FLAGS = {
    "noisy": f"rel_noise above {NOISY_REL_NOISE:g}: the time budget ran out before the median "
             "settled (typical of CPU rows)",
    "scan:<rule>": "the static scan of a --model-new file or entry-point module found the "
                   "pattern `rule` (harness/scan.py); a pointer for review, not a verdict",
    "known-issue": "the variant declares a known wrong result at this cell (`notes` has the "
                   "evidence; `Variant.known_issues`)",
    "review": f"more than {REVIEW_SPEEDUP:g}x faster than the best built-in variant at this "
              "cell: check the kernel before believing the number",
    "host-bound": "the host took most of the median to issue the call (its time is in `notes`): "
                  "the device waited for launches, so the row measures launch overhead (a "
                  "CUDA-graph replay row of the same cell measures the kernels), or the call "
                  "waits for the device inside",
    "slow-host": f"host-bound, and the host issued a small torch op at least {SLOW_HOST:g}x "
                 "slower just before this row's samples than the fastest the run had seen "
                 "(`host_op_us`, against metadata.json's at the run's start and the rows "
                 "before): the latency measures a slower host too, so compare "
                 "it with rows of the same host speed, or with the CUDA-graph row",
}

def slow_host(host_speed_us: float, reference_us: float) -> bool:
    """Whether the host issued a small op at least `SLOW_HOST` times slower before a row's
    samples (`host_op_us`) than at `reference_us` (the fastest its run had seen); False where
    either is unknown (NaN)."""
    return host_speed_us > SLOW_HOST * reference_us


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


def cell_of_key(key: tuple[str, ...]) -> tuple[str, ...]:
    """A row key without its variant: the cell (problem, shape, dtype, mode, pass, device)
    whose variants are compared with one another."""
    return key[:_VARIANT_AT] + key[_VARIANT_AT + 1:]


def variant_of_key(key: tuple[str, ...]) -> str:
    return key[_VARIANT_AT]


def _refuse_symlink(path: Path, what: str) -> None:
    if path.is_symlink():
        raise IPAInputError(f"{what}: expected a regular file, got a symbolic link {str(path)!r} "
                            f"(-> {os.readlink(path)!r}); pass the real path")


def _open_no_follow(path: Path, flags: int) -> int:
    """os.open that refuses a symbolic link at `path` (no write leaves the output folder)."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            _refuse_symlink(path, path.name)
        raise


class SweepLock:
    """An exclusive `flock` on DIR/.ipa-bench.lock while a sweep writes into DIR: a second
    sweep into the same folder is refused with the holder's PID instead of interleaving."""

    NAME = ".ipa-bench.lock"

    def __init__(self, out_dir: Path):
        self.path = Path(out_dir) / self.NAME
        self.fd: int | None = None

    def __enter__(self) -> SweepLock:
        fd = _open_no_follow(self.path, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise IPAInputError(
                f"-o/--output {str(self.path.parent)!r}: another sweep (PID {holder}) is "
                "writing into this folder; wait for it to finish, or use another folder") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self.fd = fd
        return self

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            os.ftruncate(self.fd, 0)
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None


class Medians:
    """The medians later rows of a cell are compared with: `baseline_ms` (the baseline's, by
    cell key without the variant) and `ok_ms` (every `ok` row's, by key)."""

    def __init__(self):
        self.baseline_ms: dict[tuple[str, ...], float] = {}  # cell key without the variant
        self.ok_ms: dict[tuple[str, ...], float] = {}  # median of every `ok` row by key

    def remember(self, row: dict) -> None:
        """Take in one row (the strings the CSV holds)."""
        key = row_key(row)
        if row["status"] == "ok" and row["median_ms"]:
            self.ok_ms[key] = float(row["median_ms"])
        if row["is_baseline"] == "True" and row["median_ms"]:
            self.baseline_ms[cell_of_key(key)] = float(row["median_ms"])

    def remember_rows(self, rows: list[dict]) -> None:
        """Take in rows as built (any values; missing columns empty)."""
        for row in rows:
            self.remember({c: str(row.get(c, "")) for c in COLUMNS})

    def of_cell(self, keys: set[tuple[str, ...]]) -> Medians:
        """The medians of the cells whose keys without the variant are in `keys`."""
        part = Medians()
        part.baseline_ms = {k: v for k, v in self.baseline_ms.items() if k in keys}
        part.ok_ms = {k: v for k, v in self.ok_ms.items() if cell_of_key(k) in keys}
        return part


class ResultsFile(Medians):
    """Append-only CSV that survives SIGKILL: each cell's rows go out in one write + fsync.

    Opening an existing file first checks that this tool wrote it: the header is `COLUMNS`,
    and every row's `run_id` is one of `known_run_ids` (the runs `metadata.json` lists), when
    given. Only then is a torn last line (no newline, from a killed write) cut off, so the
    file always parses. A write that fails (a full disk) is undone to the last whole cell.
    `done` maps the key of every row on disk to the code digest of its last row; `ok_ms` and
    `baseline_ms` hold the medians the next rows are compared with.
    """

    def __init__(self, path: str | Path, known_run_ids: set[str] | None = None):
        super().__init__()
        self.path = Path(path)
        self.done: dict[tuple[str, ...], str] = {}  # key -> code_digest of its last row
        _refuse_symlink(self.path, "results file")
        if self.path.exists():
            self._check_header()
            rows = self._read_rows()
            if known_run_ids is not None:
                self._check_run_ids(rows, known_run_ids)
            self._repair()
            for row in rows:
                self._remember(row)
        else:
            fd = _open_no_follow(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
            with os.fdopen(fd, "w", newline="") as f:
                csv.writer(f, lineterminator="\n").writerow(COLUMNS)
                f.flush()
                os.fsync(f.fileno())

    def _check_header(self) -> None:
        with self.path.open(newline="") as f:
            header = f.readline().rstrip("\r\n").split(",")
        missing = [c for c in COLUMNS if c not in header]
        if missing and set(missing) <= set(ADDED_COLUMNS) and header == [
                c for c in COLUMNS if c not in missing]:
            raise IPAInputError(
                f"results file {self.path}: written by an earlier ipa-bench (no "
                f"{', '.join(missing)} column); it still reads, but a sweep does not "
                "resume into it. Use a new -o DIR")
        if header != COLUMNS:
            raise IPAInputError(
                f"results file {self.path}: not written by this version of ipa-bench (its header "
                f"differs: {len(header)} columns, missing {missing[:5]}); nothing was changed. "
                "Use a new -o DIR")

    def _read_rows(self) -> list[dict]:
        """Every whole row (a torn last line, which `_repair` cuts, is left out)."""
        text = self.path.read_text()
        whole = text[: text.rfind("\n") + 1]
        return list(csv.DictReader(io.StringIO(whole)))

    def _check_run_ids(self, rows: list[dict], known: set[str]) -> None:
        unknown = sorted({row["run_id"] for row in rows} - known)
        if unknown:
            raise IPAInputError(
                f"results file {self.path}: rows of run(s) {unknown[:3]} that {METADATA_JSON} "
                "beside it does not list; a sweep resumes only its own files. Nothing was "
                "changed. Use a new -o DIR")

    def _repair(self) -> None:
        data = self.path.read_bytes()
        if data and not data.endswith(b"\n"):
            self._truncate(data.rfind(b"\n") + 1)

    def _truncate(self, size: int) -> None:
        with self.path.open("r+b") as f:
            f.truncate(size)
            os.fsync(f.fileno())

    def _remember(self, row: dict) -> None:
        self.done[row_key(row)] = row["code_digest"]
        self.remember(row)

    def append(self, rows: list[dict]) -> None:
        """Write one cell's rows in a single write, then fsync; on a failed write (a full
        disk) cut the file back to its last whole cell and raise `RunFailure`."""
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
        size = self.path.stat().st_size
        try:
            with self.path.open("a", newline="") as f:
                f.write(buffer.getvalue())
                f.flush()
                os.fsync(f.fileno())
        except OSError as exc:
            try:
                self._truncate(size)
            except OSError:
                pass  # the torn line is cut when the sweep resumes
            raise RunFailure(
                f"results file {self.path}: writing a finished cell failed ({exc}); every earlier "
                "row is on disk and the file is consistent: fix the cause (free space?) and rerun "
                "the same command to resume") from exc
        for row in rows:
            self._remember({k: str(v) for k, v in row.items()})


def known_run_ids(metadata_path: Path) -> set[str]:
    """The run ids `metadata.json` lists (empty when the file is missing)."""
    return set(metadata_runs(metadata_path))


def metadata_runs(metadata_path: Path) -> dict[str, dict]:
    """The runs `metadata.json` lists, by run id (empty when the file is missing)."""
    _refuse_symlink(metadata_path, METADATA_JSON)
    if not metadata_path.exists():
        return {}
    try:
        return {run["run_id"]: run for run in json.loads(metadata_path.read_text())["runs"]}
    except (ValueError, KeyError, TypeError) as exc:
        raise IPAInputError(f"{metadata_path}: not an ipa-bench {METADATA_JSON} ({exc}); nothing "
                            "was changed. Use a new -o DIR") from None


def read_results(path: str | Path, what: str = "RESULTS.csv", *,
                 allow_empty: bool = False, every_row: bool = False) -> pd.DataFrame:
    """A results CSV as a DataFrame, checked: the file exists, parses, has every column of
    `COLUMNS`, holds rows (unless `allow_empty`) and only known statuses. Every failure is an
    `IPAInputError` naming `what` and the path. A cell measured again (its code changed, so
    the sweep re-ran it) counts by its last row, unless `every_row`."""
    path = Path(path)
    if not path.is_file():
        raise IPAInputError(f"{what}: no such file {str(path)!r}")
    try:
        df = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        reason = " ".join(str(exc).split())
        raise IPAInputError(f"{what} {path}: not a readable CSV ({reason})") from None
    missing = [c for c in COLUMNS if c not in df.columns and c not in ADDED_COLUMNS]
    if missing:
        raise IPAInputError(f"{what} {path}: not an ipa-bench results CSV; missing columns "
                            f"{missing}")
    for column, value in ADDED_COLUMNS.items():
        if column not in df.columns:
            df[column] = value(df) if callable(value) else value
    df["flags"] = df["flags"].astype("string").fillna("")
    if df.empty and not allow_empty:
        raise IPAInputError(f"{what} {path}: no rows (only a header); nothing to read")
    untimed = df[(df["status"] == "ok") & ~pd.to_numeric(df["median_ms"], errors="coerce")
                 .between(0, float("inf"), inclusive="neither")]
    if not untimed.empty:
        raise IPAInputError(
            f"{what} {path}: {len(untimed)} row(s) with status {sorted(set(untimed['status']))} "
            f"but no finite median_ms (first at CSV line {untimed.index[0] + 2}); a timed row "
            "always has one (an edited or damaged file?)")
    unknown = sorted(set(df["status"].dropna().astype(str)) - set(STATUSES))
    if unknown or df["status"].isna().any():
        raise IPAInputError(f"{what} {path}: unknown status values {unknown or ['(empty)']}; "
                            f"expected {list(STATUSES)} (a truncated or edited file?)")
    for column in ["length", *SHAPE_COLUMNS]:
        if not df.empty and not pd.api.types.is_integer_dtype(df[column]):
            raise IPAInputError(f"{what} {path}: column {column!r} holds values that are not "
                                "integers (a truncated or edited file?)")
    return df if every_row else latest_per_key(df)


def read_gradients(csv_path: str | Path) -> pd.DataFrame:
    """The per-gradient figures beside a results CSV (`gradients.jsonl`), one row per cell and
    gradient tensor: the key columns, `tensor`, `rel_l2`, `tol`, `reference_rel_l2` and
    `of_tol` (rel_l2 / tol: above 1 is outside tolerance). A cell measured again counts by its
    last line. Empty (with those columns) when the file is absent: a forward-only sweep."""
    path = Path(csv_path).parent / GRADIENTS_JSONL
    columns = [*KEY_COLUMNS, "tensor", "rel_l2", "tol", "reference_rel_l2", "of_tol"]
    if not path.is_file():
        return pd.DataFrame(columns=columns)
    latest: dict[tuple, dict] = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        try:
            record = json.loads(line)
            key, figures = record["key"], record["gradients"]
            # Records written before the problem and head_dim columns: the simplified problem.
            key.setdefault("problem", "simplified")
            key.setdefault("head_dim", int(key["node_dim"]) // int(key["heads"]))
            latest[tuple(str(key[c]) for c in KEY_COLUMNS)] = {
                "key": key, "gradients": figures}
        except (ValueError, KeyError, TypeError, AttributeError):
            raise IPAInputError(f"{path}: line {number} is not a gradient record "
                                "(a truncated or edited file?)") from None
    rows = [{**{c: record["key"][c] for c in KEY_COLUMNS}, "tensor": tensor,
             **{f: figures.get(f, math.nan) for f in ("rel_l2", "tol", "reference_rel_l2")}}
            for record in latest.values() for tensor, figures in record["gradients"].items()]
    df = pd.DataFrame(rows, columns=columns[:-1])
    for column in ["length", *SHAPE_COLUMNS]:
        df[column] = df[column].astype(int)
    df["of_tol"] = df["rel_l2"] / df["tol"]
    return df


def has_flag(df: pd.DataFrame, flag: str) -> pd.Series:
    """Which rows carry `flag` in their `;`-joined `flags`."""
    return df["flags"].astype("string").fillna("").str.split(";").map(lambda flags: flag in flags)


def latest_per_key(df: pd.DataFrame) -> pd.DataFrame:
    """One row per key: the last one (a file that holds concatenated runs)."""
    return df.drop_duplicates(subset=KEY_COLUMNS, keep="last")
