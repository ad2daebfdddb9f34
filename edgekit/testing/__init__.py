"""What tests, benchmarks and third-party backends use to exercise edgekit: not needed on a device.

``mosquitto``: a throwaway Mosquitto on a loopback port; ``certs``: a throwaway CA for its TLS;
``contract``: the checks every backend must pass (for plugin authors: why this package ships in
the wheel); ``blackhole``: a TCP proxy that swallows traffic; ``process``: child processes for
tests; ``preview_viewer``: someone watching the preview's stream.  No ``edgekit`` command depends on it (``edgekit fleet simulate`` is
``edgekit.telemetry.simulate``).  Each module is imported on its own: none is imported here.
"""
