"""The FSDP2 fine-tuning trainer run by torchrun (`python -m trainer`), and the etcd-v3 rendezvous.

See docs/trainer.md. Nothing is imported here: `python -m trainer --help`-style config errors and
the rendezvous entry point must not pay for importing torch or transformers.
"""
