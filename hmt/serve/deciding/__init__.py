"""Deciding which variant serves: the resource monitor and load index it reads, the measured
latency estimates, the optimizer (CrowdHMTware eq. 3) and the cached decision path over them."""
