"""`[task] type = "module"`: the user's own `nn.Module`, datasets and loss, from a factory."""
