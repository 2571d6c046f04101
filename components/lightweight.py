"""The project's lightweight KFP component: `@llmft_component`.

Every step's component (components/kfp_components.py, generated) is a `@dsl.component` on the
project image (pinned tag, components/runtime/image.py) with the package preinstalled, so nothing
is pip-installed at run time (`install_kfp_package=False`) and `kfp.local`'s SubprocessRunner can
run the same components on one machine; its command execs Python so that SIGTERM reaches the step.
"""

from kfp import dsl

from components.runtime.image import DEFAULT_IMAGE

_KFP_LAUNCH = "_KFP_RUNTIME=true python3 -m kfp.dsl.executor_main"


def exec_python(command: list[str]) -> list[str]:
    """KFP's lightweight-component command with Python exec'd instead of run as a child.

    KFP generates `sh -ec '...; python3 -m kfp.dsl.executor_main ...'`; dash runs the last
    command as a child and does not forward SIGTERM, so cancelling a run would kill the task
    without the launcher inside ever hearing it (and cancelling its training job). With `exec`
    Python replaces the shell and receives the signal itself.
    """
    if not any(_KFP_LAUNCH in part for part in command):
        raise AssertionError(f"KFP's lightweight command changed; update exec_python: {command}")
    return [
        part.replace(_KFP_LAUNCH, _KFP_LAUNCH.replace("python3", "exec python3"))
        for part in command
    ]


def llmft_component(func):  # type: ignore[no-untyped-def]
    """`@dsl.component` on the project image (the one place the image is set), whose command
    execs Python so that SIGTERM reaches the step (`exec_python`)."""
    component = dsl.component(func, base_image=DEFAULT_IMAGE, install_kfp_package=False)
    container = component.component_spec.implementation.container
    container.command = exec_python(list(container.command))
    return component
