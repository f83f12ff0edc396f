"""The command line: thin wrappers that parse arguments, call the API and render results."""
