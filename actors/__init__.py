"""loopfuse's actors: independent async workers that talk only through the bus."""
