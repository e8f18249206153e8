"""The budget monitor (turns, tool calls, deadline, diminishing returns) and its token
budget engine (output, input and cost budgets, target mode)."""
