"""The KServe v2 HTTP/REST edge."""
