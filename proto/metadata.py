"""gRPC metadata keys that evenflow's server sends and its client reads: wire facts that are
not messages."""

# Trailing metadata on every UNAVAILABLE evenflow's server answers ("1"): the server refused the
# call itself (draining, its worker lost, a load abandoned) and gave no answer, so the client may
# send it again. gRPC says UNAVAILABLE too for a connection lost mid-call, after which the
# request may have run; without this key a client cannot tell the two apart.
MAY_RESEND = "evenflow-may-resend"
