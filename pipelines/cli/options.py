"""Options shared by `llmft upload`, `run` and `schedule` (pipelines/deploy/config.py documents the
setting behind each), and the run-parameter list their `--help` ends with."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from components.run_params import RunParams

ConfigOpt = Annotated[
    Path | None, typer.Option("--config", help="YAML settings (see docs/deploy/example.yaml).")
]
ParamOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--param", help="Run parameter KEY=VALUE (repeatable; the parameters are listed below)."
    ),
]
TemplateOpt = Annotated[
    str | None,
    typer.Option(
        help="Compiled YAML or registry URI.", show_default="compiled/fine_tune.<backend>.yaml"
    ),
]
ProjectOpt = Annotated[str | None, typer.Option(help="Vertex: Google Cloud project id.")]
RegionOpt = Annotated[
    str | None, typer.Option(help="Vertex: Google Cloud region.", show_default=RunParams.region)
]
RootOpt = Annotated[str | None, typer.Option(help="Where runs write artifacts (gs:// on Vertex).")]
AccountOpt = Annotated[
    str | None, typer.Option(help="Vertex: service-account email; KFP: Kubernetes service account.")
]
NetworkOpt = Annotated[str | None, typer.Option(help="Vertex: projects/N/global/networks/NAME.")]
LabelOpt = Annotated[
    list[str] | None, typer.Option("--label", help="Vertex: label KEY=VALUE (repeatable).")
]
CachingOpt = Annotated[
    bool | None, typer.Option(help="Override caching for every task.", show_default="as compiled")
]
HostOpt = Annotated[
    str | None, typer.Option(help="KFP: API endpoint.", show_default="$KF_PIPELINES_ENDPOINT")
]
NamespaceOpt = Annotated[str | None, typer.Option(help="KFP: profile namespace (multi-user).")]
PipelineIdOpt = Annotated[
    str | None, typer.Option(help="KFP: uploaded pipeline id (with --version-id).")
]
VersionIdOpt = Annotated[
    str | None, typer.Option(help="KFP: uploaded pipeline version id (from `llmft upload`).")
]


def parameters_epilog() -> str:
    """Every run parameter with its default and description (components/run_params.py)."""
    from components.run_params import defaults, describe

    lines = ["Run parameters (--param KEY=VALUE, or `parameters:` in --config):", ""]
    for name, default in defaults().items():
        # Rich reads [...] as markup: escape the bracket.
        lines.append(f"  {name} \\[default: {json.dumps(default)}]: {describe(name)}")
    return "\n\n".join(lines)
