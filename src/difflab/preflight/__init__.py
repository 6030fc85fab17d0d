"""Deployment preflight: Cloudflare's four gates, read from the running prefill and decode engines."""
