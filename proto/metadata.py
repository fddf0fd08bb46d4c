"""gRPC metadata keys that evenflow's server sends and its client reads: wire facts that are
not messages."""

# Trailing metadata (gRPC) or a header (HTTP), "1", on an UNAVAILABLE evenflow's server answers
# for a request that never reached a worker (refused while draining or with no replica in
# service, dropped from a queue at shutdown): nothing of it ran, so the client may send it again.
# A worker lost while running it is UNAVAILABLE too, unmarked, as is a connection lost mid-call:
# the request may have run (``balancer.errors.EvenflowError.not_run``).
MAY_RESEND = "evenflow-may-resend"
