"""Test tooling shipped with ssacli, never imported by it (the import contract forbids it, like
``torch.testing``): :mod:`.tiny_models` builds any model family of the installed transformers tiny
on the CPU, and :mod:`.audit` is the all-family audit over them (tests/contracts/test_families.py,
scripts/models_table.py, which writes docs/models.md and ``ssacli.attention.audited``)."""
