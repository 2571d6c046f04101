"""Command line of the preprocessing pipeline: `python -m beam_preprocess --help`.

Also what `llmft preprocess` forwards its arguments to. User mistakes print one `error:` line and
exit 2; Ctrl-C (SIGINT) one `error:` line and exit 130, with no traceback (Beam re-wraps the
KeyboardInterrupt as a RuntimeError of the step it interrupted); a summary of the written dataset
is printed as JSON on success.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
from types import FrameType

from beam_preprocess.options import help_parser
from beam_preprocess.pipeline import run
from trainer.storage import DiskFullError, check_tmpdir


def summary(manifest_dict: dict) -> dict:
    """The few numbers a person wants after a run (the manifest holds the rest)."""
    splits = manifest_dict["splits"]
    rows = sum(s["rows"] for s in splits.values())
    tokens = sum(s["tokens"] for s in splits.values())
    return {
        "seq_len": manifest_dict["seq_len"],
        "splits": {k: {"rows": v["rows"], "tokens": v["tokens"]} for k, v in splits.items()},
        "fill_ratio": round(tokens / (rows * manifest_dict["seq_len"]), 4) if rows else 0.0,
        "stats": {
            k: manifest_dict["stats"][k]
            for k in ("records_read", "kept", "filtered", "duplicates", "rejected")
        },
    }


def _without_traceback(record: logging.LogRecord) -> bool:
    record.exc_info, record.exc_text = None, None
    return True


def main(argv: list[str] | None = None, prog: str = "python -m beam_preprocess") -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or "-h" in argv or "--help" in argv:
        help_parser(prog).print_help()
        return 0 if argv else 2
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    # Beam logs a failing step's traceback before it re-raises the error, which is reported
    # below (or, if it is a bug, raised with its traceback): keep only Beam's one-line message.
    logging.getLogger("apache_beam.runners.common").addFilter(_without_traceback)
    from dataclasses import asdict

    interrupted: list[int] = []

    def on_sigint(signum: int, frame: FrameType | None) -> None:
        interrupted.append(signum)
        # Beam logs the interrupt with a traceback as the error of the step it stopped: what
        # follows an interrupt is its consequence, reported below in one line.
        logging.disable(logging.CRITICAL)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        check_tmpdir()
        manifest = run(argv)
    except (ValueError, FileNotFoundError, PermissionError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except DiskFullError as exc:  # not the user's input: the run stopped, no manifest.json
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except BaseException:
        if not interrupted:
            raise
        print(
            "error: interrupted (Ctrl-C) before the dataset was finished: no manifest.json was "
            "written; rerun the same command",
            file=sys.stderr,
        )
        return 130
    finally:
        signal.signal(signal.SIGINT, previous)
        logging.disable(logging.NOTSET)
    print(json.dumps(summary(asdict(manifest)), indent=2))
    return 0
