"""Helpers of the LLM caller actor: endpoint settings, wire conversion, tool-call assembly,
error classification and the retry policy. Each module says one thing."""
