"""Per-run etcd for torchrun rendezvous: a local process (`local`) or a StatefulSet on Kubernetes
(`kubernetes`). `components.etcd_step` picks one by backend."""
