"""The controller runtime: OpenFlow sessions (os-ken), node bootstrap (OVSDB), the reconciler."""
