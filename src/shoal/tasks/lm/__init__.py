"""The language-model task: a decoder-only transformer on a text file, and sampling from it."""
