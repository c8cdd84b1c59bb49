"""The models: attention and layers, the encoder-decoder, the decoder-only variant, the factory."""
