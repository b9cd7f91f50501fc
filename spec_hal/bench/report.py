"""Benchmark results as data: tables whose rows keep numbers (JSON) and render as markdown, the
run's environment, and the context every suite receives.

A column's ``kind`` says how its number prints: ``us`` microseconds (one decimal), ``ms``,
``ratio`` (``12.34x``), ``share`` (a fraction printed as a percentage), ``int``, ``gbs`` (GB/s),
``mb``, or ``text``. None prints as ``-`` (not measured here; the table's notes say why).
"""
from __future__ import annotations

import datetime
import json
import platform
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch


@dataclass(frozen=True)
class Column:
    key: str
    header: str
    kind: str = "text"


def _format(value, kind: str) -> str:
    if value is None:
        return "-"
    if kind in ("us", "ms", "mb"):
        return f"{value:.1f}"
    if kind == "ratio":
        return f"{value:.2f}x"
    if kind == "share":
        return f"{100 * value:.0f}%"
    if kind == "gbs":
        return f"{value:.0f}"
    return str(value)


# Called with (table, row) for every row added: ``spec-hal bench`` prints each row as it is
# measured, so a run cut short by a time limit still shows what it measured.
_row_listener: Optional[Callable[["Table", dict], None]] = None


def listen_to_rows(listener: Optional[Callable[["Table", dict], None]]) -> None:
    global _row_listener
    _row_listener = listener


@dataclass
class Table:
    """One result table: ``rows`` are dicts keyed by the columns' keys (numbers, not strings)."""

    suite: str
    title: str
    columns: list[Column]
    notes: list[str] = field(default_factory=list)
    rows: list[dict] = field(default_factory=list)

    def add(self, **values) -> dict:
        unknown = set(values) - {column.key for column in self.columns}
        if unknown:
            raise KeyError(f"table {self.title!r} has no column {sorted(unknown)}")
        self.rows.append(values)
        if _row_listener is not None:
            _row_listener(self, values)
        return values

    def row_text(self, row: dict) -> str:
        """One row as ``header=value`` pairs (the progress line of a measured row)."""
        return ", ".join(f"{column.header}={_format(row[column.key], column.kind)}"
                         for column in self.columns if column.key in row)

    def markdown(self) -> str:
        lines = [f"### {self.title}", ""]
        lines += self.notes
        if self.notes:
            lines.append("")
        lines.append("| " + " | ".join(column.header for column in self.columns) + " |")
        lines.append("|" + "|".join("---" if column.kind == "text" else "---:" for column in self.columns) + "|")
        for row in self.rows:
            lines.append("| " + " | ".join(_format(row.get(column.key), column.kind) for column in self.columns) + " |")
        return "\n".join(lines) + "\n"

    def as_json(self) -> dict:
        return {"suite": self.suite, "title": self.title, "notes": self.notes,
                "columns": [{"key": c.key, "header": c.header, "kind": c.kind} for c in self.columns],
                "rows": self.rows}


def print_table(lines: list[str], markdown_path: Optional[str]) -> None:
    """Print a markdown table (its lines) and, with ``markdown_path``, write it there (the
    measurement scripts of scripts/)."""
    table = "\n".join(lines)
    print(table)
    if markdown_path:
        with open(markdown_path, "w") as handle:
            handle.write(table + "\n")


def us(seconds: Optional[float]) -> Optional[float]:
    return None if seconds is None else seconds * 1e6


def ratio(numerator: Optional[float], denominator: Optional[float]) -> Optional[float]:
    if numerator is None or denominator is None or denominator == 0:
        return None
    return numerator / denominator


@dataclass
class Context:
    """What a suite needs: the backend under test, its device, the size grid ("quick" or "full"),
    whether to compile the torch reference (``compile_slow``: also where one compile takes tens of
    seconds per shape), the measured copy bandwidth (GPU only), eager timing settings, and
    ``progress(message)`` for long runs."""

    backend: object
    sizes: str
    compile: bool
    copy_bandwidth: Optional[float]
    progress: Callable[[str], None]
    timing: dict = field(default_factory=dict)
    compile_slow: bool = False

    @property
    def device(self) -> torch.device:
        return self.backend.device

    @property
    def quick(self) -> bool:
        return self.sizes == "quick"

    def share_of_copy(self, nbytes: float, seconds: Optional[float]) -> Optional[float]:
        if seconds is None or not self.copy_bandwidth:
            return None
        return nbytes / seconds / self.copy_bandwidth


def environment(backend, *, sizes: str, command: str, copy_bandwidth: Optional[float]) -> dict:
    """Device, versions and the run's settings (what a vendor's CI attaches beside the tables)."""
    import spec_hal

    device = backend.device
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": command,
        "sizes": sizes,
        "backend": backend.name,
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "spec_hal": spec_hal.__version__,
        "torch": torch.__version__,
        "triton": triton_version,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "copy_bandwidth_gbs": None if copy_bandwidth is None else copy_bandwidth / 1e9,
    }


def environment_markdown(env: dict) -> str:
    lines = ["## spec-hal bench", "",
             f"- device: {env['device_name']} ({env['device']}), backend {env['backend']}",
             f"- spec_hal {env['spec_hal']}, torch {env['torch']}, triton {env['triton'] or 'absent'}, Python {env['python']}",
             f"- date: {env['date']}", f"- command: `{env['command']}` (sizes: {env['sizes']})"]
    if env["copy_bandwidth_gbs"] is not None:
        lines.append(f"- measured copy bandwidth: {env['copy_bandwidth_gbs']:.0f} GB/s (device-to-device copy_, read + write)")
    else:
        lines.append("- copy bandwidth: not measured (no GPU); no share-of-bandwidth figures")
    return "\n".join(lines) + "\n"


def write_reports(env: dict, tables: list[Table], suite_seconds: dict, *, json_path: Optional[str], markdown_path: Optional[str]) -> None:
    if json_path:
        with open(json_path, "w") as handle:
            json.dump({"environment": env, "suite_seconds": suite_seconds, "tables": [t.as_json() for t in tables]}, handle, indent=1)
            handle.write("\n")
    if markdown_path:
        with open(markdown_path, "w") as handle:
            handle.write(environment_markdown(env) + "\n")
            for table in tables:
                handle.write(table.markdown() + "\n")
            handle.write("Seconds per suite: " + ", ".join(f"{name} {seconds:.0f}" for name, seconds in suite_seconds.items()) + "\n")


class Progress:
    """``progress(message)``: one line on stderr with the elapsed time of the run."""

    def __init__(self, stream=sys.stderr, enabled: bool = True):
        self.stream, self.enabled, self.start = stream, enabled, time.perf_counter()

    def __call__(self, message: str) -> None:
        if self.enabled:
            elapsed = time.perf_counter() - self.start
            self.stream.write(f"[bench {int(elapsed) // 60}:{int(elapsed) % 60:02d}] {message}\n")
            self.stream.flush()
