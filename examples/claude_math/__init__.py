"""The math agent as a Claude-style tool loop on the Anthropic SDK (see README.md)."""
