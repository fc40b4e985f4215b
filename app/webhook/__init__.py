"""The webhook process: HTTP server, review wire formats, serving certificates, metrics."""
