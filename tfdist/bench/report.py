"""Writing a benchmark's JSON and PNG, shared by every subcommand."""

from __future__ import annotations

import json
import os
import platform
import time

from tfdist.writer import atomic_path, atomic_write_text


def machine_info() -> dict:
    """What the figures were measured on."""
    return {"host_cpus": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(),
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def write(out_dir: str, name: str, result: dict, plot_fn) -> tuple[str, str]:
    """Writes OUT_DIR/NAME.json and OUT_DIR/NAME.png; returns both paths.

    Args:
        out_dir: Output directory (created).
        name: Subcommand name; the files' stem.
        result: JSON-able results; `machine` info is added.
        plot_fn: Callable(result, fig) drawing onto a matplotlib Figure.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out_dir, exist_ok=True)
    result = {"benchmark": name, "machine": machine_info(), **result}
    json_path = os.path.join(out_dir, f"{name}.json")
    atomic_write_text(json_path, json.dumps(result, indent=2, sort_keys=True) + "\n")
    png_path = os.path.join(out_dir, f"{name}.png")
    fig = plt.figure(figsize=(8, 5))
    try:
        plot_fn(result, fig)
        fig.tight_layout()
        with atomic_path(png_path, suffix=".png") as tmp:
            fig.savefig(tmp, dpi=100, format="png")
    finally:
        plt.close(fig)
    return json_path, png_path


def format_table(headers: list[str], rows: list[list]) -> str:
    """A plain fixed-width table."""
    cells = [[f"{c:.4g}" if isinstance(c, float) else str(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h)
              for i, h in enumerate(headers)]
    line = "  ".join(h.rjust(w) for h, w in zip(headers, widths))
    out = [line, "-" * len(line)]
    out += ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in cells]
    return "\n".join(out)
