"""The small Transformer the accuracy tasks train (`transformer`), its linear layers
(`linear_layers`) and its training loop (`training`)."""
