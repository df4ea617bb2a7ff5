"""What fathom does on the host it runs on (commands, namespaces), for product code and lab alike."""
