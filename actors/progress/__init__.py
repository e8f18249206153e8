"""The progress reporter: progress events with index/total from the run's plan."""
