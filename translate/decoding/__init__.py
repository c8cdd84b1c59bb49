"""Decoding: greedy, beam and sampling over the KV cache, the sentence loop, scoring and reports."""
