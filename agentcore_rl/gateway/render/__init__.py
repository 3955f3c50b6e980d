"""The gateway's rendering mode (linear history, the ``render`` extra): docs/gateway.md."""
