"""The preprocessing run's output directory, before and after the run: it must not be reachable
by an --input pattern (a rerun would read the dataset back as records); a non-empty one is
refused, and with --overwrite only the files a previous run listed in its manifest are deleted
(nothing the user owns); work directories an interrupted run left are removed. Local paths and
gs:// alike (Beam's FileSystems)."""

from __future__ import annotations

import logging
import os
import re
import shutil
from collections.abc import Sequence

from apache_beam.io.filesystems import FileSystems

from beam_preprocess.sources import is_file_pattern
from trainer import storage
from trainer.packed_data.format import (
    EVAL_RECORDS_DIR,
    FILTERED_DIR,
    MANIFEST_FILE,
    REJECTED_DIR,
    SPLITS,
    STATS_FILE,
    read_manifest,
)
from trainer.packed_data.output_lock import LOCK_FILE

log = logging.getLogger(__name__)


def list_paths(pattern: str) -> list[str]:
    """The paths matching `pattern` (Beam's FileSystems), sorted."""
    return sorted(m.path for m in FileSystems.match([pattern])[0].metadata_list)


def relative(root: str, paths: list[str]) -> list[str]:
    """`paths` relative to `root` (one outside it unchanged)."""
    root = root.rstrip("/") + "/"
    return [p[len(root) :] if p.startswith(root) else p for p in paths]


_WRITTEN_PROBES = (
    MANIFEST_FILE,
    STATS_FILE,
    *(f"{split}/part-00000-of-00001.parquet" for split in SPLITS),
    *(f"{folder}/part-00000-of-00001.jsonl" for folder in (REJECTED_DIR, FILTERED_DIR)),
    f"{EVAL_RECORDS_DIR}/part-00000-of-00001.jsonl",
)
"""Files like those a run writes into its output (an input pattern that matches one of them would
read the run's own output back: now, or in the next run over the same folder)."""


def check_output_apart_from_inputs(out: str, inputs: Sequence[str]) -> None:
    """Refuse an --output that an --input pattern reaches (`--input 'data/**' --output
    data/packed`): a rerun would read the previous dataset, its dead letters and held-out records
    as new records. An output beside the inputs (`data/*.jsonl`, `data/packed`) is fine."""
    root = _absolute(out).rstrip("/")
    for pattern in inputs:
        if not is_file_pattern(pattern):
            continue
        absolute = _absolute(pattern)
        regex = re.compile(FileSystems.get_filesystem(absolute).translate_pattern(absolute))
        hits = [p for p in _WRITTEN_PROBES if regex.match(f"{root}/{p}")]
        static = re.split(r"[*?\[]", absolute, maxsplit=1)[0].rstrip("/") or "/"
        if hits or storage.holds(root, static):
            raise ValueError(
                f"--output {out!r} overlaps --input {pattern!r}"
                + (f" (which would match {root}/{hits[0]})" if hits else "")
                + ": a run would read its own output back as records; put the output outside "
                "the input's folder, or narrow the pattern"
            )


def _absolute(path: str) -> str:
    return path if "://" in path else os.path.abspath(os.path.expanduser(path))


NOT_DATASET = (MANIFEST_FILE, LOCK_FILE)
"""Files in the output that are not part of the dataset: the manifest itself, the run's lock."""
_WORK_DIRS = re.compile(r"\.(temp-[0-9a-f]{12}|shuffle-[a-z0-9_]{8})")
"""A run's own work directories in a local output (sinks.temp_dir_for, spill.local_spill_dir)."""


def _remove_leftovers(out: str) -> None:
    """Delete the work directories an interrupted run left in the local output `out` (the caller
    holds the output's lock, so no live run uses them)."""
    if "://" in out or not os.path.isdir(out):
        return
    for name in sorted(os.listdir(out)):
        path = os.path.join(out, name)
        if _WORK_DIRS.fullmatch(name) and os.path.isdir(path) and not os.path.islink(path):
            log.warning("removing %s, left by an interrupted run", path)
            shutil.rmtree(path)


def prepare_output(out: str, overwrite: bool) -> None:
    """Refuse a non-empty output; with `overwrite`, delete exactly the files a previous run listed
    in its manifest, and refuse when anything else is there (nothing the user owns is deleted).
    Work directories an interrupted run left (`_WORK_DIRS`) are removed first: the caller holds
    the output's lock.

    Works the same on local paths and gs:// (Beam's FileSystems)."""
    if "://" not in out and os.path.exists(out) and not os.path.isdir(out):
        raise ValueError(f"--output {out!r} is a file: give a directory for the dataset")
    _remove_leftovers(out)
    existing = [p for p in relative(out, list_paths(f"{out}/**")) if p != LOCK_FILE]
    if existing and not overwrite:
        raise ValueError(
            f"--output {out!r} is not empty: choose a new directory or pass --overwrite"
        )
    if existing:
        ours = _files_of_previous_run(out)
        foreign = sorted(set(existing) - ours)
        if foreign:
            shown = ", ".join(foreign[:5]) + (
                f" and {len(foreign) - 5} more" if len(foreign) > 5 else ""
            )
            raise ValueError(
                f"--output {out!r} holds files that no finished llmft preprocess run listed in "
                f"its {MANIFEST_FILE} ({shown}), so --overwrite will not delete it: choose "
                "another directory or remove them yourself"
            )
        FileSystems.delete([f"{out}/{name}" for name in existing])
        if "://" not in out:
            _remove_empty_dirs(out)
    if "://" not in out:
        os.makedirs(out, exist_ok=True)


def _files_of_previous_run(out: str) -> set[str]:
    """Relative paths a finished run wrote, read from its manifest (empty set when none)."""
    try:
        manifest = read_manifest(out)
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return set()
    return {MANIFEST_FILE, *manifest.files}


def _remove_empty_dirs(root: str) -> None:
    for dirpath, _, _ in sorted(os.walk(root), key=lambda entry: -len(entry[0])):
        if dirpath != root and not os.listdir(dirpath):
            os.rmdir(dirpath)
