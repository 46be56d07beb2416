"""The hmt command line: thin wrappers that turn library calls into terminal output."""
