"""Looking inside: attention maps from PyTorch or an `--attentions` export, and drawing them."""
