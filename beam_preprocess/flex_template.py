"""The preprocessing pipeline as a Dataflow Flex Template: its parameters and its launcher entry.

Data teams run the same pipeline as the `preprocess` step without a KFP run:

    gcloud dataflow flex-template run prep-$(date +%s) --region R \
        --template-file-gcs-location gs://BUCKET/dataflow/templates/preprocess.json \
        --parameters input=gs://...,output=gs://...,tokenizer=gs://...,seq_len=512

(infra/README.md has the whole recipe.) The launcher image runs `main()` with the template
parameters as `--name=value` flags. Two things differ from `python -m beam_preprocess`:

- Booleans arrive as `--flag=true|false`; argparse's switches take no value, so they are
  translated (`to_pipeline_argv`).
- The launcher must return once the job exists, while manifest.json is written after the job by
  the process that waited for it. So a template run ends with the shards, stats.json and the
  dead letters, and
  `python -m beam_preprocess.flex_template --finalize <same parameters>` writes manifest.json
  afterwards (it checks the rejected fraction exactly as the pipeline step does).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import asdict
from typing import Any

from beam_preprocess.options import add_preprocess_arguments
from beam_preprocess.pipeline import DATAFLOW_RUNNERS, finish, launch, parse_options, write_manifest
from beam_preprocess.tokenize import load_tokenizer
from trainer.packed_data.format import TokenizerIdentity

log = logging.getLogger(__name__)

_BOOLEAN_ACTIONS = (argparse._StoreTrueAction, argparse._StoreFalseAction)


def _actions() -> list[argparse.Action]:
    parser = argparse.ArgumentParser(add_help=False)
    add_preprocess_arguments(parser)
    return [a for a in parser._actions if a.option_strings]


def _parameter_name(action: argparse.Action) -> str:
    """The underscore spelling (Dataflow parameter names take no dashes)."""
    return [s for s in action.option_strings if "-" not in s[2:]][-1][2:]


def boolean_parameters() -> set[str]:
    """Parameters that are argparse switches (passed as name=true|false to a template)."""
    return {_parameter_name(a) for a in _actions() if isinstance(a, _BOOLEAN_ACTIONS)}


def parameters() -> list[dict[str, Any]]:
    """The template's parameter list (Flex Template metadata format), one per pipeline flag.

    Required are the flags without a default (input, output, tokenizer, seq_len), as
    `PreprocessConfig.from_options` requires them; Beam's own options (machine type, workers,
    network) are Dataflow's runtime environment, not template parameters.
    """
    params = []
    for action in _actions():
        name = _parameter_name(action)
        entry: dict[str, Any] = {
            "name": name,
            "label": name.replace("_", " ").capitalize(),
            "helpText": action.help or "",
            "isOptional": action.default is not None,
        }
        if isinstance(action, _BOOLEAN_ACTIONS):
            entry["helpText"] += " true or false (default: false)."
            entry["regexes"] = ["^(true|false)$"]
        elif action.choices:
            entry["helpText"] += f" Default: {action.default}."
            entry["regexes"] = ["^(" + "|".join(map(str, action.choices)) + ")$"]
        elif action.type is int:
            entry["regexes"] = ["^[0-9]+$"]
            if action.default is not None:
                entry["helpText"] += f" Default: {action.default}."
        elif action.type is float:
            entry["regexes"] = [r"^[0-9]*\.?[0-9]+$"]
            entry["helpText"] += f" Default: {action.default}."
        elif action.default:  # "" is explained by the help ("empty: ...")
            entry["helpText"] += f" Default: {action.default}."
        params.append(entry)
    return params


def metadata() -> dict[str, Any]:
    """The metadata file `gcloud dataflow flex-template build --metadata-file` takes."""
    return {
        "name": "llmft-preprocess",
        "description": (
            "llmft preprocessing: raw records (JSONL/JSON/CSV/Parquet) -> validated, deduplicated, "
            "tokenized, packed Parquet shards with stats.json and dead letters (rejected/, "
            "filtered/). Write manifest.json afterwards with "
            "`python -m beam_preprocess.flex_template --finalize` and the same parameters."
        ),
        "streaming": False,
        "parameters": parameters(),
    }


def to_pipeline_argv(argv: list[str]) -> list[str]:
    """Template flags -> `beam_preprocess` flags (`--x=true` -> `--x`, `--x=false` -> dropped)."""
    switches = boolean_parameters()
    out = []
    for arg in argv:
        name, sep, value = arg[2:].partition("=") if arg.startswith("--") else ("", "", "")
        if sep and name in switches:
            if value.lower() not in ("true", "false"):
                raise ValueError(f"--{name}={value}: use true or false")
            if value.lower() == "true":
                out.append(f"--{name}")
            continue
        out.append(arg)
    return out


def finalize(argv: list[str]) -> dict[str, Any]:
    """Write manifest.json for a dataset a template job wrote; returns the manifest."""
    _, config = parse_options(argv)
    tokenizer = load_tokenizer(config.tokenizer)
    identity = TokenizerIdentity.of(tokenizer)
    identity.name_or_path = config.tokenizer
    return asdict(write_manifest(config, identity))


def run(argv: list[str]) -> dict[str, Any] | None:
    """Start the pipeline; on Dataflow return at once, elsewhere wait and write the manifest.

    The launcher must end soon after the job exists (it times out otherwise), so on Dataflow
    nothing waits here, whether Beam submitted the job or only wrote its graph for the launcher.
    Returns the manifest, or None when `--finalize` writes it after the job.
    """
    launched = launch(argv)
    if launched.runner in DATAFLOW_RUNNERS:
        log.info(
            "Dataflow job launched; when it is done, write manifest.json with "
            "`python -m beam_preprocess.flex_template --finalize` and the same parameters"
        )
        return None
    return asdict(finish(launched))


def main(argv: list[str] | None = None) -> int:
    """Entry point of the launcher image and of `--finalize`; `error:` and exit 2 on bad input."""
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    finalize_only = "--finalize" in argv
    argv = [a for a in argv if a != "--finalize"]
    try:
        pipeline_argv = to_pipeline_argv(argv)
        manifest = finalize(pipeline_argv) if finalize_only else run(pipeline_argv)
    except (ValueError, FileNotFoundError, PermissionError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if manifest is not None:
        print(json.dumps({"splits": manifest["splits"], "stats": manifest["stats"]}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
