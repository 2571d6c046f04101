"""Ship the compiled pipeline: upload templates, submit runs and manage schedules on Vertex AI
Pipelines and Kubeflow Pipelines (KFP) on GKE.

One module per job: `config` (typed settings from YAML + flags), `template` (what a compiled
template declares), `cron` (schedule syntax for both backends), `clients` (SDK clients with
clear errors for missing credentials or hosts), `upload`, `submit`, `schedule`. The CLI commands
`llmft upload|run|schedule` only parse flags and call these.
"""
