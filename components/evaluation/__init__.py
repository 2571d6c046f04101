"""Before/after evaluation of a fine-tuned causal LM: loss, generation metrics, report, gate.

Run from the command line with `llmft evaluate --base PATH --tuned PATH --data DIR --output DIR`,
or call `components.evaluation.evaluate.run_evaluation` (what the pipeline's evaluate step does).

Modules, one job each:
    loading     model + tokenizer from a local directory or any fsspec URI (gs://), on one
                device or sharded over every GPU (accelerate's device_map)
    memory_fit  does a model fit the evaluation GPUs, and which machine would
    data        the packed eval split and the held-out prompt/response records
    scoring     token-weighted loss and perplexity on target tokens of packed rows
    generation  batched greedy generation for held-out prompts
    text_metrics  normalised exact match and chrF
    harness     lm-evaluation-harness tasks on the loaded model (tasks/: the project's own)
    judge       optional pairwise judge of base vs tuned answers (Vertex AI evaluation service)
    gate        the pass/fail decision from configurable thresholds
    report      the self-contained HTML report
    evaluate    the orchestration: everything above, writing metrics.json + report.html

The pipeline's `evaluate` step (components/steps/evaluate.py) calls run_evaluation.

The registry side (upload a passing model, find the champion) is components/serving/registry.py.
"""
