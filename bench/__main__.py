"""``python -m bench NAME [FLAGS]``: run one benchmark (``python -m bench --help`` lists them)."""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import sys
from pathlib import Path

# Each name's module has ``main(argv)``; its docstring's first line is the name's summary.
BENCHMARKS = {
    "engine": "bench.engine",
    "http": "bench.http",
    "scale": "bench.scale",
    "churn": "bench.churn",
    "traffic": "bench.traffic",
    "globs": "bench.globs",
    "soak": "bench.soak",
    "vap": "bench.vap",
    "ha": "bench.ha",
    "domain": "bench.domain",
    "compile": "bench.compile",
    "freshness": "bench.freshness",
    "writes": "bench.writes",
    "names": "bench.names",
    "connections": "bench.connections",
    "framing": "bench.framing",
    "layout": "bench.layout",
    "constants": "bench.constants",
}


def summary(module: str) -> str:
    """The first line of ``module``'s docstring, read from its source (nothing is imported)."""
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None, module
    docstring = ast.get_docstring(ast.parse(Path(spec.origin).read_text()))
    return (docstring or "").splitlines()[0]


def parser() -> argparse.ArgumentParser:
    width = max(map(len, BENCHMARKS))
    listing = "\n".join(f"  {name:{width}}  {summary(m)}" for name, m in BENCHMARKS.items())
    found = argparse.ArgumentParser(
        prog="python -m bench",
        description="Run one of label-rbac's benchmarks, from the repository root.\n"
        "Every figure is reported next to a baseline measured in the same run.",
        epilog=f"benchmarks:\n{listing}\n\n'python -m bench NAME --help' shows NAME's flags.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    found.add_argument("name", choices=BENCHMARKS, metavar="NAME", help="the benchmark to run")
    found.add_argument("flags", nargs="*", default=[], metavar="FLAGS", help="its own flags")
    return found


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # Only the name is parsed here: everything after it is the benchmark's own.
    name = parser().parse_args(argv[:1]).name
    module = importlib.import_module(BENCHMARKS[name])
    sys.argv[0] = f"python -m bench {name}"  # the name argparse shows in NAME's usage line
    return int(module.main(argv[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())
