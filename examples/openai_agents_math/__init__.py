"""The math agent written with the OpenAI Agents SDK (see README.md)."""
