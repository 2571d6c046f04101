"""Ship the compiled pipeline: upload templates, submit runs and manage schedules on Vertex AI
Pipelines and Kubeflow Pipelines (KFP) on GKE.

One module per job: `config` (typed settings from YAML + flags), `checks` (what each command
needs of them), `template` (what a compiled template declares), `cron` (schedule syntax for both
backends), `clients` (SDK clients with clear errors for missing credentials or hosts), `upload`,
`submit`, `schedule` (with `schedule_vertex` and `schedule_kfp`), `from_stack`. The CLI commands
`llmft upload|run|schedule` only parse flags and call these.
"""
