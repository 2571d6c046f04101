"""The pipeline's steps, one module each, each with one entry point: `run(<Step>Request)`.

A request is a frozen dataclass whose fields are the KFP component's parameters by the same names
(components/kfp_components.py builds it from them and calls `run`); the run parameters' meanings
and defaults stay in components/params/run_params.py. The steps, in pipeline order: validate,
preprocess, etcd, train, evaluate, register, cleanup.
"""
