"""OpenFlow: the flow/group spec model, its ovs-ofctl rendering and os-ken encoding."""
