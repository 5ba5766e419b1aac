"""What the CLI and the web console show, read from the store, and the words for it: one set of
views, so a page and a command say the same thing. The control plane's reads answer with them
too (activities/cluster_reads.py), and the CLI's offline reads (``--data-dir``) call them itself.

May import ``scheduler``, ``contracts`` and ``store`` only (tests/test_layout.py): no Temporal,
no CLI, no gateway."""
