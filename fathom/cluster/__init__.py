"""Several controller replicas on one PostgreSQL store: replicas and per-switch mastership leases
(fathom.cluster.leases), one replica's lease rounds and the view the reconciler consumes
(fathom.cluster.mastership). docs/ha.md says what exists and what does not yet."""
