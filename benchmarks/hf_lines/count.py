"""Count the lines a user writes for the same job in each framework (RESULTS.md's table).

A counted line is a non-blank line that is not a comment, not part of an import statement
and not part of a docstring (the snippets' docstrings say where each came from). Lines
between `# model and data` and `# end model and data` are counted apart: the same text in
every framework that takes a model object (the Llama's config and the bytes cut into
windows), so the rest is what the framework asks for.

    python benchmarks/hf_lines/count.py
"""

from __future__ import annotations

import ast
from pathlib import Path

HERE = Path(__file__).resolve().parent
JOBS = {
    "shoal": ["shoal_llama.py", "shoal_llama.toml"],
    "Accelerate": ["accelerate_llama.py", "accelerate_fsdp.yaml"],
    "Lightning": ["lightning_llama.py"],
    "torchtitan": ["torchtitan_llama.toml", "torchtitan_additions.py"],
}


def skipped_lines(source: str) -> set[int]:
    """The line numbers of a Python file's imports and docstrings."""
    skipped: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import | ast.ImportFrom):
            skipped.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            value = body[0].value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                skipped.update(range(body[0].lineno, (body[0].end_lineno or 0) + 1))
    return skipped


def count(path: Path) -> tuple[int, int]:
    """(lines of model and data, the other counted lines) of one file."""
    text = path.read_text()
    skipped = skipped_lines(text) if path.suffix == ".py" else set()
    shared = other = 0
    inside = False
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if stripped == "# model and data":
            inside = True
        elif stripped == "# end model and data":
            inside = False
        if not stripped or stripped.startswith("#") or number in skipped:
            continue
        if inside:
            shared += 1
        else:
            other += 1
    return shared, other


def main() -> None:
    print("| framework | files | model and data | the rest | total |")
    print("|---|---|---|---|---|")
    for name, files in JOBS.items():
        shared = other = 0
        for file in files:
            a, b = count(HERE / file)
            shared, other = shared + a, other + b
        print(f"| {name} | {', '.join(files)} | {shared} | {other} | {shared + other} |")


if __name__ == "__main__":
    main()
