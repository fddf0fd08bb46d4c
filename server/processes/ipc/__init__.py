"""What crosses between evenflow's processes: message schemas (msgspec, never pickle), tensors
as raw ZeroMQ frames, and the errors that travel with them."""
