"""`python -m pipelines.cli ...`: the same as the `llmft` console script."""

from pipelines.cli import main

main()
