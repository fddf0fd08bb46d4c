"""The engine: the composition root, the model table and lifecycle, and the services of the
process that holds the models."""
