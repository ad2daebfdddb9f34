"""What tests, benchmarks and third-party backends use to exercise edgekit: not needed on a device.

``broker``: a throwaway Mosquitto on a loopback port; ``certs``: a throwaway CA for its TLS;
``contract``: the checks every backend must pass; ``fleet_sim``: simulated devices publishing
telemetry (``edgekit fleet simulate``).  Each module is imported on its own: none is imported here.
"""
