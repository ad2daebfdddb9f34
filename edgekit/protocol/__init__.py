"""What crosses the wire between devices, the fleet and the CLI: topics, stage names, messages, the broker settings."""
