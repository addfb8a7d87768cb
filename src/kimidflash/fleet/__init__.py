"""Several recipe servers behind vllm-router: the fleet file, the router, the fleet's metrics."""
