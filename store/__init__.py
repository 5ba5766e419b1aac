"""The state store: SQLModel tables (workers, deployments, instances, model files, the
reservation ledger, keys, tenants), the engine, and the ledger's transactions. SQLite by default,
PostgreSQL by URL.

Who writes: only the control plane's activities (``activities/``) and the operator's offline
commands (``gpuflow keys``/``tenants`` with ``--data-dir``/``--database-url``). Who reads: the
activities, the gateway (its routing table, keys and tenants' limits), the CLI (``status``,
``queue``, ``explain``). Workflows never import it. Imports ``scheduler`` and ``contracts``."""
