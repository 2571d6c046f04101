"""The llmft infrastructure as a Pulumi program (infra/README.md)."""
