"""The command line: commands, their arguments, reports (bench, explain) and the model zoo."""
