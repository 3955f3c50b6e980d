"""The Strands math agent on Strands' default model provider, Bedrock Converse."""
