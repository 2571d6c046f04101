"""`python -m trainer --model PATH --data DIR --output DIR [--config FILE.yaml] [--field value ...]`
or `python -m trainer --config-json '{"model": ..., ...}'` (the whole config; what launchers pass).

Run it under torchrun on every node, e.g. one machine, two processes:

    torchrun --standalone --nproc-per-node 2 -m trainer --model M --data D --output O --max-steps 50

Every TrainConfig field is a flag (docs/trainer.md). A config error prints one `error:` line on
every rank and exits 2 before any process group or model is created.
"""

from __future__ import annotations

import sys

from trainer.config_args import describe_fields, load_config
from trainer.divergence import DivergedError
from trainer.library_logs import quiet_libraries
from trainer.storage import DiskFullError, check_tmpdir


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    quiet_libraries()
    if "--help" in argv or "-h" in argv:
        print(__doc__)
        for name, text in describe_fields().items():
            print(f"  --{name.replace('_', '-')}\n      {text}")
        return 0

    try:
        check_tmpdir()
        config = load_config(argv)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    # torch, transformers: trainer.train takes 9.3 s to import (min of 3, shared 2-core machine);
    # `--help` and a bad flag answer without it
    from trainer.train import NonFiniteLossError, run

    try:
        return run(config)
    except ValueError as exc:  # user errors found during setup (dataset/tokenizer mismatch)
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (NonFiniteLossError, DivergedError, DiskFullError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
