"""The state store: SQLModel tables (workers, deployments, instances, model files, the
reservation ledger), the engine, and the ledger's transactions. SQLite by default, PostgreSQL
by URL. Only activity code imports this package; workflows never do."""
