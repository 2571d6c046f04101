"""Options shared by `llmft upload`, `run` and `schedule` (pipelines/deploy/config.py documents the
setting behind each), the decorator that gives `run` and `schedule` the deploy flags, and the
run-parameter list their `--help` ends with."""

from __future__ import annotations

import functools
import inspect
import json
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from components.params.run_params import RunParams, defaults, describe
from pipelines.cli.common import parse_labels

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
    """Every run parameter with its default and description (components/params/run_params.py)."""
    lines = ["Run parameters (--param KEY=VALUE, or `parameters:` in --config):", ""]
    for name, default in defaults().items():
        # Rich reads [...] as markup: escape the bracket.
        lines.append(f"  {name} \\[default: {json.dumps(default)}]: {describe(name)}")
    return "\n\n".join(lines)


DEPLOY_FLAGS: dict[str, Any] = {
    "template": TemplateOpt,
    "project": ProjectOpt,
    "region": RegionOpt,
    "pipeline_root": RootOpt,
    "service_account": AccountOpt,
    "network": NetworkOpt,
    "label": LabelOpt,
    "enable_caching": CachingOpt,
    "host": HostOpt,
    "namespace": NamespaceOpt,
    "pipeline_id": PipelineIdOpt,
    "version_id": VersionIdOpt,
}
"""The deploy-config flags `llmft run` and `llmft schedule` share, declared once here."""


def with_deploy_flags(command: Callable[..., None]) -> Callable[..., None]:
    """Give a command the shared deploy flags (`DEPLOY_FLAGS`, after its own options); it receives
    them as one `deploy` dict keyed as the deploy config names them (pipelines/deploy/config.py:
    `flag_overrides`), the `--label`s parsed into `labels`."""
    hints = typing.get_type_hints(command, include_extras=True)
    own = [
        p.replace(annotation=hints[p.name])
        for p in inspect.signature(command).parameters.values()
        if p.name != "deploy"
    ]
    shared = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=option)
        for name, option in DEPLOY_FLAGS.items()
    ]

    @functools.wraps(command)
    def with_flags(**values: Any) -> None:
        deploy = {name: values.pop(name) for name in DEPLOY_FLAGS}
        deploy["labels"] = parse_labels(deploy.pop("label"))
        command(**values, deploy=deploy)

    with_flags.__signature__ = inspect.Signature(own + shared)  # type: ignore[attr-defined]
    with_flags.__annotations__ = {p.name: p.annotation for p in own + shared}
    return with_flags
