"""The small Transformer the accuracy tasks train (`transformer`), its linear layers
(`linear_layers`), its training loop (`training`) and generation through its decoding
state (`sampling`)."""
