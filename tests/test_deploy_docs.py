"""docs/deploy/README.md against the facts it states: the IAM table is what the Pulumi program
grants (run under Pulumi's mocks), the KFP backend floor and its table are
components/platform/platform_facts.py's, every Kubernetes platform-spec field and placeholder the compiled
KFP pipeline uses has a floor there, and every finding of the cloud review is answered.

A table that drifted is printed in full by the failing assertion: paste it between its markers."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from fakes.pulumi_mocks import GKE_CONFIG, iam_grants, stack

REPO = Path(__file__).resolve().parents[1]
GUIDE = (REPO / "docs/deploy/README.md").read_text()
COMPILED_KFP = REPO / "compiled/fine_tune.kfp.yaml"


def _block(name: str) -> str:
    found = re.search(rf"<!-- {name}:begin -->\n(.*?)<!-- {name}:end -->", GUIDE, flags=re.S)
    assert found, f"docs/deploy/README.md has no <!-- {name}:begin/end --> block"
    return found.group(1)


def _who(member: str) -> str:
    if member.startswith("serviceAccount:") and ".svc.id.goog[" in member:
        return "KSA " + member.split("[", 1)[1].rstrip("]")
    if member.startswith("serviceAccount:"):
        return member.removeprefix("serviceAccount:").split("@")[0]
    return "each deployer"


def grants_table() -> str:
    """The roles a GKE stack with one deployer grants, as the guide's table."""
    mocks, _ = stack(GKE_CONFIG)
    order = ["llmft-pipelines", "llmft-trainer", "llmft-dataflow", "llmft-builder",
             "llmft-gke-nodes", "KSA kubeflow/llmft-pipeline", "KSA kubeflow/llmft-trainer",
             "each deployer"]  # fmt: skip
    rows = []
    for kind, scope, role, member in iam_grants(mocks):
        where = {
            "project": "project",
            "bucket": "bucket",
            "repository": f"repository `{scope}`",
            "secret": f"secret `{scope}`",
            "account": f"account `{scope.split('@')[0]}`",
        }[kind]
        rows.append((order.index(_who(member)), _who(member), f"`{role}`", where))
    lines = ["| who | role | on |", "|---|---|---|"]
    lines += [f"| {who} | {role} | {where} |" for _, who, role, where in sorted(rows)]
    return "\n".join(lines) + "\n"


def kfp_floors_table() -> str:
    from components.platform.kfp_backend import KFP_FEATURE_FLOORS, version_text

    lines = ["| feature the compiled KFP YAML uses | first KFP backend | source |", "|---|---|---|"]
    for feature, (version, source) in sorted(
        KFP_FEATURE_FLOORS.items(), key=lambda item: (item[1][0], item[0])
    ):
        lines.append(f"| {feature} | {version_text(version)} | {source} |")
    return "\n".join(lines) + "\n"


def test_the_guides_iam_table_is_what_the_stack_grants() -> None:
    """N6: the trainer's token access and every other grant, as the Pulumi program makes them."""
    expected = grants_table()
    assert _block("grants") == expected, f"paste into the grants block:\n{expected}"
    assert (
        "| llmft-trainer | `roles/secretmanager.secretAccessor` | secret `llmft-hf-token` |"
        in expected
    )


def test_the_guides_kfp_floor_is_the_facts() -> None:
    """N7: the floor the guide states is the newest feature's, and its table is the facts'."""
    from components.platform.kfp_backend import kfp_backend_floor, version_text

    stated = re.findall(r"KFP backend (\d+\.\d+\.\d+) or later", GUIDE)
    assert stated and set(stated) == {version_text(kfp_backend_floor())}, stated
    expected = kfp_floors_table()
    assert _block("kfp-floors") == expected, f"paste into the kfp-floors block:\n{expected}"


def _platform_fields(config: Any) -> set[str]:
    """`executor key` or `key.inner key` (inside a mapping or a list of mappings)."""
    fields = set()
    for key, value in config.items():
        items = value if isinstance(value, list) else [value]
        inner = {k for item in items if isinstance(item, dict) for k in item}
        fields |= {f"{key}.{k}" for k in inner} if inner else {key}
    return fields


def test_every_platform_field_and_placeholder_of_the_compiled_kfp_yaml_has_a_floor() -> None:
    """N7: a feature the compiled pipeline starts to use cannot slip past the stated floor."""
    from components.platform.kfp_backend import KFP_FEATURE_FLOORS, KFP_PLATFORM_FIELDS

    text = COMPILED_KFP.read_text()
    _, platform = [d for d in yaml.safe_load_all(text) if d]
    executors = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    used = set().union(*(_platform_fields(config) for config in executors.values()))
    assert used, "no platform spec found"
    assert sorted(used - KFP_PLATFORM_FIELDS.keys()) == [], "add these to KFP_PLATFORM_FIELDS"
    assert set(KFP_PLATFORM_FIELDS.values()) <= KFP_FEATURE_FLOORS.keys()
    if re.search(r"resourceCount: '\{\{\$\.inputs\.parameters", text):
        assert "accelerator count from a parameter" in KFP_FEATURE_FLOORS
    placeholders = set(re.findall(r"\{\{\$\.(pipeline_job_[a-z_]+)\}\}", text))
    assert placeholders == {"pipeline_job_uuid", "pipeline_job_schedule_time_utc"}
    assert {f"{p} placeholder" for p in placeholders} <= KFP_FEATURE_FLOORS.keys()


def test_every_finding_of_the_cloud_review_is_answered() -> None:
    section = GUIDE.split("## What the cloud review found, and where it stands", 1)[1]
    answered = re.findall(r"^- \*\*(N\d+)\*\*", section, flags=re.M)
    assert answered == [f"N{i}" for i in range(1, 19)]
    assert "### What no offline test can show" in section


def test_no_compile_time_image_flag_is_claimed() -> None:
    """N12: `llmft compile` has no --image (the image names itself at run time), and nothing says
    it has."""
    import typer.main

    from pipelines.cli import app

    compile_cmd = typer.main.get_command(app).commands["compile"]  # type: ignore[attr-defined]
    assert "--image" not in {opt for p in compile_cmd.params for opt in p.opts}
    for path in [
        REPO / "components/runtime/image.py",
        *REPO.glob("docs/**/*.md"),
        REPO / "README.md",
    ]:
        text = path.read_text()
        assert not re.search(r"compile[^.\n]*--image|--image[^.\n]*compile", text), path
