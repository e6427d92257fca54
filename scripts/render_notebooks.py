"""Execute the tutorial notebooks and write rendered Markdown copies a reader can open on
GitHub without running anything.

The notebooks in ``notebooks/`` are stored without outputs (diff-friendly; the docs build
executes them). This script executes each one in a fresh ``python3`` kernel (nbclient, in the
notebook's folder) and writes ``docs/tutorials/<name>.md``:

- a header line naming the source notebook, the commit, the date and this command, and saying
  that the privacy noise is fresh in every run (the numbers differ from run to run);
- the markdown cells as they are (MyST ``{doc}`` roles become ordinary links);
- each code cell in a ```` ```python ```` fence, exactly its source;
- its text outputs (streams and plain-text results, ANSI colours removed, long ones cut to
  their first and last lines) in plain ```` ``` ```` fences;
- its figures as small PNGs in ``docs/tutorials/figures/`` (rendered at ``figure.dpi`` 72,
  at most 720 pixels wide, palette-compressed).

A cell that raises stops that notebook: nothing is written for it, the others still run, and
the script exits 1. ``docs/tutorials/README.md`` lists the rendered copies.
``tests/test_tutorials_rendered.py`` checks that each copy's code cells and markdown cells
are the notebook's, so re-run this script after editing a notebook::

    python scripts/render_notebooks.py                 # every notebook (several minutes)
    python scripts/render_notebooks.py notebooks/01_quickstart.ipynb
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import io
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
OUT = ROOT / "docs" / "tutorials"
FIGURES = OUT / "figures"
#: Figures: matplotlib's figure.dpi in the kernel, and the largest width kept (pixels).
DPI = 72
MAX_WIDTH = 720
#: Text outputs longer than this many lines keep their first and last lines.
MAX_LINES = 60
HEAD_LINES, TAIL_LINES = 45, 10
#: Per-cell timeout of the kernel, seconds (the docs build uses 300).
CELL_TIMEOUT = 600

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
#: A warning's location in a kernel cell ("/tmp/ipykernel_123/456.py:5: "): a temporary name.
_CELL_FILE = re.compile(r"\S*ipykernel_\d+[/\\]\d+\.py:\d+: ")
_DOC_ROLE = re.compile(r"\{doc\}`([^`<]*?)\s*<([^`>]+)>`|\{doc\}`([^`]+)`")


def rendered_path(notebook: Path) -> Path:
    """Where the rendered copy of ``notebook`` goes."""
    return OUT / f"{notebook.stem}.md"


def markdown_cell(source: str) -> str:
    """A markdown cell as GitHub shows it: MyST ``{doc}`` roles become links to the ``.md``
    page (``docs/tutorials/`` is as deep as ``docs/notebooks/``, so relative targets hold)."""

    def link(m: re.Match[str]) -> str:
        text, target = (m.group(1), m.group(2)) if m.group(2) else (None, m.group(3))
        target = target.strip()
        return f"[{text or Path(target).name}]({target}.md)"

    return _DOC_ROLE.sub(link, source).rstrip()


def fence(text: str, info: str = "") -> str:
    """``text`` in a backtick fence longer than any backtick run inside it."""
    runs = [len(r) for r in re.findall(r"`+", text)]
    ticks = "`" * max(3, max(runs, default=0) + 1)
    return f"{ticks}{info}\n{text}\n{ticks}"


def clean_text(text: str) -> str:
    """ANSI colours and the kernel's temporary cell file names removed, trailing spaces
    dropped, long text cut to its head and tail."""
    text = _CELL_FILE.sub("", _ANSI.sub("", text))
    lines = [line.rstrip() for line in text.rstrip().splitlines()]
    if len(lines) > MAX_LINES:
        cut = len(lines) - HEAD_LINES - TAIL_LINES
        lines = [*lines[:HEAD_LINES], f"[... {cut} lines cut ...]", *lines[-TAIL_LINES:]]
    return "\n".join(lines)


def small_png(data: bytes) -> bytes:
    """A figure at most ``MAX_WIDTH`` wide, on white, with an adaptive 256-colour palette."""
    from PIL import Image

    image = Image.open(io.BytesIO(data))
    if image.mode in ("RGBA", "LA", "P"):
        image = image.convert("RGBA")
        white = Image.new("RGBA", image.size, (255, 255, 255, 255))
        image = Image.alpha_composite(white, image)
    image = image.convert("RGB")
    if image.width > MAX_WIDTH:
        height = round(image.height * MAX_WIDTH / image.width)
        image = image.resize((MAX_WIDTH, height), Image.Resampling.LANCZOS)
    image = image.quantize(colors=256, method=Image.Quantize.MEDIANCUT)
    out = io.BytesIO()
    image.save(out, format="PNG", optimize=True)
    return out.getvalue()


def outputs_markdown(outputs: list, stem: str, cell: int) -> list[str]:
    """The Markdown blocks of one code cell's outputs; figures are written to FIGURES."""
    blocks: list[str] = []
    stream: list[str] = []
    figure = 0

    def flush() -> None:
        if stream:
            text = clean_text("".join(stream))
            if text:
                blocks.append(fence(text))
            stream.clear()

    for output in outputs:
        kind = output["output_type"]
        if kind == "stream":  # stdout and stderr merged in order, as the docs build does
            stream.append(output["text"])
            continue
        flush()
        if kind == "error":
            raise RuntimeError(f"cell {cell} raised {output['ename']}")
        data = output.get("data", {})
        if "image/png" in data:
            name = f"{stem}_cell{cell:02d}_{figure}.png"
            figure += 1
            png = small_png(base64.b64decode(data["image/png"]))
            (FIGURES / name).write_bytes(png)
            blocks.append(f"![figure {figure} of cell {cell}](figures/{name})")
        elif "text/plain" in data:
            text = clean_text(data["text/plain"])
            if text:
                blocks.append(fence(text))
    flush()
    return blocks


