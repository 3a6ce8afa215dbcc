"""Test doubles that run as real servers: in-process for tests, as processes for benchmarks."""
