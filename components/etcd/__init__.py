"""Per-run etcd for torchrun rendezvous: a local process (`local`) or a StatefulSet on Kubernetes
(`kubernetes`). `components.steps.etcd` picks one by backend."""
