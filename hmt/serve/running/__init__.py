"""Running the variants: the pool of loaded variants and their runners, the hysteresis switcher,
serve --adapt's BN re-estimation, scenario replay and the ``hmt serve`` session that starts it all."""
