"""Writing result files atomically: CSV, Markdown, JSON and figures; reading
a results CSV back with one clear error.

Every file is written to a temporary file in the destination folder and
renamed over the target (os.replace), so a reader never sees half a file and
an interrupted run leaves the previous version in place.
"""
from __future__ import annotations

import csv
import io
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Iterable, Sequence

from algorithms.errors import GpusimError, ResultsFileError

DEFAULT_RESULTS = Path("results")


def ensure_dir(path) -> Path:
    """The folder `path`, made if missing; GpusimError (one line) if it cannot
    be made or written into. (GPU probes call it before their GPU work, so a
    results file that cannot be written does not lose the run.)"""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise GpusimError(f"cannot create output folder {path}: {exc.strerror}") from None
    if not path.is_dir():
        raise GpusimError(f"output path {path} exists and is not a folder")
    if not os.access(path, os.W_OK):
        raise GpusimError(f"output folder {path} is not writable")
    return path


def ensure_folder_of(path) -> Path:
    """ensure_dir() of the folder results file `path` goes in: a long run
    checks it before its work, not when it first writes."""
    return ensure_dir(Path(path).absolute().parent)


def cannot_write(name: str, path) -> bool:
    """True, after one line on stderr ("name: cannot write path: why"), when
    the folder of results file `path` cannot be made or written into: a
    long run asks before its work, so that its results are not lost after it
    (the caller exits 2)."""
    try:
        ensure_folder_of(path)
    except GpusimError as e:
        print(f"{name}: cannot write {path}: {e}", file=sys.stderr)
        return True
    return False


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _umask()  # read once: os.umask is process-wide and not thread-safe


def atomic_write_bytes(path, data: bytes) -> Path:
    """Write `data` to `path` through a temporary file beside it, so that a
    failed write leaves whatever `path` held; a write the system refuses (a
    full disk, a folder that takes no files) is a one-line GpusimError."""
    path = Path(path)
    ensure_dir(path.parent)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise GpusimError(f"cannot write {path}: {exc.strerror}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; give the usual mode
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(exc, OSError):
            raise GpusimError(f"cannot write {path}: {exc.strerror}") from None
        raise
    return path


def atomic_write_text(path, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def _cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def write_csv(path, rows: Sequence[dict], fields: Sequence[str] | None = None) -> Path:
    """Rows of dicts as CSV (columns: `fields`, else the keys of the first row
    followed by any new keys of later rows)."""
    if fields is None:
        fields = []
        for row in rows:
            fields.extend(k for k in row if k not in fields)
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(fields)
    for row in rows:
        writer.writerow([_cell(row.get(k)) for k in fields])
    return atomic_write_text(path, buf.getvalue())


def read_csv_rows(path) -> list[dict]:
    """The rows of a results CSV; a file that cannot be opened or is not
    UTF-8 text raises ResultsFileError (one line), never a traceback."""
    try:
        with open(path, newline="") as f:
            return list(csv.DictReader(f))
    except OSError as exc:
        raise ResultsFileError(f"cannot read {path}: {exc.strerror}") from None
    except (csv.Error, UnicodeDecodeError) as exc:
        raise ResultsFileError(f"{path}: not a readable CSV ({exc})") from None


def write_json(path, obj) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def markdown_table(header: Sequence[str], rows: Iterable[Sequence]) -> str:
    lines = ["| " + " | ".join(str(h) for h in header) + " |",
             "|" + "|".join("---" for _ in header) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(_cell(c) if not isinstance(c, str) else c for c in row) + " |")
    return "\n".join(lines) + "\n"


def save_figure(fig, path, dpi: int = 110) -> Path:
    """Save a matplotlib figure atomically (PNG unless the suffix says
    otherwise) and close it."""
    import matplotlib.pyplot as plt

    path = Path(path)
    buf = io.BytesIO()
    fmt = path.suffix.lstrip(".") or "png"
    fig.savefig(buf, format=fmt, dpi=dpi, bbox_inches="tight")
    plt.close(fig)
    return atomic_write_bytes(path, buf.getvalue())


def pyplot():
    """matplotlib.pyplot on the non-interactive Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def repo_relative(path) -> str:
    """A path as a report names it: from the checkout's root where it lies
    inside (an absolute path would name the machine it ran on), else as given."""
    root = Path(__file__).resolve().parents[1]
    resolved = Path(path).resolve()
    return str(resolved.relative_to(root)) if resolved.is_relative_to(root) else str(path)


def parse_int_list(text: str, name: str, minimum: int | None = None) -> list[int]:
    """'64,128' -> [64, 128]; a bad item, or one below `minimum`, is a one-line GpusimError."""
    out = []
    for item in str(text).split(","):
        item = item.strip()
        if not item:
            continue
        try:
            out.append(int(item))
        except ValueError:
            raise GpusimError(f"{name}: {item!r} is not an integer (give a comma-separated list)") from None
        if minimum is not None and out[-1] < minimum:
            raise GpusimError(f"{name}: {out[-1]} is below {minimum}, the least allowed")
    if not out:
        raise GpusimError(f"{name}: give at least one value")
    return out


def parse_str_list(text: str, name: str, allowed: Sequence[str] | None = None) -> list[str]:
    out = [s.strip() for s in str(text).split(",") if s.strip()]
    if not out:
        raise GpusimError(f"{name}: give at least one value")
    if allowed is not None:
        for s in out:
            if s not in allowed:
                raise GpusimError(f"{name}: unknown value {s!r}; choose from {', '.join(allowed)}")
    return out
