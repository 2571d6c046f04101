"""`llmft`: the command line. Every command's work lives in an importable module; the modules of
this package only parse flags and turn user errors (ValueError, FileNotFoundError) into a one-line
message and exit code 2, never a stack trace (`common.user_errors`).

Each command imports the modules that do its work inside its function (and with them torch, Beam,
KFP, Google SDKs), so `llmft --help` imports only the flags and what they need (~30 project
modules); a project import at the top of a module here is one that is on that path anyway.
The commands are registered below, in the order `llmft --help` lists them.
"""

from __future__ import annotations

import typer

from pipelines.cli import deploy, evaluate, history, quickstart, run, schedule, steps
from pipelines.cli.common import user_errors
from pipelines.cli.options import parameters_epilog
from trainer.library_logs import quiet_libraries
from trainer.storage import check_tmpdir

app = typer.Typer(
    name="llmft",
    help="Fine-tune LLMs with Kubeflow Pipelines: locally, on Vertex AI, or on KFP on GKE.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


@app.callback()
@user_errors
def _environment() -> None:
    check_tmpdir()  # before any command writes a temporary file
    quiet_libraries()


app.command("sample-data")(quickstart.sample_data)
app.command("sample-prompts")(quickstart.sample_prompts)
app.command("tiny-model")(quickstart.tiny_model)
app.command("compile")(deploy.compile_cmd)
app.command("image-tag")(deploy.image_tag)
app.command("upload")(deploy.upload_cmd)
app.command("run", epilog=parameters_epilog())(run.run_cmd)
app.command("schedule", epilog=parameters_epilog())(schedule.schedule_cmd)
app.command("history")(history.history_cmd)
app.command("train")(steps.train_cmd)
# Beam's own argparse parses (and documents) every flag: pass them all through.
app.command(
    "preprocess",
    context_settings={
        "allow_extra_args": True,
        "ignore_unknown_options": True,
        "help_option_names": [],
    },
    add_help_option=False,
)(steps.preprocess_cmd)
app.command("evaluate")(evaluate.evaluate_cmd)
app.command("cleanup")(steps.cleanup_cmd)

render_app = typer.Typer(help="Print manifests without creating anything.", no_args_is_help=True)
render_app.command("pytorchjob")(steps.render_pytorchjob)
render_app.command("trainjob")(steps.render_trainjob)
app.add_typer(render_app, name="render")

config_app = typer.Typer(help="Write deploy configs.", no_args_is_help=True)
config_app.command("from-stack")(deploy.config_from_stack_cmd)
app.add_typer(config_app, name="config")


def main() -> None:
    """Console entry point (`python -m pipelines.cli`)."""
    app()
