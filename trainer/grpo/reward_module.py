"""A user's reward function: a local or gs:// Python file, checked without running it, loaded only in
the training job.

The `reward_module` run parameter is `PATH` or `PATH:FUNCTION` (FUNCTION defaults to `reward`):

    # my_reward.py
    def reward(completions: list[str], prompts: list[str], **columns) -> list[float]:
        '''One float per completion; columns are the prompts dataset's extra columns,
        one value per completion (e.g. columns["answer"]).'''
        return [1.0 if c.strip() == a else 0.0 for c, a in zip(completions, columns["answer"])]

This is TRL's reward-function signature (GRPOTrainer `reward_funcs`), so a function written for TRL
runs here unchanged. Why two entry points: the validate step runs on the pipeline's controller (or a
user's laptop) where executing a user's code is neither safe nor needed, so `check` only reads the
file and finds a top-level `def FUNCTION` (or `FUNCTION = ...`) in its syntax tree; `load` executes
it, and is called by the training job alone.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import sys
import tempfile
from pathlib import Path

from trainer import storage
from trainer.grpo.rewards import Reward, parse_rewards

DEFAULT_FUNCTION = "reward"


def split(spec: str) -> tuple[str, str]:
    """(path, function) of a `reward_module` value. A colon after the scheme (gs://) is not a
    separator."""
    scheme, sep, rest = spec.rpartition("://")
    head = scheme + sep if sep else ""
    path, colon, function = (rest if sep else spec).rpartition(":")
    if not colon or not function.isidentifier():
        return spec, DEFAULT_FUNCTION
    return head + path, function


def check(spec: str) -> str | None:
    """Why `reward_module=spec` cannot be used (one sentence), or None. Reads, never runs, the file."""
    path, function = split(spec)
    if not path.endswith(".py"):
        return f"reward_module must name a Python file ending in .py (got {path!r})"
    if not storage.exists(path):
        return f"reward_module {path} does not exist: give a local path or gs:// URI of a .py file"
    try:
        tree = ast.parse(storage.read_text(path), filename=path)
    except SyntaxError as exc:
        return f"reward_module {path} is not valid Python (line {exc.lineno}: {exc.msg})"
    if function not in _top_level_names(tree):
        return (
            f"reward_module {path} does not define {function}(completions, prompts, **columns): "
            f"define it at the top level or name another function as {path}:NAME"
        )
    return None


def _top_level_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.ImportFrom, ast.Import)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def load(spec: str, weight: float = 1.0) -> Reward:
    """The user's reward function (executes the module: training job only). A remote file is copied
    to a fresh local directory first (a source file is small; no cache to go stale)."""
    path, function = split(spec)
    local = storage.normalize(path)
    if storage.is_remote(path):
        local = os.path.join(tempfile.mkdtemp(prefix="llmft-reward-"), os.path.basename(path))
        Path(local).write_text(storage.read_text(path))
    name = f"llmft_user_reward_{abs(hash(spec))}"
    module_spec = importlib.util.spec_from_file_location(name, local)
    if module_spec is None or module_spec.loader is None:
        raise ValueError(f"reward_module {path} cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module  # so dataclasses/pickle inside the user's module can find it
    module_spec.loader.exec_module(module)
    fn = getattr(module, function, None)
    if not callable(fn):
        raise ValueError(f"reward_module {path} defines no callable {function}")
    return Reward(f"{function} ({path})", fn, weight)


def run_rewards(rewards: str, reward_module: str) -> list[Reward]:
    """A run's rewards: the built-ins of `rewards` (JSON), then the user's function of
    `reward_module` with weight 1 (loaded, so: the training job and the evaluation only)."""
    built = parse_rewards(rewards)
    return [*built, load(reward_module)] if reward_module else built