def git(*args: str) -> str:
    result = subprocess.run(["git", *args], capture_output=True, text=True, cwd=ROOT)
    return result.stdout.strip()


def header(notebook: Path, seconds: float, command: str) -> str:
    rel = notebook.relative_to(ROOT).as_posix()
    commit = git("rev-parse", "--short=10", "HEAD") or "unknown"
    if git("status", "--porcelain", "--", rel):
        commit += " with uncommitted changes to the notebook"
    today = dt.datetime.now(dt.timezone.utc).date().isoformat()
    return (
        f"<!-- Generated by scripts/render_notebooks.py from {rel}: edit the notebook, "
        "not this file. -->\n\n"
        f"> Rendered copy of [`{rel}`](../../{rel}), executed at commit `{commit}` on "
        f"{today} ({seconds:.0f} s) with `{command}`. The privacy noise is fresh in every "
        "run (never seeded), so the numbers and figures differ from run to run."
    )


def render_notebook(notebook: Path, command: str, timeout: int = CELL_TIMEOUT) -> Path:
    """Execute ``notebook`` and write its rendered copy; return the copy's path."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(notebook, as_version=4)
    t0 = time.perf_counter()
    NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(notebook.parent)}},
    ).execute()
    seconds = time.perf_counter() - t0
    FIGURES.mkdir(parents=True, exist_ok=True)
    for old in FIGURES.glob(f"{notebook.stem}_cell*.png"):
        old.unlink()
    parts = [header(notebook, seconds, command)]
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown":
            parts.append(markdown_cell(cell.source))
        elif cell.cell_type == "code":
            parts.append(fence(cell.source, "python"))
            parts.extend(outputs_markdown(cell.get("outputs", []), notebook.stem, i))
    path = rendered_path(notebook)
    path.write_text("\n\n".join(parts) + "\n")
    return path


def write_index() -> None:
    """``docs/tutorials/README.md``: the rendered copies, in order, with their titles."""
    lines = [
        "# Tutorials, rendered",
        "",
        "Executed copies of the notebooks in [`notebooks/`](../../notebooks), with their "
        "outputs and figures, written by `python scripts/render_notebooks.py`. Each copy's "
        "first line says when it was run; the privacy noise is fresh in every run, so the "
        "numbers differ from run to run. The notebooks are the source: edit them, not these "
        "files.",
        "",
    ]
    for notebook in sorted(NOTEBOOKS.glob("*.ipynb")):
        path = rendered_path(notebook)
        if path.exists():
            title = next(
                (ln[2:] for ln in path.read_text().splitlines() if ln.startswith("# ")), ""
            )
            lines.append(f"- [{notebook.stem}]({path.name}): {title}")
    (OUT / "README.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: notebooks/*.ipynb")
    parser.add_argument("--timeout", type=int, default=CELL_TIMEOUT, help="seconds per cell")
    args = parser.parse_args(argv)
    paths = [p.resolve() for p in args.notebooks] or sorted(NOTEBOOKS.glob("*.ipynb"))
    command = " ".join(
        ["python scripts/render_notebooks.py"]
        + [Path(a).resolve().relative_to(ROOT).as_posix() for a in args.notebooks]
    )
    OUT.mkdir(parents=True, exist_ok=True)
    failed = []
    with tempfile.TemporaryDirectory(prefix="render-notebooks-") as tmp:
        # The kernels inherit this environment: small figures, unbuffered output.
        rc = Path(tmp) / "matplotlibrc"
        rc.write_text(f"figure.dpi: {DPI}\nsavefig.dpi: figure\n")
        os.environ.update({"MATPLOTLIBRC": str(rc), "PYTHONUNBUFFERED": "1"})
        for path in paths:
            t0 = time.perf_counter()
            print(f"{path.name} ...", flush=True)
            try:
                out = render_notebook(path, command, args.timeout)
            except Exception as err:  # report every notebook, then fail
                failed.append(path.name)
                print(f"{path.name} FAILED: {str(err)[-3000:]}", file=sys.stderr, flush=True)
                continue
            print(f"  -> {out.relative_to(ROOT)} ({time.perf_counter() - t0:.0f} s)", flush=True)
    write_index()
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
