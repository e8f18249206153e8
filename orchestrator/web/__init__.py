"""HTTP serving shared by the daemon and the simulator (uvicorn in a task group)."""
