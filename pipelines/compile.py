"""Compile the pipeline (both targets) and every component to YAML.

Run: `llmft compile [--target vertex|kfp|all] [--output-dir compiled]`. The files are committed;
tests/test_compile.py fails when they drift from the source.
"""

from __future__ import annotations

from pathlib import Path

from kfp import compiler

from components.kfp_components import ALL_COMPONENTS
from pipelines.fine_tune import TARGETS, build_fine_tune


def pipeline_file(target: str) -> str:
    return f"fine_tune.{target}.yaml"


def compile_pipeline(target: str, output_dir: str | Path) -> Path:
    out = Path(output_dir) / pipeline_file(target)
    out.parent.mkdir(parents=True, exist_ok=True)
    compiler.Compiler().compile(build_fine_tune(target), package_path=str(out))
    return out


def compile_components(output_dir: str | Path) -> list[Path]:
    """compiled/components/<name>.yaml for each component, for reuse by other pipelines."""
    out_dir = Path(output_dir) / "components"
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, component in ALL_COMPONENTS.items():
        path = out_dir / f"{name}.yaml"
        compiler.Compiler().compile(component, package_path=str(path))
        paths.append(path)
    return paths


def compile_all(target: str = "all", output_dir: str | Path = "compiled") -> list[Path]:
    if target not in (*TARGETS, "all"):
        raise ValueError(f"--target {target!r}: choose vertex, kfp or all")
    targets = TARGETS if target == "all" else (target,)
    written = [compile_pipeline(t, output_dir) for t in targets]
    if target == "all":
        written += compile_components(output_dir)
    return written
