"""What runs on the device: profiles, host, the candidate↔artifact rule, selection, the model and its pre/post-processing."""
