"""The edge: what a process serving the gRPC port needs (torch-free, nothing of the engine):
decoding, validation, the inference servicer, statuses, security."""
