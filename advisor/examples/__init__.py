"""Bundled example workloads (model files) for the README and the tests."""
