"""The node agent (`fathom agent`): follows what runs on the node and reports to the controller."""
