"""The data: parallel text, the vocabulary, tokens on disk, batches, the sources."""
