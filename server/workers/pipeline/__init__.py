"""Pipeline parallelism: a model cut into stages on several devices, micro-batches in flight."""
