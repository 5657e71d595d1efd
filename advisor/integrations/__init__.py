"""Applying a tuned config where people train: `lightning` (a Lightning Callback) and `hf` (the
Hugging Face Trainer). Each imports its framework, so neither is imported by `import advisor`;
install them with `pip install 'conv-advisor[lightning]'` or `'conv-advisor[hf]'`.

`precedence` holds the rule both follow when the config and the user set the same thing, and
`layout` puts inputs in the tuned memory format.
"""
