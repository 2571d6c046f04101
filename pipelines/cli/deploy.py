"""`llmft compile`, `image-tag`, `upload` and `config from-stack`: getting the pipeline and its
settings to where runs start."""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Annotated, Any

import typer

from pipelines.cli.common import check_choice, not_a_file, print_json, user_errors
from pipelines.cli.options import ConfigOpt, HostOpt, NamespaceOpt

# lazy imports: each command imports the modules of its work in its body, so that `llmft --help`
# (0.4 s) does not pay for them: their modules (kfp, the Google Cloud SDKs) take 2.3 s to import
# after pipelines.cli (min of 3, shared 2-core machine).


@user_errors
def compile_cmd(
    target: Annotated[
        str, typer.Option(help="vertex (single document), kfp (with kfp-kubernetes) or all.")
    ] = "all",
    output_dir: Annotated[Path, typer.Option(help="Where to write the YAML files.")] = Path(
        "compiled"
    ),
) -> None:
    """Compile the fine-tune pipeline (and, with --target all, every component) to YAML."""
    not_a_file(output_dir, "--output-dir")  # before the compiler's import (seconds)
    from pipelines.compile import compile_all

    for path in compile_all(target, output_dir):
        typer.echo(f"wrote {path}")


def image_tag(
    full: Annotated[bool, typer.Option(help="Print repository:tag instead of the tag.")] = False,
) -> None:
    """Print the project image tag (the package version) for docs/deploy/cloudbuild.yaml."""
    from components.runtime.image import DEFAULT_IMAGE, VERSION

    typer.echo(DEFAULT_IMAGE if full else VERSION)


@user_errors
def upload_cmd(
    target: Annotated[str, typer.Option(help="vertex (Artifact Registry) or kfp (KFP server).")],
    template: Annotated[
        Path | None,
        typer.Option(help="Compiled YAML.", show_default="compiled/fine_tune.<target>.yaml"),
    ] = None,
    config: ConfigOpt = None,
    registry: Annotated[
        str | None, typer.Option(help="Vertex: https://<region>-kfp.pkg.dev/<project>/<repo>.")
    ] = None,
    tag: Annotated[
        list[str] | None,
        typer.Option("--tag", help="Vertex: tags.", show_default="v<version>, latest"),
    ] = None,
    host: HostOpt = None,
    namespace: NamespaceOpt = None,
    pipeline_name: Annotated[
        str | None, typer.Option(help="KFP: pipeline name.", show_default="llmft-fine-tune")
    ] = None,
    version_name: Annotated[
        str | None, typer.Option(help="KFP: version name.", show_default="v<version>-<sha256[:8]>")
    ] = None,
    description: Annotated[str | None, typer.Option(help="KFP: version description.")] = None,
) -> None:
    """Publish a compiled pipeline: Vertex -> Artifact Registry (prints the sha256 version), KFP -> pipeline version."""
    from pipelines.deploy.checks import validate
    from pipelines.deploy.config import Backend, load_for

    backend = check_choice(target, typing.get_args(Backend), "--target")
    flags: dict[str, Any] = {"template": str(template) if template else None}
    if backend == "vertex":
        flags["registry"] = registry
    else:
        flags.update(host=host, namespace=namespace, pipeline_name=pipeline_name)
    cfg = load_for(backend, config, **flags)
    validate(cfg, backend, "upload")
    assert cfg.template
    if backend == "vertex":
        _upload_vertex(cfg, tag)
    else:
        _upload_kfp(cfg, version_name, description)


def _upload_vertex(cfg: Any, tags: list[str] | None) -> None:
    """Push the template to Artifact Registry; the version (sha256) on stderr and as JSON."""
    import dataclasses

    from pipelines.deploy.upload import upload_to_registry

    assert cfg.vertex.registry
    uploaded = upload_to_registry(cfg.template, cfg.vertex.registry, tags=tags)
    typer.echo(f"uploaded {uploaded.package} {uploaded.version}", err=True)
    print_json(dataclasses.asdict(uploaded))


def _upload_kfp(cfg: Any, version_name: str | None, description: str | None) -> None:
    """Upload the template as a KFP pipeline version and print its ids as JSON."""
    import contextlib
    import dataclasses
    import sys

    from pipelines.deploy.clients import kfp_client
    from pipelines.deploy.upload import upload_to_kfp

    # kfp.Client prints UI links; keep stdout for the JSON that automation reads.
    with contextlib.redirect_stdout(sys.stderr):
        result = upload_to_kfp(
            cfg.template,
            kfp_client(cfg.kfp),
            pipeline_name=cfg.kfp.pipeline_name,
            version_name=version_name,
            description=description,
            namespace=cfg.kfp.namespace,
        )
    print_json(dataclasses.asdict(result))


@user_errors
def config_from_stack_cmd(
    stack_output: Annotated[
        str,
        typer.Option(help="`pulumi stack output --json` of infra/: a JSON file, or - for stdin."),
    ],
    output: Annotated[
        Path, typer.Option(help="Deploy config to write (updated in place if it exists).")
    ] = Path("deploy.yaml"),
) -> None:
    """Write the deploy config's project, region, bucket, registry and service accounts from the
    infra stack, e.g. `pulumi -C infra stack output --json | llmft config from-stack --stack-output -`."""
    import sys

    from pipelines.deploy.from_stack import parse_stack_output, write_config

    if stack_output == "-":
        outputs = parse_stack_output(sys.stdin.read(), "stdin")
    else:
        outputs = parse_stack_output(Path(stack_output).read_text(), stack_output)
    write_config(outputs, output)
    typer.echo(f"wrote {output} (project {outputs['project']}, region {outputs['region']})")
    if outputs.get("image"):
        typer.echo(f"image: {outputs['image']}", err=True)
