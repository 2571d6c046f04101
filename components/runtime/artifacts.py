"""Where a component reads and writes its artifacts: `.uri` for data, `.path` for small reports.

A KFP artifact carries a URI (`gs://bucket/...` on Vertex AI and KFP on GKE, a plain local path
under kfp.local's pipeline root) and a `.path` derived from it (`/gcs/bucket/...` for gs://, the
URI itself for a local path). The components follow one rule on every target:

- Data artifacts (the packed dataset, the trained model's run directory) are passed on by `.uri`.
  Something other than the component's own process reads and writes them: Dataflow workers,
  trainer replicas on GKE or Vertex, the evaluator, the Model Registry (which only takes gs://).
  `trainer.storage` reaches a gs:// URI from any of them through the GCS API with the
  job's credentials, and treats a kfp.local path as the local directory it is. A `/gcs/...` path
  exists only where a Cloud Storage FUSE mount happens to be (Vertex custom jobs and pipeline
  tasks, not a GKE pod or a Dataflow worker), so handing it on would break on the other targets.
- Small files the component itself writes as an output's content (the HTML report, the Markdown
  summary, gcp_resources) go to `.path`: that is the file KFP uploads (KFP on GKE) or the FUSE
  mount of the URI (Vertex), and under kfp.local it is the URI itself.

`llmft run --backend local --param work_uri=gs://...` keeps compute on this machine and data on
GCS: kfp.local's pipeline root is always a local directory, so the data artifacts are redirected
(by setting their `.uri`, which kfp.local passes downstream) to `<work_uri>/runs/<run id>/<name>`.
"""

from __future__ import annotations

from components.runtime.run_identity import safe_run_id
from trainer import storage


def data_artifact_uri(artifact_uri: str, *, work_uri: str, run_id: str, name: str) -> str:
    """The URI a data artifact is written to: its own, unless that is local and `work_uri` is a
    remote prefix (a local run with data on GCS); then `<work_uri>/runs/<run id>/<name>`."""
    if storage.is_remote(artifact_uri) or not work_uri or not storage.is_remote(work_uri):
        return artifact_uri
    return storage.join(work_uri, "runs", safe_run_id(run_id), name)
