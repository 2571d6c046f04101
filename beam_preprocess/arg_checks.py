"""The command line's checks before a preprocessing run starts: a flag Beam does not know fails
(Beam itself only warns), whether a flag was given (so a local default fills only what the user
left out), and the --input patterns matched: their total size (the local runner's worker count)
and what is wrong with them (nothing matched, a directory, a pipe a glob found, an unknown
format). Used by pipeline.py's `parse_options` and `launch`."""

from __future__ import annotations

import argparse
import os
import stat
from typing import Any

from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions

from beam_preprocess.options import add_preprocess_arguments
from beam_preprocess.readers import format_of, format_suffix


def flag_given(argv: list[str], name: str) -> bool:
    spellings = {f"--{name}", f"--{name.replace('_', '-')}"}
    return any(arg.split("=", 1)[0] in spellings for arg in argv)


def reject_unknown_flags(argv: list[str]) -> None:
    """Beam only warns about flags it does not know; a typo must fail instead."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    add_preprocess_arguments(parser)
    seen: set[type] = set()
    pending = list(PipelineOptions.__subclasses__())
    while pending:
        cls = pending.pop()
        if cls in seen:
            continue
        seen.add(cls)
        pending.extend(cls.__subclasses__())
        try:
            cls._add_argparse_args(parser)  # type: ignore[arg-type]
        except argparse.ArgumentError:
            continue  # options defined by two views (Beam allows it); the first one is enough
    _, unknown = parser.parse_known_args(argv)
    flags = [arg for arg in unknown if arg.startswith("--")]
    if flags:
        raise ValueError(
            f"unknown flag(s): {' '.join(flags)}: see `python -m beam_preprocess --help`"
        )
    if unknown:
        raise ValueError(f"unexpected argument(s): {' '.join(unknown)}")


def match_inputs(patterns: tuple[str, ...], input_format: str = "auto") -> tuple[int, list[str]]:
    """(total bytes of the matched input files, what is wrong with the patterns, if anything):
    a pattern that matches nothing, a directory, or a file whose format its name does not tell."""
    total, problems, missing = 0, [], []
    for pattern in patterns:
        try:
            found = FileSystems.match([pattern])[0].metadata_list
        except Exception as exc:  # BeamIOError wraps the filesystem's reason
            problems.append(f"cannot list --input {pattern!r}: {exc}")
            continue
        if not found:
            missing.append(pattern)
        for metadata in found:
            local = "://" not in metadata.path
            if local and not os.path.isfile(metadata.path) and not _named_pipe(pattern, metadata):
                problems.append(_not_a_file_problem(pattern, metadata.path))
                continue
            try:
                format_of(metadata.path, input_format)
            except ValueError as exc:
                problems.append(f"--input {pattern!r} matches a file of unknown format: {exc}")
                continue
            total += metadata.size_in_bytes
    if missing:
        problems.append(f"--input matches no files: {', '.join(missing)}")
    return total, problems


def _named_pipe(pattern: str, metadata: Any) -> bool:
    """A pipe given by its exact name (`--input <(zcat data.jsonl.gz)`, a FIFO a producer
    writes): the user means to stream it. One that a glob happens to match is refused, as nothing
    may ever write to it."""
    return metadata.path == pattern and stat.S_ISFIFO(os.stat(pattern).st_mode)


def _not_a_file_problem(pattern: str, path: str) -> str:
    """A directory is not read as such (it may hold files of other formats, such as a README or
    Spark's _SUCCESS): the message names a glob of the data files in it to give instead. A pipe,
    socket or device matched by a glob is refused: reading one could wait forever."""
    if not os.path.isdir(path):
        return (
            f"--input {pattern!r} matches {path!r}, which is not a regular file (a pipe, socket "
            "or device): give files"
        )
    suffixes = sorted({s for s in map(format_suffix, os.listdir(path)) if s} or {".jsonl"})
    root = path.rstrip("/")
    return (
        f"--input {pattern!r} is a directory: give the files to read as a glob, e.g. "
        f"--input '{root}/*{suffixes[0]}' (or '{root}/' for every file directly in it)"
    )
