"""Configuration: the command line, the deployment file, and the frozen values built from them."""
