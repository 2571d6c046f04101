"""The packed-dataset format, neutral ground between the layers: Beam writes it, the trainer and
evaluation read it.

    format.py   directory layout, manifest, row columns, tokenizer identity and compatibility,
                seq_len bounds: each name spelled once
    reader.py   the one shard reader (numpy arrays straight from Arrow)

Neutral means: no torch, no Beam, no transformers, nothing of this project except
`trainer.storage` (the import contracts in pyproject.toml enforce it), so Beam workers, the trainer
and evaluation can all import it for the price of pyarrow. It lives under trainer/ only because
the top level of the repository is fixed; `trainer/__init__.py` imports nothing, so that costs
nothing. Nothing is imported here.
"""
