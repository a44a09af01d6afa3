"""Network-path test tools: a delaying TCP proxy and a network-namespace + veth harness with tbf rate limits.

Used by the retrieval-diagnosis tests and by benchmarks/retrieval_bench.py. They touch only loopback and the
namespaces they create, and tear everything down on exit.
"""
