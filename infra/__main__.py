"""Pulumi entry point: `pulumi up` in infra/ (see infra/README.md)."""

import pulumi
from llmft_infra.program import build_stack
from llmft_infra.settings import load_settings

for key, value in build_stack(load_settings()).items():
    pulumi.export(key, value)
