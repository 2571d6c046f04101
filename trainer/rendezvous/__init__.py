"""torchrun rendezvous plugins: `etcd_v3` (the `etcd-v3` backend over etcd's v3 API)."""
