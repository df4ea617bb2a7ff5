"""The br-int pipeline: stage table and pure compilers from a store snapshot to switch state."""
