"""The pipeline's steps, one module each, each with one entry point: `run(<Step>Request)`.

A step's request is its specification (components/steps/component_spec.py): `params`, the run
parameters the step takes, and its own inputs and outputs; its `COMPONENT` names the KFP
component generated from it (components/kfp_components.py). The steps, in pipeline order:
validate, preprocess, etcd, train, evaluate, register, deploy, cleanup.
"""
