"""The dated GPU and Dataflow price table a cost estimate reads, and how a user overrides it
(`gpu_hour_price_usd` on the run, `llmft run --prices FILE`).

The table is written by hand from the pricing pages (`PRICES_SOURCE`, `PRICES_WRITTEN`); nothing
here calls a network. Its own module so that the train step's actual-cost record and the
estimate (components/preflight/cost.py) read one table.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from components.platform.capacity import CAPACITIES
from components.platform.platform_facts import accelerator
from trainer.config_file import read_yaml_mapping

PRICES_WRITTEN = "2026-12-04"
"""When `GPU_HOUR_USD` was written down (not fetched by this code, and not re-checked online)."""
PRICES_SOURCE = (
    "on-demand: Compute Engine on-demand machine prices, us-central1 (cloud.google.com/compute/"
    "gpus-pricing; e.g. a2-highgpu-1g ~3.67, a2-ultragpu-1g ~5.07, a3-highgpu ~10.98 per GPU-hour), "
    "rounded up, per GPU-hour with the host machine's share (machine price / GPUs per machine). "
    "Vertex AI custom training charges a premium over these: they are a lower bound of Vertex's "
    "price. spot: a flat ~0.35-0.40 x on-demand ratio, NOT a published price (Compute Engine's "
    "own Spot price of an H100 was ~6.57 in a 2026-09 billing-catalog reading, this table says "
    "3.90). flex-start: 0.5 x on-demand, a ratio, NOT a published price; only for the GPUs "
    "Vertex offers flex-start on (platform_facts.VERTEX_FLEX_START_GPUS). Written from memory of "
    "the pricing pages, not re-checked online: confirm for your region and contract, and "
    "override with `gpu_hour_price_usd` or `llmft run --prices FILE`. The budget's timeout uses "
    "the on-demand figure unless you give a price (`budget_gpu_hour_usd`)"
)
RATIO_PRICED = ("spot", "flex-start")
"""Capacities whose table prices are ratios of on-demand, not transcribed prices."""

GPU_HOUR_USD: dict[str, dict[str, float]] = {
    "NVIDIA_B200": {"on-demand": 14.40, "spot": 5.60, "flex-start": 7.20},
    "NVIDIA_H200_141GB": {"on-demand": 12.60, "spot": 4.90, "flex-start": 6.30},
    "NVIDIA_H100_MEGA_80GB": {"on-demand": 11.70, "spot": 4.20, "flex-start": 5.85},
    "NVIDIA_H100_80GB": {"on-demand": 11.30, "spot": 3.90, "flex-start": 5.65},
    "NVIDIA_A100_80GB": {"on-demand": 5.10, "spot": 2.00, "flex-start": 2.55},
    "NVIDIA_TESLA_A100": {"on-demand": 3.70, "spot": 1.50, "flex-start": 1.85},
    "NVIDIA_L4": {"on-demand": 1.00, "spot": 0.40, "flex-start": 0.50},
    # No flex-start rows: Vertex AI offers no flex-start on T4 or V100 (check_flex_start_accelerator).
    "NVIDIA_TESLA_T4": {"on-demand": 0.55, "spot": 0.22},
    "NVIDIA_TESLA_V100": {"on-demand": 2.90, "spot": 1.10},
}
"""USD per GPU-hour by Vertex accelerator name and capacity type (see PRICES_SOURCE: on-demand
rows are Compute Engine figures, spot and flex-start are ratios)."""

DATAFLOW_VCPU_HOUR_USD = 0.056
"""Dataflow batch worker vCPU-hour (cloud.google.com/dataflow/pricing, us-central1)."""
DATAFLOW_GB_HOUR_USD = 0.003557
"""Dataflow batch worker memory GB-hour (same page)."""
DATAFLOW_GB_PER_VCPU = 3.75
"""Memory per vCPU of Dataflow's default n1-standard workers."""


def load_prices(path: str) -> dict[str, dict[str, float]]:
    """`GPU_HOUR_USD` updated from a YAML/JSON file of the same shape
    (`{NVIDIA_H100_80GB: {spot: 3.5}}`; GKE names accepted). Every problem names the file; a
    price must be a finite number >= 0 (YAML's .inf would make every budget pass, true is no
    price)."""
    try:
        data = read_yaml_mapping(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"prices file {path!r} does not exist") from None
    except UnicodeDecodeError:
        raise ValueError(f"prices file {path!r} is not text (UTF-8 YAML or JSON)") from None
    except ValueError as exc:
        message = (
            str(exc)
            .replace("config file", "prices file")
            .replace(
                "must hold a mapping of key: value",
                "must map accelerator -> capacity -> USD per GPU-hour",
            )
        )
        raise ValueError(message) from None
    prices = {name: dict(by_capacity) for name, by_capacity in GPU_HOUR_USD.items()}
    for name, by_capacity in data.items():
        try:
            gpu = accelerator(str(name)).vertex_name
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None
        if not isinstance(by_capacity, Mapping) or not all(
            c in CAPACITIES
            and isinstance(v, int | float)
            and not isinstance(v, bool)
            and math.isfinite(v)
            and v >= 0
            for c, v in by_capacity.items()
        ):
            raise ValueError(
                f"{path}: {name}: give USD per GPU-hour (a finite number >= 0) for "
                f"{', '.join(CAPACITIES)}, e.g. {{spot: 3.5}}"
            )
        prices.setdefault(gpu, {}).update({c: float(v) for c, v in by_capacity.items()})
    return prices


def gpu_hour_price(
    accelerator_type: str,
    capacity: str,
    *,
    override: float = 0.0,
    prices: Mapping[str, Mapping[str, float]] | None = None,
) -> float:
    """USD per GPU-hour: `override` when set, else the table's (ValueError: not in it)."""
    if override:
        return override
    table = GPU_HOUR_USD if prices is None else prices
    gpu = accelerator(accelerator_type).vertex_name
    try:
        return float(table[gpu][capacity])
    except KeyError:
        raise ValueError(
            f"no {capacity} price for {gpu} in the price table: set gpu_hour_price_usd"
        ) from None
