"""GRPO's setting names, without torch (trainer/config.py checks them before anything loads)."""

LOSS_TYPES = ("grpo", "dr_grpo", "dapo")
SCALE_REWARDS = ("group", "batch", "none")
