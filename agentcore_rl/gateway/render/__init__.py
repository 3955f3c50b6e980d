"""The gateway's rendering mode (linear history): :class:`~.mode.RenderMode` renders chat
requests with the model's own template, keeps each session's history as the ids served and
calls the inference server token-in. Needs the ``render`` extra. See ``docs/gateway.md``."""
