"""Programs the labs and tests run in several processes (``python -m clusterlab.device.launch``)."""
