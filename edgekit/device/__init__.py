"""What this host is and how it behaves: device profiles (data), host detection, the OS's
latency settings, and the camera-rate measurement.
"""
