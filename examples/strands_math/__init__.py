"""The math agent written with Strands Agents (see README.md)."""
