"""Fakes at the cloud control-plane boundary, one module per service, and nothing else.

- `recording`: what they share: the recorded request, a route table, a `requests` transport
  answering from it (Google REST clients: Vertex, Secret Manager), a loopback HTTP server;
- `k8s_api`: the Kubernetes API (in-process REST layer or a loopback server), with the RBAC
  permission each request needs;
- `vertex`: Vertex AI's REST transport (CustomJobs) and GAPIC clients (pipelines, schedules);
- `kfp_api`: the KFP REST API and Artifact Registry's KFP package endpoint;
- `dataflow`: a submitted Dataflow job's result;
- `pulumi_mocks`: Pulumi's unit-test mocks recording the infra program's resources;
- `google_auth`: a service-account key that loads like a user's.

Everything else in the tests is real (Beam, etcd, torchrun, the KFP compiler and local runner, a
GCS emulator). What a fake receives is compared with reviewed golden files (tests/golden/).
"""
