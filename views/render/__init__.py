"""Human-readable output: the dry-run tables (dryrun), the cluster's status and hosts (cluster),
``gpuflow explain`` (explain) and ``gpuflow estimate`` JSON (estimate_json)."""
