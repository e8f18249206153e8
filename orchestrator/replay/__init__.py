"""``loopfuse replay``: what another config would have done with recorded runs."""
