"""The emulated cloud: namespaces as nodes and VMs, one real Open vSwitch per node."""
