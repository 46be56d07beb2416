"""Reporting what the loop did: tick and request records, the Prometheus text and OpenAPI
document, and a scenario run's timeline, summary and plot."""
