"""loopfuse's orchestrator: the conductor, the runtime, config, simulator and CLI."""
