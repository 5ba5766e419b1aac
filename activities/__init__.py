"""Control-plane activities (the I/O around the policy: state store, snapshots, reservation
ledger). Built by the control-plane issue; the scheduler library they call is ready."""
